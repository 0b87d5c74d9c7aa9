"""`FileSystemSecondaryTier`: the tier's scheduler-thread API, its index, capacity and eviction,
and the tasks it queues for its I/O threads, whose file work is `SegmentIO`'s (the design is in
the package docstring, `kvref.tiering.fs`)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from typing_extensions import override

from kvref.base import OffloadingEvent, OffloadKey, ReqContext
from kvref.tiering._options import (
    check_bool,
    check_int,
    check_optional_int,
    check_path,
    check_str,
)
from kvref.tiering.base import (
    JobMetadata,
    JobResult,
    PrimaryBlocks,
    SecondaryTierManager,
)
from kvref.tiering.fs.format import MAX_KEY_BYTES, RECORD_HEADER_BYTES
from kvref.tiering.fs.index import SEGMENT_SUFFIX, Entry, Run, Segment, index_root, unlink_quietly
from kvref.tiering.fs.job import FsJob
from kvref.tiering.fs.pool import DualQueuePool, IOTask, default_threads
from kvref.tiering.fs.root import open_root, release_root
from kvref.tiering.fs.segment_io import SegmentIO, plan_read_tasks

__all__ = ["FileSystemSecondaryTier"]

logger = logging.getLogger(__name__)


class FileSystemSecondaryTier(SecondaryTierManager):
    """Secondary tier storing checksummed block records in segment files under `root_dir`.

    Args:
        primary_kv_view: the primary's `(num_blocks, row_items)` memoryview (any item format).
        root_dir: the directory holding the blocks; created (with its parents) if missing.
            Used by one tier at a time (see the module docstring); sharing its blocks between
            processes over time needs keys hashed with the same seed.
        capacity_bytes: evict least recently used segments to keep segment files under this
            many bytes; None for no limit.
        max_segment_bytes: split a store job's blocks into segment files of at most this many
            bytes (at least one block each): fewer files versus more parallel writers.
        n_read_threads: I/O threads that serve loads (promotions) first; None for one per
            usable core, 1 to 4 (`kvref.tiering.fs.pool.default_threads`).
        n_write_threads: I/O threads that serve stores and deletions first; None for one per
            two usable cores, 1 to 4.
        fsync: `fsync` each segment before renaming it into place (durable, slower).
        name: the medium named in events.
        enable_events: buffer stored/removed events for `take_events`.

    Raises:
        ValueError: an argument has the wrong type or is out of range (the message names it).
        TierRootError: (an `OSError`) `root_dir` is unusable: it cannot be created, is not a
            directory, cannot be written while empty, holds blocks of another size or format,
            or another tier holds it; the message names the path.
    """

    def __init__(
        self,
        primary_kv_view: memoryview[Any],
        root_dir: str | os.PathLike[str],
        *,
        capacity_bytes: int | None = None,
        max_segment_bytes: int = 16 << 20,
        n_read_threads: int | None = None,
        n_write_threads: int | None = None,
        fsync: bool = False,
        name: str = "fs",
        enable_events: bool = False,
    ) -> None:
        self.root_dir = check_path("root_dir", root_dir)
        capacity = check_optional_int("capacity_bytes", capacity_bytes, minimum=1)
        self._max_segment_bytes = check_int("max_segment_bytes", max_segment_bytes, minimum=1)
        n_read = check_optional_int("n_read_threads", n_read_threads, minimum=1)
        n_write = check_optional_int("n_write_threads", n_write_threads, minimum=1)
        self.n_read_threads = default_threads(read=True) if n_read is None else n_read
        self.n_write_threads = default_threads(read=False) if n_write is None else n_write
        self.fsync = check_bool("fsync", fsync)
        self.medium = check_str("name", name)
        events = check_bool("enable_events", enable_events)
        self._primary = PrimaryBlocks(primary_kv_view)
        self.block_bytes = self._primary.block_bytes
        if capacity is not None and capacity < self.block_bytes:
            raise ValueError(
                f"capacity_bytes must be None or at least one block ({self.block_bytes} bytes), "
                f"got {capacity_bytes}"
            )
        self._capacity = capacity
        self._used_bytes = 0
        self._evicted_blocks = 0
        self._index: dict[OffloadKey, Entry] = {}
        # Segments in least-recently-used order.
        self._segments: OrderedDict[Segment, None] = OrderedDict()
        self._events: list[OffloadingEvent] | None = [] if events else None
        self._last_generation = 0
        # Jobs finished without I/O, and per-task completions posted by the I/O threads
        # (deque appends and pops are atomic: the scheduler thread never waits on a lock that
        # an I/O thread could hold).
        self._done: list[FsJob] = []
        self._waiting: list[FsJob] = []  # stores done but for blocks other jobs are writing
        self._completions: deque[tuple[FsJob, Sequence[OffloadKey | str], float, float]] = deque()
        self._closed = False

        try:
            self._lock_fd: int | None = open_root(self.root_dir, self.block_bytes)
        except BaseException:
            self._primary.release()
            raise
        try:
            self._reindex()
        except BaseException:
            self._release_root()
            self._primary.release()
            raise
        self._io = SegmentIO(self._primary, fsync=self.fsync, medium=self.medium)
        self._pool = DualQueuePool(
            self.n_read_threads, self.n_write_threads, f"kvref-{self.medium}"
        )

    # --- start-up ---

    def _release_root(self) -> None:
        if self._lock_fd is not None:
            release_root(self._lock_fd)
            self._lock_fd = None

    def _record_bytes(self, key: bytes) -> int:
        return RECORD_HEADER_BYTES + len(key) + self.block_bytes

    def _reindex(self) -> None:
        found = index_root(self.root_dir, self.block_bytes)
        self._index = found.index
        self._last_generation = found.last_generation
        for segment in found.segments:
            self._segments[segment] = None
            self._used_bytes += segment.size
        if self._capacity is not None:
            while self._used_bytes > self._capacity and self._segments:
                segment = next(iter(self._segments))
                self._evict(segment, announce=False)
                unlink_quietly(segment.path)
        if found.stale_tmp or found.skipped or self._index:
            logger.info(
                "fs tier %s: re-indexed %d blocks in %d segments, removed %d stale temporary "
                "files, skipped %d damaged records",
                self.root_dir,
                len(self._index),
                len(self._segments),
                found.stale_tmp,
                found.skipped,
            )


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
    def num_evicted_blocks(self) -> int:
        return self._evicted_blocks

    @override
    def usage(self) -> float | None:
        return None if self._capacity is None else self._used_bytes / self._capacity

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        entry = self._index.get(key)
        if entry is None:
            return False
        return None if entry.segment.writing else True

    @override
    def contains(self, keys: Sequence[OffloadKey]) -> list[bool]:
        # The in-memory index is the truth (the root is this process's alone); a dict read is
        # atomic, so another thread may ask while the scheduler thread updates it.
        index = self._index
        answers: list[bool] = []
        for key in keys:
            entry = index.get(key)
            answers.append(entry is not None and not entry.segment.writing)
        return answers

    @override
    def submit_store(self, job: JobMetadata) -> None:
        state = FsJob(job)
        new: dict[OffloadKey, int] = {}
        for key, block_id in zip(job.keys, job.block_ids):
            if key in new:
                continue
            entry = self._index.get(key)
            if entry is not None:
                if entry.segment.writing:  # another job is writing it: done when that is
                    state.awaited.append((key, entry.segment))
                continue  # already stored: nothing to do
            if len(key) > MAX_KEY_BYTES:
                state.failed = True
                continue
            new[key] = block_id
        if self._closed:
            state.failed = True
            new.clear()
        plans: list[tuple[Segment, list[tuple[OffloadKey, int]]]] = []
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
        state: FsJob,
        records: list[tuple[OffloadKey, int]],
        size: int,
        plans: list[tuple[Segment, list[tuple[OffloadKey, int]]]],
        protected: Collection[OffloadKey],
    ) -> None:
        if not self._make_room(size, protected):
            state.failed = True
            return
        segment = Segment(self._new_path(), size, writing=True)
        offset = 0
        for key, _block_id in records:
            segment.keys.add(key)
            self._index[key] = Entry(segment, offset)
            offset += self._record_bytes(key)
        self._segments[segment] = None
        self._used_bytes += size
        state.segments.append(segment)
        plans.append((segment, records))

    @override
    def submit_load(self, job: JobMetadata) -> None:
        state = FsJob(job)
        block_ids: list[int] = []
        for key, block_id in zip(job.keys, job.block_ids):
            entry = self._index.get(key)
            if entry is None or entry.segment.writing:
                # Missing: the job fails, but the blocks that are here still load (and are
                # reported in `successful_keys`, so the manager keeps them).
                state.failed = True
                state.failed_keys.append(key)
                continue
            state.reads.append((key, entry))
            block_ids.append(block_id)
        if self._closed or not state.reads:
            state.failed = True
            state.reads.clear()
            self._finish(state)
            return
        tasks = plan_read_tasks(state.reads, block_ids, self.block_bytes)
        state.remaining = len(tasks)
        for key, entry in state.reads:
            entry.segment.readers += 1
            self._segments.move_to_end(entry.segment)
        for path, runs in tasks:
            self._pool.submit(self._read_task(state, path, runs), read=True)

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        done, self._done = self._done, []
        completions = self._completions
        while completions:
            state, failures, start, end = completions.popleft()
            if failures:
                state.failed = True
                state.failed_keys.extend(failures)
            state.add_span(start, end)
            state.remaining -= 1
            if state.remaining == 0:
                done.append(state)
        finished: list[FsJob] = []
        for state in done:
            if state.meta.is_promotion:
                self._settle_load(state)
            else:
                self._settle_store(state)
            (self._waiting if state.awaited else finished).append(state)
        # Stores relying on other jobs' writes finish once those settled: in this same poll
        # when those jobs finished, so a drain followed by one poll reports every job.
        waiting, self._waiting = self._waiting, []
        for state in waiting:
            if any(segment.writing for _key, segment in state.awaited):
                self._waiting.append(state)
                continue
            if any(self._index.get(key) is None for key, _segment in state.awaited):
                state.failed = True  # the write it relied on failed: that block is not stored
            finished.append(state)
        return [state.result(self.block_bytes) for state in finished]

    def _settle_store(self, state: FsJob) -> None:
        written: set[OffloadKey] = set()
        failed = set(state.failed_keys)
        for segment in state.segments:
            segment.writing = False
            if segment.path in failed:
                # Never announced, and its temporary file is already gone.
                self._forget(segment)
            else:
                written.update(segment.keys)
        state.moved = len(written)
        stored = [key for key in dict.fromkeys(state.meta.keys) if key in written]
        if self._events is not None and stored:
            self._events.append(OffloadingEvent(stored, self.medium, removed=False))

    def _settle_load(self, state: FsJob) -> None:
        failed = set(state.failed_keys)
        dropped: list[OffloadKey] = []
        state.moved = sum(key not in failed for key, _entry in state.reads)
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

    def _forget(self, segment: Segment) -> None:
        for key in segment.keys:
            del self._index[key]
        segment.keys.clear()
        del self._segments[segment]
        self._used_bytes -= segment.size

    def _evict(self, segment: Segment, *, announce: bool) -> None:
        keys = list(segment.keys)
        self._evicted_blocks += len(keys)
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
        victims: list[Segment] = []
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
        return os.path.join(self.root_dir, digest[:2], digest[2:], name + SEGMENT_SUFFIX)

    def _finish(self, state: FsJob) -> None:
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
        self._release_root()

    # --- I/O threads ---

    def _task_done(
        self, state: FsJob, failures: Sequence[OffloadKey | str], start: float | None = None
    ) -> None:
        """Post one task's outcome (the blocks or the segment that failed; empty: success).

        `start` is when the task began its I/O (None: cancelled before any).
        """
        end = time.monotonic()
        self._completions.append((state, failures, end if start is None else start, end))

    def _write_task(
        self, state: FsJob, segment: Segment, records: list[tuple[OffloadKey, int]]
    ) -> IOTask:
        def run() -> None:
            start = time.monotonic()
            ok = self._io.write_segment(segment.path, records)
            self._task_done(state, () if ok else (segment.path,), start)

        return IOTask(run, lambda: self._task_done(state, (segment.path,)))

    def _read_task(self, state: FsJob, path: str, runs: list[Run]) -> IOTask:
        def run() -> None:
            start = time.monotonic()
            self._task_done(state, self._io.read_runs(path, runs), start)

        return IOTask(run, lambda: self._task_done(state, [key for _, run in runs for key, _ in run]))

    def _delete_task(self, path: str) -> IOTask:
        # Run even when cancelled by shutdown: a restart must not find the data again.
        return IOTask(lambda: unlink_quietly(path), lambda: unlink_quietly(path))

    def _mark_dead_task(self, path: str, offset: int) -> IOTask:
        def run() -> None:
            self._io.mark_dead(path, offset)

        return IOTask(run, run)

    @override
    def __repr__(self) -> str:
        return (
            f"FileSystemSecondaryTier({str(self.root_dir)!r}, blocks={len(self._index)}, "
            f"segments={len(self._segments)}, used_bytes={self._used_bytes}, "
            f"capacity_bytes={self._capacity})"
        )

