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
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
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
from kvref.cpu.manager import describe_block
from kvref.cpu.policies.factory import CachePolicyName
from kvref.cpu.shared_region import SharedOffloadRegion
from kvref.errors import OffloadProtocolError
from kvref.tiering._options import check_bool
from kvref.tiering.base import SecondaryTierManager, TierStats
from kvref.tiering.factory import create_secondary_tier
from kvref.tiering.jobs import TierJobs
from kvref.tiering.primary import CPUPrimaryTierOffloadingManager

__all__ = [
    "CPUPrimaryTierOffloadingManager",
    "TieringOffloadingManager",
    "create_tiering_manager",
]

logger = logging.getLogger(__name__)


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
        self._drain_timeout_s = drain_timeout_s
        self._jobs = TierJobs(primary, self._tiers, failed_promotion_memory)
        # GPU -> primary stores prepared and not completed: key -> request id.
        self._pending_stores: dict[OffloadKey, str] = {}
        self._pending_stores_per_request: dict[str, int] = {}
        # Requests finished while they still had pending stores or staged promotions.
        self._deferred_finishes: dict[str, ReqContext] = {}
        # GPU loads prepared through this manager and not completed: key -> count. The primary's
        # reference counts also include the cascades' reads, which must not absorb a caller's
        # stray complete_load.
        self._gpu_loads: dict[OffloadKey, int] = {}
        self._closed = False
        self._stats = [TierStats(primary.medium), *self._jobs.stats]  # the same objects

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
            or self._jobs.any_staged
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
        self._jobs.poll_once()
        self._jobs.next_step()
        for req_id in self._jobs.submit_staged():
            self._maybe_finish_request(req_id)

    # --- OffloadingManager interface ---

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        self._jobs.poll_once()
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
            if self._jobs.failed_before(tier_index, key):
                continue
            found = tier.lookup(key, req_context)
            tier_stats = stats[tier_index + 1]
            tier_stats.lookups += 1
            if found:
                tier_stats.hits += 1
                return self._jobs.stage_promotion(tier_index, key, req_context)
            if found is None:
                busy = True
            else:
                tier_stats.misses += 1
        return None if busy else False

    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        self._jobs.poll_once()
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
        self._jobs.poll_once()
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
            self._jobs.cascade(tuple(completed), req_context)
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
        if self._jobs.staged_for(req_id):
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
        self._jobs.drop_staged()
        self._jobs.drain(self._drain_timeout_s)
        self._pending_stores.clear()
        self._pending_stores_per_request.clear()
        self._gpu_loads.clear()
        for req_id in list(self._deferred_finishes):
            self._maybe_finish_request(req_id)
        self._primary.reset_cache()
        self._jobs.next_step()

    @override
    def shutdown(self) -> None:
        """Shut the secondary tiers down (they stop copying), then the primary (its memory)."""
        if self._closed:
            return
        self._closed = True
        self._jobs.drop_staged()
        for tier in self._tiers:
            try:
                tier.shutdown()
            except Exception:
                logger.exception("secondary tier %s failed to shut down", tier.medium)
        self._jobs.abandon()
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
