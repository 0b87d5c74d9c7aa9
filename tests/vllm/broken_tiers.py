"""Broken vLLM secondary tiers, one bug each, for the conformance kit to catch.

Each is the example `DictTier` (examples/vllm_dict_tier) with one fault an author could make;
`BREAKS` says which rule of `SecondaryTierContract` each one breaks (`FOUND_BY`: the test that
shows it, where that is another rule's). Loaded by vLLM's factory from
`{"type": <class name>, "module_path": "tests.vllm.broken_tiers"}`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
from typing_extensions import override
from vllm.v1.kv_offload.base import LookupResult, Medium, OffloadingEvent, OffloadKey, ReqContext
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob

from examples.vllm_dict_tier.dict_tier import DictTier

__all__ = ["BREAKS", "FOUND_BY", "PERSISTENT"]


class ReportsJobsTwice(DictTier):
    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        finished = list(super().get_finished_jobs())
        return finished + finished


class ReportsUnknownJob(DictTier):
    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        finished = list(super().get_finished_jobs())
        return finished + [JobResult(job_id=10**9, success=True)] if finished else finished


class LosesEveryThirdJob(DictTier):
    _count = 0

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        kept: list[JobResult] = []
        for result in super().get_finished_jobs():
            self._count += 1
            if self._count % 3:
                kept.append(result)
        return kept


class ReportsOnePollLate(DictTier):
    """Results surface one poll after they are ready (a queue flushed lazily)."""

    _held: list[JobResult] = []

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        ready, self._held = self._held, list(super().get_finished_jobs())
        return ready


class LoadsWrongBytes(DictTier):
    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        super().submit_load(job_metadata)
        for row in job_metadata.chunk_ids.tolist():
            if 0 <= row < len(self._rows):
                self._rows[row, 7] ^= 0x5A


class LoadsIntoTheWrongRows(DictTier):
    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        rows = (job_metadata.chunk_ids[::-1]).copy()
        super().submit_load(TransferJob(job_metadata.job_id, job_metadata.keys, rows, True, job_metadata.req_context))


class FailedLoadReportedOk(DictTier):
    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        super().submit_load(job_metadata)
        last = self._finished.pop()
        self._finished.append(JobResult(last.job_id, success=True))


class ListsMissingBlocksAsLoaded(DictTier):
    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        super().submit_load(job_metadata)
        last = self._finished.pop()
        keys = None if last.success else tuple(job_metadata.keys)
        self._finished.append(JobResult(last.job_id, last.success, successful_keys=keys))


class EventsWithTheFlagOff(DictTier):
    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str, **options: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, **options)
        if options.get("enable_kv_events"):
            self._events = []  # ignores vLLM's global flag


class EventsForLoads(DictTier):
    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        super().submit_load(job_metadata)
        if self._events is not None:
            self._events.append(OffloadingEvent(list(job_metadata.keys), Medium.CPU, removed=False, locality=self.locality))


class EventsForFailedStores(DictTier):
    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        super().submit_store(job_metadata)
        if self._events is not None and not self._finished[-1].success:
            self._events.append(OffloadingEvent(list(job_metadata.keys), Medium.CPU, removed=False, locality=self.locality))


class LosesEvents(DictTier):
    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        return list(super().take_events())[:1]


class DoublesEvents(DictTier):
    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        events = list(super().take_events())
        return events + events


class EventsWithoutLocality(DictTier):
    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        return [OffloadingEvent(e.keys, e.medium, e.removed) for e in super().take_events()]


class IgnoresLocality(DictTier):
    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str, **options: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, **options)
        self.locality = None


class HitForEverything(DictTier):
    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT


class ForgetsStores(DictTier):
    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        super().submit_store(job_metadata)
        self._blocks.clear()


class RetriesForever(DictTier):
    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.RETRY


class AnswersHitPending(DictTier):
    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        answer = super().lookup(key, req_context)
        return LookupResult.HIT_PENDING if answer is LookupResult.HIT else answer


class CopiesSlowlyOnTheSchedulerThread(DictTier):
    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        time.sleep(0.25)  # a synchronous write to a slow disk
        super().submit_store(job_metadata)


class PendingWorkForever(DictTier):
    @override
    def has_pending_work(self) -> bool:
        return True


class RaisesOnABadChunk(DictTier):
    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        for key, row in zip(job_metadata.keys, job_metadata.chunk_ids.tolist()):
            self._blocks[key] = self._rows[row].tobytes()  # IndexError past the primary
        self._finished.append(JobResult(job_metadata.job_id, success=True))


class WrongBlockSize(DictTier):
    @property
    @override
    def block_size_bytes(self) -> int:
        return 4096


class _Threaded(DictTier):
    """Jobs run on a thread of the tier's own (the shape of a real tier), with a bug each."""

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str, **options: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, **options)
        self._lock = threading.Lock()

    def later(self, delay_s: float, work: Any) -> threading.Thread:
        thread = threading.Thread(target=lambda: (time.sleep(delay_s), work()), daemon=True)
        thread.start()
        return thread


