"""The adapter under `kvref.integrations.vllm`'s tiers: vLLM's `SecondaryTierManager` API over one
kvref tier (see the package docstring for what it translates and what it owns)."""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from typing_extensions import override
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from kvref.base import OffloadKey as KvrefKey
from kvref.base import ReqContext as KvrefContext
from kvref.tiering.base import JobMetadata
from kvref.tiering.base import JobResult as KvrefJobResult
from kvref.tiering.base import SecondaryTierManager as KvrefTier

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

__all__ = ["KvrefSecondaryTier", "KvrefTierMetrics", "check_bool", "refuse_unknown", "run_identity"]

logger = logging.getLogger(__name__)


class KvrefTierMetrics:
    """Names of the metrics the tiers report through `get_stats` (labelled by `tier_type`)."""

    BLOCKS_STORED = "vllm:kv_offload_kvref_tier_blocks_stored"
    BLOCKS_LOADED = "vllm:kv_offload_kvref_tier_blocks_loaded"
    BLOCKS_EVICTED = "vllm:kv_offload_kvref_tier_blocks_evicted"
    FAILED_STORES = "vllm:kv_offload_kvref_tier_failed_stores"
    FAILED_LOADS = "vllm:kv_offload_kvref_tier_failed_loads"
    USAGE_PERC = "vllm:kv_offload_kvref_tier_usage_perc"


_METRIC_LABELS = ("tier_type",)
_COUNTERS = {
    KvrefTierMetrics.BLOCKS_STORED: "Blocks a kvref tier stored (of successful store jobs).",
    KvrefTierMetrics.BLOCKS_LOADED: "Blocks a kvref tier loaded into the CPU tier, failed jobs' good ones included.",
    KvrefTierMetrics.BLOCKS_EVICTED: "Blocks a kvref tier evicted to make room.",
    KvrefTierMetrics.FAILED_STORES: "Store jobs of a kvref tier that failed (some block was not stored).",
    KvrefTierMetrics.FAILED_LOADS: "Load jobs of a kvref tier that failed (some block missing or damaged).",
}


def _kvref_keys(keys: Iterable[OffloadKey]) -> tuple[KvrefKey, ...]:
    # Both are NewTypes of the same bytes (block hash + group index): only the names differ.
    return cast("tuple[KvrefKey, ...]", tuple(keys))


def _kvref_context(req_context: ReqContext) -> KvrefContext:
    return KvrefContext(req_id=req_context.req_id, kv_transfer_params=req_context.kv_transfer_params)


