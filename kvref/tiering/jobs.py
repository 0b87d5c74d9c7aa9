"""The jobs between the primary tier and the secondary tiers (vLLM 0.33: in `tiering/manager.py`).

`TieringJobs` is the part of `TieringOffloadingManager` that moves chunks between tiers, never
to or from the GPU:

* cascades: `create_store_job` pins chunks in the primary and registers a job that a tier's
  `submit_store` copies out;
* promotions: `_initiate_promotion` reserves a primary slot for a chunk a tier holds, and
  `_flush_pending_promotions` submits the step's reservations, one `submit_load` per
  (tier, request);
* completion: `_process_finished_jobs` collects what the tiers report: a finished cascade
  releases its pin (and feeds the tier's back-pressure detector), a finished promotion makes its
  chunks loadable, or frees the slots of those that failed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kvref.base import CacheHitSource, OffloadKey, ReqContext
from kvref.cpu.common import CPULoadStoreSpec
from kvref.tiering.base import JobId, JobResult, SecondaryTierManager, TransferJob
from kvref.tiering.metrics import TieringMetricsTracker
from kvref.tiering.primary import CPUPrimaryTierOffloadingManager

__all__ = ["JobMetadata", "PendingPromotion", "TieringJobs"]

logger = logging.getLogger(__name__)


def _new_key_list() -> list[OffloadKey]:
    return []  # not list[OffloadKey](): a parameterised builtin is ten times slower to call


def _new_id_list() -> list[int]:
    return []


@dataclass
class PendingPromotion:
    """Chunks of one (tier, request) waiting for the step's end to be submitted."""

    req_context: ReqContext
    keys: list[OffloadKey] = field(default_factory=_new_key_list)
    chunk_ids: list[int] = field(default_factory=_new_id_list)


class JobMetadata(NamedTuple):
    """A job in flight and the tier doing it."""

    transfer_job: TransferJob
    tier_idx: int


