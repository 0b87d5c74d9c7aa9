"""`TieringOffloadingManager`: a CPU primary tier in front of any number of secondary tiers
(vLLM 0.33: `tiering/manager.py`).

Where the parts live: this module holds the calls the connector makes (lookups, GPU loads and
stores, requests, steps, reset, statistics, shutdown); the jobs between the primary and the
secondary tiers are its base class, `TieringJobs` in `kvref.tiering.jobs`.

1. Every tier gets every chunk: a chunk whose store into the primary completes is cascaded to
   all secondary tiers.
2. The primary is the gateway: secondary tiers never touch GPU memory; data flows through it.
3. Staged promotion: a chunk found only in a secondary tier is copied into the primary first,
   and `lookup` answers HIT_PENDING meanwhile ("ask again").
4. Reference counts protect primary chunks while a tier copies from or into them.

Promotions found during a step are submitted at its end (`on_schedule_end`), one
`submit_load` per (tier, request). Finished jobs are collected at most once per step by the
first `lookup`, and always before `prepare_store` decides what to evict.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from typing_extensions import override

from kvref.base import (
    CacheHitSource,
    ConfigInfoMapping,
    LookupResult,
    OffloadingConnectorStats,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    OffloadPolicy,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    check_key_collection,
)
from kvref.cpu.common import CPULoadStoreSpec
from kvref.errors import OffloadProtocolError
from kvref.tiering.base import TIER_LABEL, ParentManager, SecondaryTierManager, TransferJob
from kvref.tiering.jobs import JobMetadata, PendingPromotion, TieringJobs
from kvref.tiering.poll_thread import DEFAULT_TIER_POLL_INTERVAL_S, JOIN_TIMEOUT_S, TierPollThread
from kvref.tiering.primary import CPUPrimaryTierOffloadingManager

__all__ = ["JobMetadata", "PendingPromotion", "RequestState", "TieringOffloadingManager"]

logger = logging.getLogger(__name__)


def _new_key_list() -> list[OffloadKey]:
    return []  # not list[OffloadKey](): a parameterised builtin is ten times slower to call


@dataclass(slots=True)
class RequestState:
    """What the manager tracks of one request until every tier has been told it finished.

    Attributes:
        pending_primary_stores: `prepare_store`s with chunks whose `complete_store` (which may
            still cascade) has not come.
        request_level_tiers: the tiers that asked for the request's every chunk.
        pending_cascade_keys: chunks a request-level cascade waits on (their primary write is
            in flight).
    """

    req_context: ReqContext
    pending_primary_stores: int = 0
    is_finished: bool = False
    request_level_tiers: set[int] | None = None
    pending_cascade_keys: list[OffloadKey] = field(default_factory=_new_key_list)


class _SecondaryTierFacingParent(ParentManager):
    """The `ParentManager` one tier is given: the manager, with that tier left out."""

    __slots__ = ("_m", "_origin_idx")

    def __init__(self, manager: TieringOffloadingManager, tier_idx: int) -> None:
        self._m = manager
        self._origin_idx = tier_idx

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return self._m.on_new_request(req_context, exclude_tier_idx=self._origin_idx)

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return self._m.lookup(key, req_context, exclude_tier_idx=self._origin_idx)

    @override
    def create_store_job(self, keys: Collection[OffloadKey], req_context: ReqContext) -> TransferJob:
        return self._m.create_store_job(keys, req_context, self._origin_idx)

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        self._m.on_request_finished(req_context, exclude_tier_idx=self._origin_idx)


class TieringOffloadingManager(TieringJobs, OffloadingManager):
    """Offloads to a CPU primary tier and cascades every stored chunk to the secondary tiers.

    Its `lock` is a real lock: the tier-poll thread (started when a tier sets
    `tolerates_off_thread_polling`) enters the manager too.

    Args:
        primary_tier: the CPU tier, the only one the GPU exchanges chunks with.
        secondary_tiers: the other tiers, in lookup order (fastest first).
        tier_poll_interval_s: the pause between tier-poll rounds; zero or less: no thread.
    """

    def __init__(
        self,
        primary_tier: CPUPrimaryTierOffloadingManager,
        secondary_tiers: list[SecondaryTierManager] | None = None,
        tier_poll_interval_s: float = DEFAULT_TIER_POLL_INTERVAL_S,
    ) -> None:
        super().__init__(primary_tier, list(secondary_tiers or []))
        # Guards this manager and every tier, the primary included (which has no lock of its own).
        self._lock = threading.Lock()
        # Set by reset_cache() until on_reset_flushed(); see lookup().
        self._promotions_held = False
        self._req_state: dict[str, RequestState] = {}
        # GPU loads prepared through this manager and not completed: the primary's reference
        # counts also hold the cascades' reads, which a stray complete_load must not release.
        self._gpu_loads: Counter[OffloadKey] = Counter()
        self._tier_parents = {tier: _SecondaryTierFacingParent(self, idx) for idx, tier in enumerate(self.secondary_tiers)}
        self._polled_tiers = [tier for tier in self.secondary_tiers if tier.tolerates_off_thread_polling]
        self._tier_poll_thread: TierPollThread | None = None
        if self._polled_tiers and tier_poll_interval_s > 0:
            self._tier_poll_thread = TierPollThread(
                self.poll_tiers, self._lock, tier_poll_interval_s, name="kvref_offload_tier_poll"
            )

    @property
    @override
    def lock(self) -> threading.Lock:
        return self._lock

    def poll_tiers(self) -> None:
        """One tier-poll round: collect the polled tiers' finished jobs and let them serve.

        The caller holds `lock` throughout. The step's batching points (promotions, parked
        cascades) stay at the step's end. The once-per-step poll gate is held shut for the
        round and put back as it was, so a lookup made while serving neither polls every tier
        off-thread nor makes the next step skip its poll.
        """
        gate = self._processed_jobs_this_step
        self._processed_jobs_this_step = True
        try:
            self._process_finished_jobs(self._polled_tiers)
            for tier in self._polled_tiers:
                tier.serve_external_requests(self._tier_parents[tier])
        finally:
            self._processed_jobs_this_step = gate

    # --- lookups and promotions ---

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext, *, exclude_tier_idx: int | None = None) -> LookupResult:
        """Ask the primary, then each secondary tier in order; a secondary HIT starts a promotion.

        Args:
            key: the chunk.
            req_context: the request asking.
            exclude_tier_idx: a tier to leave out (the one serving a peer's request).

        Returns:
            HIT: ready in the primary. HIT_PENDING: its write into the primary is in flight (a
            promotion started now, or earlier). RETRY: a tier does not know yet. MISS: in no
            tier; or the primary has no room for a promotion; or promotions are held after a
            reset (see `reset_cache`).
        """
        # First, so that a promotion finished since is a HIT now, and chunks freed by finished
        # jobs are evictable in time for a promotion this lookup may start.
        self._maybe_process_finished_jobs()
        start_time = time.monotonic()
        primary_result = self.primary_tier.lookup(key, req_context)
        self._metrics.on_lookup(
            req_context, key, self._metrics.primary_tier_label, primary_result, time.monotonic() - start_time
        )
        if primary_result is LookupResult.HIT or primary_result is LookupResult.HIT_PENDING:
            return primary_result
        if self._promotions_held:
            return LookupResult.MISS
        any_retry = False
        for tier_idx, tier in enumerate(self.secondary_tiers):
            if tier_idx == exclude_tier_idx or not req_context.load_tier_filter.allows(tier.medium, tier.locality):
                continue
            start_time = time.monotonic()
            result = tier.lookup(key, req_context)
            duration = time.monotonic() - start_time
            self._metrics.on_lookup(req_context, key, self._metrics.tier_label(tier_idx), result, duration)
            if result is LookupResult.HIT:
                promoted = self._initiate_promotion(tier_idx, key, req_context)
                return LookupResult.HIT_PENDING if promoted else LookupResult.MISS
            any_retry = any_retry or result is LookupResult.RETRY
        return LookupResult.RETRY if any_retry else LookupResult.MISS

    @override
    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        load_sources = self._request_load_sources.get(req_context.req_id)
        if load_sources is not None and key in load_sources:
            return load_sources[key]
        return self.primary_tier.get_load_source(key, req_context)

    # --- GPU loads ---

    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        """Pin chunks `lookup` answered HIT for in the primary, for the GPU to read."""
        spec = self.primary_tier.prepare_load(keys, req_context)
        self._gpu_loads.update(keys)
        return spec

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark chunks recently used in every tier."""
        self.primary_tier.touch(keys, req_context)
        for tier in self.secondary_tiers:
            tier.touch(keys, req_context)

    @override
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Release the GPU's pins of a matching `prepare_load`.

        Raises:
            OffloadProtocolError: a key has no GPU load in progress (a cascade's read of it does
                not count); nothing changed.
        """
        check_key_collection(keys, "complete_load")
        needed = Counter(keys)
        for key, count in needed.items():
            if self._gpu_loads[key] < count:
                raise OffloadProtocolError("complete_load", key, "not loaded by the GPU")
        self.primary_tier.complete_load(keys, req_context)
        self._gpu_loads.subtract(needed)
        for key in needed:
            if self._gpu_loads[key] == 0:
                del self._gpu_loads[key]

    # --- GPU stores and cascades ---

    @override
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Reserve primary slots for chunks the GPU is about to store.

        Finished jobs are collected first, unconditionally, so that evictions see every cascade
        that released its chunks and every promotion that completed. For request-level tiers,
        chunks already in the primary are cascaded now.
        """
        self._processed_jobs_this_step = True
        self._process_finished_jobs()
        result = self.primary_tier.prepare_store(keys, req_context)
        if result is None:
            return None
        state = self._req_state[req_context.req_id]
        if result.keys_to_store:
            state.pending_primary_stores += 1
        if state.request_level_tiers:
            to_store = set(result.keys_to_store)
            already_in_primary = tuple(key for key in keys if key not in to_store)
            if already_in_primary:
                self._cascade_existing_chunks_to_request_level_tiers(
                    already_in_primary, req_context, state.request_level_tiers
                )
        return result

    def _cascade_existing_chunks_to_request_level_tiers(
        self, keys: Sequence[OffloadKey], req_context: ReqContext, request_level_tiers: set[int]
    ) -> None:
        """Cascade chunks already in the primary to the tiers that keep whole requests.

        A chunk whose primary write is in flight (HIT_PENDING) is parked and retried at the
        step's end: the scheduler will not offer it again. A MISS is dropped (nothing to read).
        The primary answers every chunk it holds, so RETRY cannot come here.
        """
        state = self._req_state[req_context.req_id]
        ready_keys: list[OffloadKey] = []
        for key in keys:
            result = self.primary_tier.lookup(key, req_context)
            if result is LookupResult.HIT:
                ready_keys.append(key)
            elif result is LookupResult.HIT_PENDING:
                state.pending_cascade_keys.append(key)
            else:
                assert result is LookupResult.MISS, f"primary tier returned {result} for a cascade key"
        if not ready_keys:
            return
        for tier_idx in request_level_tiers:
            tier = self.secondary_tiers[tier_idx]
            if self._should_store_to_tier(tier, len(ready_keys)):
                tier.submit_store(self.create_store_job(ready_keys, req_context, tier_idx))

    def _flush_pending_cascades(self) -> None:
        """Retry the parked request-level cascades; a parked chunk always resolves (HIT or MISS)."""
        for req_id, state in list(self._req_state.items()):
            if not state.pending_cascade_keys:
                continue
            assert state.request_level_tiers
            keys, state.pending_cascade_keys = state.pending_cascade_keys, []
            self._cascade_existing_chunks_to_request_level_tiers(keys, state.req_context, state.request_level_tiers)
            self._maybe_finalize_request(req_id)

    @override
    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Finish a GPU store into the primary and, if it succeeded, cascade it to every tier
        (each cascade pins the chunks until that tier reports its job)."""
        self.primary_tier.complete_store(keys, req_context, success)
        if success:
            for tier_idx, tier in enumerate(self.secondary_tiers):
                if self._should_store_to_tier(tier, len(keys)):
                    tier.submit_store(self.create_store_job(keys, req_context, tier_idx))
        state = self._req_state[req_context.req_id]
        assert state.pending_primary_stores > 0, f"request {req_context.req_id!r} has no store pending"
        state.pending_primary_stores -= 1
        self._maybe_finalize_request(req_context.req_id)

    # --- requests and steps ---

    @override
    def on_new_request(self, req_context: ReqContext, *, exclude_tier_idx: int | None = None) -> RequestOffloadingContext:
        """Ask every tier how it wants the request offered; REQUEST_LEVEL if any tier does."""
        state = RequestState(req_context=req_context)
        self._metrics.on_new_request(req_context)
        for tier_idx, tier in enumerate(self.secondary_tiers):
            if tier_idx != exclude_tier_idx and tier.on_new_request(req_context).policy == OffloadPolicy.REQUEST_LEVEL:
                state.request_level_tiers = (state.request_level_tiers or set()) | {tier_idx}
        self._req_state[req_context.req_id] = state
        policy = OffloadPolicy.REQUEST_LEVEL if state.request_level_tiers else OffloadPolicy.CHUNK_LEVEL
        return RequestOffloadingContext(policy=policy)

    @override
    def on_request_finished(self, req_context: ReqContext, *, exclude_tier_idx: int | None = None) -> None:
        self.primary_tier.on_request_finished(req_context)
        self._req_state[req_context.req_id].is_finished = True
        self._maybe_finalize_request(req_context.req_id, exclude_tier_idx)

    def _maybe_finalize_request(self, req_id: str, exclude_tier_idx: int | None = None) -> None:
        """Tell the tiers a finished request is over, once no cascade can be submitted for it."""
        state = self._req_state[req_id]
        if not state.is_finished or state.pending_primary_stores or state.pending_cascade_keys:
            return
        for tier_idx, tier in enumerate(self.secondary_tiers):
            if tier_idx != exclude_tier_idx:
                tier.on_request_finished(state.req_context)
        self._metrics.on_request_finished(state.req_context)
        self._request_load_sources.pop(req_id, None)
        del self._req_state[req_id]

    @override
    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """The step's end: collect jobs, let tiers serve, submit promotions, retry parked
        cascades, and re-open the poll gate for the next step."""
        self._maybe_process_finished_jobs()  # also on steps that made no lookup
        for tier in self.secondary_tiers:
            tier.serve_external_requests(self._tier_parents[tier])
        # Re-opened only now, so that lookups while serving skip a second poll.
        self._processed_jobs_this_step = False
        self._flush_pending_promotions()
        self._flush_pending_cascades()
        for tier in self.secondary_tiers:
            tier.on_schedule_end(context)
        for req_id in context.new_req_ids:
            state = self._req_state.get(req_id)
            if state is not None:
                self._metrics.on_request_allocated(state.req_context)

    @override
    def has_pending_work(self) -> bool:
        return (
            bool(self._jobs)
            or any(state.pending_cascade_keys for state in self._req_state.values())
            or any(tier.has_pending_work() for tier in self.secondary_tiers)
        )

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        """The primary's events, then each tier's."""
        yield from self.primary_tier.take_events()
        for tier in self.secondary_tiers:
            yield from tier.take_events()

    # --- reset, metrics, shutdown ---

    @override
    def reset_cache(self) -> None:
        """Empty the primary, after every tier has drained its jobs.

        A stuck tier blocks here, visibly, rather than let a copy still in flight corrupt a
        reused slot. Secondary tiers keep their data. Running requests keep their state;
        finished ones are finalized. Promotions are then held until `on_reset_flushed`: a
        worker may still write a freed slot for a job in flight at the reset, so no promotion
        may fill one meanwhile; a chunk missing from the primary is a MISS until then.
        """
        for tier in self.secondary_tiers:
            tier.drain_jobs()
        self._process_finished_jobs()
        assert not self._jobs, "a tier did not report every job after drain_jobs"
        # Staged promotions reserved slots the reset frees; none was submitted.
        self._pending_load_submissions.clear()
        self._request_load_sources.clear()
        self._gpu_loads.clear()
        self._metrics.assert_idle()
        finished_req_ids: list[str] = []
        for req_id, state in self._req_state.items():
            state.pending_primary_stores = 0
            state.pending_cascade_keys.clear()
            if state.is_finished:
                for tier in self.secondary_tiers:
                    tier.on_request_finished(state.req_context)
                self._metrics.on_request_finished(state.req_context)
                finished_req_ids.append(req_id)
        self.primary_tier.reset_cache()
        for req_id in finished_req_ids:
            del self._req_state[req_id]
        self._processed_jobs_this_step = False
        for tier in self.secondary_tiers:
            if tier.bp_detector is not None:
                tier.bp_detector.reset()
        self._promotions_held = bool(self.secondary_tiers)

    @override
    def on_reset_flushed(self) -> None:
        self._promotions_held = False

    @override
    def get_stats(self) -> OffloadingConnectorStats | None:
        """The primary's observations, the tiering's own, and each tier's."""
        stats: OffloadingConnectorStats | None = self.primary_tier.get_stats()
        if stats.is_empty():
            stats = None
        self._metrics.record_backpressure(self.secondary_tiers)
        parts = [self._metrics.take_stats(), *(tier.get_stats() for tier in self.secondary_tiers)]
        for part in parts:
            if part is None or part.is_empty():
                continue
            stats = part if stats is None else stats.aggregate(part)
        return stats

    @override
    def config_info(self) -> Sequence[ConfigInfoMapping]:
        """One mapping per tier, the primary's first, each with its `TIER_LABEL`.

        Raises:
            ValueError: the primary returned more than one mapping.
        """
        (primary_info,) = self.primary_tier.config_info()
        tier_infos = [{**primary_info, TIER_LABEL: self._metrics.primary_tier_label[0]}]
        for tier in self.secondary_tiers:
            label = self._metrics.tier_label(self._tier_index[tier])[0]
            tier_infos.append({**tier.config_info(), TIER_LABEL: label})
        return tier_infos

    @override
    def shutdown(self) -> None:
        """Stop the tier-poll thread, shut every tier down, then release the primary.

        Call it without holding `lock`: it takes the lock itself if the thread will not stop, so
        as never to tear a tier down under a running round. If a tier fails to shut down, the
        primary's memory is kept (the tier may still use it) and the error is raised.

        Raises:
            RuntimeError: the thread still runs and the lock cannot be had.
        """
        poller = self._tier_poll_thread
        if poller is not None:
            poller.stop()
            if poller.running:
                if not self._lock.acquire(timeout=JOIN_TIMEOUT_S):
                    raise RuntimeError(
                        "KV offload tier-poll thread is still running and the manager lock is unavailable; "
                        "secondary tiers were not shut down. shutdown() must be called without holding manager.lock."
                    )
                try:
                    self._shutdown_tiers()
                finally:
                    self._lock.release()
                return
        self._shutdown_tiers()

    def _shutdown_tiers(self) -> None:
        shutdown_error: Exception | None = None
        for tier_idx, tier in enumerate(self.secondary_tiers):
            try:
                tier.shutdown()
            except Exception as error:
                shutdown_error = error
                logger.exception("Failed to shut down secondary tier #%d (%s, %s)", tier_idx, tier.tier_type, type(tier).__name__)
        if shutdown_error is not None:
            raise shutdown_error
        self.primary_tier.shutdown()
