"""Read one source file for the summariser; every failure becomes a `FileError`.

The one place that opens a file to audit: the pipeline's `summarize_file` and the runner's
cached, parallel `summarize_path` both read through `read_source` and turn a summariser's
exception into a positioned error with `error_from`.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from kvref.audit.model import DEFAULT_MAX_FILE_BYTES, FileError

__all__ = ["FileStamp", "error_from", "read_source"]


@dataclass(frozen=True, slots=True)
class FileStamp:
    """The size and mtime of the bytes a summary was computed from (what the cache checks)."""

    st_size: int
    st_mtime_ns: int


def read_source(
    path: Path, relative: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> tuple[bytes | FileError, FileStamp | None]:
    """Read a file's bytes, refusing what must not be parsed.

    Args:
        path: the file.
        relative: its project-relative path, for the error.
        max_bytes: files larger than this are reported (generated code) instead of read.

    Returns:
        (the bytes, or the error: unreadable, not a regular file, over `max_bytes`; the
        size/mtime of what was read, None when nothing could be).
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
        if file_stat.st_size > max_bytes:
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


def error_from(exception: BaseException, relative: str) -> FileError:
    """The `FileError` for a summariser's exception: at its `line`/`col` with its `message`
    when it carries them (`SummaryError`), else at the best position the exception knows."""
    message = getattr(exception, "message", None)
    line = getattr(exception, "line", None)
    col = getattr(exception, "col", None)
    if isinstance(message, str) and isinstance(line, int) and isinstance(col, int):
        return FileError(relative, line, col, message)
    if isinstance(exception, SyntaxError):
        return FileError(
            relative, exception.lineno or 1, exception.offset or 1, f"syntax error: {exception.msg}"
        )
    if isinstance(exception, UnicodeDecodeError):
        return FileError(relative, 1, 1, f"cannot decode: {exception.reason}")
    if isinstance(exception, RecursionError):
        return FileError(relative, 1, 1, "cannot parse: nested too deeply")
    if isinstance(exception, MemoryError):
        return FileError(relative, 1, 1, "cannot parse: out of memory")
    return FileError(relative, 1, 1, f"cannot summarize: {type(exception).__name__}: {exception}")


def _spelled_size(count: int, *, rounded: bool = False) -> str:
    """A byte count as the configuration spells it: `16 MiB`, `512 KiB`, `100 bytes`
    (`rounded`: one decimal, `2.3 MiB`)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}" if rounded else f"{count / scale:g} {unit}"
    return f"{count} bytes"
