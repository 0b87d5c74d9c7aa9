"""`TierJobs`: the jobs between the CPU primary and the secondary tiers, for a tiering manager.

Cascades (a secondary tier copying primary blocks out) and promotions (copying blocks in) are
submitted here, collected at most once per step, and settled: a cascade drops the read reference
it held on its blocks; a promotion completes the primary slots it reserved, the blocks the tier
wrote right kept even when the job failed (vLLM's `successful_keys`), the others freed and
remembered, so that tier is not asked for them again. Promotions are staged during a step and
submitted at its end, one job per (tier, request). Every tier's counters are kept here too.

The scheduler-facing rules (which calls poll, which requests may finish) are the manager's,
`kvref.tiering.manager.TieringOffloadingManager`.
"""

from __future__ import annotations

import itertools
import logging
import time
from array import array
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from kvref.base import OffloadKey, ReqContext
from kvref.cpu.common import CPULoadStoreSpec
from kvref.tiering.base import JobId, JobMetadata, SecondaryTierManager, TierStats
from kvref.tiering.primary import CPUPrimaryTierOffloadingManager

__all__ = ["TierJobs"]

logger = logging.getLogger("kvref.tiering.manager")


@dataclass
class _StagedPromotion:
    """Primary slots reserved this step for blocks one request promotes from one tier."""

    req_context: ReqContext
    keys: list[OffloadKey] = field(default_factory=lambda: [])
    block_ids: list[int] = field(default_factory=lambda: [])


