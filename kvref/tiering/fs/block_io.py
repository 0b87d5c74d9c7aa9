"""The file work of `FileSystemSecondaryTier`'s I/O threads: writing one block file, reading one
back into its primary row and verifying it, and marking a file used.

`BlockIO` touches no scheduler state, so any I/O thread may call it. With O_DIRECT the payload
moves between the device and the primary row without a copy when the row is page-aligned and
a whole number of pages (a page-aligned primary, e.g. vLLM's or kvref's shared mmap region,
with block sizes of 4 KiB multiples); otherwise through an aligned per-thread bounce buffer.
Without O_DIRECT (the filesystem refuses it), the pages a write or read brought into the page
cache are dropped once they are clean, unless the tier keeps the page cache on purpose.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import errno
import mmap
import os
import threading
from collections.abc import Callable

from kvref.tiering.base import PrimaryBlocks
from kvref.tiering.fs.format import (
    ALIGN,
    MAX_KEY_BYTES,
    align_up,
    check_header,
    header_bytes,
    pack_header,
    payload_checksum_ok,
)
from kvref.tiering.fs.root import TMP_SUFFIX, unlink_quietly

__all__ = ["ReadProblem", "WriteOutcome", "BlockIO", "buffer_address"]

_O_DIRECT = getattr(os, "O_DIRECT", 0)
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


_write_back = _load_sync_file_range()


def buffer_address(view: memoryview) -> int | None:
    """The address of a writable buffer's first byte, or None if it cannot be had."""
    try:
        anchor = ctypes.c_char.from_buffer(view)
    except (TypeError, ValueError):
        return None
    address = ctypes.addressof(anchor)
    del anchor  # releases the export at once, so the owner can still release the view
    return address


class WriteOutcome(enum.Enum):
    """How a block's store ended."""

    WRITTEN = "written"
    EXISTED = "existed"  # another writer (any engine) had already stored it
    NO_ROOM = "no room"  # the capacity could not make room for it: nothing written


class ReadProblem(enum.Enum):
    """Why a block could not be loaded."""

    MISSING = "missing"  # no file: never stored, evicted, or deleted by hand
    DAMAGED = "damaged"  # wrong length, header, key or checksum: the file was deleted
    UNREADABLE = "unreadable"  # an I/O error: the file is left alone


