"""Positions between kvref and an editor: kvref counts characters (1-based lines and columns
in findings, 0-based columns in edits), an LSP client counts UTF-16 code units unless it
offered UTF-8 or UTF-32 (`positionEncoding`) and the server took it.

Lines are split where Python's tokenizer splits them (`\\n`, `\\r\\n`, `\\r`), which are also
the protocol's line breaks. Every position handed to the client is clamped into the document,
so a finding kept from an earlier text never points past the end of the current one.
"""

from __future__ import annotations

import io
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvref.audit.source import split_lines

__all__ = [
    "Encoding",
    "Place",
    "TextChange",
    "client_column",
    "document_bytes",
    "server_column",
    "text_change",
]

Encoding = Literal["utf-8", "utf-16", "utf-32"]


@dataclass(frozen=True, slots=True, order=True)
class Place:
    """A 0-based line and a column in the client's units."""

    line: int
    character: int


@dataclass(frozen=True, slots=True)
class TextChange:
    """Replace the text from `start` to `end` (client units) with `text`."""

    start: Place
    end: Place
    text: str


def _units(text: str, encoding: Encoding) -> int:
    if encoding == "utf-32" or text.isascii():
        return len(text)
    if encoding == "utf-8":
        return len(text.encode("utf-8", "surrogatepass"))
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def client_column(lines: Sequence[str], line: int, char_col: int, encoding: Encoding) -> Place:
    """The client's place of 0-based `line` and character column `char_col`, clamped into
    the document (a line past the end is the end of the last line)."""
    if not lines:
        return Place(0, 0)
    if line >= len(lines):
        return Place(len(lines) - 1, _units(lines[-1], encoding))
    line = max(line, 0)
    text = lines[line]
    return Place(line, _units(text[: max(0, min(char_col, len(text)))], encoding))


def server_column(lines: Sequence[str], place: Place, encoding: Encoding) -> tuple[int, int]:
    """The 0-based (line, character column) of a client's place, clamped into the document."""
    if not lines:
        return 0, 0
    if place.line >= len(lines):
        return len(lines) - 1, len(lines[-1])
    line = max(place.line, 0)
    text = lines[line]
    if encoding == "utf-32" or text.isascii():
        return line, max(0, min(place.character, len(text)))
    counted = 0
    for index, char in enumerate(text):
        if counted >= place.character:
            return line, index
        counted += _units(char, encoding)
    return line, len(text)


def _offset_place(text: str, offset: int, encoding: Encoding) -> Place:
    lines = split_lines(text[:offset])
    return Place(len(lines) - 1, _units(lines[-1], encoding))


def text_change(old: str, new: str, encoding: Encoding) -> TextChange | None:
    """The one replacement that turns `old` into `new` (their common start and end kept),
    or None when they are equal. A fix's edits become one small edit the editor can undo."""
    if old == new:
        return None
    start = 0
    limit = min(len(old), len(new))
    while start < limit and old[start] == new[start]:
        start += 1
    end_old, end_new = len(old), len(new)
    while end_old > start and end_new > start and old[end_old - 1] == new[end_new - 1]:
        end_old -= 1
        end_new -= 1
    # Never split a `\r\n` pair: the two halves are one line break to both sides.
    if start > 0 and old[start - 1] == "\r" and start < len(old) and old[start] == "\n":
        start -= 1
    if 0 < end_old < len(old) and old[end_old - 1] == "\r" and old[end_old] == "\n":
        end_old += 1
        end_new += 1
    return TextChange(
        _offset_place(old, start, encoding), _offset_place(old, end_old, encoding), new[start:end_new]
    )


def document_bytes(text: str) -> bytes:
    """The bytes the editor would save for `text`: UTF-8, or the encoding a PEP 263 coding
    cookie names when it can hold the text (the audit decodes the bytes as Python would)."""
    data = text.encode("utf-8", "surrogateescape")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:
        return data
    if encoding in ("utf-8", "utf-8-sig"):
        return data
    try:
        return text.encode(encoding)
    except (LookupError, UnicodeEncodeError):
        return data
