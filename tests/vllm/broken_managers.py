"""Broken vLLM offloading managers, one bug each, for the conformance kit to catch.

Each is vLLM 0.33's own `CPUOffloadingManager` with one fault an author could make; `BREAKS`
says which rule of `OffloadingManagerContract` each one breaks, and `POLICY` the policy its test
class declares (a manager passing one policy off as another is caught only when it declares).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from typing_extensions import override
from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

__all__ = ["BREAKS", "POLICY", "make"]


class HitWhilePending(CPUOffloadingManager):
    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        answer = super().lookup(key, req_context)
        return LookupResult.HIT if answer is LookupResult.HIT_PENDING else answer


class MissWhilePending(CPUOffloadingManager):
    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        answer = super().lookup(key, req_context)
        return LookupResult.MISS if answer is LookupResult.HIT_PENDING else answer


class LoadWithoutReference(CPUOffloadingManager):
    """`prepare_load` forgets to pin: the chunk stays evictable while it is read."""

    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        spec = super().prepare_load(keys, req_context)
        for key in keys:
            chunk = self._policy.get(key)
            assert chunk is not None
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self._num_evictable_cache_chunks += 1
                self._policy.mark_evictable(key)
        return spec

    @override
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return None


class ReferenceNeverDropped(CPUOffloadingManager):
    @override
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return None


class FailedStoreKept(CPUOffloadingManager):
    @override
    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        super().complete_store(keys, req_context, True)


class FailedStoreLeaksChunks(CPUOffloadingManager):
    @override
    def _free_chunk(self, chunk: Any) -> None:
        if getattr(self, "_failing", False):
            return  # leaked: never handed out again
        super()._free_chunk(chunk)

    @override
    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        self._failing = not success
        try:
            super().complete_store(keys, req_context, success)
        finally:
            self._failing = False


class LosesStoredEvents(CPUOffloadingManager):
    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        return [event for event in super().take_events() if event.removed]


class DoublesStoredEvents(CPUOffloadingManager):
    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        events = list(super().take_events())
        return events + [event for event in events if not event.removed]


class LosesRemovalEvents(CPUOffloadingManager):
    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        return [event for event in super().take_events() if not event.removed]


class EventsWhenDisabled(CPUOffloadingManager):
    def __init__(self, num_chunks: int, cache_policy: str = "lru", enable_events: bool = False, **kwargs: Any) -> None:
        super().__init__(num_chunks, cache_policy, enable_events=True, **kwargs)


class SharesAChunkId(CPUOffloadingManager):
    @override
    def _allocate_chunks(self, keys: list[OffloadKey]) -> list[Any]:
        chunks = super()._allocate_chunks(keys)
        for chunk in chunks[1:]:
            chunk.chunk_id = chunks[0].chunk_id
        return chunks


class ChunkIdsOutOfRange(CPUOffloadingManager):
    @override
    def _get_load_store_spec(self, keys: Iterable[OffloadKey], chunks: Iterable[Any]) -> CPULoadStoreSpec:
        return CPULoadStoreSpec([chunk.chunk_id + self._num_chunks for chunk in chunks])


class LoadsFromOtherChunks(CPUOffloadingManager):
    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        spec = super().prepare_load(keys, req_context)
        assert isinstance(spec, CPULoadStoreSpec)
        return CPULoadStoreSpec(list(reversed(spec.chunk_ids.tolist())))


class RefusesWithRoom(CPUOffloadingManager):
    """Refuses every store once the cache is half full, free chunks or not."""

    @override
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        if self._num_allocated_chunks - len(self._free_list) >= self._num_chunks // 2 and any(
            self._policy.get(key) is None for key in keys
        ):
            return None
        return super().prepare_store(keys, req_context)


class ResetKeepsBlocks(CPUOffloadingManager):
    @override
    def reset_cache(self) -> None:
        return None


class IgnoresRecency(CPUOffloadingManager):
    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return None


class EvictsWhatItWasOffered(CPUOffloadingManager):
    """Asks its policy to evict without protecting the blocks it was offered."""

    def __init__(self, num_chunks: int, cache_policy: str = "lru", **kwargs: Any) -> None:
        super().__init__(num_chunks, cache_policy, **kwargs)
        evict = self._policy.evict
        self._policy.evict = lambda n, protected: evict(n, set())


class OffersStoredBlocksAgain(CPUOffloadingManager):
    @override
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        keys = list(keys)
        output = super().prepare_store(keys, req_context)
        if output is None:
            return None
        again = [key for key in keys if key not in output.keys_to_store]
        return PrepareStoreOutput(list(output.keys_to_store) + again, output.store_spec, output.evicted_keys)


class HidesAnEviction(CPUOffloadingManager):
    @override
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        output = super().prepare_store(keys, req_context)
        if output is None or not output.evicted_keys:
            return output
        return PrepareStoreOutput(output.keys_to_store, output.store_spec, output.evicted_keys[1:])


class ServesEvictedBlocks(CPUOffloadingManager):
    """Keeps evicted keys answering HIT (a lazy index)."""

    def __init__(self, num_chunks: int, cache_policy: str = "lru", **kwargs: Any) -> None:
        super().__init__(num_chunks, cache_policy, **kwargs)
        self.ghosts: set[OffloadKey] = set()

    @override
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        output = super().prepare_store(keys, req_context)
        if output is not None:
            self.ghosts.update(output.evicted_keys)
            self.ghosts.difference_update(output.keys_to_store)
        return output

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self.ghosts:
            return LookupResult.HIT
        return super().lookup(key, req_context)


_POLICY_OF: dict[str, str] = {"ARCPassedOffAsLRU": "arc", "LRUPassedOffAsARC": "lru"}

class FailedStoreNeverReleased(CPUOffloadingManager):
    """Forgets the metadata-only removal of a failed store: the events tracker's payload leaks."""

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        return [event for event in super().take_events() if not event.metadata_only]


