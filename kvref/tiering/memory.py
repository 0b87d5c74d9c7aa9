"""`InMemorySecondaryTier`: the simplest correct secondary tier (tests, docs, a template).

It keeps a copy of each block in a Python `bytes` object. Jobs are queued by `submit_*` and
carried out, in submission order, when the tiering manager collects results with
`get_finished_jobs`, so the submitting calls never copy and a block written by a store is not
visible (lookup answers None) until its job was collected. An optional capacity evicts the
least recently used blocks.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from typing_extensions import override

from kvref.base import OffloadingEvent, OffloadKey, ReqContext
from kvref.tiering._options import check_bool, check_optional_int, check_str
from kvref.tiering.base import JobMetadata, JobResult, PrimaryBlocks, SecondaryTierManager

__all__ = ["InMemorySecondaryTier"]


class InMemorySecondaryTier(SecondaryTierManager):
    """Secondary tier holding block copies in memory.

    Args:
        primary_kv_view: the primary's `(num_blocks, block_bytes)` memoryview.
        capacity_blocks: at most this many blocks are kept (least recently used evicted first);
            None for no limit.
        name: the medium named in events.
        enable_events: buffer stored/removed events for `take_events`.

    Raises:
        ValueError: an option has the wrong type or is out of range (the message names it), or
            `primary_kv_view` is unusable.
    """

    def __init__(
        self,
        primary_kv_view: memoryview[Any],
        *,
        capacity_blocks: int | None = None,
        name: str = "memory",
        enable_events: bool = False,
    ) -> None:
        self._capacity = check_optional_int("capacity_blocks", capacity_blocks, minimum=1)
        self.medium = check_str("name", name)
        events = check_bool("enable_events", enable_events)
        self._primary = PrimaryBlocks(primary_kv_view)
        self._evicted_blocks = 0
        self._blocks: OrderedDict[OffloadKey, bytes] = OrderedDict()
        self._pending_stores: Counter[OffloadKey] = Counter()
        self._queue: deque[JobMetadata] = deque()
        self._events: list[OffloadingEvent] | None = [] if events else None

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        if key in self._blocks:
            return True
        return None if key in self._pending_stores else False

    @override
    def contains(self, keys: Sequence[OffloadKey]) -> list[bool]:
        blocks = self._blocks  # a dict read is atomic: safe beside the scheduler thread
        return [key in blocks for key in keys]

    @override
    def submit_store(self, job: JobMetadata) -> None:
        self._pending_stores.update(job.keys)
        self._queue.append(job)

    @override
    def submit_load(self, job: JobMetadata) -> None:
        self._queue.append(job)

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        results: list[JobResult] = []
        while self._queue:
            job = self._queue.popleft()
            results.append(self._load(job) if job.is_promotion else self._store(job))
        return results

    def _store(self, job: JobMetadata) -> JobResult:
        started = time.monotonic()
        self._pending_stores.subtract(job.keys)
        self._pending_stores = +self._pending_stores  # drop the keys that reached 0
        stored: list[OffloadKey] = []
        for key, block_id in zip(job.keys, job.block_ids):
            if key in self._blocks:
                continue
            self._blocks[key] = bytes(self._primary.row(block_id))
            stored.append(key)
        if self._events is not None and stored:
            self._events.append(OffloadingEvent(stored, self.medium, removed=False))
        self._evict_over_capacity()
        return JobResult(
            job.job_id,
            True,
            transfer_time=time.monotonic() - started,
            transfer_bytes=len(stored) * self._primary.block_bytes,
        )

    def _evict_over_capacity(self) -> None:
        if self._capacity is None or len(self._blocks) <= self._capacity:
            return
        evicted: list[OffloadKey] = []
        while len(self._blocks) > self._capacity:
            key, _ = self._blocks.popitem(last=False)
            evicted.append(key)
        self._evicted_blocks += len(evicted)
        if self._events is not None:
            self._events.append(OffloadingEvent(evicted, self.medium, removed=True))

    def _load(self, job: JobMetadata) -> JobResult:
        started = time.monotonic()
        loaded: list[OffloadKey] = []
        for key, block_id in zip(job.keys, job.block_ids):
            block = self._blocks.get(key)
            if block is not None:
                self._primary.row(block_id)[:] = block
                loaded.append(key)
        success = len(loaded) == len(job.keys)
        return JobResult(
            job.job_id,
            success,
            successful_keys=None if success or not loaded else tuple(loaded),
            transfer_time=time.monotonic() - started,
            transfer_bytes=len(loaded) * self._primary.block_bytes,
        )

    @override
    def num_evicted_blocks(self) -> int:
        return self._evicted_blocks

    @override
    def usage(self) -> float | None:
        return None if self._capacity is None else len(self._blocks) / self._capacity

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        # Reversed, so the request's first block ends up the most recently used.
        for key in reversed(list(keys)):
            if key in self._blocks:
                self._blocks.move_to_end(key)

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return ()
        events, self._events = self._events, []
        return events

    @override
    def shutdown(self) -> None:
        self._queue.clear()
        self._pending_stores.clear()
        self._primary.release()
