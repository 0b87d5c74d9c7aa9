"""A third-party vLLM secondary tier: blocks kept in a dict, in memory (a sketch, and a test subject).

Load it into vLLM 0.33 by module path, no fork needed:

    "secondary_tiers": [{"type": "DictTier", "module_path": "dict_tier"}]

It copies on the calling thread, which a real tier must not do (copies belong on I/O threads, see
kvref's tiers): the point here is the contract around the copies. `test_dict_tier.py` holds it to
that contract with kvref's conformance kit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from typing_extensions import override
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

__all__ = ["DictTier"]


class DictTier(SecondaryTierManager):
    """Blocks in a dict; each job is done when submitted and reported by the next poll."""

    medium: ClassVar[Medium | None] = Medium.CPU

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        enable_kv_events: bool = False,
        locality: str | None = None,
        backpressure_detector: BackpressureDetector | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality(locality) if locality is not None else None
        globally_on = offloading_spec.kv_events_config.enable_kv_cache_events
        self._events: list[OffloadingEvent] | None = [] if enable_kv_events and globally_on else None
        self._rows = np.asarray(primary_kv_view).view(np.uint8).reshape(len(primary_kv_view), -1)
        self._blocks: dict[OffloadKey, bytes] = {}
        self._finished: list[JobResult] = []

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self._blocks else LookupResult.MISS

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        keys, rows = list(job_metadata.keys), job_metadata.chunk_ids.tolist()
        if not all(0 <= row < len(self._rows) for row in rows):
            self._finished.append(JobResult(job_metadata.job_id, success=False))
            return
        for key, row in zip(keys, rows):
            self._blocks[key] = self._rows[row].tobytes()
        if self._events is not None:
            self._events.append(OffloadingEvent(keys=keys, medium=Medium.CPU, removed=False, locality=self.locality))
        self._finished.append(JobResult(job_metadata.job_id, success=True, transfer_bytes=len(keys) * self.block_size_bytes))

    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        loaded: list[OffloadKey] = []
        for key, row in zip(job_metadata.keys, job_metadata.chunk_ids.tolist()):
            block = self._blocks.get(key)
            if block is not None and 0 <= row < len(self._rows):
                self._rows[row] = np.frombuffer(block, dtype=np.uint8)
                loaded.append(key)
        success = len(loaded) == len(job_metadata.keys)
        partial = tuple(loaded) if loaded and not success else None
        self._finished.append(JobResult(job_metadata.job_id, success=success, successful_keys=partial))

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        finished, self._finished = self._finished, []
        return finished

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return ()
        events, self._events = self._events, []
        return events

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    @override
    def drain_jobs(self) -> None:
        return None  # every job was done when submitted

    @override
    def shutdown(self) -> None:
        self._blocks.clear()
