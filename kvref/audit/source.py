"""Source text helpers shared by the stages: reading, decoding, line splitting, columns.

`read_source` and `summary_or_error` are the one place a file becomes bytes and bytes a
summary or a `FileError` (the pipeline's `summarize_file`, the runner's workers and stdin all
go through them). `ast` reports columns as UTF-8 byte offsets; kvref's positions
(`kvref.audit.model.Edit`, findings) are character columns. `char_col` is the one conversion.
"""

from __future__ import annotations

import io
import os
import re
import stat
import tokenize
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from kvref.audit.model import FileError
from kvref.errors import KVRefError

__all__ = [
    "FileStamp",
    "TYPING_ALIASES",
    "TYPING_MODULES",
    "TYPING_RUNTIME_CLASSES",
    "SummaryError",
    "char_col",
    "decode_lenient",
    "decode_source",
    "detect_newline",
    "line_char_col",
    "read_source",
    "split_lines",
    "summary_or_error",
]

S = TypeVar("S")

# The modules whose names type checkers treat as `typing`'s (`override` among them).
TYPING_MODULES: frozenset[str] = frozenset({"typing", "typing_extensions"})
# typing spellings of classes, to the class a type checker takes them for, so that
# `typing.Sequence` and `collections.abc.Sequence` compare equal.
TYPING_ALIASES: dict[str, str] = {
    **{
        name: f"collections.abc.{name}"
        for name in (
            "AsyncGenerator", "AsyncIterable", "AsyncIterator", "Awaitable", "ByteString",
            "Callable", "Collection", "Container", "Coroutine", "Generator", "Hashable",
            "ItemsView", "Iterable", "Iterator", "KeysView", "Mapping", "MappingView",
            "MutableMapping", "MutableSequence", "MutableSet", "Reversible", "Sequence",
            "Sized", "ValuesView",
        )
    },
    "AbstractSet": "collections.abc.Set",
    "List": "builtins.list",
    "Dict": "builtins.dict",
    "Set": "builtins.set",
    "FrozenSet": "builtins.frozenset",
    "Tuple": "builtins.tuple",
    "Type": "builtins.type",
    "Text": "builtins.str",
}  # fmt: skip
# typing names whose runtime class lives elsewhere (`typing.Mapping` is an alias object): the
# aliases, and the names that are no aliases to a type checker but are classes at run time.
TYPING_RUNTIME_CLASSES: dict[str, str] = {
    **TYPING_ALIASES,
    "NamedTuple": "builtins.tuple",
    "TypedDict": "builtins.dict",
    "DefaultDict": "collections.defaultdict",
    "OrderedDict": "collections.OrderedDict",
    "Counter": "collections.Counter",
    "ChainMap": "collections.ChainMap",
    "Deque": "collections.deque",
    "ContextManager": "contextlib.AbstractContextManager",
    "AsyncContextManager": "contextlib.AbstractAsyncContextManager",
}

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class SummaryError(KVRefError):
    """A file that cannot be summarized: undecodable or not valid Python.

    Attributes:
        line, col: 1-based position of the problem (1, 1 when unknown).
        message: what went wrong, one line.
    """

    def __init__(self, message: str, line: int = 1, col: int = 1) -> None:
        super().__init__(f"{line}:{col}: {message}")
        self.message = message
        self.line = line
        self.col = col


@dataclass(frozen=True, slots=True)
class FileStamp:
    """The size and mtime of the bytes read (what the summary cache checks)."""

    st_size: int
    st_mtime_ns: int


def read_source(
    path: Path, relative: str, max_bytes: int | None = None
) -> tuple[bytes | FileError, FileStamp | None]:
    """A file's bytes, or a `FileError` (unreadable, not a regular file, over `max_bytes`).

    Returns:
        (the bytes or the error, the size/mtime of what was read, None when it was unreadable).
    """
    try:
        # O_NONBLOCK: a FIFO named like a module must not hang the audit.
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        return FileError(relative, 1, 1, f"cannot read: {error.strerror or error}"), None
    try:
        file_stat = os.fstat(descriptor)
        stamp = FileStamp(file_stat.st_size, file_stat.st_mtime_ns)
        if not stat.S_ISREG(file_stat.st_mode):
            return FileError(relative, 1, 1, "cannot read: not a regular file"), None
        if max_bytes is not None and file_stat.st_size > max_bytes:
            message = (
                f"skipped: {_spelled_size(file_stat.st_size, rounded=True)} is over the "
                f"{_spelled_size(max_bytes)} limit for one file (generated code? raise "
                "`max-file-size` in [tool.kvref] to audit it)"
            )
            return FileError(relative, 1, 1, message), stamp
        with os.fdopen(descriptor, "rb", closefd=False) as stream:
            return stream.read(), stamp
    except OSError as error:
        return FileError(relative, 1, 1, f"cannot read: {error.strerror or error}"), None
    finally:
        os.close(descriptor)


