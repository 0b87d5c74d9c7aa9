"""The edits that add imports where ruff's isort (`I001`, default settings) puts them.

A fix that writes a name the module lacks carries the import as edits of its own, computed
from the module's summary (`ImportFacts`), so `--fix`, `--diff` and the JSON/SARIF fixes agree
and a file that was clean under `ruff check --select I` stays clean:

- a `from M import name` joins the first `from M import ...` of the module's leading import
  block, its names re-sorted as isort sorts them (constants, classes, then the rest,
  case-insensitively); the statement is rewritten on one line when it fits the line length
  and was on one line, else one name per line with a trailing comma. A statement with a
  comment is never rewritten: the name is inserted next to its sorted neighbour instead;
- any other import becomes a new statement in its section (future, standard library,
  third-party, first-party, relative), plain `import` lines before `from` lines, sorted by
  module; a section the block lacks is added with one blank line around it;
- a module without an import block gets one after its docstring, followed by the blank lines
  ruff wants before the next statement (two before a `def` or `class`).

Where the block is not in isort's order already, a new statement goes after the block's last
statement: the file was not isort-clean, and the added line is still correct code.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from kvref.audit.model import Edit, RequiredImport
from kvref.audit.summary import ImportFacts, ImportStatement

__all__ = ["import_edits", "member_sort_key", "section_of"]

FUTURE, STANDARD_LIBRARY, THIRD_PARTY, FIRST_PARTY, LOCAL = range(5)
_INDENT = "    "


def section_of(module: str, first_party: frozenset[str]) -> int:
    """The isort section of a module spelling (leading dots: relative, the local section)."""
    if module.startswith("."):
        return LOCAL
    top = module.partition(".")[0]
    if top == "__future__":
        return FUTURE
    if top in first_party:
        return FIRST_PARTY
    if top in sys.stdlib_module_names:
        return STANDARD_LIBRARY
    return THIRD_PARTY


def member_sort_key(name: str, alias: str = "") -> tuple[int, str, str, str]:
    """isort's `order-by-type` key of an imported name: CONSTANTS, Classes, then the rest."""
    if len(name) > 1 and name.isupper():
        kind = 0
    elif name[:1].isupper():
        kind = 1
    else:
        kind = 2
    return kind, name.lower(), name, alias


def _module_key(module: str, is_from: bool) -> tuple[bool, int, str, str]:
    dots = len(module) - len(module.lstrip("."))
    # Plain imports before `from` imports; relative ones furthest first (`..` before `.`).
    return is_from, -dots, module.lstrip(".").lower(), module


@dataclass(frozen=True, slots=True)
class _Placed:
    line: int
    section: int
    key: tuple[bool, int, str, str]
    text: str
    blank_before: bool
    blank_after: bool


def import_edits(
    facts: ImportFacts,
    imports: Sequence[RequiredImport],
    *,
    newline: str,
    line_length: int,
    first_party: frozenset[str],
) -> tuple[Edit, ...]:
    """The edits that add `imports` (none of which the module has yet) to a module.

    Args:
        facts: the module's import facts (from its summary).
        imports: the imports to add.
        newline: the module's line ending.
        line_length: the longest line a rewritten `from` import may have.
        first_party: top-level names isort files as first-party.

    Returns:
        One edit per merged statement and one per insertion point.
    """
    merges: dict[int, list[RequiredImport]] = {}
    new: list[RequiredImport] = []
    targets = {
        statement.module: index
        for index, statement in reversed(list(enumerate(facts.block)))
        if statement.is_from and all(name[0] != "*" for name in statement.names)
    }
    for needed in dict.fromkeys(imports):
        target = targets.get(needed.module) if needed.name else None
        if target is None:
            new.append(needed)
        else:
            merges.setdefault(target, []).append(needed)
    edits = [
        _merge(facts.block[index], added, newline, line_length) for index, added in merges.items()
    ]
    edits.extend(_insertions(facts, new, newline, first_party))
    return tuple(sorted(edits, key=lambda edit: (edit.start_line, edit.start_col)))


def _member(name: str, alias: str) -> str:
    return f"{name} as {alias}" if alias else name


def _merge(
    statement: ImportStatement, added: Sequence[RequiredImport], newline: str, line_length: int
) -> Edit:
    """Add names to `from M import ...`, in sorted position."""
    if statement.has_comment:
        return _insert_beside(statement, added)
    members = sorted(
        {(name, alias) for name, alias, *_ in statement.names}
        | {(needed.name, needed.alias) for needed in added},
        key=lambda member: member_sort_key(*member),
    )
    head = f"from {statement.module} import "
    one_line = head + ", ".join(_member(*member) for member in members)
    if statement.line == statement.end_line and len(one_line) <= line_length:
        text = one_line
    else:
        lines = [head + "("] + [f"{_INDENT}{_member(*member)}," for member in members] + [")"]
        text = newline.join(lines)
    return Edit(statement.line, 0, statement.end_line, statement.end_col, text)


