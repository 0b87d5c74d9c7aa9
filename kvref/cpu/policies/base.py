"""The `CachePolicy` ABC: how CPU blocks are organised and which ones are evicted.

A policy owns the mapping key -> `BlockStatus` and the replacement order; the manager owns slot
allocation, reference counts and events, and calls the policy's hooks when a block's reference
count moves between 0 (evictable) and non-zero (protected), and when a request accesses blocks
(`on_request_access`, `on_store_miss`) or finishes (`on_request_finished`), as vLLM 0.33 does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence, Set
from typing import Any, TypeVar

from typing_extensions import override

from kvref.base import OffloadKey, ReqContext

__all__ = ["BlockStatus", "CachePolicy", "order_request_keys", "no_op_hook", "is_no_op_hook"]

_F = TypeVar("_F", bound=Callable[..., Any])

# Hook implementations that do nothing: the manager does not call them (a call per key is a
# Python frame per key on its hottest paths). A policy that overrides a hook is always called.
_NO_OP_HOOKS: set[object] = set()


def no_op_hook(function: _F) -> _F:
    """Declare (and return unchanged) a `CachePolicy` hook implementation that does nothing."""
    _NO_OP_HOOKS.add(function)
    return function


def is_no_op_hook(policy: CachePolicy, name: str) -> bool:
    """Return whether `policy`'s class implements the hook `name` (e.g. "mark_evictable") with a
    declared no-op, so calls of it can be skipped."""
    return getattr(type(policy), name, None) in _NO_OP_HOOKS


def order_request_keys(
    key_groups: Sequence[Sequence[OffloadKey]], req_context: ReqContext
) -> list[OffloadKey]:
    """Flatten a request's key groups into one head-to-tail order (vLLM's helper of that name).

    Sorted by recorded end-token position when every key has one (a stable sort: groups keep
    their order at equal positions); otherwise the groups are concatenated as given.

    Args:
        key_groups: the request's keys per KV-cache group, each head to tail.
        req_context: the request (its recorded key positions).

    Returns:
        Every key once per occurrence, head first.
    """
    if len(key_groups) == 1:
        keys = list(key_groups[0])
    else:
        keys = [key for group in key_groups for key in group]
    recorded = req_context.offload_key_positions
    if recorded:
        try:
            # list.sort computes every key before it moves anything: a missing position
            # leaves the list as it was.
            keys.sort(key=recorded.__getitem__)
        except KeyError:
            pass
    return keys


class BlockStatus:
    """One CPU block: its slot and how many transfers use it.

    `ref_cnt` is -1 while its write is pending (visible to lookup, not readable, not
    evictable), 0 when idle (readable and evictable) and n > 0 while n transfers read it.
    """

    __slots__ = ("ref_cnt", "block_id")

    def __init__(self, block_id: int) -> None:
        self.ref_cnt: int = -1
        self.block_id: int = block_id

    @property
    def is_ready(self) -> bool:
        """True once the block's write completed (it can be read)."""
        return self.ref_cnt >= 0

    @override
    def __repr__(self) -> str:
        return f"BlockStatus(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class CachePolicy(ABC):
    """Block organisation and replacement decisions for the CPU tier."""

    @abstractmethod
    def __init__(self, cache_capacity: int) -> None:
        """Create an empty policy for at most `cache_capacity` blocks.

        Args:
            cache_capacity: the number of CPU blocks (bounds ghost lists where the policy has
                them).
        """

    def block_map(self) -> Mapping[OffloadKey, BlockStatus] | None:
        """Return a live mapping of every held key to its block, or None (the default).

        The manager then reads blocks from it directly instead of calling `get` (its hottest
        path). The mapping must stay the same object for the policy's lifetime (`clear`
        empties it in place) and agree with `get` at all times.

        Returns:
            The mapping, or None when the policy keeps none.
        """
        return None

    def block_maps(self) -> tuple[Mapping[OffloadKey, BlockStatus], ...]:
        """Return the live mappings the manager reads blocks from directly, in probing order.

        By default `block_map()`'s, if any. A policy whose blocks are in two disjoint dicts may
        return both rather than keep a third for lookups (ARC: t1, t2); a miss then costs two
        probes. `block_map`'s rules apply to each; with none, or over two, `get` is called.
        """
        blocks = self.block_map()
        return () if blocks is None else (blocks,)

    @abstractmethod
    def get(self, key: OffloadKey) -> BlockStatus | None:
        """Return the block of `key`, or None. Does not change recency.

        Args:
            key: the block's key.

        Returns:
            Its status, or None when the policy does not hold it.
        """

    @abstractmethod
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        """Add a newly allocated block (its write still pending unless `block.ref_cnt` >= 0).

        Args:
            key: a key the policy does not hold.
            block: its status.
        """

    def insert_for_request(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus], req_context: ReqContext
    ) -> None:
        """Add the blocks one `prepare_store` allocated for `req_context`, co-indexed with `keys`.

        The default inserts each with `insert`; a policy that ranks a request's blocks by token
        position (kvref's LRU) overrides it.

        Args:
            keys: keys the policy does not hold, in the order of the store.
            blocks: their statuses (writes pending).
            req_context: the storing request.
        """
        for key, block in zip(keys, blocks):
            self.insert(key, block)

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Drop `key` (used to clean up a failed store). Absent keys are ignored.

        Args:
            key: the block's key.
        """

    @abstractmethod
    def touch(self, keys: Collection[OffloadKey]) -> None:
        """Mark blocks recently used, whatever their state; absent keys are ignored.

        Keys are applied in reverse, so the first key (a request's prefix head) ends up the
        most recently used. Pending and pinned blocks are re-ranked too (logical recency).

        Args:
            keys: the blocks, in request order.
        """

    def on_store_miss(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Observe keys a request offers to store that are not held, before they are inserted.

        Called once per key and request, even if the store is then refused. The default touches
        them (which, for absent keys, changes nothing in kvref's policies); ARC adapts its target
        on ghost hits here.

        Args:
            keys: absent keys, in the order offered.
            req_context: the storing request.
        """
        self.touch(keys)

    @no_op_hook
    def on_request_access(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Observe keys a running request loads or stores, the first time it names each.

        Keys may not be held yet. The default does nothing; LRU gives held keys with a recorded
        position the request's provisional rank here.

        Args:
            keys: keys first named by the request, in the order named.
            req_context: the request.
        """
        return None


    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: Set[OffloadKey],
        reused_keys: Set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        """Commit one finished request's access, in prefix order.

        The default touches each group.

        Args:
            key_groups: the keys the request named, per KV-cache group, head to tail.
            insertion_only_keys: keys the request stored and did not reuse.
            reused_keys: ready keys the request loaded or offered again (a frequency hit).
            req_context: the finished request.
        """
        for keys in key_groups:
            self.touch(keys)

    @abstractmethod
    def evict(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """Evict exactly `n` idle blocks (`ref_cnt == 0`) none of which is in `protected`.

        Atomic: either `n` blocks are removed and returned, or None is returned and nothing
        changed.

        Args:
            n: how many blocks to evict (n >= 1).
            protected: keys that must survive this call.

        Returns:
            The evicted (key, block) pairs in eviction order, or None.
        """

    @abstractmethod
    def clear(self) -> None:
        """Drop every block, whatever its state, and any adaptive or ghost state."""

    @no_op_hook
    def mark_evictable(self, key: OffloadKey) -> None:
        """Hook: the block of `key` just became idle (ref_cnt -1 -> 0 or 1 -> 0).

        Not a use: the block keeps the recency it had (vLLM 0.33's logical recency).

        Args:
            key: the block's key (held by the policy).
        """
        return None


    @no_op_hook
    def mark_non_evictable(self, key: OffloadKey) -> None:
        """Hook: the idle block of `key` just became protected (ref_cnt 0 -> 1).

        Args:
            key: the block's key (held by the policy).
        """
        return None