class WritesAfterDrain(_Threaded):
    """Loads copy on a thread, but `drain_jobs` does not wait for it."""

    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        rows = job_metadata.chunk_ids.tolist()
        blocks = [self._blocks.get(k) for k in job_metadata.keys]

        def copy() -> None:
            for row, block in zip(rows, blocks):
                if block is not None:
                    self._rows[row] = np.frombuffer(block, dtype=np.uint8)

        self.later(0.05, copy)
        self._finished.append(JobResult(job_metadata.job_id, success=all(b is not None for b in blocks)))


class WritesAfterShutdown(_Threaded):
    """Loads copy on a thread that `shutdown` neither waits for nor stops."""

    _pending: ClassVar[list[threading.Thread]] = []

    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        rows = job_metadata.chunk_ids.tolist()
        blocks = [self._blocks.get(k) for k in job_metadata.keys]

        def copy() -> None:
            for row, block in zip(rows, blocks):
                if block is not None:
                    self._rows[row] = np.frombuffer(block, dtype=np.uint8)
            self._finished.append(JobResult(job_metadata.job_id, success=True))

        self.later(0.05, copy)

    @override
    def drain_jobs(self) -> None:
        time.sleep(0.1)  # waits long enough, but shutdown does not


class LeavesAThreadRunning(_Threaded):
    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str, **options: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, **options)
        self._stop = threading.Event()
        threading.Thread(target=lambda: self._stop.wait(3.0), name="leaky-flusher", daemon=True).start()


class HangsInShutdown(DictTier):
    @override
    def shutdown(self) -> None:
        time.sleep(11.0)  # waits on a server that never answers
        super().shutdown()


class MixesUpOverlappingJobs(_Threaded):
    """Stores run on a thread and read the rows of the job submitted last (a shared buffer)."""

    _last_rows: list[int] = []

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        self._last_rows = job_metadata.chunk_ids.tolist()
        keys = list(job_metadata.keys)

        def copy() -> None:
            rows = self._last_rows
            for key, row in zip(keys, rows):
                self._blocks[key] = self._rows[row].tobytes()
            with self._lock:
                self._finished.append(JobResult(job_metadata.job_id, success=len(rows) >= len(keys)))

        self.later(0.01, copy)

    @override
    def drain_jobs(self) -> None:
        time.sleep(0.1)


_shared: dict[OffloadKey, bytes] = {}


class PersistentDictTier(DictTier):
    """Blocks in a process-wide dict: they outlive the instance (correct, persistent)."""

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str, **options: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, **options)
        self._blocks = _shared

    @override
    def shutdown(self) -> None:
        return None


class ForgetsOnRestart(DictTier):
    """Claims to be persistent (its test says so) but keeps blocks per instance."""


