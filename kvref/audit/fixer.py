"""Apply fixes to one file's source, keeping every byte the fixes do not touch.

Edits are applied bottom-up so earlier positions stay valid; a fix whose edits overlap an
already accepted fix, or whose imports would bind a name differently from an accepted fix's,
is skipped whole (the next run picks it up). Imports are added once per file: the `override`
import when any applied fix needs it (unless the file already binds `override`), and each
`Fix.imports` entry the file does not already have. A `from M import ...` is merged into the
first unconditional top-level `from M import ...` (`from typing_extensions import ...` or
`from typing import ...` for `override`, per the setting); the rest become new lines after
the module docstring and `from __future__` imports. Encoding, BOM and line endings are kept;
a result that does not parse raises `FixError` and nothing is written.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Literal

from kvref.audit.model import Edit, Fix, RequiredImport
from kvref.audit.summary import (
    SummaryError,
    decode_source,
    detect_newline,
    import_facts,
    split_lines,
)
from kvref.errors import KVRefError

__all__ = ["FixError", "apply_fixes"]


class FixError(KVRefError):
    """Fixes could not be applied: the source does not decode, or the result does not parse."""


def apply_fixes(
    source: bytes,
    fixes: Sequence[Fix],
    *,
    override_import: Literal["typing_extensions", "typing"] = "typing_extensions",
) -> bytes:
    """Apply fixes to a file's bytes.

    Args:
        source: the file as read.
        fixes: fixes computed from this very source (positions refer to it).
        override_import: the module a new `override` import comes from.

    Returns:
        The fixed bytes (identical to `source` when there is nothing to do).

    Raises:
        FixError: the source cannot be decoded, an edit lies outside it, or the fixed
            source does not parse.
    """
    if not fixes:
        return source
    try:
        text, encoding, bom = decode_source(source)
    except SummaryError as error:
        raise FixError(f"cannot decode: {error.message}") from None
    starts = _line_starts(text)
    accepted: list[tuple[int, int, str]] = []
    needs_override = False
    imports: dict[str, RequiredImport] = {}  # by the name each binds
    for fix in fixes:
        spans = [_offsets(edit, starts, text) for edit in fix.edits]
        if any(_overlaps(span, accepted) for span in spans):
            continue
        if any(_conflicts(needed, imports.get(needed.bound_name)) for needed in fix.imports):
            continue
        accepted.extend((start, end, edit.text) for (start, end), edit in zip(spans, fix.edits, strict=True))
        needs_override = needs_override or fix.needs_override_import
        for needed in fix.imports:
            imports.setdefault(needed.bound_name, needed)
    if needs_override or imports:
        module = override_import if needs_override else None
        for edit in _import_edits(text, module, tuple(imports.values())):
            start, end = _offsets(edit, starts, text)
            # Merged after the last imported name or inserted at a line start: never inside
            # another edit.
            accepted.append((start, end, edit.text))
    accepted.sort(key=lambda item: (item[0], item[1]), reverse=True)
    for start, end, replacement in accepted:
        text = text[:start] + replacement + text[end:]
    try:
        ast.parse(text)
    except (SyntaxError, ValueError) as error:
        raise FixError(f"the fixed source does not parse: {error}") from None
    data = text.encode(encoding)
    return b"\xef\xbb\xbf" + data if bom else data


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for line in split_lines(text)[:-1]:
        end = starts[-1] + len(line)
        starts.append(end + (2 if text.startswith("\r\n", end) else 1))
    return starts


def _offsets(edit: Edit, starts: Sequence[int], text: str) -> tuple[int, int]:
    def offset(line: int, col: int) -> int:
        if line == len(starts) + 1 and col == 0:
            return len(text)  # the end of a file without a final newline
        if not 1 <= line <= len(starts):
            raise FixError(f"edit position {line}:{col} is outside the file")
        return starts[line - 1] + col

    start = offset(edit.start_line, edit.start_col)
    end = offset(edit.end_line, edit.end_col)
    if end < start or end > len(text):
        raise FixError(f"edit {edit.start_line}:{edit.start_col} is not a valid range")
    return start, end


def _overlaps(span: tuple[int, int], accepted: Sequence[tuple[int, int, str]]) -> bool:
    start, end = span
    for other_start, other_end, _ in accepted:
        if start == end == other_start == other_end:
            return True  # two insertions at one point: their order would be arbitrary
        if start < other_end and other_start < end:
            return True
    return False


def _conflicts(needed: RequiredImport, accepted: RequiredImport | None) -> bool:
    """Two imports that bind one name to different things (`import a` and `import a.b` agree)."""
    if accepted is None or accepted == needed:
        return False
    plain = not (needed.name or needed.alias or accepted.name or accepted.alias)
    return not plain


def _import_edits(
    text: str, override_module: str | None, imports: Sequence[RequiredImport]
) -> list[Edit]:
    """The edits that add the `override` import (when a module is given) and `imports`."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError) as error:
        raise FixError(f"the source does not parse: {error}") from None
    lines = split_lines(text)
    facts = import_facts(tree, lines)
    wanted: list[RequiredImport] = []
    if override_module is not None and not facts.bound_override:
        wanted.append(RequiredImport(override_module, "override"))
    present_from, present_modules, merge_points = _existing_imports(tree, lines)
    for needed in imports:
        if needed.name:
            done = needed in present_from
        else:  # `import a.b` also provides what `import a` does
            done = any(m == needed for m in present_modules) or (
                not needed.alias
                and any(
                    not m.alias and (m.module + ".").startswith(needed.module + ".")
                    for m in present_modules
                )
            )
        if not done and needed not in wanted:
            wanted.append(needed)
    merged: dict[str, list[str]] = {}
    new_from: dict[str, list[str]] = {}
    new_plain: list[str] = []
    for needed in wanted:
        alias = f" as {needed.alias}" if needed.alias else ""
        if not needed.name:
            new_plain.append(f"import {needed.module}{alias}")
        elif needed.module in merge_points:
            merged.setdefault(needed.module, []).append(needed.name + alias)
        else:
            new_from.setdefault(needed.module, []).append(needed.name + alias)
    edits = [
        Edit(line, col, line, col, "".join(f", {name}" for name in merged[module]))
        for module in merged
        for line, col in [merge_points[module]]
    ]
    # Plain imports first, then absolute `from` imports, then relative ones (isort's order).
    statements = sorted(new_plain) + [
        f"from {module} import {', '.join(names)}"
        for module, names in sorted(new_from.items(), key=lambda item: (item[0][:1] == ".", item[0]))
    ]
    if statements:
        edits.append(_insertion(lines, facts.insert_line, statements, detect_newline(text)))
    return edits


