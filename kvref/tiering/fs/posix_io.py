"""The system calls of `BlockIO`'s Python path that the standard library does not wrap whole:
vectored reads and writes to the end, `sync_file_range` (through libc), and a directory's
`fsync`. The C extension (`_batch_io.c`) does the same in C."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable

__all__ = ["write_back", "fsync_directory", "write_all", "read_all"]

# sync_file_range(2) flags: start writeback of the range and wait for it, without the journal
# commit fdatasync also waits for; the clean pages can then be dropped.
_SYNC_FILE_RANGE_WAIT_BEFORE = 1
_SYNC_FILE_RANGE_WRITE = 2
_SYNC_FILE_RANGE_WAIT_AFTER = 4


def _load_sync_file_range() -> Callable[[int], None]:
    libc_name = ctypes.util.find_library("c")
    function = None
    if libc_name is not None:
        try:
            function = getattr(ctypes.CDLL(libc_name, use_errno=True), "sync_file_range", None)
        except OSError:
            function = None
    if function is None:
        return os.fdatasync
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    flags = _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE | _SYNC_FILE_RANGE_WAIT_AFTER

    def write_back(fd: int) -> None:
        if function(fd, 0, 0, flags) != 0:
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EINVAL, errno.ESPIPE):
                os.fdatasync(fd)  # a filesystem without it (some FUSE, NFS): the slow way
                return
            raise OSError(err, os.strerror(err))

    return write_back


write_back = _load_sync_file_range()
"""Write a file's dirty pages back and wait, so that they can be dropped (fdatasync where
sync_file_range is missing)."""


def fsync_directory(directory: str) -> None:
    """Make the entries of `directory` (a rename into it) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, parts: list[memoryview]) -> None:
    """Write `parts` from offset 0 to the end, through short writes (OSError if one makes no progress)."""
    offset = 0
    pending = parts
    while pending:
        written = os.pwritev(fd, pending, offset)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        offset += written
        while pending and written >= len(pending[0]):
            written -= len(pending[0])
            pending = pending[1:]
        if pending and written:
            pending = [pending[0][written:], *pending[1:]]


def read_all(fd: int, parts: list[memoryview]) -> int:
    """Read from offset 0 into `parts` until they are full or the file ends; return the bytes read."""
    offset = 0
    pending = parts
    while pending:
        count = os.preadv(fd, pending, offset)
        if count == 0:
            return offset
        offset += count
        while pending and count >= len(pending[0]):
            count -= len(pending[0])
            pending = pending[1:]
        if pending and count:
            pending = [pending[0][count:], *pending[1:]]
    return offset