class ReleasesRetriedBlocks(CPUOffloadingManager):
    """Releases a failed store's blocks even when a retry holds them again."""

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is None:
            return []
        events, self.events = self.events, []
        return events  # vLLM's drops from a release the blocks a retry holds again


class StaleUsageAfterReset(CPUOffloadingManager):
    """`reset_cache` leaves a stale count behind: the empty cache reports usage above 0."""

    @override
    def reset_cache(self) -> None:
        super().reset_cache()
        self._num_evictable_cache_chunks = -1  # a stale count the usage gauge is computed from


class CountsPendingTwice(CPUOffloadingManager):
    """Counts each chunk of a store as two in flight: write usage passes 100%."""

    @override
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        output = super().prepare_store(keys, req_context)
        if output is not None:
            self._num_write_pending_chunks += len(output.keys_to_store)
        return output

    @override
    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        before = self._num_write_pending_chunks
        super().complete_store(keys, req_context, success)
        self._num_write_pending_chunks -= before - self._num_write_pending_chunks


BREAKS: dict[str, str] = {
    "HitWhilePending": "lookup_is_hit_pending_while_a_store_is_in_flight",
    "MissWhilePending": "lookup_is_hit_pending_while_a_store_is_in_flight",
    "LoadWithoutReference": "a_chunk_being_loaded_is_never_evicted",
    "ReferenceNeverDropped": "prepare_store_does_not_refuse_when_there_is_room",
    "FailedStoreKept": "lookup_is_a_miss_after_a_failed_complete_store",
    "FailedStoreLeaksChunks": "a_failed_store_frees_its_chunks",
    "LosesStoredEvents": "events_replay_to_what_lookups_report",
    "DoublesStoredEvents": "events_replay_to_what_lookups_report",
    "LosesRemovalEvents": "removal_events_name_exactly_the_evicted_keys",
    "EventsWhenDisabled": "no_events_unless_enabled",
    "SharesAChunkId": "chunk_ids_are_distinct_and_in_range",
    "ChunkIdsOutOfRange": "chunk_ids_are_distinct_and_in_range",
    "LoadsFromOtherChunks": "loads_read_the_chunks_given_at_store_time",
    "RefusesWithRoom": "prepare_store_does_not_refuse_when_there_is_room",
    "ResetKeepsBlocks": "reset_cache_empties",
    "IgnoresRecency": "evictions_follow_the_reference_policy",
    "ARCPassedOffAsLRU": "evictions_follow_the_reference_policy",
    "LRUPassedOffAsARC": "evictions_follow_the_reference_policy",
    "EvictsWhatItWasOffered": "keys_offered_again_stay_stored",
    "OffersStoredBlocksAgain": "keys_already_stored_are_never_offered_again",
    "HidesAnEviction": "evicted_keys_name_exactly_the_keys_that_went",
    "ServesEvictedBlocks": "evicted_keys_name_exactly_the_keys_that_went",
    "FailedStoreNeverReleased": "a_failed_store_is_released_in_the_events",
    "ReleasesRetriedBlocks": "a_failed_store_is_released_in_the_events",
    "StaleUsageAfterReset": "stats_are_well_formed",
    "CountsPendingTwice": "stats_are_well_formed",
}
# The policy each one's test class declares (None: policy-independent rules only).
POLICY: dict[str, str | None] = {**{name: "lru" for name in BREAKS}, "LRUPassedOffAsARC": "arc"}


def make(name: str, num_chunks: int, enable_events: bool) -> CPUOffloadingManager:
    """Build broken manager `name` (a plain vLLM manager of another policy for the impostors)."""
    cls = globals().get(name, CPUOffloadingManager)
    return cls(num_chunks, _POLICY_OF.get(name, "lru"), enable_events=enable_events)
