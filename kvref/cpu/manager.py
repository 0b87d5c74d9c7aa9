"""The CPU offloading manager: a fixed pool of CPU blocks behind a `CachePolicy` (vLLM: `cpu/manager.py`).

The manager owns what every policy shares: slot allocation, reference counts, the count of idle
blocks, events and protocol checks. The policy owns the key -> block mapping and decides which
idle blocks to evict. Block states (kv-offload.md section 4):

    absent --prepare_store--> pending (ref_cnt -1) --complete_store--> idle (0) <--> reading (n > 0)
      ^                          | complete_store(success=False): dropped, slot freed
      +---- evicted (idle and not named by the evicting prepare_store) <----+

Like vLLM 0.33's manager, it also keeps one access record per request (in the request's
`ReqContext`): the keys the request loaded or offered to store, grouped by KV-cache group, which
it stored and which it reused. The policy sees a request's first access to each key
(`on_request_access`), its store misses once (`on_store_miss`), and the whole record when the
request finishes (`on_request_finished`), which is where LRU and ARC commit its recency.

This module holds the calls, in the order a request makes them; what they read and update (the
block pool, the fast paths bound to the policy, the access records, statistics, events, protocol
errors) is the manager's base class, `ManagerBookkeeping` in `kvref.cpu.bookkeeping`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection
from itertools import filterfalse, repeat
from typing import cast

from typing_extensions import override

from kvref.base import (
    OffloadingEvent,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    check_key_collection,
)
from kvref.cpu.bookkeeping import ManagerBookkeeping, RequestAccess, describe_block
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.policies.base import BlockStatus, CachePolicy

__all__ = ["CPUOffloadingManager", "describe_block"]

# What check_key_collection refuses; tested inline first, so a valid call costs no extra frame.
# Callers test `keys.__class__ is not list` before it: an isinstance test against this tuple
# fails slowly, type by type, and a list (what the connector passes) is never one of them.
_SINGLE_KEY_TYPES = (bytes, bytearray, memoryview, str)
# C-level accessors for the per-key loops: a key's 4-byte KV-cache group suffix, a block's
# fields, the halves of an eviction's (key, block) pairs.
_GROUP_SUFFIX = operator.itemgetter(slice(-4, None))
_REF_CNT = operator.attrgetter("ref_cnt")
_BLOCK_ID = operator.attrgetter("block_id")
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
# on_new_request's answer, the same for every request (frozen: one instance serves them all).
_BLOCK_LEVEL = RequestOffloadingContext()


def _make_touch(
    policy_touch: Callable[[Collection[OffloadKey]], None],
) -> Callable[[Collection[OffloadKey], ReqContext], None]:
    """Return a manager's touch: refuse a single key, then pass the keys to the policy (a
    closure, as the lookup is: see `make_lookup`)."""

    def touch(keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if keys.__class__ is not list and isinstance(keys, _SINGLE_KEY_TYPES):
            check_key_collection(keys, "touch")
        policy_touch(keys)

    return touch


class CPUOffloadingManager(ManagerBookkeeping):
    """Offloads blocks to `num_blocks` CPU slots, evicting idle blocks as the policy chooses.

    Args:
        num_blocks: how many CPU blocks (slots) there are, >= 1.
        cache_policy: which idle blocks to evict first: "lru" or "arc" (or a name given to
            `register_cache_policy`).
        enable_events: buffer stored/removed events for `take_events` (off: none are kept).

    Raises:
        ValueError: `num_blocks` is not an integer >= 1 or `cache_policy` is not a known
            policy.

    Speed: lookups and completions read blocks straight from the policy's `block_maps` (no
    policy call per key), hooks a policy declares no-ops are not called, and each slot keeps
    one `BlockStatus` for its lifetime (reused, not reallocated, when the slot is).
    """

    @override
    def _bind_policy(self, policy: CachePolicy) -> None:
        super()._bind_policy(policy)
        # Instance attributes: callers reach the closures without binding a method, on the two
        # calls made per block and step. Set through setattr, not vars(): vars() turns the
        # instance's inline attribute values into a dict, which makes every later attribute
        # access of the manager slower. A subclass that overrides a call keeps its method.
        if type(self).lookup is CPUOffloadingManager.lookup:
            object.__setattr__(self, "lookup", self._lookup)
        if type(self).touch is CPUOffloadingManager.touch:
            object.__setattr__(self, "touch", _make_touch(policy.touch))

    # --- OffloadingManager interface ---

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        # Instances call the closure directly (see make_lookup); this serves subclasses' super().
        return self._lookup(key, req_context)

    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        if keys.__class__ is not list and isinstance(keys, _SINGLE_KEY_TYPES):
            check_key_collection(keys, "prepare_load")
        found = list(map(self._get_block, keys))
        if None in found:
            get_other = self._get_other_block
            if get_other is not None:
                # The second map's blocks, with the first's as defaults (the maps are disjoint):
                # one more probe per key, in C.
                found = list(map(get_other, keys, found))
            if None in found:
                self._refuse_load(keys, found)
        blocks = cast(list[BlockStatus], found)
        pinned = 0
        if self._hook_non_evictable:
            # A hook to call per pinned key: every block is checked before the first call.
            if min(map(_REF_CNT, blocks), default=0) < 0:
                self._refuse_load(keys, found)
            hook = self._the_policy.mark_non_evictable
            for key, block in zip(keys, blocks):
                if block.ref_cnt == 0:
                    pinned += 1
                    hook(key)
                block.ref_cnt += 1
        else:
            # One pass: pin, count the blocks that were idle (a key listed twice pins once),
            # and stop at a pending block, whose pins are then undone.
            for block in blocks:
                count = block.ref_cnt
                if count <= 0:
                    if count:
                        for pinned_block in blocks:
                            if pinned_block is block:
                                break
                            pinned_block.ref_cnt -= 1
                        self._refuse_load(keys, found)
                    pinned += 1
                block.ref_cnt = count + 1
        named = dict.fromkeys(keys)
        self._num_idle_blocks -= pinned
        self._blocks_loaded += len(blocks)
        state = req_context.get_state(RequestAccess)
        if state is None or state.owner is not self or state.generation != self._generation:
            state = self._request_access(req_context)
        self._record_access(state, named, req_context, reused_keys=keys)
        return CPULoadStoreSpec.from_id_list(list(map(_BLOCK_ID, blocks)))

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        # Instances call _make_touch's closure directly; this serves subclasses' super().
        if keys.__class__ is not list and isinstance(keys, _SINGLE_KEY_TYPES):
            check_key_collection(keys, "touch")
        self._policy_touch(keys)

    @override
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if keys.__class__ is not list and isinstance(keys, _SINGLE_KEY_TYPES):
            check_key_collection(keys, "complete_load")
        found = list(map(self._get_block, keys))
        if None in found:
            if self._get_other_block is not None:
                found = list(map(self._get_other_block, keys, found))  # see prepare_load
            if None in found:
                self._refuse_release(keys, found)
        blocks = cast(list[BlockStatus], found)
        # Finishing a load is not a use: the block becomes evictable with the recency it has.
        released = 0
        unloaded = False
        for block in blocks:
            count = block.ref_cnt - 1
            block.ref_cnt = count
            if count <= 0:
                if count:
                    unloaded = True
                else:
                    released += 1
        if unloaded:
            # A block with no load in progress (or fewer than its key is listed): undo, name it.
            for block in blocks:
                block.ref_cnt += 1
            self._refuse_release(keys, found)
        self._num_idle_blocks += released
        if self._hook_evictable:
            mark_evictable = self._the_policy.mark_evictable
            for key, block in dict(zip(keys, blocks)).items():  # a key listed twice, once
                if block.ref_cnt == 0:
                    mark_evictable(key)

    @override
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """See `OffloadingManager.prepare_store`.

        As in vLLM, the request's access is recorded (and ARC learns from ghost hits) before
        room is sought, so a refused store (None) still counts as the request naming the keys;
        no block, slot or event changes.
        """
        if keys.__class__ is not list and isinstance(keys, _SINGLE_KEY_TYPES):
            check_key_collection(keys, "prepare_store")
        # dict.fromkeys drops repeated keys (each needs one slot) and gives a set view for free.
        requested = dict.fromkeys(keys)
        keys_to_store = list(filterfalse(self._blocks.__contains__, requested))
        other_blocks = self._other_blocks
        if other_blocks is not None and keys_to_store:
            keys_to_store = list(filterfalse(other_blocks.__contains__, keys_to_store))
        if keys_to_store and self._one_group:
            first_group = self._first_group
            if first_group is None:
                first_group = self._first_group = frozenset([_GROUP_SUFFIX(keys_to_store[0])])
            self._one_group = first_group.issuperset(map(_GROUP_SUFFIX, keys_to_store))
        # Keys the request names here, in the order given: absent and ready ones, not pending.
        named: dict[OffloadKey, None]
        ready_keys: list[OffloadKey]
        if len(keys_to_store) == len(requested):
            named, ready_keys = requested, []
        else:
            found = self._find(requested)
            ready_keys = [key for key, block in zip(requested, found) if block is not None and block.ref_cnt >= 0]
            named = dict.fromkeys([key for key, block in zip(requested, found) if block is None or block.ref_cnt >= 0])

        state = req_context.get_state(RequestAccess)
        if state is None or state.owner is not self or state.generation != self._generation:
            state = self._request_access(req_context)
        new_misses: list[OffloadKey] = []
        if keys_to_store and self._hook_store_miss and not state.finished:
            inserted, refused = state.inserted_keys, state.refused_misses
            if inserted.isdisjoint(keys_to_store) and not refused:
                new_misses = keys_to_store  # the common case, checked in C
            else:
                new_misses = [key for key in keys_to_store if key not in inserted and key not in refused]
            if new_misses:
                # ARC learns from b1/b2 before insert removes the ghost entries; once per request.
                self._the_policy.on_store_miss(new_misses, req_context)
        self._record_access(state, named, req_context, reused_keys=ready_keys)
        if not keys_to_store:
            return PrepareStoreOutput([], CPULoadStoreSpec(()), [])

        evicted_keys: list[OffloadKey] = []
        free_list = self._free_list
        num_wanted = len(keys_to_store)
        num_to_evict = num_wanted - (len(free_list) + self._num_blocks - self._num_allocated_blocks)
        if num_to_evict > 0:
            # Keys named by this call must survive it, stored ones included.
            protected = requested.keys()
            evicted = (
                self._the_policy.evict(num_to_evict, protected)
                if num_to_evict <= self._num_idle_blocks
                else None
            )
            # The policy's answer is checked in C (the right count, every block idle, none
            # protected); _valid_eviction repeats the checks only to report and undo a bad one.
            if evicted is None:
                return self._refuse_store(state, new_misses)
            evicted_keys = list(map(_FIRST, evicted))
            evicted_blocks = list(map(_SECOND, evicted))
            if not (
                len(evicted) == num_to_evict
                and not any(map(_REF_CNT, evicted_blocks))
                and protected.isdisjoint(evicted_keys)
            ) and not self._valid_eviction(evicted, num_to_evict, protected):
                return self._refuse_store(state, new_misses)
            self._num_idle_blocks -= num_to_evict
            self._blocks_evicted += num_to_evict
            free_list.extend(evicted_blocks)
            if self._events is not None:
                self._emit(evicted_keys, removed=True)

        if self._num_allocated_blocks == self._num_blocks:
            # Every slot was handed out once: all come from the free list, last freed first.
            new_blocks = free_list[-num_wanted:]
            del free_list[-num_wanted:]
            new_blocks.reverse()
            for block in new_blocks:
                block.ref_cnt = -1
        else:
            new_blocks = self._allocate_blocks(num_wanted)
        self._the_policy.insert_for_request(keys_to_store, new_blocks, req_context)
        state.inserted_keys.update(keys_to_store)
        return PrepareStoreOutput(
            keys_to_store, CPULoadStoreSpec.from_id_list(list(map(_BLOCK_ID, new_blocks))), evicted_keys
        )

    @override
    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        if keys.__class__ is not list and isinstance(keys, _SINGLE_KEY_TYPES):
            check_key_collection(keys, "complete_store")
        get, get_other = self._get_block, self._get_other_block
        # Keys already stored or never prepared are ignored (the call is idempotent): a call
        # that names no pending block ends here, having built nothing. A block is looked for
        # in the second map (if any) only when the first lacks it.
        for key in keys:
            block = get(key)
            if block is None and get_other is not None:
                block = get_other(key)
            if block is not None and block.ref_cnt < 0:
                break
        else:
            return
        if not success:
            policy = self._the_policy
            for key in keys:
                block = get(key)
                if block is None and get_other is not None:
                    block = get_other(key)
                if block is not None and block.ref_cnt < 0:
                    policy.remove(key)
                    self._free_list.append(block)
            return
        # Finishing a store is not a use: the block becomes evictable with the recency it has.
        stored_keys: list[OffloadKey] = []
        for key in keys:
            block = get(key)
            if block is None and get_other is not None:
                block = get_other(key)
            if block is not None and block.ref_cnt < 0:
                block.ref_cnt = 0
                stored_keys.append(key)
        if self._hook_evictable:
            mark_evictable = self._the_policy.mark_evictable
            for key in stored_keys:
                mark_evictable(key)
        self._num_idle_blocks += len(stored_keys)
        self._blocks_stored += len(stored_keys)
        if self._events is not None:
            self._emit(stored_keys, removed=False)

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._request_access(req_context)
        return _BLOCK_LEVEL

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        """Commit the request's access to the policy (once; later calls do nothing).

        The keys of each KV-cache group are passed head to tail: by recorded token position
        when every key has one, else in the order the request first named them.
        """
        state = req_context.get_state(RequestAccess)
        if (
            state is None
            or state.owner is not self
            or state.generation != self._generation
            or state.finished
        ):
            return
        state.finished = True
        seen = state.seen_keys
        recorded = req_context.offload_key_positions
        key_groups: list[list[OffloadKey]]
        if (
            self._one_group
            or not seen
            or all(map(bytes.endswith, seen, repeat(_GROUP_SUFFIX(next(iter(seen))))))
        ):
            key_groups = [list(seen)]  # one KV-cache group: the common case
        else:
            groups: dict[bytes, list[OffloadKey]] = {}
            for key, suffix in zip(seen, map(_GROUP_SUFFIX, seen)):
                group = groups.get(suffix)
                if group is None:
                    groups[suffix] = [key]
                else:
                    group.append(key)
            # The group suffix is big-endian, so sorting the bytes sorts by group index.
            key_groups = [groups[suffix] for suffix in sorted(groups)]
        if recorded:
            for keys in key_groups:
                try:
                    # list.sort computes every key first: a missing position changes nothing.
                    keys.sort(key=recorded.__getitem__)
                except KeyError:
                    pass
        self._the_policy.on_request_finished(
            tuple(key_groups),
            state.inserted_keys - state.reused_keys,
            state.reused_keys,
            req_context,
        )

    @override
    def take_events(self) -> list[OffloadingEvent]:
        if not self._events:
            return []
        events, self._events = self._events, []
        return events

    @override
    def reset_cache(self) -> None:
        """Drop every block, and every buffered event; the statistics counters are kept.

        Like vLLM, no removal event is emitted: the engine announces a reset itself (vLLM's
        `AllBlocksCleared`), and events still buffered would describe blocks that no longer exist,
        so they are dropped rather than delivered after the reset.
        """
        self._the_policy.clear()
        self._generation += 1
        self._num_idle_blocks = 0
        self._free_list.clear()
        self._num_allocated_blocks = 0
        if self._events is not None:
            self._events = []
