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
from kvref.audit.summarise.records import ImportFacts

__all__ = ["ImportStatement", "import_edits", "member_sort_key", "parse_block", "section_of"]

FUTURE, STANDARD_LIBRARY, THIRD_PARTY, FIRST_PARTY, LOCAL, AFTER_IMPORTS = range(6)
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


_NO_MEMBER = (-1, "", "", "")
_ModuleKey = tuple[bool, int, str, str, tuple[int, str, str, str]]


def _module_key(module: str, is_from: bool, first: tuple[str, str] | None = None) -> _ModuleKey:
    dots = len(module) - len(module.lstrip("."))
    # Plain imports before `from` imports; relative ones furthest first (`..` before `.`);
    # `from M import a as b` stays a statement of its own, ordered by its first name.
    member = member_sort_key(*first) if first else _NO_MEMBER
    return is_from, -dots, module.lstrip(".").lower(), module, member


@dataclass(frozen=True, slots=True)
class ImportStatement:
    """One statement of a module's leading import block.

    Attributes:
        line, end_line: its first and last line; end_col: the character column just after
            its last character (0-based).
        module: `from` imports: the module with its leading dots; plain imports: the first
            imported module.
        names: `from` imports: each imported name, `name` or `name as alias` (plain: none).
        comment_positions: only when a `#` appears on one of its lines (it is then never
            rewritten whole): `(line, col, end_line, end_col)` of each name, in characters.
    """

    line: int
    end_line: int
    end_col: int
    module: str
    names: tuple[str, ...]
    comment_positions: tuple[tuple[int, int, int, int], ...] = ()

    @property
    def is_from(self) -> bool:
        """A `from ... import ...` statement."""
        return bool(self.names)


def parse_block(facts: ImportFacts) -> tuple[ImportStatement, ...]:
    """The statements of the module's leading import block (see `ImportFacts.block`)."""
    statements: list[ImportStatement] = []
    for row in facts.block.split("\n") if facts.block else ():
        line, end_line, end_col, module, names, positions = row.split("\t")
        numbers = [int(value) for value in positions.split(",")] if positions else []
        spans = tuple(
            (numbers[i], numbers[i + 1], numbers[i + 2], numbers[i + 3]) for i in range(0, len(numbers), 4)
        )
        statements.append(
            ImportStatement(int(line), int(end_line), int(end_col), module, tuple(names.split(",")) if names else (), spans)
        )
    return tuple(statements)


@dataclass(frozen=True, slots=True)
class _Placed:
    line: int
    section: int
    key: _ModuleKey
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
    block = parse_block(facts)
    targets = {
        statement.module: index
        for index, statement in reversed(list(enumerate(block)))
        if statement.is_from and not any(name == "*" or " as " in name for name in statement.names)
    }
    for needed in dict.fromkeys(imports):
        # ruff keeps `name as alias` imports in statements of their own (combine-as-imports).
        target = targets.get(needed.module) if needed.name and not needed.alias and not needed.older else None
        if target is None:
            new.append(needed)
        else:
            merges.setdefault(target, []).append(needed)
    edits = [_merge(block[index], added, newline, line_length) for index, added in merges.items()]
    edits.extend(_insertions(facts, block, new, newline, first_party))
    return tuple(sorted(edits, key=lambda edit: (edit.start_line, edit.start_col)))


def _member(name: str, alias: str) -> str:
    return f"{name} as {alias}" if alias else name


