"""What the CPU manager keeps about its blocks and requests, apart from its public calls.

`CPUOffloadingManager` (`kvref.cpu.manager`) answers the `OffloadingManager` calls; this module
holds what those calls read and update, as the manager's base class:

* the block pool: `num_blocks` slots, handed out by a bump pointer and then from a free list,
  each slot keeping one `BlockStatus` for its lifetime; the count of idle blocks;
* the fast paths bound to the policy: its block maps, read directly, the hooks it declares no-ops
  (never called), and the lookup closure with its counters (`make_lookup`);
* the per-request access records (`RequestAccess`, kept in each request's `ReqContext`);
* statistics, events, and the protocol errors a refused call raises (`describe_block` names a
  block's state in them);
* checking what a policy's `evict` returned, and undoing a bad answer.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence, Set
from itertools import filterfalse
from typing import NoReturn, cast

from typing_extensions import override

from kvref.base import (
    OffloadingEvent,
    OffloadingManager,
    OffloadingStats,
    OffloadKey,
    ReqContext,
)
from kvref.cpu.common import CPU_MEDIUM
from kvref.cpu.policies.base import BlockStatus, CachePolicy, is_no_op_hook
from kvref.cpu.policies.factory import CachePolicyName, create_cache_policy
from kvref.errors import OffloadProtocolError

__all__ = ["ManagerBookkeeping", "RequestAccess", "describe_block", "make_lookup"]

logger = logging.getLogger(__name__)


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


class RequestAccess:
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


def make_lookup(
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


class ManagerBookkeeping(OffloadingManager):
    """The state behind `CPUOffloadingManager`'s calls, and the helpers they share.

    Its constructor is the manager's (see `CPUOffloadingManager` for the arguments). The calls
    themselves, and everything an engine author reads to learn the protocol, are in
    `kvref.cpu.manager`.
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
        # Tests swap in policies after construction: each is bound afresh.
        self._bind_policy(policy)

    def _bind_policy(self, policy: CachePolicy) -> None:
        """Bind the fast paths to `policy`: its block maps, its hooks, a lookup over its maps."""
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
        self._lookup, self._lookup_counts = make_lookup(self._blocks, self._other_blocks, *self._lookup_counts())

    @override
    def __getstate__(self) -> dict[str, object]:
        # The lookup and touch closures are bound to this manager's policy: copies and
        # unpickled managers get their own (see __setstate__), starting from this one's counts.
        # (vars() slows this manager's attribute access from now on, see the _policy setter:
        # copies are for tests and snapshots, off the serving path.)
        state = dict(vars(self))
        for name in ("lookup", "touch", "_lookup", "_lookup_counts", "_get_block", "_get_other_block"):
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

    def _request_access(self, req_context: ReqContext) -> RequestAccess:
        state = req_context.get_state(RequestAccess)
        if state is None or state.owner is not self or state.generation != self._generation:
            state = RequestAccess(self, self._generation)
            req_context.set_state(state)
        return state

    def _record_access(
        self,
        state: RequestAccess,
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

    # --- refused calls: what they raise or count ---

    def _refuse_load(self, keys: Collection[OffloadKey], found: list[BlockStatus | None]) -> NoReturn:
        """Raise the protocol error a bad prepare_load deserves (nothing was changed)."""
        for key, block in zip(keys, found):
            if block is None or block.ref_cnt < 0:
                raise self._protocol_error("prepare_load", key, "only stored blocks can be loaded")
        raise AssertionError("prepare_load refused a valid load")  # pragma: no cover

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

    def _refuse_store(self, state: RequestAccess, new_misses: list[OffloadKey]) -> None:
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
            and all(block.ref_cnt == 0 for _, block in evicted)
            and protected.isdisjoint(key for key, _ in evicted)
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
