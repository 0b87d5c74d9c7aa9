"""The README's API map lists only public names, and every main public name.

Each row of the table under "### API map" names a module and some of its names. A name listed
there must be in that module's `__all__` and importable from it, so the table cannot drift from
the code; every name `kvref` re-exports must appear somewhere in the table.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
# Names `kvref.__all__` exports that the map leaves out on purpose.
NOT_IN_MAP = frozenset({"__version__", "CachePolicyName"})


def api_rows(text: str) -> list[tuple[str, list[str]]]:
    """Return (module, names) for each row of the README's API map table.

    Args:
        text: the README's text.

    Returns:
        One entry per table row, names stripped of any call signature.
    """
    section = text.split("### API map", 1)[1].split("\n#", 1)[0]
    rows: list[tuple[str, list[str]]] = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or not cells[0].startswith("`"):
            continue  # not a row, or the header and its rule
        module = cells[0].strip("`")
        names = [re.split(r"[(\[]", code, maxsplit=1)[0] for code in re.findall(r"`([^`]+)`", cells[1])]
        rows.append((module, names))
    return rows


ROWS = api_rows(README.read_text(encoding="utf-8"))


def test_the_map_has_rows() -> None:
    assert len(ROWS) >= 10
    assert all(names for _, names in ROWS)


@pytest.mark.parametrize(("module_name", "names"), ROWS, ids=[module for module, _ in ROWS])
def test_listed_names_are_public_and_importable(module_name: str, names: list[str]) -> None:
    module = importlib.import_module(module_name)
    exported: list[str] = list(getattr(module, "__all__", []))
    missing = [name for name in names if name not in exported]
    assert not missing, f"{module_name}.__all__ lacks {missing}"
    for name in names:
        assert getattr(module, name) is not None


def test_every_main_public_name_is_listed() -> None:
    import kvref

    listed = {name for _, names in ROWS for name in names}
    unlisted = sorted(set(kvref.__all__) - NOT_IN_MAP - listed)
    assert not unlisted, f"README's API map lacks {unlisted}"


def test_the_parser_reads_a_row() -> None:
    text = "### API map\n\n| module | names | what |\n|---|---|---|\n| `m.n` | `A(x=1)`, `b` | d |\n"
    assert api_rows(text) == [("m.n", ["A", "b"])]
