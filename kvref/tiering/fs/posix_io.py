"""The system calls of `BlockIO`'s Python path that the standard library does not wrap whole:
vectored reads and writes to the end, `sync_file_range` and `renameat2` (through libc), and a
directory's `fsync`. The C extension (`_batch_io.c`) does the same in C."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable
from typing import Any

__all__ = [
    "MAX_REQUEST_BYTES",
    "MAX_LAST_REQUEST_BYTES",
    "write_back",
    "publish_file",
    "fsync_directory",
    "write_all",
    "read_all",
]

MAX_REQUEST_BYTES = 1 << 20
"""Bytes per `preadv`/`pwritev`: a block file of more is read or written in several requests.
Devices are fastest at requests of about 1 MiB (NVMe controllers cap a request at 128 KiB to
2 MiB; the kernel splits larger ones). On this project's virtio disk, from buffers on huge pages,
8 threads read 4.4 GB/s in 1 MiB requests and 3.1 GB/s in 2 MiB ones (`huge_pages.py`)."""


MAX_LAST_REQUEST_BYTES = MAX_REQUEST_BYTES + MAX_REQUEST_BYTES // 4
"""What is left of a transfer goes in one request when it is at most this many bytes, rather
than in a request of `MAX_REQUEST_BYTES` and a small one after it. A block file holds a page of
header besides its payload, so a 2 MiB block's file (2 MiB + 4 KiB) went to the device as 1 MiB,
1 MiB and 4 KiB, and a 1 MiB block's as 1 MiB and 4 KiB: that last page costs a round trip of
its own while it holds one of the thread's turns. Now they go as 1 MiB and 1 MiB + 4 KiB, and
as one request. On this project's disk, 16 threads reading 2 MiB block files (cold, hashing and
copying each) went from 4.03 to 4.27 GB/s (medians of 4 runs of a plain C reader)."""


def _clip(parts: list[memoryview]) -> list[memoryview]:
    """The part of `parts` one system call moves: all of it, up to `MAX_LAST_REQUEST_BYTES`,
    else the first `MAX_REQUEST_BYTES`."""
    clipped: list[memoryview] = []
    total = sum(len(part) for part in parts)
    room = total if total <= MAX_LAST_REQUEST_BYTES else MAX_REQUEST_BYTES
    for part in parts:
        if room <= 0:
            break
        clipped.append(part if len(part) <= room else part[:room])
        room -= len(clipped[-1])
    return clipped

# sync_file_range(2) flags: start writeback of the range and wait for it, without the journal
# commit fdatasync also waits for; the clean pages can then be dropped.
_SYNC_FILE_RANGE_WAIT_BEFORE = 1
_SYNC_FILE_RANGE_WRITE = 2
_SYNC_FILE_RANGE_WAIT_AFTER = 4


def _libc_function(name: str) -> Any:
    """libc's function `name` (errno kept), or None where libc or the function is missing."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    try:
        return getattr(ctypes.CDLL(libc_name, use_errno=True), name, None)
    except OSError:
        return None


def _load_sync_file_range() -> Callable[[int], None]:
    function = _libc_function("sync_file_range")
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


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_renameat2 = _libc_function("renameat2")
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
# Errors that say the filesystem lacks a way (then the next is tried), not that it failed.
_NO_RENAME_FLAGS = frozenset({errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP})
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP})


def publish_file(source: str, target: str) -> None:
    """Give the file `source` the name `target`, unless a file has that name.

    A block file, once published, keeps its name and inode until it is deleted: another host
    may hold the name in its kernel's entry cache (a second on JuiceFS, `actimeo` on NFS), and
    a file replaced under it would make its next open fail (ENOENT, ESTALE on NFS) although the
    block is there. So the first writer's file stays and a later one fails with
    FileExistsError. The ways, in order: `renameat2(RENAME_NOREPLACE)` (one atomic call: ext4,
    XFS, btrfs, tmpfs, FUSE filesystems that implement it, JuiceFS among them); where the
    filesystem or libc lacks it, `link` then `unlink` (NFS); where hard links are refused too,
    `rename`, which replaces.

    Raises:
        FileExistsError: a file is at `target`; `source` is left as it was.
        OSError: the file could not be published; `source` is left as it was.
    """
    err = errno.ENOSYS
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
    if err not in _NO_RENAME_FLAGS:
        raise OSError(err, os.strerror(err), source, None, target)
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        os.replace(source, target)
        return
    os.unlink(source)


def fsync_directory(directory: str) -> None:
    """Make the entries of `directory` (a rename into it) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _advance(parts: list[memoryview], done: int) -> list[memoryview]:
    """`parts` past their first `done` bytes: the parts done dropped, a part half done shortened."""
    while parts and done >= len(parts[0]):
        done -= len(parts[0])
        parts = parts[1:]
    if parts and done:
        parts = [parts[0][done:], *parts[1:]]
    return parts


def write_all(fd: int, parts: list[memoryview]) -> None:
    """Write `parts` from offset 0 to the end, through short writes (OSError if one makes no progress)."""
    offset = 0
    pending = parts
    while pending:
        written = os.pwritev(fd, _clip(pending), offset)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        offset += written
        pending = _advance(pending, written)


def read_all(fd: int, parts: list[memoryview]) -> int:
    """Read from offset 0 into `parts` until they are full or the file ends; return the bytes read."""
    offset = 0
    pending = parts
    while pending:
        count = os.preadv(fd, _clip(pending), offset)
        if count == 0:
            return offset
        offset += count
        pending = _advance(pending, count)
    return offset