class TieringJobs:
    """The jobs of a tiering manager (see the module docstring).

    Args:
        primary_tier: the CPU tier the jobs read from and write into.
        secondary_tiers: the tiers doing the jobs.
    """

    def __init__(self, primary_tier: CPUPrimaryTierOffloadingManager, secondary_tiers: list[SecondaryTierManager]) -> None:
        self.primary_tier = primary_tier
        self.secondary_tiers = secondary_tiers
        self._job_id_counter: JobId = 0
        # Every job in flight; TransferJob.is_promotion tells the direction.
        self._jobs: dict[JobId, JobMetadata] = {}
        # Promotions staged by lookup(), by tier index, then request id.
        self._pending_load_submissions: dict[int, dict[str, PendingPromotion]] = {}
        # Set once the step's jobs were collected; cleared at the step's end.
        self._processed_jobs_this_step = False
        # The tier each promoted chunk came from, per request, so that a disk hit served from
        # the primary after its promotion still counts as a disk hit.
        self._request_load_sources: dict[str, dict[OffloadKey, CacheHitSource]] = {}
        self._tier_index = {tier: idx for idx, tier in enumerate(secondary_tiers)}
        primary_view = primary_tier.get_kv_memoryview()
        assert primary_view.strides is not None
        self._metrics = TieringMetricsTracker(
            tier_types=[tier.tier_type for tier in secondary_tiers],
            num_primary_chunks=primary_tier.num_chunks,
            primary_chunk_size=primary_view.strides[0],
        )

    def _next_job_id(self) -> JobId:
        job_id = self._job_id_counter
        self._job_id_counter += 1
        return job_id

    def _register_job(self, transfer_job: TransferJob, tier_idx: int) -> None:
        job_metadata = JobMetadata(transfer_job, tier_idx)
        self._jobs[transfer_job.job_id] = job_metadata
        self._metrics.on_job_registered(job_metadata)

    def _maybe_process_finished_jobs(self) -> None:
        """Collect finished jobs, at most once per step."""
        if not self._processed_jobs_this_step:
            self._processed_jobs_this_step = True
            self._process_finished_jobs()

    def _process_finished_jobs(self, tiers: Sequence[SecondaryTierManager] | None = None) -> None:
        """Collect the finished jobs of `tiers` (default: all): a finished cascade releases its
        read of the primary; a finished promotion makes its chunks loadable (or frees them)."""
        for tier in self.secondary_tiers if tiers is None else tiers:
            tier_idx = self._tier_index[tier]
            for completed_job in tier.get_finished_jobs():
                job_metadata = self._jobs.pop(completed_job.job_id, None)
                assert job_metadata is not None, f"tier #{tier_idx} ({tier.tier_type}) finished unknown job {completed_job.job_id}"
                assert job_metadata.tier_idx == tier_idx, (
                    f"job {completed_job.job_id} reported by tier #{tier_idx} belongs to tier #{job_metadata.tier_idx}"
                )
                self._metrics.on_job_finished(job_metadata, completed_job)
                transfer_job = job_metadata.transfer_job
                if transfer_job.is_promotion:
                    self._complete_promotion(job_metadata, completed_job)
                else:
                    self.primary_tier.complete_read(transfer_job.keys, transfer_job.req_context)
                    self._update_backpressure(tier, job_metadata, completed_job)

    def _complete_promotion(self, job_metadata: JobMetadata, completed_job: JobResult) -> None:
        transfer_job = job_metadata.transfer_job
        successful_keys: Collection[OffloadKey]
        failed_keys: Collection[OffloadKey]
        if completed_job.success:
            successful_keys, failed_keys = transfer_job.keys, ()
        elif completed_job.successful_keys:
            successful_keys = completed_job.successful_keys
            failed = set(transfer_job.keys)
            assert failed.issuperset(successful_keys), f"promotion {completed_job.job_id} reported unknown keys"
            failed_keys = failed.difference(successful_keys)
        else:
            successful_keys, failed_keys = (), transfer_job.keys
        load_sources = self._request_load_sources.get(transfer_job.req_context.req_id)
        if load_sources is not None:
            source = self.secondary_tiers[job_metadata.tier_idx].cache_hit_source
            for key in failed_keys:
                if load_sources.get(key) == source:
                    del load_sources[key]
        if successful_keys:
            self.primary_tier.complete_write(successful_keys, transfer_job.req_context, True)
        if failed_keys:
            self.primary_tier.complete_write(failed_keys, transfer_job.req_context, False)

    def _should_store_to_tier(self, tier: SecondaryTierManager, num_blocks: int) -> bool:
        detector = tier.bp_detector
        return detector is None or detector.should_store(num_blocks)

    def _update_backpressure(self, tier: SecondaryTierManager, job_metadata: JobMetadata, completed_job: JobResult) -> None:
        detector = tier.bp_detector
        if detector is None:
            return
        was_under_pressure = detector.is_under_pressure()
        if completed_job.success:
            transfer_job = job_metadata.transfer_job
            num_bytes = completed_job.transfer_bytes
            if num_bytes is None:
                num_bytes = len(transfer_job.keys) * tier.block_size_bytes
            detector.update(transfer_job.submit_time, num_bytes)
        else:
            detector.on_store_failed()
        if detector.is_under_pressure() != was_under_pressure:
            logger.info(
                "Tier #%d (%s) back-pressure %s (stats=%s)",
                self._tier_index[tier],
                tier.tier_type,
                "activated" if detector.is_under_pressure() else "cleared",
                detector.stats,
            )

    def _initiate_promotion(self, tier_idx: int, key: OffloadKey, req_context: ReqContext) -> bool:
        """Reserve a primary slot for `key` now, and stage its `submit_load` for the step's end.

        Reserved at once, so that later lookups of the step see the chunk in flight and do not
        promote it twice.

        Returns:
            False when the primary has no room (the chunk is then treated as unavailable).
        """
        result = self.primary_tier.prepare_write([key], req_context)
        if result is None:
            self._metrics.on_promotion_allocation_failure()
            return False
        store_spec = result.store_spec
        assert isinstance(store_spec, CPULoadStoreSpec)
        source = self.secondary_tiers[tier_idx].cache_hit_source
        load_sources = self._request_load_sources.setdefault(req_context.req_id, {})
        for promoted_key in result.keys_to_store:
            load_sources[promoted_key] = source
        pending = self._pending_load_submissions.setdefault(tier_idx, {})
        entry = pending.setdefault(req_context.req_id, PendingPromotion(req_context=req_context))
        entry.keys.extend(result.keys_to_store)
        entry.chunk_ids.extend(store_spec.chunk_ids)
        return True

    def _flush_pending_promotions(self) -> None:
        """Submit the step's staged promotions: one `submit_load` per (tier, request)."""
        for tier_idx, pending_by_request in self._pending_load_submissions.items():
            tier = self.secondary_tiers[tier_idx]
            for entry in pending_by_request.values():
                transfer_job = TransferJob(
                    job_id=self._next_job_id(),
                    keys=entry.keys,
                    chunk_ids=entry.chunk_ids,
                    is_promotion=True,
                    req_context=entry.req_context,
                )
                self._register_job(transfer_job, tier_idx)
                tier.submit_load(transfer_job)
        self._pending_load_submissions.clear()

    def create_store_job(self, keys: Collection[OffloadKey], req_context: ReqContext, tier_idx: int = 0) -> TransferJob:
        """Pin chunks in the primary and register a cascade job to tier `tier_idx`.

        The caller starts the copy; the tier reports the job through `get_finished_jobs`.
        """
        spec = self.primary_tier.prepare_read(keys, req_context)
        transfer_job = TransferJob(
            job_id=self._next_job_id(), keys=keys, chunk_ids=spec.chunk_ids, is_promotion=False, req_context=req_context
        )
        self._register_job(transfer_job, tier_idx)
        return transfer_job