class TierJobs:
    """The in-flight jobs of one tiering manager.

    Args:
        primary: the CPU tier whose slots the jobs read and write.
        tiers: the secondary tiers, in lookup order.
        failed_promotion_memory: per tier, how many blocks whose promotion failed are
            remembered (and not asked for again) even if the tier still claims them.

    Attributes:
        stats: the secondary tiers' counters, in tier order.
    """

    def __init__(
        self,
        primary: CPUPrimaryTierOffloadingManager,
        tiers: Sequence[SecondaryTierManager],
        failed_promotion_memory: int,
    ) -> None:
        self._primary = primary
        self._tiers = tiers
        self._failed_promotion_memory = failed_promotion_memory
        self._job_ids = itertools.count()
        # In-flight jobs: id -> (tier index, job).
        self._jobs: dict[JobId, tuple[int, JobMetadata]] = {}
        # Per tier: request id -> promotion staged this step, submitted by `submit_staged`.
        self._staged: list[dict[str, _StagedPromotion]] = [{} for _ in tiers]
        # Per tier: blocks whose promotion failed (bounded, oldest forgotten first).
        self._failed_promotions: list[OrderedDict[OffloadKey, None]] = [OrderedDict() for _ in tiers]
        self._polled_this_step = False
        self.stats = [TierStats(tier.medium) for tier in tiers]

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def any_staged(self) -> bool:
        return any(self._staged)

    def staged_for(self, req_id: str) -> bool:
        """Whether a promotion of request `req_id` waits for the end of the step."""
        return any(req_id in staged for staged in self._staged)

    def failed_before(self, tier_index: int, key: OffloadKey) -> bool:
        """Whether `key`'s promotion from that tier failed (and it has not stored it since)."""
        return key in self._failed_promotions[tier_index]

    # --- submitting ---

    def cascade(self, keys: tuple[OffloadKey, ...], req_context: ReqContext) -> None:
        """Copy stored primary blocks to every tier: one job and one read reference per tier."""
        for tier_index in range(len(self._tiers)):
            spec = self._primary.prepare_read(keys, req_context)
            self.submit(tier_index, JobMetadata(next(self._job_ids), keys, spec.block_ids, False, req_context))

    def stage_promotion(self, tier_index: int, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Reserve a primary slot for `key` from that tier, submitted at the end of the step.

        Returns:
            None (ask again: the block is on its way), or False when the primary has no room.
        """
        output = self._primary.prepare_write((key,), req_context)
        if output is None:
            # No room in the primary: report a miss rather than make the request wait forever.
            return False
        assert isinstance(output.store_spec, CPULoadStoreSpec)
        assert output.keys_to_store == [key], f"primary already held {key.hex()}"
        staged = self._staged[tier_index].get(req_context.req_id)
        if staged is None:
            staged = self._staged[tier_index][req_context.req_id] = _StagedPromotion(req_context)
        staged.keys.append(key)
        staged.block_ids.append(output.store_spec.block_ids[0])
        return None

    def submit_staged(self) -> list[str]:
        """Submit the step's staged promotions, one job per (tier, request); return the requests."""
        requests: list[str] = []
        for tier_index, staged in enumerate(self._staged):
            if not staged:
                continue
            self._staged[tier_index] = {}
            for promotion in staged.values():
                job = JobMetadata(
                    job_id=next(self._job_ids),
                    keys=tuple(promotion.keys),
                    block_ids=array("q", promotion.block_ids),
                    is_promotion=True,
                    req_context=promotion.req_context,
                )
                self.submit(tier_index, job)
            requests.extend(staged)
        return requests

    def drop_staged(self) -> None:
        """Forget the step's staged promotions (their reserved slots vanish with the primary)."""
        self._staged = [{} for _ in self._tiers]

    def submit(self, tier_index: int, job: JobMetadata) -> None:
        self._jobs[job.job_id] = (tier_index, job)
        tier = self._tiers[tier_index]
        try:
            if job.is_promotion:
                tier.submit_load(job)
            else:
                tier.submit_store(job)
        except Exception:
            # A tier must report failures as failed jobs; one that raises anyway must not
            # leave primary blocks pinned or reserved forever.
            logger.exception("secondary tier %s raised from submit; job %d failed", tier.medium, job.job_id)
            del self._jobs[job.job_id]
            self._settle(tier_index, job, success=False)

    # --- collecting ---

    def poll_once(self) -> None:
        """Collect finished jobs, unless this step did already."""
        if not self._polled_this_step:
            self._polled_this_step = True
            self.collect()

    def next_step(self) -> None:
        """The step ended: the next one collects again."""
        self._polled_this_step = False

    def collect(self) -> None:
        """Collect and settle every job the tiers report finished."""
        for tier_index, tier in enumerate(self._tiers):
            try:
                results = list(tier.get_finished_jobs())
            except Exception:
                logger.exception("secondary tier %s raised from get_finished_jobs", tier.medium)
                continue
            for result in results:
                entry = self._jobs.get(result.job_id)
                if entry is None or entry[0] != tier_index:
                    logger.warning(
                        "secondary tier %s reported job %d, which it was not running; ignored",
                        tier.medium,
                        result.job_id,
                    )
                    continue
                del self._jobs[result.job_id]
                self._settle(tier_index, entry[1], result.success, result.successful_keys)

    def drain(self, timeout_s: float) -> None:
        """Wait for every tier's jobs and settle them (abandoning them after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        for tier in self._tiers:
            tier.drain_jobs()
        self.collect()
        while self._jobs:
            if time.monotonic() >= deadline:
                logger.error(
                    "reset_cache: %d secondary-tier jobs did not finish within %.1f s; their "
                    "results will be ignored",
                    len(self._jobs),
                    timeout_s,
                )
                self._jobs.clear()
                return
            time.sleep(0.001)
            self.collect()

    def abandon(self) -> None:
        """Forget every job and staged promotion (the tiers were shut down)."""
        self.drop_staged()
        self._jobs.clear()

    def _settle(
        self,
        tier_index: int,
        job: JobMetadata,
        success: bool,
        successful_keys: Collection[OffloadKey] | None = None,
    ) -> None:
        failed = self._failed_promotions[tier_index]
        stats = self.stats[tier_index]
        if not success:
            stats.failed_jobs += 1
        elif job.is_promotion:
            stats.blocks_loaded += len(job.keys)
        else:
            stats.blocks_stored += len(job.keys)
        if not job.is_promotion:
            self._primary.complete_read(job.keys, job.req_context)
            if success and failed:
                for key in job.keys:
                    failed.pop(key, None)
            return
        if success:
            self._primary.complete_write(job.keys, job.req_context, True)
            return
        # As vLLM: the blocks of a failed promotion that the tier wrote completely stay.
        kept = set(successful_keys or ())
        if not kept.issubset(job.keys):
            logger.warning(
                "secondary tier %s reported successful keys that job %d does not have; "
                "all of its blocks are dropped",
                self._tiers[tier_index].medium,
                job.job_id,
            )
            kept.clear()
        lost = [key for key in job.keys if key not in kept]
        if kept:
            stats.blocks_loaded += len(kept)
            self._primary.complete_write([key for key in job.keys if key in kept], job.req_context, True)
        self._primary.complete_write(lost, job.req_context, False)
        if self._failed_promotion_memory:
            for key in lost:
                failed[key] = None
                failed.move_to_end(key)
            while len(failed) > self._failed_promotion_memory:
                failed.popitem(last=False)
