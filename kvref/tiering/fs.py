"""`FileSystemSecondaryTier`: a crash-safe secondary tier of checksummed block files.

Layout under `root_dir`:

    kvref_fs_tier.json                  the block size and format the files were written with
    <ff>/<ff>/<generation>.kvs          a segment: the blocks of one store job, back to back
    record = header (magic, format, key length, CRC-32, payload length) | key | payload

A store job's new blocks are written as one segment file (split at `max_segment_bytes`), so a
file is created per job rather than per block: creating files is the slow part of small writes
on most filesystems. The two fan-out directory levels come from a hash of the segment's
generation (a strictly increasing nanosecond clock), which also makes every segment name new,
so deleting an evicted segment can never remove newer data.

Crash safety: a segment is written to `<name>.tmp` (optionally `fsync`ed) and renamed into
place with `os.replace`, so a final name always holds whole records. Each record carries its
key and a CRC-32 of its payload; a load verifies the record's header, key and checksum after
reading straight into the primary slot, and any mismatch fails the job and drops the block from
the index (its record is marked dead on disk, or its segment deleted once empty), so it is a
miss afterwards, restarts included, and wrong bytes are never reported as loaded. At start-up
the tier re-indexes the segments already there (blocks survive a restart), deletes stale `.tmp`
files left by a crash, and skips records that are truncated or of another block size.

Threads: the scheduler thread only updates an in-memory index (so `lookup` never touches the
disk) and queues tasks (one per segment to write, one per block to read); a pool of I/O threads
runs them. The pool has two queues: read threads serve loads first and write threads serve
stores and deletions first, and each kind takes from the other queue when its own is empty, so
a burst of stores never starves promotions and no thread idles while work is queued. Failures
(disk full, permission denied, I/O errors) become failed jobs; nothing raises on the scheduler
thread.

Capacity: with `capacity_bytes`, storing evicts whole segments, least recently used first (a
block's `touch`, store or promotion makes its segment recent), skipping segments being written
or read and segments holding blocks of the storing job; a segment that cannot be placed fails
its job. Blocks of one segment were stored together by one request, so they tend to be reused
together. I/O is buffered (through the page cache); `fsync=True` makes stores durable before
they are reported finished.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import queue
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

__all__ = ["FileSystemSecondaryTier", "CONFIG_FILE_NAME", "RECORD_HEADER_BYTES"]

logger = logging.getLogger(__name__)

CONFIG_FILE_NAME = "kvref_fs_tier.json"

_FORMAT_VERSION = 2
_MAGIC = b"KVREFBLK"
# A record dropped (damaged) while the rest of its segment lives on: skipped at re-indexing.
_DEAD_MAGIC = b"KVREFDED"
# magic, format version, key length, CRC-32 of the payload, payload length
_HEADER = struct.Struct("<8sHHIQ")
RECORD_HEADER_BYTES = _HEADER.size
"""Bytes of a record's fixed header; a record is this header, then its key, then its payload."""
_MAX_KEY_BYTES = 0xFFFF
_SEGMENT_SUFFIX = ".kvs"
_TMP_SUFFIX = ".tmp"
_WARN_INTERVAL_S = 10.0


def _write_all(fd: int, parts: Sequence[memoryview]) -> None:
    pending = list(parts)
    while pending:
        written = os.writev(fd, pending[:1024])  # IOV_MAX
        while pending and written >= len(pending[0]):
            written -= len(pending[0])
            pending.pop(0)
        if pending and written:
            pending[0] = pending[0][written:]


def _read_exact_into(fd: int, buffers: Sequence[memoryview], offset: int) -> bool:
    """Fill `buffers` in order from `offset`; False if the file ends first."""
    pending = list(buffers)
    while pending:
        count = os.preadv(fd, pending, offset)
        if count == 0:
            return False
        offset += count
        while pending and count >= len(pending[0]):
            count -= len(pending[0])
            pending.pop(0)
        if pending and count:
            pending[0] = pending[0][count:]
    return True


class _Segment:
    """One segment file and the blocks of it the index still holds."""

    __slots__ = ("path", "size", "keys", "writing", "readers")

    def __init__(self, path: str, size: int, writing: bool) -> None:
        self.path = path
        self.size = size
        self.keys: set[OffloadKey] = set()
        self.writing = writing
        self.readers = 0

    @property
    def idle(self) -> bool:
        return not self.writing and self.readers == 0


class _Entry:
    """Where one block's record is."""

    __slots__ = ("segment", "offset")

    def __init__(self, segment: _Segment, offset: int) -> None:
        self.segment = segment
        self.offset = offset