def summary_or_error(
    relative: str, source: bytes, summarize: Callable[[str, bytes], S]
) -> S | FileError:
    """`summarize(relative, source)`, or the `FileError` it raised (any exception: one bad file
    must not stop the audit; one with `line`, `col` and `message`, as `SummaryError`, keeps
    its position)."""
    try:
        return summarize(relative, source)
    except Exception as error:  # noqa: BLE001
        message = getattr(error, "message", None)
        line, col = getattr(error, "line", None), getattr(error, "col", None)
        if isinstance(message, str) and isinstance(line, int) and isinstance(col, int):
            return FileError(relative, line, col, message)
        if isinstance(error, SyntaxError):
            line, col = error.lineno or 1, error.offset or 1
            return FileError(relative, line, col, f"syntax error: {error.msg}")
        if isinstance(error, UnicodeDecodeError):
            return FileError(relative, 1, 1, f"cannot decode: {error.reason}")
        if isinstance(error, RecursionError):
            return FileError(relative, 1, 1, "cannot parse: nested too deeply")
        if isinstance(error, MemoryError):
            return FileError(relative, 1, 1, "cannot parse: out of memory")
        return FileError(relative, 1, 1, f"cannot summarize: {type(error).__name__}: {error}")


def _spelled_size(count: int, *, rounded: bool = False) -> str:
    """A byte count as the configuration spells it: `16 MiB`, `512 KiB`, `100 bytes`
    (`rounded`: one decimal, `2.3 MiB`)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}" if rounded else f"{count / scale:g} {unit}"
    return f"{count} bytes"


def split_lines(text: str) -> list[str]:
    """Split on the line breaks Python's tokenizer knows (not form feeds or U+2028)."""
    if "\r" not in text:
        return text.split("\n")
    return _LINE_BREAK.split(text)


def detect_newline(text: str) -> str:
    """The file's line ending: that of its first line ("\n" when it has none)."""
    match = _LINE_BREAK.search(text)
    return match.group() if match else "\n"


def char_col(line_text: str, byte_col: int) -> int:
    """The character column in `line_text` of a UTF-8 byte column (what `ast` reports)."""
    if line_text.isascii():
        return byte_col
    return len(line_text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))


def line_char_col(lines: Sequence[str], line: int, byte_col: int) -> int:
    """`char_col` on 1-based `line` of `lines` (a line outside them counts as ASCII)."""
    return char_col(lines[line - 1], byte_col) if 0 < line <= len(lines) else byte_col


def decode_source(source: bytes) -> tuple[str, str, bool]:
    """Decode per PEP 263 (BOM, coding cookie, else UTF-8): returns (text, encoding, bom).

    Raises:
        SummaryError: the bytes do not decode, with the position of the problem.
    """
    # Most files: ASCII first two lines without a cookie are UTF-8 whatever follows, which is
    # what `detect_encoding` would conclude after more work.
    first_break = source.find(b"\n")
    second_break = source.find(b"\n", first_break + 1) if first_break >= 0 else -1
    head = source if second_break < 0 else source[:second_break]
    if head.isascii() and b"coding" not in head:
        try:
            return source.decode("utf-8"), "utf-8", False
        except UnicodeDecodeError:
            pass  # reported with its position below
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    except SyntaxError as error:
        # Either a bad cookie, or a first line that is not UTF-8: find which, and where.
        encoding = "utf-8"
        message = error.msg.partition(" for ")[0]
        try:
            source.decode(encoding)
        except UnicodeDecodeError:
            pass
        else:
            raise SummaryError(f"cannot decode: {message}", error.lineno or 1, 1) from None
    bom = encoding == "utf-8-sig"
    try:
        text = source.decode(encoding)
    except UnicodeDecodeError as error:
        line = source.count(b"\n", 0, error.start) + 1
        col = error.start - (source.rfind(b"\n", 0, error.start) + 1) + 1
        raise SummaryError(f"cannot decode as {encoding}: {error.reason}", line, col) from None
    except LookupError:
        raise SummaryError(f"unknown encoding {encoding!r}") from None
    return text, ("utf-8" if bom else encoding), bom


def decode_lenient(source: bytes) -> str:
    """Decode for display (diffs): never fails, and keeps a UTF-8 BOM visible as U+FEFF."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    except SyntaxError:
        encoding = "utf-8"
    if encoding == "utf-8-sig":
        encoding = "utf-8"
    try:
        return source.decode(encoding, errors="replace")
    except LookupError:
        return source.decode("utf-8", errors="replace")
