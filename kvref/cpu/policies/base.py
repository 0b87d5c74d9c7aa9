"""The `CachePolicy` ABC: how CPU chunks are organised and which are evicted (vLLM 0.33:
`cpu/policies/base.py`).

A policy owns the key -> `ChunkStatus` mapping and the replacement order; the manager owns slot
allocation, reference counts and events. LRU and ARC differ in both halves - ARC's ghost lists
and target size sit where organisation and eviction meet - so one class holds both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence

from typing_extensions import override

from kvref.base import OffloadKey, ReqContext

__all__ = ["CachePolicy", "ChunkStatus", "order_request_keys"]


def order_request_keys(key_groups: Sequence[Sequence[OffloadKey]], req_context: ReqContext) -> list[OffloadKey]:
    """Return one head-to-tail order across a request's KV-cache groups (each head to tail).

    By recorded end-token position when every key has one (a stable sort: groups keep their
    order at equal positions); otherwise the groups concatenated as given.
    """
    if len(key_groups) == 1:
        return list(key_groups[0])  # one group is head to tail already (the contract)
    keys = [key for group in key_groups for key in group]
    try:
        # list.sort computes every key before it moves any: a missing position changes nothing.
        keys.sort(key=req_context.offload_key_positions.__getitem__)
    except KeyError:
        pass
    return keys


class ChunkStatus:
    """The offloading status of one chunk: its CPU slot and how many transfers read it.

    Attributes:
        ref_cnt: -1 while its write is pending (not readable, not evictable), 0 when idle
            (readable, evictable), n > 0 while n transfers read it.
        chunk_id: the index of its CPU slot.
    """

    # A plain class with slots rather than vLLM's ctypes.Structure: a third of the memory, and
    # attribute reads that are a slot load instead of a C-type conversion.
    __slots__ = ("ref_cnt", "chunk_id")

    def __init__(self, chunk_id: int) -> None:
        self.ref_cnt: int = -1
        self.chunk_id: int = chunk_id

    @property
    def is_ready(self) -> bool:
        """Whether the chunk's write completed (it can be read)."""
        return self.ref_cnt >= 0

    @override
    def __repr__(self) -> str:
        return f"ChunkStatus(chunk_id={self.chunk_id}, ref_cnt={self.ref_cnt})"


class CachePolicy(ABC):
    """Chunk organisation and replacement decisions for the CPU tier.

    Args:
        cache_capacity: the number of CPU chunks (bounds ghost lists where a policy keeps them).
    """

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity

    @abstractmethod
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        """Return the chunk of `key`, or None when the policy does not hold it; no recency change."""

    def chunk_map(self) -> Mapping[OffloadKey, ChunkStatus] | None:
        """Return a live mapping of every held key to its chunk, or None (the default).

        A policy that keeps its chunks in one dict hands it over, and the manager reads chunks
        from it directly: a lookup is then one dict probe, not a method call per key. The
        mapping must stay the same object for the policy's lifetime (`clear` empties it in
        place) and agree with `get` at all times.
        """
        return None

    @abstractmethod
    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        """Add a newly allocated chunk (its write pending), stored by `req_context`.

        Args:
            key: a key the policy does not hold.
            chunk: its status.
            req_context: the storing request (its key positions order a request's chunks).
        """

    def insert_many(self, keys: Sequence[OffloadKey], chunks: Sequence[ChunkStatus], req_context: ReqContext) -> None:
        """`insert` each of `keys` with its chunk (co-indexed), in order.

        The manager's `prepare_store` uses it: one call per store instead of one per key. The
        default calls `insert`.
        """
        for key, chunk in zip(keys, chunks):
            self.insert(key, chunk, req_context)

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Drop `key`, held by the policy (to clean up after a failed store)."""

    @abstractmethod
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark chunks recently used, whatever their state; absent keys are ignored.

        Keys come in request order and are applied last to first, so the request's head ends
        up the most recently used.

        Args:
            keys: the chunks.
            req_context: the request touching them.
        """

    def on_store_miss(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Observe keys a request offers to store that are not held, before they are inserted.

        Called once per key and request, even if the store is then refused. The default
        touches them; ARC adapts its target to ghost-list hits here.
        """
        self.touch(keys, req_context)

    def on_request_access(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Observe the keys a running request names for the first time (they may not be held).

        For keeping prefix order during a request without committing the access, which
        `on_request_finished` does. The default does nothing.
        """
        return None

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        """Commit one finished request's access, in prefix order.

        The default touches each group.

        Args:
            key_groups: the keys the request named, per KV-cache group, head to tail.
            insertion_only_keys: chunks the request created and did not reuse.
            reused_keys: ready chunks it reused (loaded, or offered again): a frequency hit.
            req_context: the finished request.
        """
        for keys in key_groups:
            self.touch(keys, req_context)

    @abstractmethod
    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """Evict exactly `n` idle chunks (`ref_cnt == 0`), none of them in `protected`.

        Atomic: either `n` chunks are removed and returned, or None is returned and nothing
        changed.

        Returns:
            The evicted (key, chunk) pairs, in eviction order, or None.
        """

    @abstractmethod
    def clear(self) -> None:
        """Drop every chunk, whatever its `ref_cnt`, and any ghost or adaptive state."""

    def mark_evictable(self, key: OffloadKey) -> None:
        """Hook: the chunk of `key` just became idle (ref_cnt -1 -> 0 or 1 -> 0); not a use."""
        return None

    def mark_non_evictable(self, key: OffloadKey) -> None:
        """Hook: the idle chunk of `key` just became protected (ref_cnt 0 -> 1)."""
        return None
