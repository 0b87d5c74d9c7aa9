"""The file work of `FileSystemSecondaryTier`'s I/O threads: writing a task's block files,
reading them back into their primary rows and verifying them, and marking files used.

`BlockIO` touches no scheduler state, so any I/O thread may call it. It works a task's blocks
at a time: through `kvref.tiering.fs._batch_io`, a C extension that does a whole task's system
calls and checksums in one call without the GIL, where it was built (Linux with a C compiler at
install time; `NATIVE_BATCH_IO`), else in Python, block by block, with the same files and
outcomes. The Python path is the reference: read it to learn what a block file's I/O does.

With O_DIRECT a block file moves between the device and a per-thread staging buffer on huge
pages, where the kernel grants them (`kvref.tiering.fs.huge_pages` says why: the device is twice
as fast with them), and the payload is copied to or from its row; a load's payload reaches the
row only once verified. Without huge pages it moves to and from the row without a copy when the
row is page-aligned and a whole number of pages (a page-aligned primary, e.g. vLLM's or kvref's
shared mmap region, with block sizes of 4 KiB multiples); otherwise through an aligned
per-thread bounce buffer. `BlockIO.transfer` says which.
Without O_DIRECT (the filesystem refuses it), the pages a write or read brought into the page
cache are dropped once they are clean, unless the tier keeps the page cache on purpose.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
from collections.abc import Callable, Sequence
from types import ModuleType

from kvref.tiering.base import PrimaryBlocks
from kvref.tiering.fs.format import (
    ALIGN,
    FORMAT_VERSION,
    MAX_KEY_BYTES,
    align_up,
    check_header,
    header_bytes,
    pack_header,
    payload_checksum_ok,
)
from kvref.tiering.fs.huge_pages import ThreadBuffers, transparent_huge_pages
from kvref.tiering.fs.posix_io import (
    MAX_LAST_REQUEST_BYTES,
    MAX_REQUEST_BYTES,
    fsync_directory,
    publish_file,
    read_all,
    write_all,
    write_back,
)
from kvref.tiering.fs.root import TMP_SUFFIX, unlink_quietly

__all__ = [
    "NATIVE_BATCH_IO",
    "ReadProblem",
    "Transfer",
    "WriteOutcome",
    "BlockIO",
    "buffer_address",
]

_O_DIRECT = getattr(os, "O_DIRECT", 0)

# Codes of the Python path's per-block steps, as the C extension returns them.
_WRITE_DONE, _WRITE_EXISTED = 0, 1
# Errors that say a block file is gone: deleted, or, on a shared filesystem, deleted by another
# host (evicted) after this one looked it up or while it read it (JuiceFS then fails the read
# with ENOENT, NFS with ESTALE). A miss, not an I/O error that would bar the block here.
_GONE = frozenset({errno.ENOENT, errno.ESTALE})


def _load_native() -> ModuleType | None:
    try:
        from kvref.tiering.fs import _batch_io
    except ImportError:  # not built: no compiler at install time, or not Linux
        return None
    # What both paths must agree on; a build of other code lacks some or differs (a stale .so).
    expected = {
        "FORMAT_VERSION": FORMAT_VERSION,
        "ALIGN": ALIGN,
        "MAX_REQUEST": MAX_REQUEST_BYTES,
        "MAX_LAST_REQUEST": MAX_LAST_REQUEST_BYTES,
        "WRITE_DONE": _WRITE_DONE,
        "WRITE_EXISTED": _WRITE_EXISTED,
        # read_blocks' codes index _READ_PROBLEMS.
        "READ_OK": 0,
        "READ_MISSING": 1,
        "READ_DAMAGED": 2,
        "READ_UNREADABLE": 3,
    }
    if any(getattr(_batch_io, name, None) != value for name, value in expected.items()):
        return None  # never write or read with it
    return _batch_io


NATIVE_BATCH_IO = _load_native()
"""The C extension doing a task's block files without the GIL, or None where it was not built
(then the Python path does the same work, slower: about 3x the CPU per GiB at 256 KiB)."""


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

    MISSING = "missing"  # no file (or gone while read): never stored, evicted, deleted by hand
    DAMAGED = "damaged"  # wrong length, header, key or checksum: the file was deleted
    UNREADABLE = "unreadable"  # an I/O error: the file is left alone


class Transfer(enum.Enum):
    """How payloads move between the device and the primary's rows."""

    HUGE_PAGES = "staged on huge pages"  # O_DIRECT through a huge-page buffer, then a copy
    ZERO_COPY = "zero-copy"  # straight between the file and the row
    BOUNCE = "bounce"  # O_DIRECT through an aligned buffer: the rows do not take it


