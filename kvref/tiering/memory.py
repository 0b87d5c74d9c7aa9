"""`InMemorySecondaryTier`: the simplest correct secondary tier (tests, docs, a template; vLLM
0.33's counterpart is `tiering/example/manager.py`).

It keeps a copy of each chunk in a Python `bytes` object. Jobs are queued by `submit_*` and
carried out, in submission order, when the tiering manager collects results with
`get_finished_jobs`, so the submitting calls never copy, and a chunk whose store is queued
answers RETRY until its job was collected. A lookup needs no I/O, so it answers at once. An
optional capacity evicts the least recently used chunks.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import override

from kvref.base import (
    ConfigInfo,
    ConfigInfoMapping,
    LookupResult,
    Medium,
    OffloadingConnectorStats,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from kvref.tiering._options import check_bool, check_locality, check_optional_int
from kvref.tiering.backpressure import BackpressureDetector
from kvref.tiering.base import JobResult, PrimaryBlocks, SecondaryTierManager, TransferJob
from kvref.tiering.tier_reporting import TierCounters, TierEvents, tier_metric_definitions

if TYPE_CHECKING:
    from kvref.base import OffloadingSpec

__all__ = ["InMemorySecondaryTier", "MemoryTierInfo"]


@dataclass(frozen=True)
class MemoryTierInfo(ConfigInfo):
    """What an `InMemorySecondaryTier` publishes on the config-info metric."""

    memory_capacity_chunks: int | None


class InMemorySecondaryTier(SecondaryTierManager):
    """Secondary tier holding chunk copies in memory.

    Args:
        offloading_spec, primary_kv_view, tier_type, backpressure_detector: as every tier
            (`SecondaryTierManager`).
        capacity_chunks: at most this many chunks are kept (least recently used evicted first);
            None for no limit.
        enable_kv_events: emit stored/removed events (also needs the spec's global flag).
        locality: "LOCAL" or "REMOTE", for events and load tier filters; None if unknown.

    Raises:
        ValueError: an option has the wrong type or is out of range (the message names it), or
            `primary_kv_view` is unusable.
    """

    medium: ClassVar[Medium | None] = Medium.CPU

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        *,
        capacity_chunks: int | None = None,
        enable_kv_events: bool = False,
        locality: str | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self._capacity = check_optional_int("capacity_chunks", capacity_chunks, minimum=1)
        self.locality = check_locality("locality", locality)
        events = check_bool("enable_kv_events", enable_kv_events)
        self._events = TierEvents(events, offloading_spec, Medium.CPU, self.locality, tier_type)
        self._primary = PrimaryBlocks(primary_kv_view)
        self._chunks: OrderedDict[OffloadKey, bytes] = OrderedDict()
        self._pending_stores: Counter[OffloadKey] = Counter()
        self._queue: deque[TransferJob] = deque()
        self._counters = TierCounters()
        self._info = MemoryTierInfo(self._capacity)

    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, key: object) -> bool:
        return key in self._chunks

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._chunks:
            return LookupResult.HIT
        return LookupResult.RETRY if key in self._pending_stores else LookupResult.MISS

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        self._pending_stores.update(job_metadata.keys)
        self._queue.append(job_metadata)

    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        self._queue.append(job_metadata)

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        results: list[JobResult] = []
        while self._queue:
            job = self._queue.popleft()
            results.append(self._load(job) if job.is_promotion else self._store(job))
        return results

    def _store(self, job: TransferJob) -> JobResult:
        started = time.monotonic()
        self._pending_stores.subtract(job.keys)
        self._pending_stores = +self._pending_stores  # drop the keys that reached 0
        stored: list[OffloadKey] = []
        for key, chunk_id in zip(job.keys, job.chunk_ids):
            if key in self._chunks:
                continue
            self._chunks[key] = bytes(self._primary.row(chunk_id))
            stored.append(key)
        self._counters.chunks_stored += len(stored)
        self._events.announce(stored, removed=False)
        self._evict_over_capacity()
        return JobResult(
            job.job_id,
            True,
            transfer_time=time.monotonic() - started,
            transfer_bytes=len(stored) * self._primary.block_bytes,
        )

    def _evict_over_capacity(self) -> None:
        if self._capacity is None or len(self._chunks) <= self._capacity:
            return
        evicted: list[OffloadKey] = []
        while len(self._chunks) > self._capacity:
            key, _ = self._chunks.popitem(last=False)
            evicted.append(key)
        self._counters.chunks_evicted += len(evicted)
        self._events.announce(evicted, removed=True)

    def _load(self, job: TransferJob) -> JobResult:
        started = time.monotonic()
        loaded: list[OffloadKey] = []
        for key, chunk_id in zip(job.keys, job.chunk_ids):
            chunk = self._chunks.get(key)
            if chunk is not None:
                self._primary.row(chunk_id)[:] = chunk
                loaded.append(key)
        self._counters.chunks_loaded += len(loaded)
        self._counters.chunks_lost += len(job.keys) - len(loaded)
        success = len(loaded) == len(job.keys)
        return JobResult(
            job.job_id,
            success,
            successful_keys=None if success or not loaded else tuple(loaded),
            transfer_time=time.monotonic() - started,
            transfer_bytes=len(loaded) * self._primary.block_bytes,
        )

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        # Reversed, so the request's first chunk ends up the most recently used.
        for key in reversed(list(keys)):
            if key in self._chunks:
                self._chunks.move_to_end(key)

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        return self._events.take()

    @override
    def drain_jobs(self) -> None:
        """Nothing runs between calls: a queued job is carried out when it is collected."""
        return None

    @classmethod
    @override
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        return tier_metric_definitions()

    @override
    def get_stats(self) -> OffloadingConnectorStats:
        usage = None if self._capacity is None else len(self._chunks) / self._capacity
        return self._counters.take_stats(self.tier_type, usage)

    @classmethod
    @override
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return MemoryTierInfo.config_info_keys()

    @override
    def config_info(self) -> ConfigInfoMapping:
        return self._info.as_config_info()

    @override
    def shutdown(self) -> None:
        self._queue.clear()
        self._pending_stores.clear()
        self._primary.release()