class BlockIO:
    """Reads and writes the block files of one tier (any thread; no scheduler state).

    Args:
        primary: the primary's rows, the source of stores and the destination of loads.
        direct: use O_DIRECT (the root passed `probe_o_direct`).
        keep_page_cache: buffered I/O only: leave the pages a read or write brought in cached.
        fsync: `fsync` each block file before renaming it into place.
        token: this writer's part of temporary file names (`writer_token`).
    """

    def __init__(
        self,
        primary: PrimaryBlocks,
        *,
        direct: bool,
        keep_page_cache: bool,
        fsync: bool,
        token: str,
    ) -> None:
        self._primary = primary
        self.block_bytes = primary.block_bytes
        self.direct = direct
        self._drop_pages = not direct and not keep_page_cache
        self._fsync = fsync
        self._tmp_suffix = f".{token}{TMP_SUFFIX}"
        self._open_flags = os.O_CLOEXEC | (_O_DIRECT if direct else 0)
        self._payload_bytes = align_up(self.block_bytes)
        # Rows go to and from the device as they are when O_DIRECT accepts them: page-aligned
        # and a whole number of pages; buffered I/O takes any row, then padded by a zero tail.
        base = buffer_address(primary.row(0)) if primary.num_blocks else None
        self.zero_copy = not direct or (
            base is not None and base % ALIGN == 0 and self.block_bytes % ALIGN == 0
        )
        self._padding = bytes(self._payload_bytes - self.block_bytes)
        self._local = threading.local()

    # --- buffers ---

    def _buffer(self) -> memoryview:
        """This thread's aligned buffer: the longest header, unless zero-copy a payload, and a
        last page that a read fills only when a file is longer than it should be."""
        buffer: memoryview | None = getattr(self._local, "buffer", None)
        if buffer is None:
            size = header_bytes(MAX_KEY_BYTES) + (0 if self.zero_copy else self._payload_bytes) + ALIGN
            buffer = memoryview(mmap.mmap(-1, size))  # anonymous mmap: page-aligned
            self._local.buffer = buffer
        return buffer

    # --- writes ---

    def write_block(
        self, path: str, key: bytes, block_id: int, make_room: Callable[[], bool]
    ) -> WriteOutcome:
        """Store primary row `block_id` as `key`'s block file `path` (unless one is there), via a
        temporary file of this writer renamed into place.

        Args:
            path: the block file's path.
            key: the block's key.
            block_id: the primary row to store.
            make_room: called once the temporary file is written whole, before it is renamed
                into place (every other engine's listing counts it from then on, so of two
                writers racing for the last room the later one to list sees the other's file);
                False: no room, and the file is deleted.

        Raises:
            OSError: the write failed (disk full, I/O error, ...); no temporary file is left.
        """
        if os.path.exists(path):
            self.mark_used([path])
            return WriteOutcome.EXISTED
        row = self._primary.row(block_id)
        buffer = self._buffer()
        head = header_bytes(len(key))
        pack_header(buffer[:head], key, row)
        if self.zero_copy:
            parts = [buffer[:head], row]
            if self._padding:
                parts.append(memoryview(self._padding))
        else:
            payload = buffer[head : head + self._payload_bytes]
            payload[: self.block_bytes] = row
            payload[self.block_bytes :] = self._padding
            parts = [buffer[: head + self._payload_bytes]]
        tmp_path = path + self._tmp_suffix
        fd = self._create(tmp_path)
        try:
            try:
                _write_all(fd, parts)
                if self._fsync:
                    os.fsync(fd)
                elif self._drop_pages:
                    _write_back(fd)
                if self._drop_pages:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            if not make_room():
                unlink_quietly(tmp_path)
                return WriteOutcome.NO_ROOM
            try:
                os.replace(tmp_path, path)
            except FileExistsError:
                # Some shared filesystems refuse to replace a name (EEXIST) where POSIX replaces
                # it: another writer published this block first, with the same bytes.
                unlink_quietly(tmp_path)
                self.mark_used([path])
                return WriteOutcome.EXISTED
        except BaseException:
            unlink_quietly(tmp_path)
            raise
        if self._fsync:
            _fsync_directory(os.path.dirname(path))  # the rename itself survives a power cut
        return WriteOutcome.WRITTEN

    def _create(self, tmp_path: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | self._open_flags
        try:
            return os.open(tmp_path, flags, 0o644)
        except FileNotFoundError:
            # The fan-out directory is new (or was deleted by hand): make it, once.
            os.makedirs(os.path.dirname(tmp_path), exist_ok=True)
            return os.open(tmp_path, flags, 0o644)
        except FileExistsError:
            # Left by a writer of this token that died between create and rename: impossible
            # for a live process (one writer per block), so it is stale.
            unlink_quietly(tmp_path)
            return os.open(tmp_path, flags, 0o644)

    # --- reads ---

    def read_block(self, path: str, key: bytes, block_id: int, used: list[str]) -> ReadProblem | None:
        """Read `key`'s block file into primary row `block_id` and verify it.

        A file that fails verification has still been read into the row (unless read through
        the bounce buffer): the caller must fail the load. A damaged file is deleted, unless a
        writer has replaced it since it was opened.

        Args:
            path: the block file's path.
            key: the block's key.
            block_id: the primary row to fill.
            used: `path` is appended when the load succeeded: a use, which the caller marks
                (`mark_used`) once the job's outcome is posted, off the load's latency.

        Returns:
            None when the row now holds the block, else why not.
        """
        try:
            fd = os.open(path, os.O_RDONLY | self._open_flags)
        except FileNotFoundError:
            return ReadProblem.MISSING
        except OSError:
            return ReadProblem.UNREADABLE
        try:
            problem = self._read_verified(fd, key, block_id)
            if problem is ReadProblem.DAMAGED:
                self._delete_if_same(fd, path)
            else:
                if self._drop_pages:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                used.append(path)  # a load is a use, in every engine's eyes
        except OSError:
            problem = ReadProblem.UNREADABLE
        finally:
            os.close(fd)
        return problem

    def _read_verified(self, fd: int, key: bytes, block_id: int) -> ReadProblem | None:
        row = self._primary.row(block_id)
        buffer = self._buffer()
        head = header_bytes(len(key))
        if self.zero_copy:
            parts = [buffer[:head], row]
            payload = row
            if self._padding:
                parts.append(memoryview(bytearray(len(self._padding))))
        else:
            parts = [buffer[: head + self._payload_bytes]]
            payload = buffer[head : head + self.block_bytes]
        expected = sum(len(part) for part in parts)
        # One page more than the file should hold: a longer file fills some of it (no fstat).
        if _read_all(fd, [*parts, buffer[-ALIGN:]]) != expected:
            return ReadProblem.DAMAGED
        hasher = check_header(buffer[:head], key, self.block_bytes)
        if hasher is None or not payload_checksum_ok(buffer[:head], hasher, payload):
            return ReadProblem.DAMAGED
        if not self.zero_copy:
            row[:] = payload
        return None

    @staticmethod
    def _delete_if_same(fd: int, path: str) -> None:
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                unlink_quietly(path)
        except OSError:
            pass

    # --- recency ---

    @staticmethod
    def mark_used(paths: list[str]) -> None:
        """Set the files' modification time to now: eviction in every engine sharing the root
        takes the least recently used file first (atime is often off: mtime is what counts)."""
        for path in paths:
            try:
                os.utime(path)
            except OSError:
                pass  # gone or read-only: nothing to mark


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, parts: list[memoryview]) -> None:
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


def _read_all(fd: int, parts: list[memoryview]) -> int:
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
