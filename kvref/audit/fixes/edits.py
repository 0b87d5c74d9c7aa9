"""Apply fixes to one file's source, keeping every byte the fixes do not touch.

A fix carries all of its edits, the imports it needs included (`kvref.audit.fixes.import_edits`
places them). Edits are applied bottom-up so earlier positions stay valid; two fixes that carry
the very same edit (the `override` import every KVR001 fix of a file adds) share it, and a fix
whose edits overlap another accepted fix's differently is skipped whole (the next `--fix` round
picks it up, computed from the new source). An import that the fixed code no longer uses (the
`Sequence` of an annotation a fix rewrote to `Collection`) is removed, so a file clean under
ruff's F401 stays clean; only a name the original used and the result does not is touched.
Encoding, BOM and line endings are kept; a result that does not parse raises `FixError` and
nothing is written.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from kvref.audit.model import Edit, Fix
from kvref.audit.source import SummaryError, char_col, decode_source, split_lines
from kvref.audit.summarise.newer_syntax import parse_source
from kvref.errors import KVRefError

__all__ = ["FixError", "apply_fixes"]


class FixError(KVRefError):
    """Fixes could not be applied: the source does not decode, or the result does not parse."""


def apply_fixes(source: bytes, fixes: Sequence[Fix]) -> bytes:
    """Apply fixes to a file's bytes.

    Args:
        source: the file as read.
        fixes: fixes computed from this very source (positions refer to it).

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
    accepted: dict[tuple[int, int, str], None] = {}
    for fix in fixes:
        spans = [(*_offsets(edit, starts, text), edit.text) for edit in fix.edits]
        fresh = [span for span in spans if span not in accepted]
        if any(_overlaps(span, accepted) for span in fresh):
            continue
        accepted.update(dict.fromkeys(fresh))
    fixed = _replace(text, accepted)
    if fixed == text:
        return source
    try:
        fixed = _drop_unused_imports(text, fixed)
        parse_source(fixed)
    except (SyntaxError, ValueError) as error:
        raise FixError(f"the fixed source does not parse: {error}") from None
    data = fixed.encode(encoding)
    return b"\xef\xbb\xbf" + data if bom else data


def _replace(text: str, spans: dict[tuple[int, int, str], None]) -> str:
    for start, end, replacement in sorted(spans, key=lambda item: (item[0], item[1]), reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


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


def _overlaps(span: tuple[int, int, str], accepted: dict[tuple[int, int, str], None]) -> bool:
    start, end, _ = span
    for other_start, other_end, _ in accepted:
        if start == end == other_start == other_end:
            return True  # two insertions at one point: their order would be arbitrary
        if start < other_end and other_start < end:
            return True
    return False


def _names_used(tree: ast.Module) -> set[str]:
    """Every name the module reads, in code, in `__all__`, or in a string (annotation)."""
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 400:
            try:  # a forward reference `"Sequence[int]"`, or an `__all__` entry
                expression = ast.parse(node.value.strip(), mode="eval")
            except (SyntaxError, ValueError, RecursionError):
                continue
            used.update(n.id for n in ast.walk(expression) if isinstance(n, ast.Name))
    return used


def _drop_unused_imports(original: str, fixed: str) -> str:
    """`fixed` without the top-level imported names that `original` used and `fixed` does not."""
    after = parse_source(fixed)
    used_after = _names_used(after)
    bound = {
        (alias.asname or alias.name).partition(".")[0]
        for statement in after.body
        if isinstance(statement, ast.Import | ast.ImportFrom)
        for alias in statement.names
    }
    unused = bound - used_after
    if not unused:
        return fixed
    dropped = unused & _names_used(parse_source(original))
    if not dropped:
        return fixed
    spans = dict.fromkeys(_removals(after, dropped, fixed, _line_starts(fixed)))
    return _replace(fixed, spans)


def _removals(
    tree: ast.Module, dropped: set[str], text: str, starts: Sequence[int]
) -> Iterator[tuple[int, int, str]]:
    """Spans to delete: whole statements on lines of their own, else runs of names with the
    separator before them (or after, for a run at the start)."""
    lines = split_lines(text)

    def offset(line: int, byte_col: int) -> int:
        return starts[line - 1] + char_col(lines[line - 1], byte_col)

    for statement in tree.body:
        if not isinstance(statement, ast.Import | ast.ImportFrom):
            continue
        names = statement.names
        gone = [(alias.asname or alias.name).partition(".")[0] in dropped for alias in names]
        if not any(gone):
            continue
        end_line = statement.end_lineno or statement.lineno
        if all(gone):
            alone = (
                lines[statement.lineno - 1][: statement.col_offset].strip() == ""
                and lines[end_line - 1][statement.end_col_offset or 0 :].strip() == ""
            )
            if alone:  # shares no line with other code
                stop = starts[end_line] if end_line < len(starts) else len(text)
                yield starts[statement.lineno - 1], stop, ""
            continue
        index = 0
        while index < len(names):
            if not gone[index]:
                index += 1
                continue
            last = index
            while last + 1 < len(names) and gone[last + 1]:
                last += 1
            if index > 0:  # `, b, c` after the kept `a`
                kept, end = names[index - 1], names[last]
                start = offset(kept.end_lineno or kept.lineno, kept.end_col_offset or 0)
                yield start, offset(end.end_lineno or end.lineno, end.end_col_offset or 0), ""
            else:  # `a, b, ` before the kept `c`
                first, kept = names[0], names[last + 1]
                yield offset(first.lineno, first.col_offset), offset(kept.lineno, kept.col_offset), ""
            index = last + 1
