"""Multi-tier offloading: a CPU primary tier in front of any number of secondary tiers.

`TieringOffloadingManager` is the `OffloadingManager` the connector talks to. The GPU only ever
exchanges blocks with the primary (`CPUPrimaryTierOffloadingManager`, over a
`SharedOffloadRegion`); secondary tiers copy blocks out of and into the primary's memory.

    store:   prepare_store/complete_store (GPU -> primary), then a cascade: one
             `submit_store` per secondary tier, each holding one read reference on the blocks
             until that tier reports the job finished.
    lookup:  primary, then each secondary tier in order. A secondary hit reserves a primary slot
             at once (so the block is promoted only once, whoever asks) and answers None
             ("retry"); at the end of the step the reservations are submitted, one `submit_load`
             per (tier, request). When the promotion finishes the block is loadable from the
             primary; when it fails the slot is freed and the tier is not asked for that block
             again (until it stores it anew), so lookups miss instead of retrying forever.

End of step: the connector signals it by calling `end_step()` once per scheduler step, after the
step's lookups and prepare calls (vLLM: `on_schedule_end`). `take_events()` calls `end_step()`
first, so a connector of the vLLM era, which calls `take_events()` once per step, needs nothing
else. Finished jobs are collected at most once per step: by the step's first `lookup`,
`prepare_load` or `prepare_store` (so that cascades that finished release their references
before any eviction decision of that step), or else by `end_step()` itself, so an idle engine
that only keeps stepping still sees its cascades release their blocks and its promotions
complete, and `has_pending_work()` turns False. Then `end_step()` submits the promotions staged
during the step and re-opens the poll for the next step.

Statistics: `get_stats()` returns the primary's `OffloadingStats` with every tier's cumulative
`TierStats` (primary first) in its `tiers`; `tier_stats()` returns those alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from array import array
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

from typing_extensions import override

from kvref.base import (
    OffloadingEvent,
    OffloadingManager,
    OffloadingStats,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.manager import CPUOffloadingManager, describe_block
from kvref.cpu.policies.factory import CachePolicyName
from kvref.cpu.shared_region import SharedOffloadRegion
from kvref.errors import KVRefError, OffloadProtocolError
from kvref.tiering._options import check_bool
from kvref.tiering.base import JobId, JobMetadata, SecondaryTierManager, TierStats
from kvref.tiering.factory import create_secondary_tier

__all__ = [
    "CPUPrimaryTierOffloadingManager",
    "TieringOffloadingManager",
    "create_tiering_manager",
]

logger = logging.getLogger(__name__)


class CPUPrimaryTierOffloadingManager(CPUOffloadingManager):
    """The CPU tier of a tiering setup: a `CPUOffloadingManager` over a shared region.

    Adds the secondary tiers' vocabulary (a secondary tier *reads* the primary to store a block,
    and *writes* it to promote one) and the memoryview through which they copy.

    Args:
        region: the shared memory holding the blocks (one per row); the manager owns it from now
            on and cleans it up in `shutdown`.
        cache_policy: "lru" or "arc".
        enable_events: buffer stored/removed events of the CPU medium.
    """

    def __init__(
        self,
        region: SharedOffloadRegion,
        cache_policy: CachePolicyName = "lru",
        enable_events: bool = False,
    ) -> None:
        super().__init__(region.num_blocks, cache_policy, enable_events)
        self.region = region
        self._kv_view: memoryview | None = region.create_kv_memoryview()

    def prepare_read(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        """`prepare_load` for a secondary tier that is about to copy the blocks out."""
        return self.prepare_load(keys, req_context)

    def complete_read(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """`complete_load` once a secondary tier's copy out finished."""
        self.complete_load(keys, req_context)

    def prepare_write(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """`prepare_store` for blocks a secondary tier is about to copy in (a promotion)."""
        return self.prepare_store(keys, req_context)

    def complete_write(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """`complete_store` once a secondary tier's copy in finished (or failed)."""
        self.complete_store(keys, req_context, success)

    def get_kv_memoryview(self) -> memoryview:
        """Return the `(num_blocks, row_bytes)` view secondary tiers copy through.

        Raises:
            KVRefError: the manager was shut down.
        """
        if self._kv_view is None:
            raise KVRefError("the primary tier was shut down; its memory is released")
        return self._kv_view

    @override
    def shutdown(self) -> None:
        """Release the view and clean up the region (unlinking it if this process created it)."""
        self._kv_view = None
        self.region.cleanup()


@dataclass
class _StagedPromotion:
    """Primary slots reserved this step for blocks one request promotes from one tier."""

    req_context: ReqContext
    keys: list[OffloadKey] = field(default_factory=lambda: [])
    block_ids: list[int] = field(default_factory=lambda: [])


class TieringOffloadingManager(OffloadingManager):
    """Offloads to a CPU primary tier and cascades every stored block to secondary tiers.

    See the module docstring for the data flow and how the end of a step is signalled.

    Args:
        primary: the CPU tier (the only one the GPU exchanges blocks with).
        secondary_tiers: the other tiers, in lookup order (fastest first).
        failed_promotion_memory: per tier, how many blocks whose promotion failed are
            remembered (and not asked for again) even if the tier still claims them.
        drain_timeout_s: how long `reset_cache` waits for the tiers' jobs to finish.

    Raises:
        ValueError: `failed_promotion_memory` < 0 or `drain_timeout_s` < 0.
    """

    def __init__(
        self,
        primary: CPUPrimaryTierOffloadingManager,
        secondary_tiers: Sequence[SecondaryTierManager] = (),
        *,
        failed_promotion_memory: int = 65_536,
        drain_timeout_s: float = 60.0,
    ) -> None:
        if failed_promotion_memory < 0:
            raise ValueError(f"failed_promotion_memory must be >= 0, got {failed_promotion_memory}")
        if drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {drain_timeout_s}")
        self._primary = primary
        self._tiers: tuple[SecondaryTierManager, ...] = tuple(secondary_tiers)
        self._failed_promotion_memory = failed_promotion_memory
        self._drain_timeout_s = drain_timeout_s
        self._job_ids = itertools.count()
        # In-flight jobs: id -> (tier index, job).
        self._jobs: dict[JobId, tuple[int, JobMetadata]] = {}
        # Per tier: request id -> promotion staged this step, submitted by end_step().
        self._staged: list[dict[str, _StagedPromotion]] = [{} for _ in self._tiers]
        # Per tier: blocks whose promotion failed (bounded, oldest forgotten first).
        self._failed_promotions: list[OrderedDict[OffloadKey, None]] = [
            OrderedDict() for _ in self._tiers
        ]
        # GPU -> primary stores prepared and not completed: key -> request id.
        self._pending_stores: dict[OffloadKey, str] = {}
        self._pending_stores_per_request: dict[str, int] = {}
        # Requests finished while they still had pending stores or staged promotions.
        self._deferred_finishes: dict[str, ReqContext] = {}
        # GPU loads prepared through this manager and not completed: key -> count. The primary's
        # reference counts also include the cascades' reads, which must not absorb a caller's
        # stray complete_load.
        self._gpu_loads: dict[OffloadKey, int] = {}
        self._polled_this_step = False
        self._closed = False
        self._stats = [TierStats(primary.medium)] + [TierStats(tier.medium) for tier in self._tiers]

    # --- introspection ---

    @property
    def primary(self) -> CPUPrimaryTierOffloadingManager:
        """The CPU primary tier."""
        return self._primary

    @property
    def secondary_tiers(self) -> tuple[SecondaryTierManager, ...]:
        """The secondary tiers, in lookup order."""
        return self._tiers

    @property
    def num_inflight_jobs(self) -> int:
        """Jobs submitted to secondary tiers and not yet reported finished."""
        return len(self._jobs)

    def has_pending_work(self) -> bool:
        """True while jobs are in flight, promotions are staged, or a tier has work of its own.

        While True the engine should keep stepping (and calling `end_step`) even with no
        request scheduled: each step end collects what finished.
        """
        return (
            bool(self._jobs)
            or any(self._staged)
            or any(tier.has_pending_work() for tier in self._tiers)
        )

    @override
    def get_stats(self) -> OffloadingStats:
        """Return the primary tier's counters with every tier's `TierStats` in `tiers`.

        The top-level counters are the CPU primary's (what the GPU stored into and loaded
        from it); `tiers` holds `tier_stats()`: the primary first, then each secondary tier.
        """
        primary = self._primary.get_stats()
        return dataclasses.replace(primary, tiers=MappingProxyType(self.tier_stats()))

    def tier_stats(self) -> dict[str, TierStats]:
        """Return a snapshot of each tier's cumulative counters, primary first.

        Returns:
            Tier name -> its `TierStats` (a copy). The primary is named by its medium ("CPU");
            a secondary tier by its medium, suffixed with "#<index>" if two tiers share a name.
        """
        primary = self._primary
        snapshot: dict[str, TierStats] = {}
        for index, stats in enumerate(self._stats):
            copy = dataclasses.replace(stats)
            if index == 0:
                used = primary.num_blocks - primary.num_free_blocks
                copy.usage = used / primary.num_blocks if primary.num_blocks else None
            else:
                tier = self._tiers[index - 1]
                copy.blocks_evicted = tier.num_evicted_blocks()
                copy.usage = tier.usage()
            name = copy.name if copy.name not in snapshot else f"{copy.name}#{index}"
            snapshot[name] = copy
        return snapshot

    @override
    def __repr__(self) -> str:
        return (
            f"TieringOffloadingManager(primary={self._primary!r}, tiers="
            f"{[tier.medium for tier in self._tiers]}, inflight_jobs={len(self._jobs)})"
        )

    # --- steps and jobs ---

    def end_step(self) -> None:
        """Signal the end of a scheduler step (also done by `take_events`).

        Collects finished jobs unless a call of this step already did (an idle step makes
        progress too), submits the promotions staged during the step, one `submit_load` per
        (tier, request), and re-opens the poll for the next step.
        """
        self._poll_finished_jobs_once()
        self._polled_this_step = False
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
                self._submit(tier_index, job)
            for req_id in staged:
                self._maybe_finish_request(req_id)

    def _submit(self, tier_index: int, job: JobMetadata) -> None:
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

    def _poll_finished_jobs_once(self) -> None:
        if not self._polled_this_step:
            self._polled_this_step = True
            self._process_finished_jobs()

    def _process_finished_jobs(self) -> None:
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

    def _settle(
        self,
        tier_index: int,
        job: JobMetadata,
        success: bool,
        successful_keys: Collection[OffloadKey] | None = None,
    ) -> None:
        failed = self._failed_promotions[tier_index]
        stats = self._stats[tier_index + 1]
        if not success:
            stats.failed_jobs += 1
        elif job.is_promotion:
            stats.blocks_loaded += len(job.keys)
        else:
            stats.blocks_stored += len(job.keys)
        if job.is_promotion:
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
        else:
            self._primary.complete_read(job.keys, job.req_context)
            if success and failed:
                for key in job.keys:
                    failed.pop(key, None)

    # --- OffloadingManager interface ---

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        self._poll_finished_jobs_once()
        found = self._primary.lookup(key, req_context)
        stats = self._stats
        stats[0].lookups += 1
        if found is not False:
            if found:
                stats[0].hits += 1
            return found
        stats[0].misses += 1
        busy = False
        for tier_index, tier in enumerate(self._tiers):
            if key in self._failed_promotions[tier_index]:
                continue
            found = tier.lookup(key, req_context)
            tier_stats = stats[tier_index + 1]
            tier_stats.lookups += 1
            if found:
                tier_stats.hits += 1
                return self._stage_promotion(tier_index, key, req_context)
            if found is None:
                busy = True
            else:
                tier_stats.misses += 1
        return None if busy else False

    def _stage_promotion(
        self, tier_index: int, key: OffloadKey, req_context: ReqContext
    ) -> bool | None:
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

    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        self._poll_finished_jobs_once()
        spec = self._primary.prepare_load(keys, req_context)
        loads = self._gpu_loads
        for key in keys:
            loads[key] = loads.get(key, 0) + 1
        self._stats[0].blocks_loaded += len(keys)
        return spec

    @override
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Release GPU loads prepared by `prepare_load`.

        Raises:
            OffloadProtocolError: a key (counted with repetition) has no GPU load prepared
                through this manager in progress; nothing was changed. A cascade's read of the
                same block does not count: it belongs to the tier copying it.
        """
        loads = self._gpu_loads
        releases: dict[OffloadKey, int] = {}
        for key in keys:
            releases[key] = releases.get(key, 0) + 1
        for key, count in releases.items():
            in_progress = loads.get(key, 0)
            if in_progress < count:
                state = describe_block(self._primary.policy.get(key))
                detail = (
                    f"{in_progress} GPU loads of it in progress, {count} released; "
                    "only loads prepared by prepare_load can be completed"
                )
                raise OffloadProtocolError("complete_load", key, state, detail)
        self._primary.complete_load(keys, req_context)
        for key, count in releases.items():
            remaining = loads[key] - count
            if remaining:
                loads[key] = remaining
            else:
                del loads[key]

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._primary.touch(keys, req_context)
        for tier in self._tiers:
            tier.touch(keys, req_context)

    @override
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        # Cascades that finished release their primary references before eviction is decided.
        self._poll_finished_jobs_once()
        output = self._primary.prepare_store(keys, req_context)
        if output is not None:
            self._stats[0].blocks_evicted += len(output.evicted_keys)
        if output is not None and output.keys_to_store:
            req_id = req_context.req_id
            for key in output.keys_to_store:
                self._pending_stores[key] = req_id
            self._pending_stores_per_request[req_id] = (
                self._pending_stores_per_request.get(req_id, 0) + len(output.keys_to_store)
            )
        return output

    @override
    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        # Only keys this manager prepared for a GPU store: a key pending because it is being
        # promoted must not be marked written by a caller passing a superset.
        completed: list[OffloadKey] = []
        requests: set[str] = set()
        for key in dict.fromkeys(keys):
            req_id = self._pending_stores.pop(key, None)
            if req_id is not None:
                completed.append(key)
                requests.add(req_id)
                self._pending_stores_per_request[req_id] -= 1
        if not completed:
            return
        self._primary.complete_store(completed, req_context, success)
        if success:
            self._stats[0].blocks_stored += len(completed)
        else:
            self._stats[0].failed_jobs += 1
        if success:
            keys_tuple = tuple(completed)
            for tier_index in range(len(self._tiers)):
                # One read reference per tier, dropped when that tier's job finishes.
                spec = self._primary.prepare_read(keys_tuple, req_context)
                job = JobMetadata(next(self._job_ids), keys_tuple, spec.block_ids, False, req_context)
                self._submit(tier_index, job)
        for req_id in requests:
            if self._pending_stores_per_request[req_id] == 0:
                del self._pending_stores_per_request[req_id]
            self._maybe_finish_request(req_id)

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return self._primary.on_new_request(req_context)

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        """Finish the request in the primary now, in the secondary tiers once nothing more can be
        submitted to them for it (its pending stores completed, its staged promotions sent)."""
        self._primary.on_request_finished(req_context)
        self._deferred_finishes[req_context.req_id] = req_context
        self._maybe_finish_request(req_context.req_id)

    def _maybe_finish_request(self, req_id: str) -> None:
        if req_id not in self._deferred_finishes or req_id in self._pending_stores_per_request:
            return
        if any(req_id in staged for staged in self._staged):
            return
        req_context = self._deferred_finishes.pop(req_id)
        for tier in self._tiers:
            tier.on_request_finished(req_context)

    @override
    def take_events(self) -> list[OffloadingEvent]:
        """End the step (see `end_step`), then return the primary's and the tiers' events."""
        self.end_step()
        events = list(self._primary.take_events())
        for tier in self._tiers:
            events.extend(tier.take_events())
        return events

    @override
    def reset_cache(self) -> None:
        """Empty the primary; secondary tiers keep their blocks.

        Order: staged promotions are dropped unsubmitted; every tier is drained and its results
        applied (no job may touch a primary slot after the reset); requests waiting to finish
        are finished in the tiers; then the primary is reset.
        """
        # Their reserved slots vanish with the primary's reset below.
        self._staged = [{} for _ in self._tiers]
        self._drain()
        self._pending_stores.clear()
        self._pending_stores_per_request.clear()
        self._gpu_loads.clear()
        for req_id in list(self._deferred_finishes):
            self._maybe_finish_request(req_id)
        self._primary.reset_cache()
        self._polled_this_step = False

    def _drain(self) -> None:
        deadline = time.monotonic() + self._drain_timeout_s
        for tier in self._tiers:
            tier.drain_jobs()
        self._process_finished_jobs()
        while self._jobs:
            if time.monotonic() >= deadline:
                logger.error(
                    "reset_cache: %d secondary-tier jobs did not finish within %.1f s; their "
                    "results will be ignored",
                    len(self._jobs),
                    self._drain_timeout_s,
                )
                self._jobs.clear()
                return
            time.sleep(0.001)
            self._process_finished_jobs()

    @override
    def shutdown(self) -> None:
        """Shut the secondary tiers down (they stop copying), then the primary (its memory)."""
        if self._closed:
            return
        self._closed = True
        self._staged = [{} for _ in self._tiers]
        for tier in self._tiers:
            try:
                tier.shutdown()
            except Exception:
                logger.exception("secondary tier %s failed to shut down", tier.medium)
        self._jobs.clear()
        self._primary.shutdown()


def create_tiering_manager(
    region: SharedOffloadRegion,
    secondary_tiers: Iterable[Mapping[str, Any]] = (),
    *,
    cache_policy: CachePolicyName = "lru",
    enable_events: bool = False,
) -> TieringOffloadingManager:
    """Build a primary tier over `region` and the secondary tiers the configs describe.

    Args:
        region: the shared memory of the primary tier (owned by the manager from now on).
        secondary_tiers: one config per tier, in lookup order, e.g.
            `{"type": "fs", "root_dir": "/mnt/nvme/kv"}` (see `create_secondary_tier`).
        cache_policy: the primary's eviction policy, "lru" or "arc".
        enable_events: enable stored/removed events in the primary and every tier.

    Returns:
        The manager.

    Raises:
        ValueError: an argument or a tier config is invalid (the message names the field);
            everything built so far was shut down and the region cleaned up.
        OSError: a tier's storage is unusable (e.g. `TierRootError` for an fs root); cleaned
            up the same way.
    """
    configs = _check_tier_configs(secondary_tiers)
    events = check_bool("enable_events", enable_events)
    primary = CPUPrimaryTierOffloadingManager(region, cache_policy, events)
    tiers: list[SecondaryTierManager] = []
    overrides: dict[str, Any] = {"enable_events": True} if events else {}
    try:
        for config in configs:
            tiers.append(create_secondary_tier(config, primary.get_kv_memoryview(), **overrides))
    except BaseException:
        for tier in tiers:
            tier.shutdown()
        primary.shutdown()
        raise
    return TieringOffloadingManager(primary, tiers)


def _check_tier_configs(secondary_tiers: object) -> list[Mapping[str, Any]]:
    # A single mapping (or a string) where a list of them is expected is a common slip: iterating
    # it would yield its keys.
    kind = type(secondary_tiers).__name__
    if isinstance(secondary_tiers, (Mapping, str, bytes)) or not isinstance(
        secondary_tiers, Iterable
    ):
        raise ValueError(
            f"secondary_tiers must be a list of tier configs (mappings), got {kind}"
        )
    configs: list[Mapping[str, Any]] = []
    for index, config in enumerate(cast(Iterable[object], secondary_tiers)):
        if not isinstance(config, Mapping):
            raise ValueError(
                f"secondary_tiers[{index}] must be a mapping with a 'type', got {config!r}"
            )
        configs.append(cast(Mapping[str, Any], config))
    return configs