def check_bool(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{field} must be true or false, got {value!r}")
    return value


def refuse_unknown(tier: str, unknown: dict[str, object]) -> None:
    # vLLM passes every key of the tier's config as a keyword: a misspelt option would
    # otherwise be a TypeError about __init__, not a configuration error naming the key.
    if unknown:
        names = ", ".join(repr(name) for name in sorted(unknown))
        raise ValueError(f"{tier}: unknown option {names} (docs/LIBRARY.md lists the options)")


def run_identity(offloading_spec: OffloadingSpec) -> str:
    """`<model>_<digest>_r<rank>`: what vLLM's own fs tier names a run's directory after.

    The digest covers the model, dtype, KV-cache groups, tokens per hash, chunk size and (unless
    the layout is parallelism-agnostic) the parallel layout: engines share blocks exactly when
    it is equal, as they do through vLLM's fs tier.
    """
    mapper = FileMapper.from_offloading_spec(
        root_dir="",
        offloading_spec=offloading_spec,
        blocks_per_file=offloading_spec.blocks_per_chunk,
        parallel_agnostic=True,
    )
    return f"{os.path.basename(mapper.base_path)}_r{mapper.rank}"


class _TierLookups(AsyncLookupManager):
    """vLLM's asynchronous lookups, asking a kvref tier's blocking `contains` on vLLM's thread."""

    def __init__(self, tier: KvrefTier, tier_type: str) -> None:
        self._tier = tier  # before the base class starts its thread
        super().__init__(tier_type=tier_type)

    @override
    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier.contains(_kvref_keys(keys))


@dataclass
class _Counters:
    """What `get_stats` reports next (vLLM's stats are increments since the last call)."""

    blocks_stored: int = 0
    blocks_loaded: int = 0
    failed_stores: int = 0
    failed_loads: int = 0


class KvrefSecondaryTier(SecondaryTierManager):
    """A kvref tier behind vLLM's `SecondaryTierManager` API (see the module docstring).

    Args:
        offloading_spec, primary_kv_view, tier_type, backpressure_detector: as vLLM's factory
            passes them.
        tier: the kvref tier, built over `primary_kv_view` by the subclass.
        enable_kv_events: emit KV events (also needs the spec's global KV-events flag).
        locality: "LOCAL" or "REMOTE" (where the tier's storage is), or None.

    Raises:
        ValueError: `locality` or `enable_kv_events` is invalid (the message names it).
    """

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None,
        *,
        tier: KvrefTier,
        enable_kv_events: bool,
        locality: str | None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        try:
            self.locality = None if locality is None else Locality(locality)
        except ValueError as exc:
            tier.shutdown()
            raise ValueError(f"locality: {exc} (use 'LOCAL' or 'REMOTE')") from None
        self._tier = tier
        self._events_on = enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events
        if enable_kv_events and not self._events_on:
            logger.warning(
                "enable_kv_events is set on secondary tier %r but KV cache events are disabled "
                "globally; the tier will not emit events",
                tier_type,
            )
        self._events: list[OffloadingEvent] = []
        self._jobs: dict[int, TransferJob] = {}  # submitted, not yet reported to vLLM
        self._refused: list[KvrefJobResult] = []  # submissions the kvref tier raised on
        self._counters = _Counters()
        self._evicted_reported = 0
        self._closed = False
        # Named as vLLM's own tiers name theirs (its fs and obj tiers, and its tests, use it).
        self._lookup_manager = _TierLookups(tier, tier_type)

    @property
    def kvref_tier(self) -> KvrefTier:
        """The kvref tier doing the work (for diagnostics: its repr, `location`, `redis_key`)."""
        return self._tier

    # --- lookups ---

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookup_manager.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    @override
    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookup_manager.flush()

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookup_manager.cleanup(req_context.req_id)
        self._tier.on_request_finished(_kvref_context(req_context))

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._tier.touch(_kvref_keys(keys), _kvref_context(req_context))

    # --- jobs ---

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata)

    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata)

    def _submit(self, job: TransferJob) -> None:
        if job.job_id in self._jobs:
            logger.error("secondary tier %r: job %d submitted twice; ignored", self.tier_type, job.job_id)
            return
        self._jobs[job.job_id] = job
        keys = _kvref_keys(job.keys)
        try:
            meta = JobMetadata(
                job.job_id,
                keys,
                job.chunk_ids.tolist(),
                job.is_promotion,
                _kvref_context(job.req_context),
            )
            if job.is_promotion:
                self._tier.submit_load(meta)
            else:
                self._tier.submit_store(meta)
        except Exception:
            # A tier reports failures as failed jobs; one that raises must not stop vLLM.
            logger.exception("secondary tier %r: job %d could not be submitted", self.tier_type, job.job_id)
            self._refused.append(KvrefJobResult(job.job_id, False))

    @override
    def get_finished_jobs(self) -> list[JobResult]:
        done = list(self._tier.get_finished_jobs())
        if self._refused:
            done.extend(self._refused)
            self._refused.clear()
        results: list[JobResult] = []
        for result in done:
            job = self._jobs.pop(result.job_id, None)
            if job is None:
                # Reporting it would trip vLLM's assertion and stop the scheduler.
                logger.error(
                    "secondary tier %r reported job %d, which is not running; dropped",
                    self.tier_type,
                    result.job_id,
                )
                continue
            results.append(self._finish(job, result))
        return results

    def _finish(self, job: TransferJob, result: KvrefJobResult) -> JobResult:
        counters = self._counters
        kept: tuple[OffloadKey, ...] | None = None
        if job.is_promotion:
            if result.success:
                counters.blocks_loaded += len(job.keys)
            else:
                counters.failed_loads += 1
                job_keys = set(job.keys)
                kept = cast("tuple[OffloadKey, ...]", result.successful_keys or ())
                if not job_keys.issuperset(kept):
                    logger.error("secondary tier %r: job %d kept unknown keys", self.tier_type, job.job_id)
                    kept = ()
                counters.blocks_loaded += len(kept)
                # As vLLM's fs tier: the lost blocks answer MISS from now on, so the scheduler
                # does not promote them again and again.
                self._lookup_manager.mark_miss(job_keys.difference(kept))
                kept = kept or None
        elif result.success:
            counters.blocks_stored += len(job.keys)
            if self._events_on:
                self._events.append(
                    OffloadingEvent(keys=list(job.keys), medium=self._medium(), removed=False, locality=self.locality)
                )
        else:
            counters.failed_stores += 1
        return JobResult(
            job_id=job.job_id,
            success=result.success,
            successful_keys=kept,
            transfer_time=result.transfer_time,
            transfer_bytes=result.transfer_bytes,
        )

    def _medium(self) -> Medium:
        medium = type(self).medium
        assert medium is not None
        return medium

    @override
    def drain_jobs(self) -> None:
        self._tier.drain_jobs()

    @override
    def has_pending_work(self) -> bool:
        return self._tier.has_pending_work()

    @override
    def take_events(self) -> list[OffloadingEvent]:
        # The kvref tier's removals (evictions, damaged blocks); its stored events are replaced
        # by the one-per-job events above. Nothing is buffered unless events are on.
        events, self._events = self._events, []
        for event in self._tier.take_events():
            if event.removed:
                events.append(
                    OffloadingEvent(
                        keys=cast("list[OffloadKey]", list(event.keys)),
                        medium=self._medium(),
                        removed=True,
                        locality=self.locality,
                    )
                )
        return events

    @override
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._lookup_manager.shutdown()
        self._tier.shutdown()

    # --- statistics ---

    @classmethod
    @override
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        metrics: dict[str, OffloadingMetricMetadata] = {
            name: OffloadingCounterMetadata(documentation=text, labelnames=_METRIC_LABELS)
            for name, text in _COUNTERS.items()
        }
        metrics[KvrefTierMetrics.USAGE_PERC] = OffloadingGaugeMetadata(
            documentation="Fraction of a kvref tier's capacity in use (bounded tiers only).",
            labelnames=_METRIC_LABELS,
        )
        return metrics

    @override
    def get_stats(self) -> OffloadingConnectorStats:
        stats = OffloadingConnectorStats()
        labels = (self.tier_type,)
        counters, self._counters = self._counters, _Counters()
        evicted = self._tier.num_evicted_blocks()
        for name, value in (
            (KvrefTierMetrics.BLOCKS_STORED, counters.blocks_stored),
            (KvrefTierMetrics.BLOCKS_LOADED, counters.blocks_loaded),
            (KvrefTierMetrics.BLOCKS_EVICTED, evicted - self._evicted_reported),
            (KvrefTierMetrics.FAILED_STORES, counters.failed_stores),
            (KvrefTierMetrics.FAILED_LOADS, counters.failed_loads),
        ):
            if value:
                stats.increase_counter(name, value, labels)
        self._evicted_reported = evicted
        usage = self._tier.usage()
        if usage is not None:
            stats.set_gauge(KvrefTierMetrics.USAGE_PERC, usage, labels)
        return stats