class IndexesOnlyItsOwnStores(PersistentDictTier):
    """Blocks in a shared store, but each instance answers lookups from an index of its own
    (what the store held when it started, and what it stored since), as a disk tier with an
    in-memory index per process does: a restart finds every block, another engine none."""

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str, **options: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, **options)
        self._index = set(self._blocks)

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self._index else LookupResult.MISS

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        super().submit_store(job_metadata)
        if self._finished[-1].success:
            self._index.update(job_metadata.keys)


class RemembersMisses(PersistentDictTier):
    """Blocks in a shared store, but a block an instance once found absent stays a MISS there
    until that instance stores it itself (a negative cache that only its own stores clear)."""

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str, **options: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, **options)
        self._absent: set[OffloadKey] = set()

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._absent:
            return LookupResult.MISS
        answer = super().lookup(key, req_context)
        if answer is LookupResult.MISS:
            self._absent.add(key)
        return answer

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        super().submit_store(job_metadata)
        if self._finished[-1].success:
            self._absent.difference_update(job_metadata.keys)


BREAKS: dict[str, str] = {
    "ReportsJobsTwice": "every_job_is_reported_exactly_once",
    "ReportsUnknownJob": "every_job_is_reported_exactly_once",
    "LosesEveryThirdJob": "every_job_is_reported_exactly_once",
    "ReportsOnePollLate": "every_job_is_reported_by_the_first_poll_after_drain",
    "LoadsWrongBytes": "stored_bytes_load_back_exactly",
    "LoadsIntoTheWrongRows": "stored_bytes_load_back_exactly",
    "FailedLoadReportedOk": "a_load_of_a_missing_block_fails_its_job",
    "ListsMissingBlocksAsLoaded": "a_failed_load_lists_only_blocks_written_right",
    "EventsWithTheFlagOff": "no_events_when_kv_events_are_off_globally",
    "EventsForLoads": "no_event_for_loads_or_failed_stores",
    "EventsForFailedStores": "no_event_for_loads_or_failed_stores",
    "LosesEvents": "one_stored_event_per_successful_store",
    "DoublesEvents": "one_stored_event_per_successful_store",
    "EventsWithoutLocality": "one_stored_event_per_successful_store",
    "IgnoresLocality": "locality_is_the_configured_one",
    "HitForEverything": "lookup_answers_miss_for_absent_keys",
    "ForgetsStores": "lookup_is_a_hit_once_a_store_finished",
    "RetriesForever": "lookup_settles",
    "AnswersHitPending": "lookup_answers_hit_miss_or_retry",
    "CopiesSlowlyOnTheSchedulerThread": "calls_return_without_waiting_for_io",
    "PendingWorkForever": "has_pending_work_ends",
    "RaisesOnABadChunk": "a_store_that_cannot_be_done_fails_its_job",
    "WrongBlockSize": "factory_builds_the_configured_tier",
    "WritesAfterDrain": "nothing_touches_the_primary_after_drain_jobs",
    "WritesAfterShutdown": "nothing_touches_the_primary_after_shutdown",
    "LeavesAThreadRunning": "shutdown_returns_promptly_and_leaves_no_thread",
    "HangsInShutdown": "shutdown_returns_promptly_and_leaves_no_thread",
    "MixesUpOverlappingJobs": "stored_bytes_load_back_exactly",
    "ForgetsOnRestart": "blocks_survive_a_new_instance",
    "IndexesOnlyItsOwnStores": "a_block_stored_by_one_instance_is_a_hit_in_another",
    "RemembersMisses": "a_block_stored_by_one_instance_is_a_hit_in_another",
}
# The rule's test that shows the fault, where another rule's test is not the one that would.
FOUND_BY: dict[str, str] = {"MixesUpOverlappingJobs": "overlapping_jobs_from_several_requests"}
PERSISTENT = frozenset({"ForgetsOnRestart", "IndexesOnlyItsOwnStores", "RemembersMisses", "PersistentDictTier"})