def _insert_beside(statement: ImportStatement, added: Sequence[RequiredImport]) -> Edit:
    """Names inserted next to their sorted neighbour, the statement's comments untouched."""
    ordered = sorted(added, key=lambda needed: member_sort_key(needed.name, needed.alias))
    names = statement.names
    text = ", ".join(_member(needed.name, needed.alias) for needed in ordered)
    first_key = member_sort_key(ordered[0].name, ordered[0].alias)
    before = [entry for entry in names if member_sort_key(entry[0], entry[1]) < first_key]
    if before:
        _, _, _, _, end_line, end_col = before[-1]
        return Edit(end_line, end_col, end_line, end_col, ", " + text)
    _, _, line, col, _, _ = names[0]
    return Edit(line, col, line, col, text + ", ")


def _insertions(
    facts: ImportFacts, new: Sequence[RequiredImport], newline: str, first_party: frozenset[str]
) -> list[Edit]:
    """New statements, grouped by the point each goes before."""
    if not new:
        return []
    merged: dict[str, list[tuple[str, str]]] = {}  # names of one new `from M` share a line
    for needed in new:
        if needed.name:
            merged.setdefault(needed.module, []).append((needed.name, needed.alias))
    texts: list[tuple[str, bool, str]] = []
    for module, members in merged.items():
        members.sort(key=lambda member: member_sort_key(*member))
        texts.append((module, True, f"from {module} import {', '.join(_member(*m) for m in members)}"))
    texts.extend(
        (needed.module, False, f"import {_member(needed.module, needed.alias)}")
        for needed in new
        if not needed.name
    )
    block = facts.block
    if not block:
        return [_new_block(facts, texts, newline, first_party)]
    sections = [section_of(statement.module, first_party) for statement in block]
    in_order = all(a <= b for a, b in zip(sections, sections[1:]))
    placed: list[_Placed] = []
    for module, is_from, text in texts:
        section = section_of(module, first_party)
        key = _module_key(module, is_from)
        if not in_order:
            placed.append(_Placed(block[-1].end_line + 1, section, key, text, False, False))
            continue
        same = [s for s, sec in zip(block, sections) if sec == section]
        if same:
            later = [s for s in same if _module_key(s.module, s.is_from) > key]
            line = later[0].line if later else same[-1].end_line + 1
            placed.append(_Placed(line, section, key, text, False, False))
            continue
        earlier = [s for s, sec in zip(block, sections) if sec < section]
        if earlier:
            placed.append(_Placed(earlier[-1].end_line + 1, section, key, text, True, False))
        else:
            placed.append(_Placed(block[0].line, section, key, text, False, True))
    by_line: dict[int, list[_Placed]] = {}
    for item in placed:
        by_line.setdefault(item.line, []).append(item)
    return [_joined(line, items, newline) for line, items in sorted(by_line.items())]


def _joined(line: int, items: list[_Placed], newline: str) -> Edit:
    items.sort(key=lambda item: (item.section, item.key))
    parts: list[str] = []
    if any(item.blank_before for item in items):
        parts.append(newline)
    for index, item in enumerate(items):
        if index and item.section != items[index - 1].section:
            parts.append(newline)
        parts.append(item.text + newline)
    if any(item.blank_after for item in items):
        parts.append(newline)
    return Edit(line, 0, line, 0, "".join(parts))


def _new_block(
    facts: ImportFacts, texts: Sequence[tuple[str, bool, str]], newline: str, first_party: frozenset[str]
) -> Edit:
    """An import block for a module that has none: after the docstring, before the code."""
    ordered = sorted(texts, key=lambda item: (section_of(item[0], first_party), _module_key(item[0], item[1])))
    parts: list[str] = []
    after_docstring = facts.insert_line < facts.next_line
    if after_docstring:
        parts.append(newline)
    previous = -1
    for module, _, text in ordered:
        section = section_of(module, first_party)
        if previous != -1 and section != previous:
            parts.append(newline)
        parts.append(text + newline)
        previous = section
    wanted = 2 if facts.next_is_definition else 1
    present = facts.next_line - facts.insert_line  # the lines between: blank (or comments)
    parts.append(newline * max(0, wanted - present))
    return Edit(facts.insert_line, 0, facts.insert_line, 0, "".join(parts))
