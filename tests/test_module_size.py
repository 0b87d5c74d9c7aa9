"""No module over 500 lines in the packages listed here: a longer one has more than one job
(docs/ARCHITECTURE.md; split it where a reader can name both halves)."""

from __future__ import annotations

from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 500
# Relative to the checkout; every `.py` below each is checked.
SIZE_CHECKED_DIRECTORIES = ("kvref/audit", "kvref/server", "kvref/tiering", "kvref/integrations", "kvref/testing")


def line_count(path: Path) -> int:
    """Lines as `wc -l` counts them (a last line without a newline counts too)."""
    return len(path.read_bytes().splitlines())


@pytest.mark.parametrize("directory", SIZE_CHECKED_DIRECTORIES)
def test_no_module_is_over_the_limit(directory: str) -> None:
    modules = sorted((CHECKOUT / directory).rglob("*.py"))
    assert modules, f"no modules under {directory}"
    too_long = {
        path.relative_to(CHECKOUT).as_posix(): lines
        for path in modules
        if (lines := line_count(path)) > MAX_MODULE_LINES
    }
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines: {too_long}"
