"""Adaptive Replacement Cache over CPU chunks (vLLM 0.33: `cpu/policies/arc.py`).

Megiddo and Modha's ARC (FAST '03) with logical recency: only stores, touches and finished
requests move chunks; a chunk whose store or load completes stays where it is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence

from typing_extensions import override

from kvref.base import OffloadKey, ReqContext
from kvref.cpu.policies._ghosts import GhostList
from kvref.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys

__all__ = ["ARCCachePolicy"]


class ARCCachePolicy(CachePolicy):
    """ARC: balance recency against frequency, and learn the balance from recent mistakes.

    State:
        t1: chunks used once since they were stored ("recent"), least recent first.
        t2: chunks used at least twice ("frequent"), least recent first.
        b1, b2: ghost lists, keys recently evicted from t1 and t2 (no slots), each bounded by
            `cache_capacity` (`GhostList`s: a dict and a deque each, half an OrderedDict's
            memory per key; their `members` dicts are probed directly).
        target_t1_size: how large t1 should be, in [0, cache_capacity]; starts at 0.

    Algorithm:
        1. insert: a new chunk joins t1's most recent end and leaves b1/b2.
        2. A request's access (`on_request_finished`, over its keys tail first): a chunk it
           reused moves from t1 to t2, or to t2's most recent end; a chunk it only stored
           moves to its own list's most recent end (a store is not a frequency hit).
        3. Ghost hits adapt the target, once per request, before insertion drops the ghost
           (`on_store_miss`; `touch` too): a b1 hit (evicted from t1 too early) grows it by
           max(1, |b2| / |b1|), a b2 hit shrinks it by max(1, |b1| / |b2|).
        4. evict: while t1's remaining size is at least int(target_t1_size), take t1's oldest
           idle chunk into b1, else t2's oldest into b2, else t1's; then trim both ghost lists
           to `cache_capacity`.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.target_t1_size: float = 0.0
        self.t1: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        self.b1 = GhostList()
        self.b2 = GhostList()
        # Every held chunk, t1's and t2's: a lookup is one probe, not one per list.
        self._chunks: dict[OffloadKey, ChunkStatus] = {}

    @override
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self._chunks.get(key)

    @override
    def chunk_map(self) -> Mapping[OffloadKey, ChunkStatus]:
        return self._chunks

    @override
    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self._chunks[key] = chunk
        self.t1[key] = chunk
        self.b1.discard(key)
        self.b2.discard(key)

    @override
    def insert_many(self, keys: Sequence[OffloadKey], chunks: Sequence[ChunkStatus], req_context: ReqContext) -> None:
        self._chunks.update(zip(keys, chunks))
        self.t1.update(zip(keys, chunks))
        b1, b2 = self.b1, self.b2
        for key in [key for key in keys if key in b1.members or key in b2.members]:  # ghosts no more
            b1.discard(key)
            b2.discard(key)

    @override
    def remove(self, key: OffloadKey) -> None:
        self._chunks.pop(key, None)
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def _adapt_to_ghost_hit(self, key: OffloadKey) -> None:
        if key in self.b1.members:
            delta = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
            self.b1.move_to_end(key)
        elif key in self.b2.members:
            delta = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            self.b2.move_to_end(key)

    @override
    def on_store_miss(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        b1, b2 = self.b1.members, self.b2.members
        for key in reversed(keys if isinstance(keys, list) else list(keys)):
            if key in b1 or key in b2:  # only a ghost adapts the target
                self._adapt_to_ghost_hit(key)

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        t1, t2 = self.t1, self.t2
        # A list (what the manager is given) is walked backwards in place, not copied first.
        for key in reversed(keys if isinstance(keys, list) else list(keys)):
            if key in t2:  # the most common case first: a chunk used before, used again
                t2.move_to_end(key)
            elif key in t1:
                chunk = t1.pop(key)
                if chunk.ref_cnt >= 0:  # ready: a second use
                    t2[key] = chunk
                else:
                    t1[key] = chunk  # only just prepared for storing: not a second use
            elif key in self.b1.members or key in self.b2.members:  # only a ghost adapts the target
                self._adapt_to_ghost_hit(key)

    @override
    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        t1, t2 = self.t1, self.t2
        for key in reversed(order_request_keys(key_groups, req_context)):
            if key in insertion_only_keys:  # a store is not a frequency hit: keep its list
                if key in t1:
                    t1.move_to_end(key)
                elif key in t2:
                    t2.move_to_end(key)
            elif key in reused_keys:  # a reuse is one more access
                if key in t1:
                    t2[key] = t1.pop(key)
                elif key in t2:
                    t2.move_to_end(key)

    @override
    def clear(self) -> None:
        self._chunks.clear()
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.target_t1_size = 0.0

    @override
    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        # Choose all n first, changing nothing, so that a shortfall leaves the policy as it
        # was. The scans only move forward: restarting from the oldest end after each choice
        # would make a batch eviction quadratic.
        t1_idle = ((key, chunk) for key, chunk in self.t1.items() if chunk.ref_cnt == 0 and key not in protected)
        t2_idle = ((key, chunk) for key, chunk in self.t2.items() if chunk.ref_cnt == 0 and key not in protected)
        target = int(self.target_t1_size)
        t1_size = len(self.t1)  # as the choices so far would leave it
        evicted: list[tuple[OffloadKey, ChunkStatus]] = []
        from_t1: list[OffloadKey] = []
        from_t2: list[OffloadKey] = []
        for _ in range(n):
            entry = next(t1_idle, None) if t1_size >= target else None
            if entry is None:
                entry = next(t2_idle, None)
                if entry is not None:
                    from_t2.append(entry[0])
                    evicted.append(entry)
                    continue
                entry = next(t1_idle, None)
                if entry is None:
                    return None
            t1_size -= 1
            from_t1.append(entry[0])
            evicted.append(entry)

        for key in from_t1:
            del self.t1[key]
        for key in from_t2:
            del self.t2[key]
        for key, _ in evicted:
            del self._chunks[key]
        self.b1.extend(from_t1)
        self.b2.extend(from_t2)
        self.b1.trim(self.cache_capacity)
        self.b2.trim(self.cache_capacity)
        return evicted
