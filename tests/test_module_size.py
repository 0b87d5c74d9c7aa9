"""No module over 500 lines anywhere in kvref/ or tools/: a longer one has more than one job
(docs/ARCHITECTURE.md; split it where a reader can name both halves)."""

from __future__ import annotations

from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 500
# Relative to the checkout; every `.py` below each is checked, at any depth.
SIZE_CHECKED_DIRECTORIES = ("kvref", "tools")


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


def test_the_limit_catches_a_long_module(tmp_path: Path) -> None:
    long_module = tmp_path / "long.py"
    long_module.write_text("x = 1\n" * MAX_MODULE_LINES + "y = 2")  # the last line has no newline
    assert line_count(long_module) == MAX_MODULE_LINES + 1


# The vLLM adapter translates types and nothing else (issue 42: it was 366 lines when kvref's
# tiers had a contract of their own); a longer one is translating behaviour again.
ADAPTER = CHECKOUT / "kvref" / "integrations" / "vllm" / "_adapter.py"
MAX_ADAPTER_LINES = 120


def test_the_vllm_adapter_only_translates_types() -> None:
    assert line_count(ADAPTER) <= MAX_ADAPTER_LINES
