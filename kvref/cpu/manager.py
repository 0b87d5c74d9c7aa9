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
"""

from __future__ import annotations

import logging
import operator
from itertools import filterfalse, repeat
from typing import NoReturn, cast
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence, Set

from typing_extensions import override

from kvref.base import (
    OffloadingEvent,
    OffloadingManager,
    OffloadingStats,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    check_key_collection,
)
from kvref.cpu.common import CPU_MEDIUM, CPULoadStoreSpec
from kvref.cpu.policies.base import BlockStatus, CachePolicy, is_no_op_hook
from kvref.cpu.policies.factory import CachePolicyName, create_cache_policy
from kvref.errors import OffloadProtocolError

__all__ = ["CPUOffloadingManager", "describe_block"]

logger = logging.getLogger(__name__)

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


def describe_block(block: BlockStatus | None) -> str:
    """Name the state of a block as protocol errors report it: absent, pending, idle, reading(n)."""
    if block is None:
        return "absent"
    if block.ref_cnt < 0:
        return "pending"
    return f"reading({block.ref_cnt})" if block.ref_cnt else "idle"


def _positive_int(name: str, value: int) -> int:
    # operator.index admits any integer type (numpy's included) and nothing else.
    try:
        number = operator.index(value)
    except TypeError:
        number = 0
    if number < 1 or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return number


class _RequestAccess:
    """The keys one request named to one manager (kept in the request's context)."""

    __slots__ = ("owner", "generation", "seen_keys", "inserted_keys", "reused_keys", "refused_misses", "finished")

    def __init__(self, owner: object, generation: int) -> None:
        self.owner = owner
        self.generation = generation
        # Every key the request named, in first-named order (grouped when the request finishes).
        self.seen_keys: dict[OffloadKey, None] = {}
        self.inserted_keys: set[OffloadKey] = set()
        self.reused_keys: set[OffloadKey] = set()
        # Store misses the policy saw in stores that were then refused. With inserted_keys, they
        # are the keys whose miss it saw (vLLM's store_miss_keys), without a set update per store.
        self.refused_misses: set[OffloadKey] = set()
        self.finished = False


class _PolicyBlocks(Mapping[OffloadKey, BlockStatus]):
    """A policy's blocks seen through `get`, for policies that keep no `block_maps`."""

    def __init__(self, policy: CachePolicy) -> None:
        self._get = policy.get

    @override
    def __getitem__(self, key: OffloadKey) -> BlockStatus:
        block = self._get(key)
        if block is None:
            raise KeyError(key)
        return block

    @override
    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self._get(cast(OffloadKey, key)) is not None

    @override
    def __iter__(self) -> Iterator[OffloadKey]:
        raise TypeError("a policy's blocks cannot be listed through get()")

    @override
    def __len__(self) -> int:
        raise TypeError("a policy's blocks cannot be counted through get()")


def _no_lookups() -> tuple[int, int, int]:
    return 0, 0, 0



def _make_lookup(
    blocks: Mapping[OffloadKey, BlockStatus],
    other_blocks: Mapping[OffloadKey, BlockStatus] | None,
    hits: int,
    pending: int,
    misses: int,
) -> tuple[Callable[[OffloadKey, ReqContext], bool | None], Callable[[], tuple[int, int, int]]]:
    """Return a manager's lookup over `blocks` (then `other_blocks`, if any) and the reader of
    its counters (hits, pending, misses), which start at the values given.

    A closure rather than a method: no bound method per call, and the maps and counters are
    cell variables rather than instance attributes, on the path every request ends with.
    """

    get = blocks.get

    def lookup(key: OffloadKey, req_context: ReqContext) -> bool | None:
        nonlocal hits, pending, misses
        # One probe (a containment test and an index would be two for a hit, the common answer).
        block = get(key)
        if block is None:
            misses += 1
            return False
        if block.ref_cnt >= 0:
            hits += 1
            return True
        pending += 1
        return None

    def lookup_in_two(key: OffloadKey, req_context: ReqContext) -> bool | None:
        nonlocal hits, pending, misses
        block = get(key)
        if block is None:
            block = get_other(key)
            if block is None:
                misses += 1
                return False
        if block.ref_cnt >= 0:
            hits += 1
            return True
        pending += 1
        return None

    def counts() -> tuple[int, int, int]:
        return hits, pending, misses

    if other_blocks is None:
        return lookup, counts
    get_other = other_blocks.get
    return lookup_in_two, counts


class CPUOffloadingManager(OffloadingManager):
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

    def __init__(
        self, num_blocks: int, cache_policy: CachePolicyName = "lru", enable_events: bool = False
    ) -> None:
        self._num_blocks: int = _positive_int("num_blocks", num_blocks)
        self.medium: str = CPU_MEDIUM
        # Slots [0, _num_allocated_blocks) have been handed out at least once (the bump pointer).
        self._num_allocated_blocks: int = 0
        # Blocks of freed slots, reused last-freed-first (a slot keeps its BlockStatus).
        self._free_list: list[BlockStatus] = []
        # Blocks with ref_cnt 0: what eviction can reclaim, counted so a hopeless prepare_store
        # fails without asking the policy.
        self._num_idle_blocks: int = 0
        self._lookup_counts: Callable[[], tuple[int, int, int]] = _no_lookups
        self._policy = create_cache_policy(cache_policy, self._num_blocks)
        # The KV-cache group suffix of the first key offered for storing (a one-element set, for
        # a check in C), and whether every key offered since (stored or refused) ends with it.
        # Every key a request names was offered at some point, so while this holds a finishing
        # request's keys are one group, known without a check per key (a store offers a few new
        # keys; a request names many).
        self._first_group: frozenset[bytes] | None = None
        self._one_group = True
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        # Bumped by reset_cache, so access records of requests from before are started afresh.
        self._generation: int = 0
        # Counters for get_stats: one increment per call on the hot paths (lookup's are kept by
        # its closure).
        self._blocks_stored = self._blocks_loaded = self._blocks_evicted = 0
        self._stores_refused = 0

    @property
    def _policy(self) -> CachePolicy:
        return self._the_policy

    @_policy.setter
    def _policy(self, policy: CachePolicy) -> None:
        # Rebind the fast paths to the policy (tests swap in policies after construction).
        self._the_policy = policy
        maps = policy.block_maps()
        if not 1 <= len(maps) <= 2:
            maps = (_PolicyBlocks(policy),)
        # Where blocks are read directly: the first map, and a second one (ARC's t2) or None.
        self._blocks: Mapping[OffloadKey, BlockStatus] = maps[0]
        self._other_blocks: Mapping[OffloadKey, BlockStatus] | None = maps[1] if len(maps) == 2 else None
        # Bound once: one attribute load per call, not two.
        self._get_block = self._blocks.get
        self._get_other_block = None if self._other_blocks is None else self._other_blocks.get
        self._hook_evictable = not is_no_op_hook(policy, "mark_evictable")
        self._hook_non_evictable = not is_no_op_hook(policy, "mark_non_evictable")
        self._hook_access = not is_no_op_hook(policy, "on_request_access")
        self._hook_store_miss = not is_no_op_hook(policy, "on_store_miss")
        self._policy_touch = policy.touch
        self._one_group = False  # a policy swapped in may hold keys of any group
        self._lookup, self._lookup_counts = _make_lookup(self._blocks, self._other_blocks, *self._lookup_counts())
        if type(self).lookup is CPUOffloadingManager.lookup:
            # An instance attribute: callers reach the closure without binding a method. Set
            # through setattr, not vars(): vars() turns the instance's inline attribute values
            # into a dict, which makes every later attribute access of the manager slower.
            object.__setattr__(self, "lookup", self._lookup)

    @override
    def __getstate__(self) -> dict[str, object]:
        # The lookup closure is bound to this manager's block map: copies and unpickled managers
        # get their own (see __setstate__), starting from this one's counts. (vars() slows this
        # manager's attribute access from now on, see the _policy setter: copies are for tests
        # and snapshots, off the serving path.)
        state = dict(vars(self))
        for name in ("lookup", "_lookup", "_lookup_counts", "_get_block", "_get_other_block"):
            state.pop(name, None)
        state["_lookup_totals"] = self._lookup_counts()
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        totals = cast(tuple[int, int, int], state.pop("_lookup_totals"))
        for name, value in state.items():  # not vars().update: see the _policy setter
            object.__setattr__(self, name, value)
        self._lookup_counts = lambda: totals
        self._policy = self._the_policy
        self._one_group = cast(bool, state["_one_group"])

    @override
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_blocks={self._num_blocks}, "
            f"policy={type(self._policy).__name__}, free={self.num_free_blocks}, "
            f"idle={self._num_idle_blocks})"
        )

    # --- read-only views (tests, metrics) ---

    @property
    def num_blocks(self) -> int:
        """The number of CPU blocks (slots)."""
        return self._num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Slots that hold no block at all."""
        return len(self._free_list) + self._num_blocks - self._num_allocated_blocks

    @property
    def num_idle_blocks(self) -> int:
        """Blocks that are stored, readable and not being read: the eviction candidates."""
        return self._num_idle_blocks

    @property
    def policy(self) -> CachePolicy:
        """The cache policy (for inspection; mutate it only through the manager)."""
        return self._policy

    @override
    def get_stats(self) -> OffloadingStats:
        """Return the cumulative counters and the slot usage (see `OffloadingStats`)."""
        hits, pending, misses = self._lookup_counts()
        return OffloadingStats(
            lookups=hits + pending + misses,
            hits=hits,
            pending=pending,
            misses=misses,
            blocks_stored=self._blocks_stored,
            blocks_loaded=self._blocks_loaded,
            blocks_evicted=self._blocks_evicted,
            stores_refused=self._stores_refused,
            num_blocks=self._num_blocks,
            used_blocks=self._num_blocks - self.num_free_blocks,
        )

    # --- block pool ---

    def _allocate_blocks(self, n: int) -> list[BlockStatus]:
        """Fresh slots first, then freed ones last-freed-first (as vLLM); writes pending."""
        start = self._num_allocated_blocks
        num_fresh = min(n, self._num_blocks - start)
        blocks = list(map(BlockStatus, range(start, start + num_fresh)))
        self._num_allocated_blocks = start + num_fresh
        num_reused = n - num_fresh
        if num_reused:
            free_list = self._free_list
            assert len(free_list) >= num_reused, f"{n} slots wanted, {self.num_free_blocks} free"
            reused = free_list[-num_reused:]
            del free_list[-num_reused:]
            reused.reverse()  # last freed first
            for block in reused:
                block.ref_cnt = -1
            blocks += reused
        return blocks

    def _protocol_error(self, operation: str, key: OffloadKey, detail: str) -> OffloadProtocolError:
        return OffloadProtocolError(operation, key, describe_block(self._find([key])[0]), detail)

    def _find(self, keys: Collection[OffloadKey]) -> list[BlockStatus | None]:
        """The block of each key, or None."""
        found = list(map(self._get_block, keys))
        if None in found and self._get_other_block is not None:
            found = list(map(self._get_other_block, keys, found))  # see prepare_load
        return found

    def _emit(self, keys: list[OffloadKey], removed: bool) -> None:
        if self._events is not None and keys:
            self._events.append(OffloadingEvent(keys, self.medium, removed))

    # --- request access records ---

    def _request_access(self, req_context: ReqContext) -> _RequestAccess:
        state = req_context.get_state(_RequestAccess)
        if state is None or state.owner is not self or state.generation != self._generation:
            state = _RequestAccess(self, self._generation)
            req_context.set_state(state)
        return state

    def _record_access(
        self,
        state: _RequestAccess,
        named: dict[OffloadKey, None],
        req_context: ReqContext,
        reused_keys: Collection[OffloadKey] = (),
    ) -> None:
        """Record the keys a call named (a new dict, no repeats, in order, which the record may
        keep: the caller does not change it) and those it reused."""
        if state.finished:
            # vLLM asserts here; kvref ignores accesses after the finish (a composite manager's
            # internal transfers for the request may still arrive).
            return
        seen = state.seen_keys
        if not seen:
            state.seen_keys = named  # the request's first keys: kept, not copied
            if self._hook_access and named:
                self._the_policy.on_request_access(list(named), req_context)
        elif self._hook_access:
            new_keys = list(filterfalse(seen.__contains__, named))
            if new_keys:
                seen.update(named)
                self._the_policy.on_request_access(new_keys, req_context)
        else:
            seen.update(named)
        if reused_keys:
            inserted = state.inserted_keys
            # Re-reading a block this request stored is an internal transfer (a tier's
            # cascade), not a second use.
            if inserted:
                state.reused_keys.update([key for key in reused_keys if key not in inserted])
            else:
                state.reused_keys.update(reused_keys)

    # --- OffloadingManager interface ---

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        # Instances call the closure directly (see _make_lookup); this serves subclasses' super().
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
        state = req_context.get_state(_RequestAccess)
        if state is None or state.owner is not self or state.generation != self._generation:
            state = self._request_access(req_context)
        self._record_access(state, named, req_context, reused_keys=keys)
        return CPULoadStoreSpec.from_id_list(list(map(_BLOCK_ID, blocks)))

    def _refuse_load(self, keys: Collection[OffloadKey], found: list[BlockStatus | None]) -> NoReturn:
        """Raise the protocol error a bad prepare_load deserves (nothing was changed)."""
        for key, block in zip(keys, found):
            if block is None or block.ref_cnt < 0:
                raise self._protocol_error("prepare_load", key, "only stored blocks can be loaded")
        raise AssertionError("prepare_load refused a valid load")  # pragma: no cover

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
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

    def _refuse_release(self, keys: Collection[OffloadKey], found: list[BlockStatus | None]) -> NoReturn:
        """Raise the protocol error a bad complete_load deserves (state already restored)."""
        for key, block in zip(keys, found):
            if block is None or block.ref_cnt <= 0:
                raise self._protocol_error("complete_load", key, "no load of it is in progress")
        self._check_repeated_releases(keys)
        raise AssertionError("complete_load refused a valid release")  # pragma: no cover

    def _check_repeated_releases(self, keys: Collection[OffloadKey]) -> None:
        # A key listed n times releases n loads: it must have at least n in progress.
        releases: dict[OffloadKey, int] = {}
        for key in keys:
            releases[key] = releases.get(key, 0) + 1
        for (key, count), block in zip(releases.items(), self._find(releases)):
            assert block is not None, "a missing block is refused before repeats are counted"
            if block.ref_cnt < count:
                raise self._protocol_error(
                    "complete_load", key, f"listed {count} times but only {block.ref_cnt} loads are in progress"
                )

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

        state = req_context.get_state(_RequestAccess)
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

    def _refuse_store(self, state: _RequestAccess, new_misses: list[OffloadKey]) -> None:
        """Count a refused store; the policy saw its misses (once per request, stored or not)."""
        self._stores_refused += 1
        if new_misses:
            state.refused_misses.update(new_misses)

    def _valid_eviction(
        self,
        evicted: Sequence[tuple[OffloadKey, BlockStatus]],
        wanted: int,
        protected: Set[OffloadKey],
    ) -> bool:
        """Check a policy's answer; put back what a misbehaving policy took, and say so."""
        if (
            len(evicted) == wanted
            and not any(map(_REF_CNT, map(_SECOND, evicted)))
            and protected.isdisjoint(map(_FIRST, evicted))
        ):
            return True
        policy = self._the_policy
        logger.warning(
            "cache policy %s returned %d blocks (idle and unprotected expected) for %d "
            "evictions; the store is refused",
            type(policy).__name__,
            len(evicted),
            wanted,
        )
        for key, block in evicted:
            if policy.get(key) is None:
                policy.insert(key, block)
                if block.ref_cnt == 0:
                    policy.mark_evictable(key)
        return False

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
        state = req_context.get_state(_RequestAccess)
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
