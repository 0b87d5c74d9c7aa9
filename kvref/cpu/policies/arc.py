"""Adaptive Replacement Cache (Megiddo & Modha, FAST'03) over CPU blocks (vLLM: `cpu/policies/arc.py`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterator, Set

from typing_extensions import override

from kvref.base import OffloadKey
from kvref.cpu.policies.base import BlockStatus, CachePolicy

__all__ = ["ARCCachePolicy"]

_Entries = Iterator[tuple[OffloadKey, BlockStatus]]


class ARCCachePolicy(CachePolicy):
    """ARC: balance recency against frequency, and learn the balance from recent mistakes.

    State:
        t1: blocks used once since they were stored ("recent").
        t2: blocks used at least twice ("frequent").
        b1, b2: ghost lists, the keys (no slots) recently evicted from t1 and t2, each bounded
            by `cache_capacity`, oldest first.
        target_t1_size: how large t1 should be, in [0, cache_capacity]; starts at 0.
        t1_evictable, t2_evictable: the idle members (ref_cnt 0) of t1 and t2 in LRU order;
            eviction walks only these, so it costs O(evicted + protected idle blocks skipped).

    Algorithm:
        1. insert(key): the new block (its write pending) joins t1; the key leaves b1/b2.
        2. A block that becomes idle (its store or its last load completed) re-enters the MRU
           end of its own list's idle order: within t1 or t2 that counts as a use. (vLLM leaves
           it in place; kvref treats it like its LRU does, which is what keeps the idle order a
           plain `OrderedDict`.) Becoming idle never promotes.
        3. touch(keys), applied last key first so a request's first key ends most recent:
           a. in t1 and ready: promote to t2 (at the MRU end if idle). In t1 but still pending:
              nothing; the block was only just prepared for storing, not used twice.
           b. in t2: move to the MRU end if idle.
           c. in b1 (evicted from t1 too early): target_t1_size += max(1, |b2| / |b1|), capped
              at cache_capacity; the key moves to b1's MRU end.
           d. in b2 (evicted from t2 too early): target_t1_size -= max(1, |b1| / |b2|), floored
              at 0; the key moves to b2's MRU end.
        4. evict(n, protected) first chooses, mutating nothing. With a running size s = |t1|:
           while fewer than n are chosen, if s >= int(target_t1_size) take the oldest idle,
           unprotected, not yet chosen t1 block (s -= 1), else the oldest such t2 block; when
           the preferred list has none left, take from the other one (vLLM gives up instead,
           refusing evictions the manager's idle count promised); if neither has one, return
           None with nothing changed.
        5. Then it commits: the chosen blocks leave t1/t2, their keys enter the MRU ends of b1
           (from t1) and b2 (from t2), and each ghost list drops its oldest keys down to
           cache_capacity.
        6. clear(): empty all lists and reset target_t1_size to 0.
    """

    @override
    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity: int = cache_capacity
        self.target_t1_size: float = 0.0
        self.t1: dict[OffloadKey, BlockStatus] = {}
        self.t2: dict[OffloadKey, BlockStatus] = {}
        self.t1_evictable: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self.t2_evictable: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    @override
    def get(self, key: OffloadKey) -> BlockStatus | None:
        block = self.t1.get(key)
        return block if block is not None else self.t2.get(key)

    @override
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.t1[key] = block
        if block.ref_cnt == 0:
            self.t1_evictable[key] = block
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    @override
    def remove(self, key: OffloadKey) -> None:
        if self.t1.pop(key, None) is not None:
            self.t1_evictable.pop(key, None)
        elif self.t2.pop(key, None) is not None:
            self.t2_evictable.pop(key, None)

    @override
    def touch(self, keys: Collection[OffloadKey]) -> None:
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        for key in reversed(list(keys)):
            block = t1.get(key)
            if block is not None:
                if block.is_ready:
                    del t1[key]
                    t2[key] = block
                    if self.t1_evictable.pop(key, None) is not None:
                        self.t2_evictable[key] = block
            elif key in t2:
                if key in self.t2_evictable:
                    self.t2_evictable.move_to_end(key)
            elif key in b1:
                delta = max(1.0, len(b2) / len(b1))
                self.target_t1_size = min(self.target_t1_size + delta, float(self.cache_capacity))
                b1.move_to_end(key)
            elif key in b2:
                delta = max(1.0, len(b1) / len(b2))
                self.target_t1_size = max(self.target_t1_size - delta, 0.0)
                b2.move_to_end(key)

    @override
    def evict(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        if n <= 0:
            return []
        # Monotonic iterators: each list is walked at most once per call, never restarted.
        t1_idle: _Entries = (e for e in self.t1_evictable.items() if e[0] not in protected)
        t2_idle: _Entries = (e for e in self.t2_evictable.items() if e[0] not in protected)
        chosen: list[tuple[OffloadKey, BlockStatus, bool]] = []
        t1_size = len(self.t1)
        while len(chosen) < n:
            prefer_t1 = t1_size >= int(self.target_t1_size)
            first, second = (t1_idle, t2_idle) if prefer_t1 else (t2_idle, t1_idle)
            entry = next(first, None)
            from_t1 = prefer_t1
            if entry is None:
                entry = next(second, None)
                from_t1 = not prefer_t1
            if entry is None:
                return None
            if from_t1:
                t1_size -= 1
            chosen.append((entry[0], entry[1], from_t1))

        for key, block, from_t1 in chosen:
            assert block.ref_cnt == 0, f"ARC index holds {key.hex()} with ref_cnt {block.ref_cnt}"
            if from_t1:
                del self.t1[key], self.t1_evictable[key]
                self.b1[key] = None
            else:
                del self.t2[key], self.t2_evictable[key]
                self.b2[key] = None
        for ghosts in (self.b1, self.b2):
            for _ in range(len(ghosts) - self.cache_capacity):
                ghosts.popitem(last=False)
        return [(key, block) for key, block, _ in chosen]

    @override
    def clear(self) -> None:
        for entries in (self.t1, self.t2, self.t1_evictable, self.t2_evictable, self.b1, self.b2):
            entries.clear()
        self.target_t1_size = 0.0

    @override
    def mark_evictable(self, key: OffloadKey) -> None:
        block = self.t1.get(key)
        evictable = self.t1_evictable
        if block is None:
            block, evictable = self.t2[key], self.t2_evictable
        # Not indexed while busy, so the key goes in at the recent end (step 2).
        evictable[key] = block

    @override
    def mark_non_evictable(self, key: OffloadKey) -> None:
        if self.t1_evictable.pop(key, None) is None:
            self.t2_evictable.pop(key, None)
