"""`FileSystemSecondaryTier`: a crash-safe secondary tier of one file per block.

Layout under `root_dir`:

    kvref_fs_tier.json                    the block size the files were written with
    <ff>/<ff>/<key hex>.<generation>.kvb  one block: header, key, payload

The two fan-out levels come from a hash of the key (at most 65 536 directories, created
lazily). The generation (a nanosecond clock, strictly increasing) makes every write a new file
name, so deleting an evicted file can never remove a newer copy of the same key.

Crash safety: a block is written to `<name>.tmp` (optionally `fsync`ed) and renamed into place
with `os.replace`, so a final name always holds a whole block. Each file carries a CRC-32 of its
payload and its key; a load verifies size, header, key and checksum after reading straight into
the primary slot, and any mismatch fails the job and drops the block from the index, so the
block is a miss afterwards and wrong bytes are never reported as loaded. At start-up the tier
re-indexes the files already there (blocks survive a restart), deletes stale `.tmp` files left by
a crash, and ignores files of another size.

Threads: the scheduler thread only updates an in-memory index (so `lookup` never touches the
disk) and queues one task per block; a pool of I/O threads runs them. The pool has two queues:
read threads serve loads first and write threads serve stores and deletions first, and each
kind takes from the other queue when its own is empty, so a burst of stores never starves
promotions and idle threads are never wasted. Failures (disk full, permission denied, I/O
errors) become failed jobs; nothing raises on the scheduler thread.

Capacity: with `capacity_bytes`, storing evicts the least recently used idle blocks (not being
written or read); a block that cannot be placed fails its job. `touch`, completed stores and
promotions count as uses. I/O is buffered (through the page cache); `fsync=True` makes stores
durable before they are reported finished.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path

from typing_extensions import override

from kvref.base import OffloadingEvent, OffloadKey, ReqContext
from kvref.tiering.base import JobMetadata, JobResult, PrimaryBlocks, SecondaryTierManager

__all__ = ["FileSystemSecondaryTier", "MAX_KEY_BYTES", "CONFIG_FILE_NAME"]

logger = logging.getLogger(__name__)

CONFIG_FILE_NAME = "kvref_fs_tier.json"
MAX_KEY_BYTES = 100
"""Longer keys would make file names exceed common 255-byte limits; such blocks fail to store."""

_FORMAT_VERSION = 1
_MAGIC = b"KVREFBLK"
# magic, format version, key length, CRC-32 of the payload, payload length
_HEADER = struct.Struct("<8sHHIQ")
_BLOCK_SUFFIX = ".kvb"
_TMP_SUFFIX = ".tmp"
_WARN_INTERVAL_S = 10.0


def _fan_out(key: bytes) -> tuple[str, str]:
    digest = hashlib.blake2b(key, digest_size=2).hexdigest()
    return digest[:2], digest[2:]


def _write_all(fd: int, parts: Sequence[memoryview]) -> None:
    pending = list(parts)
    while pending:
        written = os.writev(fd, pending)
        while pending and written >= len(pending[0]):
            written -= len(pending[0])
            pending.pop(0)
        if pending and written:
            pending[0] = pending[0][written:]


def _read_exact(fd: int, dest: memoryview, offset: int) -> bool:
    """Fill `dest` from `offset`; False if the file ends first."""
    filled = 0
    while filled < len(dest):
        count = os.preadv(fd, [dest[filled:]], offset + filled)
        if count == 0:
            return False
        filled += count
    return True


class _Entry:
    """One block in the index: where its file is and what is happening to it."""

    __slots__ = ("path", "size", "writing", "readers")

    def __init__(self, path: str, size: int, writing: bool) -> None:
        self.path = path
        self.size = size
        self.writing = writing
        self.readers = 0

    @property
    def idle(self) -> bool:
        return not self.writing and self.readers == 0


class _Job:
    """A submitted job's blocks, completed by I/O threads (fields after `lock` are shared)."""

    __slots__ = ("meta", "entries", "remaining", "failed", "failed_keys")

    def __init__(self, meta: JobMetadata, entries: list[tuple[OffloadKey, _Entry]]) -> None:
        self.meta = meta
        self.entries = entries
        self.remaining = len(entries)
        self.failed = False
        self.failed_keys: list[OffloadKey] = []


