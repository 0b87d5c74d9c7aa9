"""The CPU offloading manager: a fixed pool of CPU chunks behind a `CachePolicy` (vLLM 0.33:
`cpu/manager.py`).

The manager owns what every policy shares: the chunk pool, reference counts, the admission
filter, per-request access records, events and statistics. The policy owns the key -> chunk
mapping and decides which idle chunks to evict. A chunk's states:

    absent --prepare_store--> pending (ref_cnt -1) --complete_store--> idle (0) <--> read (n > 0)
      ^                          | complete_store(success=False): dropped, slot freed
      +------- evicted by a prepare_store that needs its slot (idle, not named by it)

Each request's accesses are recorded in its `ReqContext` (the keys it loaded or offered to
store, which it stored, which it reused); the policy sees each first access, each store miss
once, and the whole record when the request finishes, where LRU and ARC commit it. Where kvref
differs from vLLM on purpose is listed in docs/VLLM_DIFFERENCES.md.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from typing_extensions import override

from kvref.base import (
    CacheHitSource,
    ConfigInfoMapping,
    LookupResult,
    Medium,
    OffloadingConnectorStats,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    check_key_collection,
)
from kvref.cpu.common import CPULoadStoreSpec, CPUOffloadingInfo, CPUOffloadingMetrics
from kvref.cpu.policies.base import CachePolicy, ChunkStatus
from kvref.cpu.policies.factory import CachePolicyFactory
from kvref.errors import OffloadProtocolError

__all__ = ["CPUOffloadingManager"]

# An OffloadKey ends with its group index in 4 big-endian bytes; grouping and sorting keys by
# those bytes needs no index decoded.
_GROUP_SUFFIX = operator.itemgetter(slice(-4, None))
# The per-chunk checks of a batch run in C (`min(map(...))`) rather than as a loop of compares.
_REF_CNT = operator.attrgetter("ref_cnt")
_CHUNK_ID = operator.attrgetter("chunk_id")
# A module global is a tenth of the time of an enum attribute read (`lookup` runs per key).
_MISS, _HIT, _HIT_PENDING = LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING
# _LIST: `keys` that are not a list (what the connector passes) are checked for a single key (a
# TypeError); the check's call costs as much as a cheap call's own work.


# Dataclass factories: calling a parameterised builtin (`set[OffloadKey]()`) is ten times slower
# than the builtin itself, and a record is made per request.
def _new_key_set() -> set[OffloadKey]:
    return set()


def _new_key_dict() -> dict[OffloadKey, None]:
    return {}


@dataclass(slots=True)
class _RequestCacheAccess:
    """The cache keys one request named, and how.

    Attributes:
        seen_keys: every key it named, in the order first named (grouped by KV-cache group only
            when it finishes).
        inserted_keys: chunks it stored.
        reused_keys: ready chunks it loaded or offered again (not ones it stored itself).
        store_miss_keys: keys the policy has seen it miss (once per request).
    """

    owner: object
    cache_generation: int
    seen_keys: dict[OffloadKey, None] = field(default_factory=_new_key_dict)
    inserted_keys: set[OffloadKey] = field(default_factory=_new_key_set)
    reused_keys: set[OffloadKey] = field(default_factory=_new_key_set)
    store_miss_keys: set[OffloadKey] = field(default_factory=_new_key_set)
    finished: bool = False


class CPUOffloadingManager(OffloadingManager):
    """Offloads chunks to `num_chunks` CPU slots, evicting idle chunks as the policy chooses.

    Args:
        num_chunks: how many CPU chunk slots there are.
        cache_policy: the policy's registered name ("lru", "arc"), or the class name of an
            out-of-tree policy in `cache_policy_module_path`.
        cache_policy_module_path: the module to import an unregistered policy from.
        enable_events: collect stored/removed events for `take_events`.
        store_threshold: how many times a chunk must be offered to `prepare_store` before it is
            stored (the reuse filter; below 2, every offer is stored).
        max_tracker_size: how many chunks the reuse filter counts offers for (least recently
            offered forgotten first).
        info: the static facts `config_info` publishes.

    Raises:
        ValueError: `num_chunks` < 0, `max_tracker_size` < 1, or an unknown `cache_policy`.
    """

    def __init__(
        self,
        num_chunks: int,
        cache_policy: str = "lru",
        cache_policy_module_path: str | None = None,
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        info: CPUOffloadingInfo | None = None,
    ) -> None:
        if num_chunks < 0:
            raise ValueError(f"num_chunks must be >= 0, got {num_chunks}")
        if max_tracker_size < 1:
            raise ValueError(f"max_tracker_size must be >= 1, got {max_tracker_size}")
        self.medium: Medium = Medium.CPU
        self._num_chunks: int = num_chunks
        self._config_info: ConfigInfoMapping = info.as_config_info() if info is not None else {}
        self._num_allocated_chunks: int = 0
        self._free_list: list[int] = []
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        policy_cls = CachePolicyFactory.get_cache_policy_cls(cache_policy, cache_policy_module_path)
        self._policy: CachePolicy = policy_cls(cache_capacity=num_chunks)
        # The policy's chunks read directly when it keeps them in one dict (`chunk_map`): one
        # dict probe per key instead of a method call.
        chunk_map = self._policy.chunk_map()
        get_chunk = self._policy.get if chunk_map is None else chunk_map.get
        self._get_chunk: Callable[[OffloadKey], ChunkStatus | None] = get_chunk
        # Hooks a policy leaves as the base's no-ops (kvref's LRU and ARC keep no index of idle
        # chunks) are not called: that would be a call per key.
        policy_class = type(self._policy)
        hooks = (policy_class.mark_evictable, policy_class.mark_non_evictable)
        self._calls_evictability_hooks = hooks != (CachePolicy.mark_evictable, CachePolicy.mark_non_evictable)
        self._calls_request_access_hook = policy_class.on_request_access is not CachePolicy.on_request_access
        # Chunks that are idle (ref_cnt 0) and chunks with a store in flight (ref_cnt -1).
        self._num_evictable_cache_chunks: int = 0
        self._num_write_pending_chunks: int = 0
        self.store_threshold: int = store_threshold
        self.max_tracker_size: int = max_tracker_size
        self.stores_skipped_in_current_batch: int = 0
        self.allocation_sizes_in_current_batch: list[int] = []
        self._cache_generation = 0
        # The reuse filter: offers per chunk, least recently offered first.
        self.counts: OrderedDict[OffloadKey, int] | None = OrderedDict() if store_threshold >= 2 else None

    @property
    def num_chunks(self) -> int:
        """The CPU chunk slots."""
        return self._num_chunks

    # --- chunk pool ---

    def _get_num_free_chunks(self) -> int:
        return len(self._free_list) + self._num_chunks - self._num_allocated_chunks

    def _allocate_chunks(self, keys: list[OffloadKey]) -> list[ChunkStatus]:
        """Give each key a slot: never-used slots first, in order, then freed ones, last freed
        first."""
        num_fresh = min(len(keys), self._num_chunks - self._num_allocated_chunks)
        num_reused = len(keys) - num_fresh
        assert len(self._free_list) >= num_reused, "the chunk pool is short of free slots"
        chunk_ids = list(range(self._num_allocated_chunks, self._num_allocated_chunks + num_fresh))
        self._num_allocated_chunks += num_fresh
        if num_reused:
            chunk_ids += reversed(self._free_list[-num_reused:])  # what popping each would give
            del self._free_list[-num_reused:]
        return list(map(ChunkStatus, chunk_ids))

    def _free_chunk(self, chunk: ChunkStatus) -> None:
        self._free_list.append(chunk.chunk_id)

    def _get_load_store_spec(self, keys: Iterable[OffloadKey], chunks: Iterable[ChunkStatus]) -> CPULoadStoreSpec:
        return CPULoadStoreSpec(list(map(_CHUNK_ID, chunks)))

    # --- the reuse filter ---

    def _record_accesses(self, keys: Collection[OffloadKey]) -> None:
        """Count one offer of each key, forgetting the least recently offered untracked ones
        when the tracker is full, never a key of this offer."""
        assert self.counts is not None
        counts = self.counts
        protected: set[OffloadKey] = set()
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                counts[key] += 1
                protected.add(key)
        num_unprotected = len(counts) - len(protected)
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if num_unprotected == 0:
                    continue
                counts.popitem(last=False)
                num_unprotected -= 1
            counts[key] = 1

    # --- per-request access records ---

    def _get_request_cache_access(self, req_context: ReqContext) -> _RequestCacheAccess:
        state = req_context.get_state(_RequestCacheAccess)
        if state is None or state.owner is not self or state.cache_generation != self._cache_generation:
            state = _RequestCacheAccess(owner=self, cache_generation=self._cache_generation)
            req_context.set_state(state)
        return state

    def _check_not_finished(
        self, operation: str, state: _RequestCacheAccess, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        """Refuse a finished request that names a key it never named before (vLLM asserts);
        nothing has changed yet when this raises."""
        if state.finished and not state.seen_keys.keys() >= set(keys):
            raise OffloadProtocolError(operation, None, "finished", f"request {req_context.req_id!r} already finished")

    def _record_request_cache_access(
        self, state: _RequestCacheAccess, keys: Collection[OffloadKey], req_context: ReqContext, reused_keys: Collection[OffloadKey] = ()
    ) -> None:
        seen = state.seen_keys
        if self._calls_request_access_hook:
            new_keys = list(dict.fromkeys(key for key in keys if key not in seen))
            if new_keys:
                self._policy.on_request_access(new_keys, req_context)
        seen.update(dict.fromkeys(keys))  # keys seen before keep their place
        # Re-reading a chunk this request inserted is an internal transfer (a tiering cascade,
        # say), not a second cache access.
        if state.inserted_keys:
            state.reused_keys.update(set(reused_keys).difference(state.inserted_keys))
        else:
            state.reused_keys.update(reused_keys)

    # --- OffloadingManager interface ---

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._get_request_cache_access(req_context)
        return RequestOffloadingContext()

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        chunk = self._get_chunk(key)
        if chunk is None:
            return _MISS
        return _HIT if chunk.ref_cnt >= 0 else _HIT_PENDING

    @override
    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource.HOST

    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        """See `OffloadingManager.prepare_load`.

        Raises:
            OffloadProtocolError: a key is absent or its store is pending; nothing changed.
        """
        return self._prepare_load(keys, req_context, record_access=True)

    def _prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext, *, record_access: bool
    ) -> CPULoadStoreSpec:
        if not isinstance(keys, list):  # see _LIST
            check_key_collection(keys, "prepare_load")
        found = list(map(self._get_chunk, keys))
        if None in found or min(map(_REF_CNT, found), default=0) < 0:  # every key checked first
            bad = next(i for i, chunk in enumerate(found) if chunk is None or chunk.ref_cnt < 0)
            raise OffloadProtocolError("prepare_load", list(keys)[bad], "absent" if found[bad] is None else "pending")
        chunks = cast("list[ChunkStatus]", found)
        state = self._get_request_cache_access(req_context) if record_access else None
        if state is not None:
            self._check_not_finished("prepare_load", state, keys, req_context)
        for key, chunk in zip(keys, chunks):
            if chunk.ref_cnt == 0:
                self._num_evictable_cache_chunks -= 1  # ref_cnt 0 -> 1
                if self._calls_evictability_hooks:
                    self._policy.mark_non_evictable(key)
            chunk.ref_cnt += 1
        if state is not None:
            self._record_request_cache_access(state, keys, req_context, reused_keys=keys)
        return self._get_load_store_spec(keys, chunks)

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if not isinstance(keys, list):  # see _LIST
            check_key_collection(keys, "touch")
        self._policy.touch(keys, req_context)

    @override
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """See `OffloadingManager.complete_load`.

        Raises:
            OffloadProtocolError: a key is absent or has fewer loads in progress than it is
                listed; nothing changed.
        """
        if not isinstance(keys, list):  # see _LIST
            check_key_collection(keys, "complete_load")
        chunks = list(map(self._get_chunk, keys))
        idle: list[OffloadKey] = []  # keys whose chunk no load reads any more
        released = 0
        for key, chunk in zip(keys, chunks):
            if chunk is None or chunk.ref_cnt < 1:
                for undone in cast("list[ChunkStatus]", chunks[:released]):  # undo the releases so far
                    undone.ref_cnt += 1
                state = "absent" if chunk is None else f"read by {max(chunk.ref_cnt, 0)} loads"
                raise OffloadProtocolError("complete_load", key, state)
            chunk.ref_cnt -= 1
            released += 1
            if chunk.ref_cnt == 0:
                idle.append(key)
        self._num_evictable_cache_chunks += len(idle)  # ref_cnt 1 -> 0
        if self._calls_evictability_hooks:
            for key in idle:
                self._policy.mark_evictable(key)

    @override
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """See `OffloadingManager.prepare_store`.

        All or nothing: every key not already present gets a slot (evicting idle chunks, never
        one of `keys`), or None is returned. The request's access is recorded either way, as
        in vLLM, so a refused store still counts as the request naming the keys.

        Raises:
            OffloadProtocolError: the request already finished; nothing changed.
        """
        if not isinstance(keys, list):  # see _LIST
            check_key_collection(keys, "prepare_store")
        keys = list(dict.fromkeys(keys))  # a key offered twice takes one chunk
        state = self._get_request_cache_access(req_context)
        self._check_not_finished("prepare_store", state, keys, req_context)
        if self.counts is not None:
            self._record_accesses(keys)
        # Ready resident chunks are reuses even if the tracker forgot them; the threshold
        # applies to new store candidates only.
        chunks = list(map(self._get_chunk, keys))
        keys_to_store = [key for key, chunk in zip(keys, chunks) if chunk is None]
        ready_existing_keys: list[OffloadKey] = []
        if len(keys_to_store) < len(keys):
            ready_existing_keys = [key for key, chunk in zip(keys, chunks) if chunk is not None and chunk.ref_cnt >= 0]
        if self.counts is not None:
            num_store_candidates = len(keys_to_store)
            keys_to_store = [key for key in keys_to_store if self.counts.get(key, 0) >= self.store_threshold]
            self.stores_skipped_in_current_batch += num_store_candidates - len(keys_to_store)

        new_store_misses = [key for key in keys_to_store if key not in state.store_miss_keys]
        if new_store_misses:
            # ARC learns from b1/b2 before insert() drops the ghost entry; once per request.
            self._policy.on_store_miss(new_store_misses, req_context)
            state.store_miss_keys.update(new_store_misses)
        # Recorded before any early return (pending chunks are not); candidates count as
        # insertions only once allocated.
        recorded = keys
        if len(keys_to_store) + len(ready_existing_keys) < len(keys):
            recorded_keys = set(keys_to_store).union(ready_existing_keys)
            recorded = [key for key in keys if key in recorded_keys]
        self._record_request_cache_access(state, recorded, req_context, reused_keys=ready_existing_keys)
        if not keys_to_store:
            return PrepareStoreOutput(keys_to_store=[], store_spec=self._get_load_store_spec([], []), evicted_keys=[])

        self.allocation_sizes_in_current_batch.append(len(keys_to_store))
        num_chunks_to_evict = len(keys_to_store) - self._get_num_free_chunks()
        to_evict: list[OffloadKey] = []
        if num_chunks_to_evict > 0:
            if num_chunks_to_evict > self._num_evictable_cache_chunks:
                return None
            # A chunk named by this call must still be there after it, stored ones included.
            evicted = self._policy.evict(num_chunks_to_evict, set(keys))
            if evicted is None:
                return None
            assert len(evicted) == num_chunks_to_evict, f"{type(self._policy).__name__} evicted {len(evicted)} chunks, not {num_chunks_to_evict}"
            self._num_evictable_cache_chunks -= len(evicted)
            to_evict = [key for key, _ in evicted]
            self._free_list.extend(chunk.chunk_id for _, chunk in evicted)
        if to_evict and self.events is not None:
            self.events.append(OffloadingEvent(keys=to_evict, medium=self.medium, removed=True))

        chunks = self._allocate_chunks(keys_to_store)
        self._policy.insert_many(keys_to_store, chunks, req_context)
        self._num_write_pending_chunks += len(keys_to_store)
        state.inserted_keys.update(keys_to_store)
        return PrepareStoreOutput(
            keys_to_store=keys_to_store,
            store_spec=self._get_load_store_spec(keys_to_store, chunks),
            evicted_keys=to_evict,
        )

    @override
    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """See `OffloadingManager.complete_store`.

        Idempotent: keys already stored, and keys never prepared, are ignored.
        """
        if not isinstance(keys, list):  # see _LIST
            check_key_collection(keys, "complete_store")
        completed: list[OffloadKey] = []  # stored, or dropped when the write failed
        for key in keys:  # one `get` per key: a completion is mostly a few keys, often one
            chunk = self._get_chunk(key)
            if chunk is None or chunk.ref_cnt >= 0:  # absent, or already stored (ready)
                continue
            self._num_write_pending_chunks -= 1
            if success:
                chunk.ref_cnt = 0
                self._num_evictable_cache_chunks += 1
                if self._calls_evictability_hooks:
                    self._policy.mark_evictable(key)
            else:
                self._policy.remove(key)
                self._free_chunk(chunk)
            completed.append(key)
        if completed and self.events is not None:
            # A failed write only releases its allocation: no stored chunk is removed.
            self.events.append(OffloadingEvent(completed, self.medium, removed=not success, metadata_only=not success))

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        state = req_context.get_state(_RequestCacheAccess)
        if state is None or state.owner is not self or state.cache_generation != self._cache_generation or state.finished:
            return
        state.finished = True
        # The keys per KV-cache group, groups in index order (suffixes are big-endian).
        seen = list(state.seen_keys)
        if len(set(map(_GROUP_SUFFIX, seen))) <= 1:
            groups = [seen]  # one group: the common case, told apart in C
        else:
            by_suffix: dict[bytes, list[OffloadKey]] = {}
            for key in seen:
                by_suffix.setdefault(_GROUP_SUFFIX(key), []).append(key)
            groups = [by_suffix[suffix] for suffix in sorted(by_suffix)]
        positions = req_context.offload_key_positions
        for keys in groups:
            try:
                keys.sort(key=positions.__getitem__)  # by position when every key has one
            except KeyError:
                pass  # list.sort computes every position before it moves a key
        key_groups = tuple(map(tuple, groups))  # immutable, as vLLM hands them to its policies
        self._policy.on_request_finished(key_groups, state.inserted_keys - state.reused_keys, state.reused_keys, req_context)

    @override
    def reset_cache(self) -> None:
        """Drop every chunk, whatever its state.

        The scheduler guarantees that no completion of a job from before the reset arrives
        after it, and flushes loads in flight to the workers before new stores begin, so freed
        slots are not raced for.
        """
        self._policy.clear()
        self._cache_generation += 1
        self._num_evictable_cache_chunks = 0
        self._num_write_pending_chunks = 0
        self._free_list.clear()
        self._num_allocated_chunks = 0

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is None:
            return
        # Detached first, so a drain abandoned half-way cannot replay a metadata-only removal
        # against a key a retry has since allocated again.
        events, self.events = self.events, []
        for event in events:
            if event.metadata_only:
                keys = [key for key in event.keys if self._policy.get(key) is None]
                if not keys:
                    continue
                event = replace(event, keys=keys)
            yield event

    @override
    def config_info(self) -> Sequence[ConfigInfoMapping]:
        """The facts of the one cache this manager holds."""
        return [self._config_info]

    @override
    def get_stats(self) -> OffloadingConnectorStats:
        stats = OffloadingConnectorStats()
        num_used = self._num_allocated_chunks - len(self._free_list) - self._num_evictable_cache_chunks
        capacity = max(self._num_chunks, 1)  # a manager of no chunks reports 0.0
        usage = num_used / capacity
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, usage)
        for allocation_size in self.allocation_sizes_in_current_batch:
            stats.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, allocation_size)
        self.allocation_sizes_in_current_batch.clear()
        write_usage = self._num_write_pending_chunks / capacity
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, write_usage)
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, max(usage - write_usage, 0.0))
        if self.store_threshold >= 2:
            stats.increase_counter(CPUOffloadingMetrics.STORES_SKIPPED, self.stores_skipped_in_current_batch)
            self.stores_skipped_in_current_batch = 0
        return stats