class _Job:
    """A submitted job's I/O (only the scheduler thread touches it; see `_task_done`)."""

    __slots__ = ("meta", "segments", "reads", "remaining", "failed", "failed_keys")

    def __init__(self, meta: JobMetadata) -> None:
        self.meta = meta
        self.segments: list[_Segment] = []
        self.reads: list[tuple[OffloadKey, _Entry]] = []
        self.remaining = 0
        self.failed = False
        # Blocks whose load failed, and paths of segments whose write failed.
        self.failed_keys: list[OffloadKey | str] = []


class _Task:
    """One unit of I/O for the pool; `run` and `cancel` never raise."""

    __slots__ = ("run", "cancel")

    def __init__(self, run: Callable[[], None], cancel: Callable[[], None]) -> None:
        self.run = run
        self.cancel = cancel


class _DualQueuePool:
    """I/O threads over a read queue and a write queue; each thread prefers one queue.

    Submitting never waits on a lock an I/O thread may hold: a task is appended to its deque
    and a token to a `SimpleQueue`; a thread takes one token, then one task from its own queue
    or, if that is empty, from the other (there is always one: tasks go in before tokens).
    """

    def __init__(self, n_read_threads: int, n_write_threads: int, name: str) -> None:
        self._reads: deque[_Task] = deque()
        self._writes: deque[_Task] = deque()
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._closed = False
        self._submitted = 0  # written by the submitting thread only
        self._finished = 0  # under _idle
        self._idle = threading.Condition()
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
        if self._closed:
            task.cancel()
            return
        (self._reads if read else self._writes).append(task)
        self._submitted += 1
        self._tokens.put(True)

    def _work(self, prefer_reads: bool) -> None:
        own, other = (self._reads, self._writes) if prefer_reads else (self._writes, self._reads)
        while self._tokens.get():
            try:
                task = own.popleft()
            except IndexError:
                task = other.popleft()
            try:
                if self._closed:
                    task.cancel()
                else:
                    task.run()
            finally:
                with self._idle:
                    self._finished += 1
                    self._idle.notify_all()

    def drain(self) -> None:
        with self._idle:
            while self._finished < self._submitted:
                self._idle.wait()

    def shutdown(self) -> None:
        """Let running tasks finish, cancel queued ones, and join the threads."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._tokens.put(False)  # after every queued task's token: those get cancelled
        for thread in self._threads:
            thread.join()


class FileSystemSecondaryTier(SecondaryTierManager):
    """Secondary tier storing checksummed block records in segment files under `root_dir`.

    Args:
        primary_kv_view: the primary's `(num_blocks, block_bytes)` memoryview.
        root_dir: the directory holding the blocks; created if missing. Sharing it between
            processes needs keys hashed with the same seed.
        capacity_bytes: evict least recently used segments to keep segment files under this
            many bytes; None for no limit.
        max_segment_bytes: split a store job's blocks into segment files of at most this many
            bytes (at least one block each): fewer files versus more parallel writers.
        n_read_threads: I/O threads that serve loads (promotions) first.
        n_write_threads: I/O threads that serve stores and deletions first.
        fsync: `fsync` each segment before renaming it into place (durable, slower).
        name: the medium named in events.
        enable_events: buffer stored/removed events for `take_events`.

    Raises:
        ValueError: `root_dir` is unusable (not a directory, not writable, holds blocks of
            another size or format), or another argument is out of range.
    """

    def __init__(
        self,
        primary_kv_view: memoryview,
        root_dir: str | os.PathLike[str],
        *,
        capacity_bytes: int | None = None,
        max_segment_bytes: int = 16 << 20,
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
        if capacity_bytes is not None and capacity_bytes < self.block_bytes:
            raise ValueError(
                f"capacity_bytes must be None or at least one block ({self.block_bytes} bytes), "
                f"got {capacity_bytes}"
            )
        if max_segment_bytes < 1:
            raise ValueError(f"max_segment_bytes must be >= 1, got {max_segment_bytes}")
        self._capacity = capacity_bytes
        self._max_segment_bytes = max_segment_bytes
        self._used_bytes = 0
        self._index: dict[OffloadKey, _Entry] = {}
        # Segments in least-recently-used order.
        self._segments: OrderedDict[_Segment, None] = OrderedDict()
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._last_generation = 0
        self._made_dirs: set[str] = set()
        # Jobs finished without I/O, and per-task completions posted by the I/O threads
        # (deque appends and pops are atomic: the scheduler thread never waits on a lock that
        # an I/O thread could hold).
        self._done: list[_Job] = []
        self._completions: deque[tuple[_Job, OffloadKey | str | None]] = deque()
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

    def _record_bytes(self, key: bytes) -> int:
        return _HEADER.size + len(key) + self.block_bytes

    def _reindex(self) -> None:
        found: list[tuple[int, float, str, int]] = []  # generation, mtime, path, size
        stale_tmp = 0
        for dirpath, _dirnames, filenames in os.walk(self.root_dir):
            for filename in filenames:
                path = os.path.join(dirpath, filename)
                if filename.endswith(_TMP_SUFFIX):
                    stale_tmp += 1
                    _unlink_quietly(path)
                elif filename.endswith(_SEGMENT_SUFFIX):
                    try:
                        generation = int(filename[: -len(_SEGMENT_SUFFIX)], 16)
                        stat = os.stat(path)
                    except (ValueError, OSError):
                        continue
                    found.append((generation, stat.st_mtime, path, stat.st_size))
        skipped = 0
        # Oldest generation first: a key stored again later (after an eviction that a crash
        # interrupted) keeps its newest record.
        segments: list[tuple[float, _Segment]] = []
        for generation, mtime, path, size in sorted(found):
            self._last_generation = max(self._last_generation, generation)
            records, bad = self._scan_segment(path, size)
            skipped += bad
            segment = _Segment(path, size, writing=False)
            for key, offset in records:
                previous = self._index.get(key)
                if previous is not None:
                    previous.segment.keys.discard(key)
                segment.keys.add(key)
                self._index[key] = _Entry(segment, offset)
            segments.append((mtime, segment))
        for _mtime, segment in sorted(segments, key=lambda item: item[0]):
            if segment.keys:
                self._segments[segment] = None
                self._used_bytes += segment.size
            else:
                _unlink_quietly(segment.path)
        if self._capacity is not None:
            while self._used_bytes > self._capacity and self._segments:
                segment = next(iter(self._segments))
                self._evict(segment, announce=False)
                _unlink_quietly(segment.path)
        if stale_tmp or skipped or self._index:
            logger.info(
                "fs tier %s: re-indexed %d blocks in %d segments, removed %d stale temporary "
                "files, skipped %d damaged records",
                self.root_dir,
                len(self._index),
                len(self._segments),
                stale_tmp,
                skipped,
            )

    def _scan_segment(self, path: str, size: int) -> tuple[list[tuple[OffloadKey, int]], int]:
        """Read a segment's record headers: (key, offset) of each whole record, and the number
        of records skipped because they are damaged or of another block size."""
        records: list[tuple[OffloadKey, int]] = []
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return records, 1
        try:
            offset = 0
            while offset + _HEADER.size <= size:
                header = os.pread(fd, _HEADER.size, offset)
                if len(header) < _HEADER.size:
                    return records, 1
                magic, version, key_len, _crc, payload_len = _HEADER.unpack(header)
                end = offset + _HEADER.size + key_len + payload_len
                if magic not in (_MAGIC, _DEAD_MAGIC) or version != _FORMAT_VERSION or end > size:
                    return records, 1  # what follows cannot be located
                if magic == _MAGIC and payload_len == self.block_bytes:
                    key = os.pread(fd, key_len, offset + _HEADER.size)
                    records.append((OffloadKey(key), offset))
                offset = end
            return records, 1 if offset != size else 0
        except OSError:
            return records, 1
        finally:
            os.close(fd)

    # --- scheduler-thread API ---

    def __len__(self) -> int:
        return len(self._index)

    @property
    def used_bytes(self) -> int:
        """Bytes of segment files stored or being written."""
        return self._used_bytes

    @property
    def num_segments(self) -> int:
        """Segment files stored or being written."""
        return len(self._segments)

    def location(self, key: OffloadKey) -> tuple[str, int, int] | None:
        """Return (segment path, record offset, record bytes) of a block, for diagnostics."""
        entry = self._index.get(key)
        if entry is None:
            return None
        return entry.segment.path, entry.offset, self._record_bytes(key)

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        entry = self._index.get(key)
        if entry is None:
            return False
        return None if entry.segment.writing else True

    @override
    def submit_store(self, job: JobMetadata) -> None:
        state = _Job(job)
        new: dict[OffloadKey, int] = {}
        for key, block_id in zip(job.keys, job.block_ids):
            if key in self._index or key in new:
                continue  # already stored or being written: nothing to do
            if len(key) > _MAX_KEY_BYTES:
                state.failed = True
                continue
            new[key] = block_id
        if self._closed:
            state.failed = True
            new.clear()
        plans: list[tuple[_Segment, list[tuple[OffloadKey, int]]]] = []
        chunk: list[tuple[OffloadKey, int]] = []
        chunk_bytes = 0
        for key, block_id in new.items():
            record_bytes = self._record_bytes(key)
            if chunk and chunk_bytes + record_bytes > self._max_segment_bytes:
                self._plan_segment(state, chunk, chunk_bytes, plans, job.keys)
                chunk, chunk_bytes = [], 0
            chunk.append((key, block_id))
            chunk_bytes += record_bytes
        if chunk:
            self._plan_segment(state, chunk, chunk_bytes, plans, job.keys)
        state.remaining = len(plans)
        if not plans:
            self._finish(state)
            return
        for segment, records in plans:
            self._pool.submit(self._write_task(state, segment, records), read=False)

    def _plan_segment(
        self,
        state: _Job,
        records: list[tuple[OffloadKey, int]],
        size: int,
        plans: list[tuple[_Segment, list[tuple[OffloadKey, int]]]],
        protected: Collection[OffloadKey],
    ) -> None:
        if not self._make_room(size, protected):
            state.failed = True
            return
        segment = _Segment(self._new_path(), size, writing=True)
        offset = 0
        for key, _block_id in records:
            segment.keys.add(key)
            self._index[key] = _Entry(segment, offset)
            offset += self._record_bytes(key)
        self._segments[segment] = None
        self._used_bytes += size
        state.segments.append(segment)
        plans.append((segment, records))

    @override
    def submit_load(self, job: JobMetadata) -> None:
        state = _Job(job)
        for key in job.keys:
            entry = self._index.get(key)
            if entry is None or entry.segment.writing:
                state.reads.clear()
                break
            state.reads.append((key, entry))
        if self._closed or len(state.reads) != len(job.keys) or not state.reads:
            state.failed = True
            state.reads.clear()
            self._finish(state)
            return
        state.remaining = len(state.reads)
        for (key, entry), block_id in zip(state.reads, job.block_ids):
            entry.segment.readers += 1
            self._segments.move_to_end(entry.segment)
            self._pool.submit(self._read_task(state, key, entry, block_id), read=True)

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        done, self._done = self._done, []
        completions = self._completions
        while completions:
            state, failure = completions.popleft()
            if failure is not None:
                state.failed = True
                state.failed_keys.append(failure)
            state.remaining -= 1
            if state.remaining == 0:
                done.append(state)
        results: list[JobResult] = []
        for state in done:
            if state.meta.is_promotion:
                self._settle_load(state)
            else:
                self._settle_store(state)
            results.append(JobResult(state.meta.job_id, not state.failed))
        return results

    def _settle_store(self, state: _Job) -> None:
        written: set[OffloadKey] = set()
        failed = set(state.failed_keys)
        for segment in state.segments:
            segment.writing = False
            if segment.path in failed:
                # Never announced, and its temporary file is already gone.
                self._forget(segment)
            else:
                written.update(segment.keys)
        stored = [key for key in dict.fromkeys(state.meta.keys) if key in written]
        if self._events is not None and stored:
            self._events.append(OffloadingEvent(stored, self.medium, removed=False))

    def _settle_load(self, state: _Job) -> None:
        failed = set(state.failed_keys)
        dropped: list[OffloadKey] = []
        for key, entry in state.reads:
            segment = entry.segment
            segment.readers -= 1
            if key in failed and self._index.get(key) is entry:
                # Corrupt, truncated or vanished: never offer this block again, not even after
                # a restart (its record is marked dead unless the whole segment goes).
                del self._index[key]
                segment.keys.discard(key)
                dropped.append(key)
                if segment.keys:
                    self._pool.submit(self._mark_dead_task(segment.path, entry.offset), read=False)
            if not segment.keys and segment.idle and segment in self._segments:
                self._forget(segment)
                self._pool.submit(self._delete_task(segment.path), read=False)
        self._announce_removed(dropped)

    def _forget(self, segment: _Segment) -> None:
        for key in segment.keys:
            del self._index[key]
        segment.keys.clear()
        del self._segments[segment]
        self._used_bytes -= segment.size

    def _evict(self, segment: _Segment, *, announce: bool) -> None:
        keys = list(segment.keys)
        self._forget(segment)
        if announce:
            self._announce_removed(keys)

    def _announce_removed(self, keys: list[OffloadKey]) -> None:
        if self._events is not None and keys:
            self._events.append(OffloadingEvent(keys, self.medium, removed=True))

    def _make_room(self, size: int, protected: Collection[OffloadKey]) -> bool:
        """Evict idle segments, least recently used first, until `size` more bytes fit.

        A segment holding one of `protected` (the storing job's keys, some of which may be
        stored already) is never evicted, so a job never evicts its own blocks.
        """
        if self._capacity is None or self._used_bytes + size <= self._capacity:
            return True
        protected_keys = set(protected)
        victims: list[_Segment] = []
        freed = 0
        for segment in self._segments:
            if self._used_bytes - freed + size <= self._capacity:
                break
            if segment.idle and segment.keys.isdisjoint(protected_keys):
                victims.append(segment)
                freed += segment.size
        if self._used_bytes - freed + size > self._capacity:
            return False
        for segment in victims:
            self._evict(segment, announce=True)
            self._pool.submit(self._delete_task(segment.path), read=False)
        return True

    def _new_path(self) -> str:
        self._last_generation = max(time.time_ns(), self._last_generation + 1)
        name = f"{self._last_generation:016x}"
        digest = hashlib.blake2b(name.encode(), digest_size=2).hexdigest()
        return os.path.join(self.root_dir, digest[:2], digest[2:], name + _SEGMENT_SUFFIX)

    def _finish(self, state: _Job) -> None:
        self._done.append(state)

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        # Reversed, so the segment of the request's first block ends up the most recent.
        for key in reversed(list(keys)):
            entry = self._index.get(key)
            if entry is not None:
                self._segments.move_to_end(entry.segment)

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

    def _task_done(self, state: _Job, failure: OffloadKey | str | None) -> None:
        """Post one task's outcome (failure: the block or segment that failed, or None)."""
        self._completions.append((state, failure))

    def _write_task(
        self, state: _Job, segment: _Segment, records: list[tuple[OffloadKey, int]]
    ) -> _Task:
        def run() -> None:
            ok = self._write_segment(segment.path, records)
            self._task_done(state, None if ok else segment.path)

        return _Task(run, lambda: self._task_done(state, segment.path))

    def _read_task(self, state: _Job, key: OffloadKey, entry: _Entry, block_id: int) -> _Task:
        path, offset = entry.segment.path, entry.offset

        def run() -> None:
            ok = self._read_record(key, path, offset, block_id)
            self._task_done(state, None if ok else key)

        return _Task(run, lambda: self._task_done(state, key))

    def _delete_task(self, path: str) -> _Task:
        # Run even when cancelled by shutdown: a restart must not find the data again.
        return _Task(lambda: _unlink_quietly(path), lambda: _unlink_quietly(path))

    def _mark_dead_task(self, path: str, offset: int) -> _Task:
        def run() -> None:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.pwrite(fd, _DEAD_MAGIC, offset)
                finally:
                    os.close(fd)
            except OSError as exc:
                logger.debug("could not mark the record at %s:%d dead: %s", path, offset, exc)

        return _Task(run, run)

    def _write_segment(self, path: str, records: list[tuple[OffloadKey, int]]) -> bool:
        tmp_path = path + _TMP_SUFFIX
        try:
            directory = os.path.dirname(path)
            if directory not in self._made_dirs:
                os.makedirs(directory, exist_ok=True)
                self._made_dirs.add(directory)
            fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                # One record per system call, checksummed just before it is written: the
                # payload is still in cache for the copy, and no call grows past one block.
                for key, block_id in records:
                    payload = self._primary.row(block_id)
                    header = _HEADER.pack(
                        _MAGIC, _FORMAT_VERSION, len(key), zlib.crc32(payload), len(payload)
                    )
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

    def _read_record(self, key: bytes, path: str, offset: int, block_id: int) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                header = bytearray(_HEADER.size + len(key))
                dest = self._primary.row(block_id)
                # One system call for header, key and payload, straight into the primary slot.
                if not _read_exact_into(fd, [memoryview(header), dest], offset):
                    raise _CorruptBlock("truncated record")
                magic, version, key_len, crc, payload_len = _HEADER.unpack_from(header)
                if (
                    magic != _MAGIC
                    or version != _FORMAT_VERSION
                    or key_len != len(key)
                    or payload_len != self.block_bytes
                    or bytes(header[_HEADER.size :]) != key
                ):
                    raise _CorruptBlock("header")
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
            f"segments={len(self._segments)}, used_bytes={self._used_bytes}, "
            f"capacity_bytes={self._capacity})"
        )


class _CorruptBlock(Exception):
    """A record does not hold what the index promises."""


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            logger.debug("could not delete %s: %s", path, exc)