class _Task:
    """One block of I/O for the pool; `run` and `cancel` never raise."""

    __slots__ = ("run", "cancel")

    def __init__(self, run: Callable[[], None], cancel: Callable[[], None]) -> None:
        self.run = run
        self.cancel = cancel


class _DualQueuePool:
    """I/O threads over a read queue and a write queue; each thread prefers one queue."""

    def __init__(self, n_read_threads: int, n_write_threads: int, name: str) -> None:
        self._cond = threading.Condition()
        self._reads: deque[_Task] = deque()
        self._writes: deque[_Task] = deque()
        self._running = 0
        self._closed = False
        self._threads = [
            threading.Thread(
                target=self._work, args=(prefer_reads,), name=f"{name}-{kind}{i}", daemon=True
            )
            for prefer_reads, kind, count in (
                (True, "r", n_read_threads),
                (False, "w", n_write_threads),
            )
            for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, task: _Task, *, read: bool) -> None:
        with self._cond:
            if self._closed:
                task.cancel()
                return
            (self._reads if read else self._writes).append(task)
            self._cond.notify()

    def _work(self, prefer_reads: bool) -> None:
        own, other = (self._reads, self._writes) if prefer_reads else (self._writes, self._reads)
        while True:
            with self._cond:
                while not own and not other and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                task = (own or other).popleft()
                self._running += 1
            try:
                task.run()
            finally:
                with self._cond:
                    self._running -= 1
                    if not self._running and not self._reads and not self._writes:
                        self._cond.notify_all()

    def drain(self) -> None:
        with self._cond:
            while self._running or self._reads or self._writes:
                self._cond.wait()

    def shutdown(self) -> None:
        """Cancel queued tasks, let running ones finish, and join the threads."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            cancelled = [*self._reads, *self._writes]
            self._reads.clear()
            self._writes.clear()
            self._cond.notify_all()
        for task in cancelled:
            task.cancel()
        for thread in self._threads:
            thread.join()


class FileSystemSecondaryTier(SecondaryTierManager):
    """Secondary tier storing one checksummed file per block under `root_dir`.

    Args:
        primary_kv_view: the primary's `(num_blocks, block_bytes)` memoryview.
        root_dir: the directory holding the blocks; created if missing. Sharing it between
            processes needs keys hashed with the same seed.
        capacity_bytes: evict least recently used blocks to stay under this many bytes of
            block files; None for no limit.
        n_read_threads: I/O threads that serve loads (promotions) first.
        n_write_threads: I/O threads that serve stores and deletions first.
        fsync: `fsync` each block file before renaming it into place (durable, slower).
        name: the medium named in events.
        enable_events: buffer stored/removed events for `take_events`.

    Raises:
        ValueError: `root_dir` is unusable (not a directory, not writable, holds blocks of
            another size), or another argument is out of range.
    """

    def __init__(
        self,
        primary_kv_view: memoryview,
        root_dir: str | os.PathLike[str],
        *,
        capacity_bytes: int | None = None,
        n_read_threads: int = 4,
        n_write_threads: int = 4,
        fsync: bool = False,
        name: str = "fs",
        enable_events: bool = False,
    ) -> None:
        if n_read_threads < 1 or n_write_threads < 1:
            raise ValueError(
                f"n_read_threads and n_write_threads must be >= 1, got {n_read_threads} and "
                f"{n_write_threads}"
            )
        self._primary = PrimaryBlocks(primary_kv_view)
        self.medium = name
        self.root_dir = Path(root_dir)
        self.block_bytes = self._primary.block_bytes
        self.fsync = fsync
        max_file_bytes = _HEADER.size + MAX_KEY_BYTES + self.block_bytes
        if capacity_bytes is not None and capacity_bytes < max_file_bytes:
            raise ValueError(
                f"capacity_bytes must be None or hold at least one block file "
                f"(>= {max_file_bytes} bytes), got {capacity_bytes}"
            )
        self._capacity = capacity_bytes
        self._used_bytes = 0
        self._index: OrderedDict[OffloadKey, _Entry] = OrderedDict()
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._last_generation = 0
        self._made_dirs: set[str] = set()
        self._done_lock = threading.Lock()
        self._done: list[_Job] = []
        self._closed = False
        self._last_warning = 0.0

        self._check_root()
        self._reindex()
        self._pool = _DualQueuePool(n_read_threads, n_write_threads, f"kvref-{name}")

    # --- start-up ---

    def _unusable(self, reason: str) -> ValueError:
        return ValueError(f"root_dir {str(self.root_dir)!r} is not usable: {reason}")

    def _check_root(self) -> None:
        try:
            self.root_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._unusable(exc.strerror or str(exc)) from exc
        if not self.root_dir.is_dir():
            raise self._unusable("it is not a directory")
        config_path = self.root_dir / CONFIG_FILE_NAME
        config: dict[str, int] = {"format": _FORMAT_VERSION, "block_bytes": self.block_bytes}
        found: object = None
        try:
            if config_path.exists():
                found = json.loads(config_path.read_text())
            # Rewriting the config is also the write-permission probe.
            tmp_path = config_path.with_suffix(_TMP_SUFFIX)
            tmp_path.write_text(json.dumps(config))
            if found is None or found == config:
                os.replace(tmp_path, config_path)
            else:
                tmp_path.unlink()
        except OSError as exc:
            raise self._unusable(exc.strerror or str(exc)) from exc
        except ValueError as exc:
            raise self._unusable(f"{CONFIG_FILE_NAME} is not valid JSON ({exc})") from exc
        if found is not None and found != config:
            raise self._unusable(
                f"it holds blocks written as {found}, this tier needs {config}; use another "
                f"root_dir or empty this one"
            )

    def _file_size(self, key: bytes) -> int:
        return _HEADER.size + len(key) + self.block_bytes

    def _reindex(self) -> None:
        # key -> (generation, mtime, path, size) of its newest file
        found: dict[OffloadKey, tuple[int, float, str, int]] = {}
        stale_tmp = ignored = 0
        for dirpath, _dirnames, filenames in os.walk(self.root_dir):
            for filename in filenames:
                path = os.path.join(dirpath, filename)
                if filename.endswith(_TMP_SUFFIX):
                    stale_tmp += 1
                    _unlink_quietly(path)
                    continue
                parsed = _parse_block_name(filename)
                if parsed is None:
                    continue
                key, generation = parsed
                try:
                    stat = os.stat(path)
                except OSError:
                    continue
                if stat.st_size != self._file_size(key):
                    ignored += 1
                    continue
                self._last_generation = max(self._last_generation, generation)
                candidate = (generation, stat.st_mtime, path, stat.st_size)
                previous = found.setdefault(key, candidate)
                if previous is not candidate:
                    # A crash between writing a newer copy and deleting the older one.
                    older, newer = sorted((previous, candidate))
                    _unlink_quietly(older[2])
                    found[key] = newer
        for key, (_gen, _mtime, path, size) in sorted(found.items(), key=lambda item: item[1][1]):
            self._index[key] = _Entry(path, size, writing=False)
            self._used_bytes += size
        if self._capacity is not None:
            while self._used_bytes > self._capacity and self._index:
                _key, entry = self._index.popitem(last=False)
                self._used_bytes -= entry.size
                _unlink_quietly(entry.path)
        if stale_tmp or ignored or self._index:
            logger.info(
                "fs tier %s: re-indexed %d blocks, removed %d stale temporary files, ignored %d "
                "files of another size",
                self.root_dir,
                len(self._index),
                stale_tmp,
                ignored,
            )

    # --- scheduler-thread API ---

    def __len__(self) -> int:
        return len(self._index)

    @property
    def used_bytes(self) -> int:
        """Bytes of block files stored or being written."""
        return self._used_bytes

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        entry = self._index.get(key)
        if entry is None:
            return False
        return None if entry.writing else True

    @override
    def submit_store(self, job: JobMetadata) -> None:
        if self._closed:
            self._finish_now(job)
            return
        planned: list[tuple[OffloadKey, _Entry, int]] = []
        unplaceable = False
        for key, block_id in zip(job.keys, job.block_ids):
            if key in self._index:
                continue  # already stored or being written: nothing to do
            size = self._file_size(key)
            if len(key) > MAX_KEY_BYTES or not self._make_room(size):
                unplaceable = True
                continue
            entry = _Entry(self._new_path(key), size, writing=True)
            self._index[key] = entry
            self._used_bytes += size
            planned.append((key, entry, block_id))
        state = _Job(job, [(key, entry) for key, entry, _ in planned])
        state.failed = unplaceable
        if not planned:
            self._finish(state)
            return
        for key, entry, block_id in planned:
            self._pool.submit(self._write_task(state, key, entry, block_id), read=False)

    @override
    def submit_load(self, job: JobMetadata) -> None:
        entries: list[tuple[OffloadKey, _Entry]] = []
        for key in job.keys:
            entry = self._index.get(key)
            if entry is None or entry.writing:
                entries = []
                break
            entries.append((key, entry))
        if self._closed or not entries or len(entries) != len(job.keys):
            self._finish_now(job)
            return
        state = _Job(job, entries)
        for (key, entry), block_id in zip(entries, job.block_ids):
            entry.readers += 1
            self._index.move_to_end(key)
            self._pool.submit(self._read_task(state, key, entry, block_id), read=True)

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._done_lock:
            done, self._done = self._done, []
        results: list[JobResult] = []
        for state in done:
            if state.meta.is_promotion:
                self._settle_load(state)
            else:
                self._settle_store(state)
            results.append(JobResult(state.meta.job_id, not state.failed))
        return results

    def _settle_store(self, state: _Job) -> None:
        failed = set(state.failed_keys)
        stored: list[OffloadKey] = []
        for key, entry in state.entries:
            if key in failed:
                self._drop(key, entry, announce=False)
            else:
                entry.writing = False
                stored.append(key)
        if self._events is not None and stored:
            self._events.append(OffloadingEvent(stored, self.medium, removed=False))

    def _settle_load(self, state: _Job) -> None:
        failed = set(state.failed_keys)
        dropped: list[OffloadKey] = []
        for key, entry in state.entries:
            entry.readers -= 1
            if key in failed and self._drop(key, entry, announce=False):
                dropped.append(key)
        if dropped:
            # Corrupt, truncated or vanished files: never offer these blocks again.
            self._announce_removed(dropped)

    def _drop(self, key: OffloadKey, entry: _Entry, *, announce: bool) -> bool:
        """Remove `entry` from the index (if still current) and delete its file."""
        if self._index.get(key) is not entry:
            return False
        del self._index[key]
        self._used_bytes -= entry.size
        if not entry.writing:
            self._pool.submit(self._delete_task(entry.path), read=False)
        if announce:
            self._announce_removed([key])
        return True

    def _announce_removed(self, keys: list[OffloadKey]) -> None:
        if self._events is not None and keys:
            self._events.append(OffloadingEvent(keys, self.medium, removed=True))

    def _make_room(self, size: int) -> bool:
        if self._capacity is None or self._used_bytes + size <= self._capacity:
            return True
        victims: list[tuple[OffloadKey, _Entry]] = []
        freed = 0
        for key, entry in self._index.items():
            if entry.idle:
                victims.append((key, entry))
                freed += entry.size
                if self._used_bytes - freed + size <= self._capacity:
                    break
        if self._used_bytes - freed + size > self._capacity:
            return False
        for key, entry in victims:
            self._drop(key, entry, announce=False)
        self._announce_removed([key for key, _ in victims])
        return True

    def _new_path(self, key: bytes) -> str:
        self._last_generation = max(time.time_ns(), self._last_generation + 1)
        first, second = _fan_out(key)
        return os.path.join(
            self.root_dir, first, second, f"{key.hex()}.{self._last_generation:016x}{_BLOCK_SUFFIX}"
        )

    def _finish_now(self, job: JobMetadata) -> None:
        state = _Job(job, [])
        state.failed = True
        self._finish(state)

    def _finish(self, state: _Job) -> None:
        with self._done_lock:
            self._done.append(state)

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        # Reversed, so the request's first block ends up the most recently used.
        for key in reversed(list(keys)):
            if key in self._index:
                self._index.move_to_end(key)

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return ()
        events, self._events = self._events, []
        return events

    @override
    def drain_jobs(self) -> None:
        self._pool.drain()

    @override
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown()
        self._primary.release()

    # --- I/O threads ---

    def _block_done(self, state: _Job, key: OffloadKey, ok: bool) -> None:
        with self._done_lock:
            if not ok:
                state.failed = True
                state.failed_keys.append(key)
            state.remaining -= 1
            if state.remaining == 0:
                self._done.append(state)

    def _write_task(self, state: _Job, key: OffloadKey, entry: _Entry, block_id: int) -> _Task:
        def run() -> None:
            self._block_done(state, key, self._write_block(key, entry.path, block_id))

        return _Task(run, lambda: self._block_done(state, key, False))

    def _read_task(self, state: _Job, key: OffloadKey, entry: _Entry, block_id: int) -> _Task:
        def run() -> None:
            self._block_done(state, key, self._read_block(key, entry.path, block_id))

        return _Task(run, lambda: self._block_done(state, key, False))

    def _delete_task(self, path: str) -> _Task:
        return _Task(lambda: _unlink_quietly(path), lambda: None)

    def _write_block(self, key: bytes, path: str, block_id: int) -> bool:
        tmp_path = path + _TMP_SUFFIX
        try:
            directory = os.path.dirname(path)
            if directory not in self._made_dirs:
                os.makedirs(directory, exist_ok=True)
                self._made_dirs.add(directory)
            payload = self._primary.row(block_id)
            header = _HEADER.pack(
                _MAGIC, _FORMAT_VERSION, len(key), zlib.crc32(payload), len(payload)
            )
            fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                _write_all(fd, [memoryview(header + key), payload])
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp_path, path)
            return True
        except Exception as exc:
            self._warn("write", path, exc)
            _unlink_quietly(tmp_path)
            return False

    def _read_block(self, key: bytes, path: str, block_id: int) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if os.fstat(fd).st_size != self._file_size(key):
                    raise _CorruptBlock("size")
                header = bytearray(_HEADER.size + len(key))
                if not _read_exact(fd, memoryview(header), 0):
                    raise _CorruptBlock("truncated header")
                magic, version, key_len, crc, payload_len = _HEADER.unpack_from(header)
                if (
                    magic != _MAGIC
                    or version != _FORMAT_VERSION
                    or key_len != len(key)
                    or payload_len != self.block_bytes
                    or bytes(header[_HEADER.size :]) != key
                ):
                    raise _CorruptBlock("header")
                dest = self._primary.row(block_id)
                if not _read_exact(fd, dest, len(header)):
                    raise _CorruptBlock("truncated payload")
                if zlib.crc32(dest) != crc:
                    raise _CorruptBlock("checksum mismatch")
            finally:
                os.close(fd)
            return True
        except Exception as exc:
            self._warn("read", path, exc)
            return False

    def _warn(self, operation: str, path: str, exc: Exception) -> None:
        # Disk-full or permission errors hit every block: warn at most every few seconds.
        now = time.monotonic()
        level = logging.DEBUG
        if now - self._last_warning >= _WARN_INTERVAL_S:
            self._last_warning = now
            level = logging.WARNING
        logger.log(level, "fs tier %s: %s of %s failed: %s", self.medium, operation, path, exc)

    @override
    def __repr__(self) -> str:
        return (
            f"FileSystemSecondaryTier({str(self.root_dir)!r}, blocks={len(self._index)}, "
            f"used_bytes={self._used_bytes}, capacity_bytes={self._capacity})"
        )


class _CorruptBlock(Exception):
    """A block file does not hold what its name promises."""


def _parse_block_name(filename: str) -> tuple[OffloadKey, int] | None:
    if not filename.endswith(_BLOCK_SUFFIX):
        return None
    stem = filename[: -len(_BLOCK_SUFFIX)]
    key_hex, _, generation_hex = stem.rpartition(".")
    try:
        return OffloadKey(bytes.fromhex(key_hex)), int(generation_hex, 16)
    except ValueError:
        return None


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.ENOENT,):
            logger.debug("could not delete %s: %s", path, exc)
