"""What the tiering manager measures (vLLM 0.33: `tiering/metrics.py`).

Per tier (label "<index>:<tier_type>", the primary "0:primary"): chunk queries and hits, how
long lookups took (synchronously, and from a first RETRY until the lookup resolved), bytes and
seconds read and written, failed jobs, promotion latency, primary slots held by jobs in flight,
and back-pressure. `take_stats` hands over what was observed since its last call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from kvref.base import LookupResult, OffloadingConnectorStats, OffloadKey, ReqContext
from kvref.tiering.base import JobResult, SecondaryTierManager, TieringOffloadingMetrics, TransferJob

__all__ = ["PRIMARY_TIER_LABEL", "TierLabel", "TieringMetricsTracker"]

TierLabel = tuple[str]
PRIMARY_TIER_LABEL: TierLabel = ("0:primary",)


def _new_observed() -> dict[TierLabel, dict[OffloadKey, float | None]]:
    return {}  # not dict[...](): a parameterised builtin is ten times slower to call


class _JobMetadataLike(Protocol):
    @property
    def transfer_job(self) -> TransferJob: ...

    @property
    def tier_idx(self) -> int: ...


@dataclass(slots=True)
class _RequestMetricsState:
    # Per tier, per key: None once resolved, else when its lookup first answered RETRY. None
    # altogether once the request is scheduled (later lookups are not the admission's).
    observed_lookups: dict[TierLabel, dict[OffloadKey, float | None]] | None = field(default_factory=_new_observed)


@dataclass
class _TierState:
    active_promotion_count: int = 0
    active_cascade_count: int = 0
    primary_write_chunk_count: int = 0
    primary_read_chunk_count: int = 0


class TieringMetricsTracker:
    """Collects the tiering manager's observations between two `take_stats` calls.

    Args:
        tier_types: each secondary tier's type, in tier order.
        num_primary_chunks: the primary's chunk slots.
        primary_chunk_size: the bytes of one primary chunk.
    """

    def __init__(self, tier_types: list[str], num_primary_chunks: int, primary_chunk_size: int) -> None:
        self._tier_types = tier_types
        self._num_primary_chunks = num_primary_chunks
        self._primary_chunk_size = primary_chunk_size
        self._request_states: dict[str, _RequestMetricsState] = {}
        self._tier_states = [_TierState() for _ in tier_types]
        self._stats = OffloadingConnectorStats()
        self._tier_labels: dict[int, TierLabel] = {}

    def tier_label(self, tier_idx: int) -> TierLabel:
        """The label of secondary tier `tier_idx`: "<index + 1>:<tier_type>" (built once)."""
        label = self._tier_labels.get(tier_idx)
        if label is None:
            label = self._tier_labels[tier_idx] = (f"{tier_idx + 1}:{self._tier_types[tier_idx]}",)
        return label

    @property
    def primary_tier_label(self) -> TierLabel:
        """The primary tier's label."""
        return PRIMARY_TIER_LABEL

    def on_new_request(self, req_context: ReqContext) -> None:
        self._request_states[req_context.req_id] = _RequestMetricsState()

    def on_request_allocated(self, req_context: ReqContext) -> None:
        """The request was scheduled: its lookups no longer count toward admission delays."""
        state = self._request_states.get(req_context.req_id)
        if state is not None:
            state.observed_lookups = None

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._request_states.pop(req_context.req_id, None)

    def on_lookup(
        self,
        req_context: ReqContext,
        key: OffloadKey,
        tier_label: TierLabel,
        result: LookupResult,
        lookup_duration: float,
    ) -> None:
        """Observe one lookup of `key` in one tier that took `lookup_duration` seconds."""
        state = self._request_states.setdefault(req_context.req_id, _RequestMetricsState())
        if state.observed_lookups is None:
            return
        if result in (LookupResult.HIT, LookupResult.MISS):
            observed = state.observed_lookups.setdefault(tier_label, {})
            start_time = observed.get(key)
            if key not in observed or start_time is not None:
                observed[key] = None
                self._observe_resolved_lookup(tier_label, result, lookup_duration, start_time)
        elif result is LookupResult.RETRY:
            observed = state.observed_lookups.setdefault(tier_label, {})
            observed.setdefault(key, time.monotonic() - lookup_duration)

    def on_job_registered(self, job_metadata: _JobMetadataLike) -> None:
        transfer_job = job_metadata.transfer_job
        state = self._tier_states[job_metadata.tier_idx]
        if transfer_job.is_promotion:
            state.active_promotion_count += 1
            state.primary_write_chunk_count += len(transfer_job.chunk_ids)
        else:
            state.active_cascade_count += 1
            state.primary_read_chunk_count += len(transfer_job.chunk_ids)

    def on_job_finished(self, job_metadata: _JobMetadataLike, result: JobResult) -> None:
        self._observe_finished_job_stats(job_metadata, result)
        if job_metadata.transfer_job.is_promotion:
            self._observe_promotion_latency(job_metadata, result)
        self._decrement_tier_state(job_metadata)

    def on_promotion_allocation_failure(self) -> None:
        self._stats.increase_counter(TieringOffloadingMetrics.PROMOTION_ALLOCATION_FAILURES)

    def record_backpressure(self, tiers: list[SecondaryTierManager]) -> None:
        """Observe each tier's back-pressure: its latency EMA and the stores it dropped."""
        for tier_idx, tier in enumerate(tiers):
            detector = tier.bp_detector
            if detector is None:
                continue
            label = self.tier_label(tier_idx)
            ema = detector.stats.get("store_latency_ema")
            if ema is not None:
                self._stats.set_gauge(TieringOffloadingMetrics.BACKPRESSURE_STORE_LATENCY_EMA, ema, labelvalues=label)
            stores_dropped, blocks_dropped = detector.policy.pop_stores_dropped()
            if stores_dropped > 0:
                self._stats.increase_counter(
                    TieringOffloadingMetrics.BACKPRESSURE_STORES_DROPPED, stores_dropped, labelvalues=label
                )
            if blocks_dropped > 0:
                self._stats.increase_counter(
                    TieringOffloadingMetrics.BACKPRESSURE_BLOCKS_DROPPED, blocks_dropped, labelvalues=label
                )

    def take_stats(self) -> OffloadingConnectorStats | None:
        """Return the observations since the last call (and the gauges of jobs in flight)."""
        stats = OffloadingConnectorStats()
        self._observe_active_transfer_stats(stats)
        if not self._stats.is_empty():
            stats.aggregate(self._stats)
            self._stats = OffloadingConnectorStats()
        return None if stats.is_empty() else stats

    def assert_idle(self) -> None:
        """Check that no job is counted as in flight (after a reset drained them all)."""
        assert all(
            state.active_promotion_count == state.active_cascade_count == 0
            and state.primary_write_chunk_count == state.primary_read_chunk_count == 0
            for state in self._tier_states
        ), "jobs are still counted in flight"

    def _decrement_tier_state(self, job_metadata: _JobMetadataLike) -> None:
        transfer_job = job_metadata.transfer_job
        state = self._tier_states[job_metadata.tier_idx]
        if transfer_job.is_promotion:
            assert state.active_promotion_count > 0, "a promotion finished twice"
            state.active_promotion_count -= 1
            state.primary_write_chunk_count -= len(transfer_job.chunk_ids)
        else:
            assert state.active_cascade_count > 0, "a cascade finished twice"
            state.active_cascade_count -= 1
            state.primary_read_chunk_count -= len(transfer_job.chunk_ids)

    def _observe_finished_job_stats(self, job_metadata: _JobMetadataLike, completed_job: JobResult) -> None:
        transfer_job = job_metadata.transfer_job
        labelvalues = self.tier_label(job_metadata.tier_idx)
        completed_key_count = len(transfer_job.keys)
        if not completed_job.success:
            failures = (
                TieringOffloadingMetrics.PROMOTION_JOB_FAILURES
                if transfer_job.is_promotion
                else TieringOffloadingMetrics.CASCADE_JOB_FAILURES
            )
            self._stats.increase_counter(failures, labelvalues=labelvalues)
            if not (transfer_job.is_promotion and completed_job.successful_keys):
                return
            completed_key_count = len(completed_job.successful_keys)
        if transfer_job.is_promotion:
            bytes_metric, time_metric = TieringOffloadingMetrics.READ_BYTES, TieringOffloadingMetrics.READ_TIME
        else:
            bytes_metric, time_metric = TieringOffloadingMetrics.WRITE_BYTES, TieringOffloadingMetrics.WRITE_TIME
        self._stats.increase_counter(bytes_metric, completed_key_count * self._primary_chunk_size, labelvalues)
        if completed_job.transfer_time is not None:
            self._stats.increase_counter(time_metric, completed_job.transfer_time, labelvalues)

    def _observe_promotion_latency(self, job_metadata: _JobMetadataLike, result: JobResult) -> None:
        # From the job's creation to its report, tier queueing included (unlike the tier's own
        # transfer_time); failed promotions too.
        self._stats.observe_histogram(
            TieringOffloadingMetrics.PROMOTION_LATENCY,
            time.monotonic() - job_metadata.transfer_job.submit_time,
            (*self.tier_label(job_metadata.tier_idx), "success" if result.success else "failure"),
        )

    def _observe_active_transfer_stats(self, stats: OffloadingConnectorStats) -> None:
        for tier_idx, state in enumerate(self._tier_states):
            labelvalues = self.tier_label(tier_idx)
            stats.set_gauge(
                TieringOffloadingMetrics.PRIMARY_WRITE_USAGE_PERC,
                state.primary_write_chunk_count / max(self._num_primary_chunks, 1),
                labelvalues,
            )
            stats.set_gauge(
                TieringOffloadingMetrics.PRIMARY_READ_USAGE_PERC,
                state.primary_read_chunk_count / max(self._num_primary_chunks, 1),
                labelvalues,
            )
            stats.set_gauge(TieringOffloadingMetrics.ACTIVE_PROMOTION_JOBS, state.active_promotion_count, labelvalues)
            stats.set_gauge(TieringOffloadingMetrics.ACTIVE_CASCADE_JOBS, state.active_cascade_count, labelvalues)

    def _observe_resolved_lookup(
        self, tier_label: TierLabel, result: LookupResult, lookup_duration: float, async_start_time: float | None
    ) -> None:
        self._stats.increase_counter(TieringOffloadingMetrics.CHUNK_QUERIES, labelvalues=tier_label)
        if result is LookupResult.HIT:
            self._stats.increase_counter(TieringOffloadingMetrics.CHUNK_HITS, labelvalues=tier_label)
        self._stats.observe_histogram(TieringOffloadingMetrics.LOOKUP_SYNC_DELAY, lookup_duration, tier_label)
        if async_start_time is not None:
            self._stats.observe_histogram(
                TieringOffloadingMetrics.LOOKUP_ASYNC_DELAY, time.monotonic() - async_start_time, tier_label
            )
