"""`FileSystemSecondaryTier`: the tier's scheduler-thread API and its bookkeeping of jobs; the I/O
threads run `JobTasks` (`kvref.tiering.fs.tasks`), whose file work is `BlockIO`'s and whose
room-making is `RootCapacity`'s; existence checks run on an `AsyncLookupManager`'s thread, as in
vLLM's fs tier (the design is in the package docstring, `kvref.tiering.fs`)."""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import override

from kvref.base import (
    ConfigInfoMapping,
    LookupResult,
    Medium,
    OffloadingConnectorStats,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from kvref.tiering._options import check_bool, check_locality, check_optional_int, check_path, check_seconds
from kvref.tiering.backpressure import BackpressureDetector
from kvref.tiering.base import JobResult, PrimaryBlocks, SecondaryTierManager, TransferJob
from kvref.tiering.fs.block_io import BlockIO, ReadProblem, Transfer, WriteOutcome
from kvref.tiering.fs.capacity import RootCapacity
from kvref.tiering.fs.format import MAX_KEY_BYTES, file_bytes, header_bytes
from kvref.tiering.fs.job import BlockWrite, FsJob
from kvref.tiering.fs.pool import DualQueuePool, IOTask, default_threads
from kvref.tiering.fs.reports import BlockFileLookups, BlockReports, FileSystemTierInfo
from kvref.tiering.fs.tasks import JobTasks, Outcome
from kvref.tiering.fs.root import block_name, fanout_dir, open_root, probe_o_direct, writer_token
from kvref.tiering.run_identity import run_identity
from kvref.tiering.tier_reporting import TierEvents, tier_metric_definitions

if TYPE_CHECKING:
    from kvref.base import OffloadingSpec

__all__ = ["FileSystemSecondaryTier", "FileSystemTierInfo"]

logger = logging.getLogger(__name__)

_TASK_BYTES = 4 << 20
"""One I/O task moves blocks of up to this many bytes (at least one block): fewer hand-overs
for small blocks, while a large job still spreads over every I/O thread."""
_MARK_INTERVAL_S = 1.0
"""A block marked used less than this long ago by this engine is not marked again (a `touch` of
a long prefix every step would otherwise cost a metadata write per block per step)."""
_MAX_MARKED = 1 << 16


class FileSystemSecondaryTier(SecondaryTierManager):
    """Secondary tier of checksummed block files under `root_dir`, shared by every engine (and
    host) that opens the same root.

    Args:
        offloading_spec, primary_kv_view, tier_type, backpressure_detector: as every tier
            (`SecondaryTierManager`); the primary's view may have any item format.
        root_dir: the blocks go under `root_dir/<run identity>` (`kvref.tiering.run_identity`:
            the directory vLLM's own fs tier would use), created with its parents if missing,
            so that engines of other models or KV layouts never read them. Any number of
            tiers, in any processes or hosts, may use it at once; they share blocks when their
            keys are hashed with the same seed.
        capacity_bytes: keep the block files of the whole root (whichever engines wrote them)
            under this many bytes, evicting the least recently used ones; None for no limit.
            Engines sharing a root should give the same value: each enforces its own.
        n_read_threads: I/O threads that serve loads (promotions) first; None for the default
            (`kvref.tiering.fs.pool.default_threads`). They take stores when no load is
            queued, except where stores are pipelined: O_DIRECT, the C path, no capacity.
        n_write_threads: I/O threads that serve stores first, and loads when no store is
            queued; None for the default. Where stores are pipelined, they run on these alone.
        fsync: `fsync` each block file before renaming it into place (durable, slower).
        page_cache: keep blocks in the page cache: buffered I/O whose pages stay cached. Off by
            default (O_DIRECT, or buffered I/O whose pages are dropped once clean); worth it
            only where spare DRAM should serve repeated loads of a small hot set.
        huge_page_staging: with O_DIRECT, move each block file through a per-I/O-thread
            buffer on transparent huge pages and copy the payload to or from its row (a device
            takes a huge page as one segment, 4 KiB pages one by one: twice the speed on the
            disk measured in `BENCHMARKS.md`). Costs a memory copy per block and a buffer per
            I/O thread, made at start-up: blocks of 1 MiB and more take their payload rounded
            up to 2 MiB each, smaller ones share huge pages. None (the default) stages where
            the kernel grants transparent huge pages (`always` or `madvise`); False moves
            payloads straight between the file and the row, which pays where the primary
            itself is on huge pages. `self.transfer` says which.
        stale_tmp_s: another writer's temporary file older than this many seconds belongs to a
            dead writer and is deleted by whoever finds it (at most 3600).
        enable_kv_events: emit stored/removed events (also needs the spec's global flag).
        locality: "LOCAL" or "REMOTE", for events and load tier filters; None if unknown.

    Raises:
        ValueError: an argument has the wrong type or is out of range (the message names it).
        TierRootError: (an `OSError`) `root_dir` is unusable: it cannot be created, is not a
            directory, cannot be written while new, or holds blocks of another size or format;
            the message names the path.
    """

    medium: ClassVar[Medium | None] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        *,
        root_dir: str | os.PathLike[str],
        capacity_bytes: int | None = None,
        n_read_threads: int | None = None,
        n_write_threads: int | None = None,
        fsync: bool = False,
        page_cache: bool = False,
        huge_page_staging: bool | None = None,
        stale_tmp_s: float = 900.0,
        enable_kv_events: bool = False,
        locality: str | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.root_dir = check_path("root_dir", root_dir) / run_identity(offloading_spec)
        """The directory of this engine configuration's blocks (the root of the design)."""
        capacity = check_optional_int("capacity_bytes", capacity_bytes, minimum=1)
        n_read = check_optional_int("n_read_threads", n_read_threads, minimum=1)
        n_write = check_optional_int("n_write_threads", n_write_threads, minimum=1)
        self.fsync = check_bool("fsync", fsync)
        self.page_cache = check_bool("page_cache", page_cache)
        staging = None if huge_page_staging is None else check_bool("huge_page_staging", huge_page_staging)
        stale_tmp = check_seconds("stale_tmp_s", stale_tmp_s, maximum=3600.0)
        self.locality = check_locality("locality", locality)
        events = check_bool("enable_kv_events", enable_kv_events)
        self._primary = PrimaryBlocks(primary_kv_view)
        self.block_bytes = self._primary.block_bytes
        self.file_bytes = file_bytes(32, self.block_bytes)
        """The size of one block file of a 32-byte key (vLLM's and kvref's keys)."""
        if capacity is not None and capacity < self.file_bytes:
            self._primary.release()
            raise ValueError(
                f"capacity_bytes must be None or at least one block file ({self.file_bytes} "
                f"bytes), got {capacity_bytes}"
            )
        try:
            open_root(self.root_dir, self.block_bytes)
        except BaseException:
            self._primary.release()
            raise
        self.direct = not self.page_cache and probe_o_direct(self.root_dir)
        if not self.direct and not self.page_cache:
            logger.warning(
                "fs tier %s: %s does not take O_DIRECT; using buffered I/O and dropping the "
                "pages of each block once written back",
                tier_type,
                self.root_dir,
            )
        threads = functools.partial(default_threads, direct=self.direct, file_bytes=self.file_bytes)
        self.n_read_threads = threads(read=True) if n_read is None else n_read
        self.n_write_threads = threads(read=False) if n_write is None else n_write
        self._token = writer_token()
        self._io = BlockIO(
            self._primary,
            direct=self.direct,
            keep_page_cache=self.page_cache,
            fsync=self.fsync,
            token=self._token,
            huge_page_staging=staging,
        )
        self._capacity = RootCapacity(
            self.root_dir,
            capacity,
            self.file_bytes,
            token=self._token,
            stale_tmp_s=stale_tmp,
        )
        self._dirs = [os.path.join(self.root_dir, f"{index:02x}") for index in range(256)]

        # --- scheduler-thread state ---
        self._writing: dict[OffloadKey, BlockWrite] = {}
        self._reading: Counter[str] = Counter()  # file names being loaded (read by I/O threads)
        self._unreadable: set[str] = set()  # files that failed with an I/O error: misses here
        # File names this engine marked used lately, and when: `touch` marks each at most once
        # a second (a long prefix touched every step would be a metadata write per block).
        self._marked: OrderedDict[str, float] = OrderedDict()
        self._reports = BlockReports(
            TierEvents(events, offloading_spec, Medium.STORAGE, self.locality, tier_type), self._capacity
        )
        self._info = FileSystemTierInfo(capacity, self.fsync)
        self._done: list[FsJob] = []
        self._waiting: list[FsJob] = []  # stores done but for blocks other jobs are writing
        self._closed = False
        self._tasks = JobTasks(self._io, self._capacity, self._dirs, self._reading, tier_type)
        self._lookup_manager = BlockFileLookups(tier_type, self.block_path)

        # Stores are pipelined (each block's checksum and copy made while the one before is
        # written) where the C path writes a task's blocks in one call: a bounded root stores
        # one block per call, to make room for each as it lands. Pipelined O_DIRECT stores run
        # on the write threads alone (`default_threads` says why); other stores want the read
        # threads' help (1 MiB stores into a bounded root: 0.84x of the device with it, 0.81x
        # without, in one 5-round run).
        pipelined = self.direct and self._io.native and capacity is None
        self._io.prepare_threads(
            self.n_read_threads + self.n_write_threads, self.n_write_threads if pipelined else 0
        )
        self._pool = DualQueuePool(
            self.n_read_threads,
            self.n_write_threads,
            f"kvref-{tier_type}",
            read_threads_take_writes=not pipelined,
        )
        # Learn the root's usage and remove dead writers' temporary files, off the caller's
        # thread (a root of millions of files takes a while to list).
        self._pool.submit(
            IOTask(lambda: self._capacity.sweep(lambda: self._closed), lambda: None), read=False
        )

    # --- paths ---

    def block_path(self, key: OffloadKey) -> str:
        """Return the path of `key`'s block file (whether or not it exists)."""
        name = block_name(key)
        return os.path.join(self._dirs[fanout_dir(name)], name)

    def location(self, key: OffloadKey) -> tuple[str, int, int] | None:
        """Return (file path, payload offset, file bytes) of a block held now, for diagnostics."""
        path = self.block_path(key)
        try:
            size = os.stat(path).st_size
        except OSError:
            return None
        return path, header_bytes(len(key)), size

    # --- stats ---

    @property
    def transfer(self) -> Transfer:
        """How payloads move between the device and the rows."""
        return self._io.transfer

    @property
    def used_bytes(self) -> int:
        """Bytes of the root's block files as last listed, plus this engine's writes in flight."""
        return self._capacity.used_bytes

    @classmethod
    @override
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        return tier_metric_definitions()

    @override
    def get_stats(self) -> OffloadingConnectorStats:
        self._reports.report_evictions()
        capacity = self._capacity.capacity_bytes
        usage = None if capacity is None else min(1.0, self._capacity.used_bytes / capacity)
        return self._reports.counters.take_stats(self.tier_type, usage)

    @classmethod
    @override
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return FileSystemTierInfo.config_info_keys()

    @override
    def config_info(self) -> ConfigInfoMapping:
        return self._info.as_config_info()

    # --- requests and lookups ---

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._writing:
            return LookupResult.RETRY  # this engine's write is in flight: ask again
        if self._closed or block_name(key) in self._unreadable:
            return LookupResult.MISS
        found = self._lookup_manager.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY  # checked on the lookup thread after this step
        return LookupResult.HIT if found else LookupResult.MISS

    @override
    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookup_manager.flush()

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookup_manager.cleanup(req_context.req_id)

    # --- stores ---

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        state = FsJob(job := job_metadata)
        new: dict[OffloadKey, int] = {}
        for key, block_id in zip(job.keys, job.chunk_ids):
            if key in new:
                continue
            pending = self._writing.get(key)
            if pending is not None:  # another job of this engine is writing it
                state.awaited.append(pending)
                continue
            if len(key) > MAX_KEY_BYTES:
                state.failed = True
                state.failed_keys.append(key)
                continue
            new[key] = block_id
        if self._closed:
            state.failed = True
            new.clear()
        if not new:
            self._done.append(state)
            return
        protected = frozenset(block_name(key) for key in job.keys)
        tasks: list[list[tuple[OffloadKey, int]]] = [[]]
        task_bytes = 0
        for key, block_id in new.items():
            write = BlockWrite(key)
            self._writing[key] = write
            state.writes.append(write)
            if tasks[-1] and task_bytes + self.block_bytes > _TASK_BYTES:
                tasks.append([])
                task_bytes = 0
            tasks[-1].append((key, block_id))
            task_bytes += self.block_bytes
        state.remaining = len(tasks)
        for blocks in tasks:
            self._pool.submit(self._tasks.write(state, blocks, protected), read=False)

    # --- loads ---

    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        state = FsJob(job := job_metadata)
        tasks: list[list[tuple[OffloadKey, str, int]]] = [[]]
        task_bytes = 0
        for key, block_id in zip(job.keys, job.chunk_ids):
            name = block_name(key)
            if key in self._writing or name in self._unreadable or self._closed:
                # Not readable here: the job fails, but the blocks that are here still load
                # (and are reported in `successful_keys`, so the manager keeps them).
                state.failed = True
                state.failed_keys.append(key)
                continue
            state.reads.append((key, name))
            if tasks[-1] and task_bytes + self.block_bytes > _TASK_BYTES // 2:
                tasks.append([])
                task_bytes = 0
            tasks[-1].append((key, name, block_id))
            task_bytes += self.block_bytes
        if not state.reads:
            self._done.append(state)
            return
        for _key, name in state.reads:
            self._reading[name] += 1
            self._marked[name] = time.monotonic()  # the load marks it used
        state.remaining = len(tasks)
        for blocks in tasks:
            self._pool.submit(self._tasks.read(state, blocks), read=True)

    # --- results ---

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        done, self._done = self._done, []
        completions = self._tasks.completions
        while completions:
            state, outcomes, start, end = completions.popleft()
            if state.meta.is_promotion:
                self._settle_reads(state, outcomes)
            else:
                self._settle_writes(state, outcomes)
            state.add_span(start, end)
            state.remaining -= 1
            if state.remaining == 0:
                done.append(state)
        # Blocks evicted to make room for these stores went first: removed before stored.
        self._reports.report_evictions()
        finished: list[FsJob] = []
        for state in done:
            if not state.meta.is_promotion:
                self._announce_stored(state)
            (self._waiting if state.awaited else finished).append(state)
        # Stores relying on other jobs' writes finish once those settled: in this same poll
        # when those jobs finished, so a drain followed by one poll reports every job.
        waiting, self._waiting = self._waiting, []
        for state in waiting:
            if not all(write.done for write in state.awaited):
                self._waiting.append(state)
                continue
            if not all(write.ok for write in state.awaited):
                state.failed = True  # the write it relied on failed: that block is not stored
            finished.append(state)
        return [state.result(self.block_bytes) for state in finished]

    def _settle_writes(self, state: FsJob, outcomes: list[Outcome]) -> None:
        writes = {write.key: write for write in state.writes}
        for key, outcome in outcomes:
            write = writes[key]
            write.done = True
            write.ok = outcome is WriteOutcome.WRITTEN or outcome is WriteOutcome.EXISTED
            self._reports.counters.chunks_stored += outcome is WriteOutcome.WRITTEN
            if self._writing.get(key) is write:
                del self._writing[key]
            if write.ok:
                state.moved += 1
                self._unreadable.discard(block_name(key))
            else:
                state.failed = True
                state.failed_keys.append(key)

    def _settle_reads(self, state: FsJob, outcomes: list[Outcome]) -> None:
        removed: list[str] = []
        lost: list[OffloadKey] = []
        for key, problem in outcomes:
            name = block_name(key)
            self._reading[name] -= 1
            if self._reading[name] <= 0:
                del self._reading[name]
            if problem is None:
                state.moved += 1
                continue
            state.failed = True
            state.failed_keys.append(key)
            lost.append(key)
            if problem is ReadProblem.UNREADABLE:
                self._unreadable.add(name)  # never promoted again by this engine
            else:
                removed.append(name)  # missing or damaged (and deleted): gone for every engine
        self._reports.counters.chunks_loaded += len(outcomes) - len(lost)
        self._reports.counters.chunks_lost += len(lost)
        # As vLLM's fs tier: the lost blocks answer MISS from now on, so that the manager does
        # not promote them again and again.
        self._lookup_manager.mark_miss(lost)
        self._reports.removed(removed)

    def _announce_stored(self, state: FsJob) -> None:
        ok = {write.key for write in state.writes if write.ok}
        ok.update(write.key for write in state.awaited if write.ok)
        self._reports.stored((block_name(key), key) for key in dict.fromkeys(state.meta.keys) if key in ok)

    # --- recency ---

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if self._closed:
            return
        now = time.monotonic()
        marked = self._marked
        paths: list[str] = []
        for key in keys:
            name = block_name(key)
            last = marked.get(name)
            if last is not None and now - last < _MARK_INTERVAL_S:
                continue
            marked[name] = now
            marked.move_to_end(name)
            paths.append(os.path.join(self._dirs[fanout_dir(name)], name))
        while len(marked) > _MAX_MARKED:
            marked.popitem(last=False)
        if paths:
            # A metadata write per block, off the scheduler thread; absent files are skipped.
            self._pool.submit(IOTask(lambda: self._io.mark_used(paths), lambda: None), read=False)

    # --- the rest of the contract ---

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        self._reports.report_evictions()
        return self._reports.events.take()

    @override
    def drain_jobs(self) -> None:
        self._pool.drain()

    @override
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._lookup_manager.shutdown()
        self._pool.shutdown()
        self._primary.release()

    def __len__(self) -> int:
        """Block files in the root as last listed (0 until a listing; unbounded: not listed)."""
        return self._capacity.files_found

    @override
    def __repr__(self) -> str:
        return (
            f"FileSystemSecondaryTier({str(self.root_dir)!r}, direct={self.direct}, "
            f"transfer={self.transfer.value!r}, "
            f"used_bytes={self.used_bytes}, capacity_bytes={self._capacity.capacity_bytes})"
        )