# read_blocks' codes (0: loaded), as the C extension returns them.
_READ_PROBLEMS = (
    None,
    ReadProblem.MISSING,
    ReadProblem.DAMAGED,
    ReadProblem.UNREADABLE,
)


class BlockIO:
    """Reads and writes the block files of one tier (any thread; no scheduler state).

    Args:
        primary: the primary's rows, the source of stores and the destination of loads.
        direct: use O_DIRECT (the root passed `probe_o_direct`).
        keep_page_cache: buffered I/O only: leave the pages a read or write brought in cached.
        fsync: `fsync` each block file before renaming it into place.
        token: this writer's part of temporary file names (`writer_token`).
        native: do the file work in `NATIVE_BATCH_IO` (when built) rather than in Python.
        huge_page_staging: with O_DIRECT and page-aligned rows, stage payloads on huge pages
            (`Transfer.HUGE_PAGES`); None where the kernel grants transparent huge pages.
    """

    def __init__(
        self,
        primary: PrimaryBlocks,
        *,
        direct: bool,
        keep_page_cache: bool,
        fsync: bool,
        token: str,
        native: bool = True,
        huge_page_staging: bool | None = None,
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
        whole_pages = base is not None and base % ALIGN == 0 and self.block_bytes % ALIGN == 0
        if huge_page_staging is None:
            huge_page_staging = transparent_huge_pages()
        if not direct:
            self.transfer = Transfer.ZERO_COPY
        elif not whole_pages:
            self.transfer = Transfer.BOUNCE
        else:
            self.transfer = Transfer.HUGE_PAGES if huge_page_staging else Transfer.ZERO_COPY
        self._padding = bytes(self._payload_bytes - self.block_bytes)
        self._native = NATIVE_BATCH_IO if native else None
        self._sync = 0
        if self._native is not None:
            self._sync = (
                (self._native.SYNC_FSYNC if fsync else 0)
                | (self._native.SYNC_WRITE_BACK if self._drop_pages and not fsync else 0)
                | (self._native.SYNC_DROP_PAGES if self._drop_pages else 0)
            )
        # One aligned buffer per I/O thread: the longest header, unless zero-copy a payload, and
        # a last page that a read fills only when a file is longer than it should be. Staged,
        # the payload of a 32-byte key's file (vLLM's and kvref's) starts a huge page.
        self._buffers, self._second_buffers = (
            ThreadBuffers(
                header_bytes(MAX_KEY_BYTES) + (0 if self._zero_copy else self._payload_bytes) + ALIGN,
                huge_pages=self.transfer is Transfer.HUGE_PAGES,
                lead=header_bytes(32),
                payload=self._payload_bytes,
            )
            for _ in range(2)
        )  # the second: a writing thread's next block, prepared while it writes one (C only)

    @property
    def _zero_copy(self) -> bool:
        return self.transfer is Transfer.ZERO_COPY

    @property
    def native(self) -> bool:
        """Whether the file work runs in the C extension."""
        return self._native is not None

    # --- buffers ---

    def prepare_threads(self, threads: int, pipelined_writers: int) -> None:
        """Make the buffers of `threads` I/O threads now, at start-up, rather than on each
        thread's first transfer (`ThreadBuffers.prepare`), and the second buffers of
        `pipelined_writers` threads that store several blocks per call (C path only)."""
        self._buffers.prepare(threads)
        if self._native is not None:
            self._second_buffers.prepare(pipelined_writers)

    def _buffer(self) -> memoryview:
        return self._buffers.get()

    # --- writes ---

    def write_blocks(
        self,
        paths: Sequence[str],
        keys: Sequence[bytes],
        block_ids: Sequence[int],
        make_room: Callable[[int], bool],
    ) -> list[WriteOutcome | OSError]:
        """Store primary rows as block files (unless one is there): each into a temporary file
        of this writer, then each renamed into place.

        Args:
            paths: the block files' paths.
            keys: the blocks' keys.
            block_ids: the primary rows to store.
            make_room: called with a block's index once its temporary file is written whole,
                before it is renamed into place (every other engine's listing counts it from
                then on, so of two writers racing for the last room the later one to list sees
                the other's file); False: no room, and the file is deleted.

        Returns:
            Each block's outcome, or the OSError that failed it (disk full, I/O error, ...);
            no temporary file is left behind.
        """
        tmp_paths = [path + self._tmp_suffix for path in paths]
        if self._native is not None:
            rows = [self._primary.row(block_id) for block_id in block_ids]
            second = self._second_buffers.get() if len(paths) > 1 else None
            codes: list[int] = self._native.write_blocks(
                paths, tmp_paths, keys, rows, self._buffer(), self.block_bytes,
                self.direct, self._zero_copy, self._sync, second,
            )  # fmt: skip
        else:
            codes = [
                self._write_temporary(path, tmp_path, key, block_id)
                for path, tmp_path, key, block_id in zip(paths, tmp_paths, keys, block_ids)
            ]
        outcomes: list[WriteOutcome | OSError] = []
        publish: list[int] = []
        for index, code in enumerate(codes):
            if code == _WRITE_EXISTED:
                outcomes.append(WriteOutcome.EXISTED)
                continue
            if code < 0:
                outcomes.append(OSError(-code, os.strerror(-code), paths[index]))
                continue
            try:
                room = make_room(index)
            except BaseException:
                for later in range(index, len(codes)):
                    if codes[later] == _WRITE_DONE:
                        unlink_quietly(tmp_paths[later])
                for earlier in publish:
                    unlink_quietly(tmp_paths[earlier])
                raise
            if room:
                publish.append(index)
                outcomes.append(WriteOutcome.WRITTEN)
            else:
                unlink_quietly(tmp_paths[index])
                outcomes.append(WriteOutcome.NO_ROOM)
        sources = [tmp_paths[index] for index in publish]
        targets = [paths[index] for index in publish]
        if self._native is not None:
            renamed: list[int] = self._native.rename_files(sources, targets)
        else:
            renamed = [_rename(source, target) for source, target in zip(sources, targets)]
        for index, code in zip(publish, renamed):
            if code == _WRITE_EXISTED:
                outcomes[index] = WriteOutcome.EXISTED
            elif code < 0:
                outcomes[index] = OSError(-code, os.strerror(-code), paths[index])
        self.mark_used(
            [path for path, outcome in zip(paths, outcomes) if outcome is WriteOutcome.EXISTED]
        )
        if self._fsync:
            # The renames themselves survive a power cut.
            for directory in {
                os.path.dirname(targets[i]) for i, code in enumerate(renamed) if code == 0
            }:
                fsync_directory(directory)
        return outcomes

    def _write_temporary(self, path: str, tmp_path: str, key: bytes, block_id: int) -> int:
        """The Python path's step before the rename: 0 written, 1 a file is already at `path`
        (nothing written), else -errno (nothing left)."""
        if os.path.exists(path):
            return _WRITE_EXISTED
        row = self._primary.row(block_id)
        buffer = self._buffer()
        head = header_bytes(len(key))
        pack_header(buffer[:head], key, row)
        if self._zero_copy:
            parts = [buffer[:head], row]
            if self._padding:
                parts.append(memoryview(self._padding))
        else:
            payload = buffer[head : head + self._payload_bytes]
            payload[: self.block_bytes] = row
            payload[self.block_bytes :] = self._padding
            parts = [buffer[: head + self._payload_bytes]]
        try:
            fd = self._create(tmp_path)
        except OSError as exc:
            return -(exc.errno or errno.EIO)
        try:
            try:
                write_all(fd, parts)
                if self._fsync:
                    os.fsync(fd)
                elif self._drop_pages:
                    write_back(fd)
                if self._drop_pages:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except OSError as exc:
            unlink_quietly(tmp_path)
            return -(exc.errno or errno.EIO)
        except BaseException:
            unlink_quietly(tmp_path)
            raise
        return _WRITE_DONE

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

    def read_blocks(
        self, paths: Sequence[str], keys: Sequence[bytes], block_ids: Sequence[int]
    ) -> list[ReadProblem | None]:
        """Read block files into primary rows and verify them.

        A file that fails verification has still been read into its row (unless read through
        the bounce buffer): the caller must fail that block's load. A damaged file is deleted,
        unless a writer has replaced it since it was opened.

        Args:
            paths: the block files' paths.
            keys: the blocks' keys.
            block_ids: the primary rows to fill.

        Returns:
            Per block, None when its row now holds it, else why not.
        """
        if self._native is not None:
            rows = [self._primary.row(block_id) for block_id in block_ids]
            codes: list[int] = self._native.read_blocks(
                paths, keys, rows, self._buffer(), self.block_bytes,
                self.direct, self._zero_copy, self._drop_pages,
            )  # fmt: skip
            return [_READ_PROBLEMS[code] for code in codes]
        return [
            self._read_block(path, key, block_id)
            for path, key, block_id in zip(paths, keys, block_ids)
        ]

    def _read_block(self, path: str, key: bytes, block_id: int) -> ReadProblem | None:
        """The Python path: one block file into its row."""
        try:
            fd = os.open(path, os.O_RDONLY | self._open_flags)
        except OSError as exc:
            return ReadProblem.MISSING if exc.errno in _GONE else ReadProblem.UNREADABLE
        try:
            problem = self._read_verified(fd, key, block_id)
            if problem is ReadProblem.DAMAGED:
                self._delete_if_same(fd, path)
            elif self._drop_pages:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            problem = ReadProblem.MISSING if exc.errno in _GONE else ReadProblem.UNREADABLE
        finally:
            os.close(fd)
        return problem

    def _read_verified(self, fd: int, key: bytes, block_id: int) -> ReadProblem | None:
        row = self._primary.row(block_id)
        buffer = self._buffer()
        head = header_bytes(len(key))
        if self._zero_copy:
            parts = [buffer[:head], row]
            payload = row
            if self._padding:
                parts.append(memoryview(bytearray(len(self._padding))))
        else:
            parts = [buffer[: head + self._payload_bytes]]
            payload = buffer[head : head + self.block_bytes]
        expected = sum(len(part) for part in parts)
        # One page more than the file should hold: a longer file fills some of it (no fstat).
        if read_all(fd, [*parts, buffer[-ALIGN:]]) != expected:
            return ReadProblem.DAMAGED
        hasher = check_header(buffer[:head], key, self.block_bytes)
        if hasher is None or not payload_checksum_ok(buffer[:head], hasher, payload):
            return ReadProblem.DAMAGED
        if not self._zero_copy:
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

    def mark_used(self, paths: Sequence[str]) -> None:
        """Set the files' modification time to now: eviction in every engine sharing the root
        takes the least recently used file first (atime is often off: mtime is what counts)."""
        if not paths:
            return
        if self._native is not None:
            self._native.touch_files(paths)
            return
        for path in paths:
            try:
                os.utime(path)
            except OSError:
                pass  # gone or read-only: nothing to mark


def _rename(source: str, target: str) -> int:
    """The Python path's publishing step: 0 published, 1 a file is at the target (another writer
    published this block first, with the same bytes: it stays), else -errno; `source` is gone
    afterwards."""
    try:
        publish_file(source, target)
    except OSError as exc:
        unlink_quietly(source)
        return _WRITE_EXISTED if exc.errno == errno.EEXIST else -(exc.errno or errno.EIO)
    except BaseException:
        unlink_quietly(source)
        raise
    return _WRITE_DONE
