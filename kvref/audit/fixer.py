"""Apply fixes to one file's source, keeping every byte the fixes do not touch.

Edits are applied bottom-up so earlier positions stay valid; a fix whose edits overlap an
already accepted fix is skipped whole (the next run picks it up). The `override` import is
added once when any applied fix needs it: merged into an existing unconditional
`from typing_extensions import ...` (or `from typing import ...`, per the setting), else as
a new line after the module docstring and `from __future__` imports. Encoding, BOM and line
endings are kept; a result that does not parse raises `FixError` and nothing is written.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Literal

from kvref.audit.model import Edit, Fix
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
    needs_import = False
    for fix in fixes:
        spans = [_offsets(edit, starts, text) for edit in fix.edits]
        if any(_overlaps(span, accepted) for span in spans):
            continue
        accepted.extend((start, end, edit.text) for (start, end), edit in zip(spans, fix.edits, strict=True))
        needs_import = needs_import or fix.needs_override_import
    if needs_import:
        edit = _import_edit(text, override_import)
        if edit is not None:
            start, end = _offsets(edit, starts, text)
            # Merged after the last imported name or inserted at a line start: it never
            # falls inside another edit, but two insertions at one place keep file order.
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


def _import_edit(text: str, module: str) -> Edit | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError) as error:
        raise FixError(f"the source does not parse: {error}") from None
    lines = split_lines(text)
    facts = import_facts(tree, lines)
    if facts.bound_override:
        return None
    for merge_module, line, col in facts.merge_points:
        if merge_module == module:
            return Edit(line, col, line, col, ", override")
    newline = detect_newline(text)
    statement = f"from {module} import override{newline}"
    line = facts.insert_line
    if line > len(lines) or (line == len(lines) and lines[-1] == ""):
        # At the end of the file: after its last line, which may lack a line break.
        last = len(lines)
        tail = "" if lines[-1] == "" else newline
        return Edit(last, len(lines[-1]), last, len(lines[-1]), tail + statement)
    return Edit(line, 0, line, 0, statement)