def _existing_imports(
    tree: ast.Module, lines: Sequence[str]
) -> tuple[set[RequiredImport], list[RequiredImport], dict[str, tuple[int, int]]]:
    """The unconditional top-level imports: `from` names, plain imports, and merge points.

    A merge point is the end of the last name of the first `from M import ...` (not `*`) of
    each module spelling M (relative ones with their dots), as (line, character column).
    """
    present_from: set[RequiredImport] = set()
    present_modules: list[RequiredImport] = []
    merge_points: dict[str, tuple[int, int]] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            present_modules.extend(RequiredImport(a.name, "", a.asname or "") for a in statement.names)
        elif isinstance(statement, ast.ImportFrom):
            module = "." * statement.level + (statement.module or "")
            if any(a.name == "*" for a in statement.names):
                continue
            present_from.update(RequiredImport(module, a.name, a.asname or "") for a in statement.names)
            if module not in merge_points:
                last = statement.names[-1]
                line = last.end_lineno or statement.lineno
                merge_points[module] = (line, _char_col(lines, line, last.end_col_offset or 0))
    return present_from, present_modules, merge_points


def _char_col(lines: Sequence[str], line: int, byte_col: int) -> int:
    """The character column of a UTF-8 byte column (what `ast` reports)."""
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    return len(text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))


def _insertion(lines: Sequence[str], line: int, statements: Sequence[str], newline: str) -> Edit:
    """New import lines before `line` (after the last line when it is past the end)."""
    text = "".join(statement + newline for statement in statements)
    if line > len(lines) or (line == len(lines) and lines[-1] == ""):
        # At the end of the file: after its last line, which may lack a line break.
        last = len(lines)
        tail = "" if lines[-1] == "" else newline
        return Edit(last, len(lines[-1]), last, len(lines[-1]), tail + text)
    return Edit(line, 0, line, 0, text)