def _merge(
    statement: ImportStatement, added: Sequence[RequiredImport], newline: str, line_length: int
) -> Edit:
    """Add names to `from M import ...`, in sorted position."""
    if statement.comment_positions:
        return _insert_beside(statement, added)
    members = sorted(
        {_split(name) for name in statement.names} | {(needed.name, needed.alias) for needed in added},
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


def _split(member: str) -> tuple[str, str]:
    name, _, alias = member.partition(" as ")
    return name, alias


def _insert_beside(statement: ImportStatement, added: Sequence[RequiredImport]) -> Edit:
    """Names inserted next to their sorted neighbour, the statement's comments untouched."""
    ordered = sorted(added, key=lambda needed: member_sort_key(needed.name, needed.alias))
    text = ", ".join(_member(needed.name, needed.alias) for needed in ordered)
    first_key = member_sort_key(ordered[0].name, ordered[0].alias)
    spans = statement.comment_positions
    before = [
        span for name, span in zip(statement.names, spans) if member_sort_key(*_split(name)) < first_key
    ]
    if before:
        _, _, end_line, end_col = before[-1]
        return Edit(end_line, end_col, end_line, end_col, ", " + text)
    line, col, _, _ = spans[0]
    return Edit(line, col, line, col, text + ", ")


def _insertions(
    facts: ImportFacts,
    block: Sequence[ImportStatement],
    new: Sequence[RequiredImport],
    newline: str,
    first_party: frozenset[str],
) -> list[Edit]:
    """New statements, grouped by the point each goes before."""
    if not new:
        return []
    merged: dict[str, list[tuple[str, str]]] = {}  # names of one new `from M` share a line
    texts: list[tuple[int, _ModuleKey, str]] = []
    for needed in new:
        if needed.older:
            # Not an import statement isort sorts: a block of its own after the imports.
            texts.append((AFTER_IMPORTS, _module_key(needed.module, True), _versioned(needed, newline)))
        elif needed.name and not needed.alias:
            merged.setdefault(needed.module, []).append((needed.name, ""))
        elif needed.name:
            member = _member(needed.name, needed.alias)
            key = _module_key(needed.module, True, (needed.name, needed.alias))
            texts.append((section_of(needed.module, first_party), key, f"from {needed.module} import {member}"))
        else:
            key = _module_key(needed.module, False)
            texts.append((section_of(needed.module, first_party), key, f"import {_member(needed.module, needed.alias)}"))
    for module, members in merged.items():
        members.sort(key=lambda member: member_sort_key(*member))
        text = f"from {module} import {', '.join(_member(*m) for m in members)}"
        texts.append((section_of(module, first_party), _module_key(module, True, members[0]), text))
    if not block:
        return [_new_block(facts, texts, newline)]
    sections = [section_of(statement.module, first_party) for statement in block]
    in_order = all(a <= b for a, b in zip(sections, sections[1:]))
    placed: list[_Placed] = []
    for section, key, text in texts:
        if not in_order:
            placed.append(_Placed(block[-1].end_line + 1, section, key, text, section == AFTER_IMPORTS, False))
            continue
        same = [s for s, sec in zip(block, sections) if sec == section]
        if same:
            later = [s for s in same if _statement_key(s) > key]
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


def _statement_key(statement: ImportStatement) -> _ModuleKey:
    first = _split(statement.names[0]) if statement.names else None
    return _module_key(statement.module, statement.is_from, first)


def _joined(line: int, items: list[_Placed], newline: str) -> Edit:
    items.sort(key=lambda item: (item.section, item.key))
    parts: list[str] = []
    # Only the first item can open a section after the statement above, and only the last
    # can close one before the statement below; the others are separated by section.
    if items[0].blank_before:
        parts.append(newline)
    for index, item in enumerate(items):
        if index and item.section != items[index - 1].section:
            parts.append(newline)
        parts.append(item.text + newline)
    if items[-1].blank_after:
        parts.append(newline)
    return Edit(line, 0, line, 0, "".join(parts))


def _versioned(needed: RequiredImport, newline: str) -> str:
    """`if sys.version_info >= since:` import from `module`, `else:` from `older`."""
    member = _member(needed.name, needed.alias)
    return newline.join(
        (
            f"if sys.version_info >= {needed.since!r}:",
            f"{_INDENT}from {needed.module} import {member}",
            "else:",
            f"{_INDENT}from {needed.older} import {member}",
        )
    )


def _new_block(facts: ImportFacts, texts: Sequence[tuple[int, _ModuleKey, str]], newline: str) -> Edit:
    """An import block for a module that has none: after the docstring, before the code."""
    ordered = sorted(texts, key=lambda item: (item[0], item[1]))
    parts: list[str] = []
    after_docstring = facts.insert_line < facts.next_line
    if after_docstring:
        parts.append(newline)
    previous = -1
    for section, _, text in ordered:
        if previous != -1 and section != previous:
            parts.append(newline)
        parts.append(text + newline)
        previous = section
    wanted = 2 if facts.next_is_definition else 1
    present = facts.next_line - facts.insert_line  # the lines between: blank (or comments)
    parts.append(newline * max(0, wanted - present))
    return Edit(facts.insert_line, 0, facts.insert_line, 0, "".join(parts))
