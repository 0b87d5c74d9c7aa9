"""Adaptive Replacement Cache (Megiddo & Modha, FAST'03) over CPU blocks (vLLM 0.33: `cpu/policies/arc.py`)."""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence, Set

from typing_extensions import override

from kvref.base import OffloadKey, ReqContext
from kvref.cpu.policies._arc_ghosts import GhostList
from kvref.cpu.policies.base import BlockStatus, CachePolicy, order_request_keys

__all__ = ["ARCCachePolicy"]

_Entries = Iterator[tuple[OffloadKey, BlockStatus]]
_FIRST = operator.itemgetter(0)  # an eviction's key
# touch tests longer key lists against every table in C before its per-key loop.
_PROBED_IN_C = 16


class ARCCachePolicy(CachePolicy):
    """ARC: balance recency against frequency, and learn the balance from recent mistakes.

    Recency is logical, as in vLLM 0.33: only stores, touches and finished requests move blocks;
    a block whose store or load completes stays where it is.

    State:
        t1: blocks used once since they were stored ("recent"), least recent first, whatever
            their state (pending, idle, being read).
        t2: blocks used at least twice ("frequent"), least recent first.
        b1, b2: ghost lists, the keys (no slots) recently evicted from t1 and t2, each bounded
            by `cache_capacity`, oldest first (`GhostList`s: a dict and a deque each, not an
            OrderedDict).
        target_t1_size: how large t1 should be, in [0, cache_capacity]; starts at 0.

    t2 and t1 are the manager's `block_maps`: it probes t2, then t1 (a hit is mostly a reuse, in
    t2), rather than ARC keeping a third map of every block for lookups (as much memory again
    as t1 and t2's tables).

    Algorithm:
        1. insert(key): the new block (its write pending) joins t1's MRU end; the key leaves
           b1/b2.
        2. on_store_miss(keys), once per key and request, before insertion, last key first:
           c. in b1 (evicted from t1 too early): target_t1_size += max(1, |b2| / |b1|), capped
              at cache_capacity; the key moves to b1's MRU end.
           d. in b2 (evicted from t2 too early): target_t1_size -= max(1, |b1| / |b2|), floored
              at 0; the key moves to b2's MRU end.
        3. touch(keys), applied last key first so a request's first key ends most recent:
           a. in t1 and ready: promote to t2's MRU end. In t1 but pending: move to t1's MRU end
              (only just prepared for storing, not used twice).
           b. in t2: move to the MRU end.
           c/d. in a ghost list: as in step 2.
        4. on_request_finished, over the request's keys tail first: a key it only stored moves
           to the MRU end of its own list; a key it reused (loaded, or offered again while
           ready) is promoted from t1 to t2 or moves to t2's MRU end.
        5. evict(n, protected) first chooses, mutating nothing. With a running size s = |t1|:
           for each victim, if s >= int(target_t1_size) take the oldest idle, unprotected t1
           block (s -= 1); failing that, the oldest such t2 block; failing that, t1 again; if
           none, return None with nothing changed. Each list is scanned once per call.
        6. Then it commits: the chosen blocks leave t1/t2, their keys enter the MRU ends of b1
           (from t1) and b2 (from t2), and each ghost list drops its oldest keys down to
           cache_capacity.
        7. clear(): empty all lists and reset target_t1_size to 0.

    Eviction scans t1/t2 from the old end past busy blocks, as vLLM does: busy blocks are
    usually the most recent ones, so the scan rarely skips many.
    """

    @override
    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity: int = cache_capacity
        self.target_t1_size: float = 0.0
        self.t1: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self.b1: GhostList = GhostList()
        self.b2: GhostList = GhostList()

    @override
    def block_maps(self) -> tuple[Mapping[OffloadKey, BlockStatus], ...]:
        return self.t2, self.t1

    @override
    def get(self, key: OffloadKey) -> BlockStatus | None:
        block = self.t1.get(key)
        return block if block is not None else self.t2.get(key)

    @override
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.t1[key] = block
        self.b1.discard((key,))
        self.b2.discard((key,))

    @override
    def insert_for_request(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus], req_context: ReqContext
    ) -> None:
        t1 = self.t1
        # A loop: OrderedDict.update takes a slow generic path.
        for key, block in zip(keys, blocks):
            t1[key] = block
        # Ghost hits are rare: find them in C, then drop only those.
        for ghosts in (self.b1, self.b2):
            copies = ghosts.copies
            if copies and not copies.keys().isdisjoint(keys):
                ghosts.discard(copies.keys() & keys)

    @override
    def remove(self, key: OffloadKey) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def _adapt_to_ghost_hit(self, key: OffloadKey) -> None:
        b1, b2 = self.b1, self.b2
        if key in b1:
            delta = max(1.0, b2.size / b1.size)
            self.target_t1_size = min(self.target_t1_size + delta, float(self.cache_capacity))
            b1.refresh(key)
        elif key in b2:
            delta = max(1.0, b1.size / b2.size)
            self.target_t1_size = max(self.target_t1_size - delta, 0.0)
            b2.refresh(key)

    @override
    def on_store_miss(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        b1, b2 = self.b1.copies, self.b2.copies
        # Discarded keys with stale copies are in the dicts too: they only cost a closer look.
        if (b1 and not b1.keys().isdisjoint(keys)) or (b2 and not b2.keys().isdisjoint(keys)):
            for key in reversed(keys):
                if key in b1 or key in b2:
                    self._adapt_to_ghost_hit(key)

    @override
    def touch(self, keys: Collection[OffloadKey]) -> None:
        # Probed in the order keys are most often found (t2, t1, the ghosts): each probe of
        # another large table is a likely cache miss, the main cost per key.
        t1, t2 = self.t1, self.t2
        num_keys = len(keys)
        if num_keys == 1:
            # One key: no reversal, no method bound for a single call, and the ghost lists
            # read only if the key is not held.
            for key in keys:
                if key in t2:
                    t2.move_to_end(key)
                elif key in t1:
                    self._use_recent(key)
                elif key in self.b1.copies or key in self.b2.copies:
                    self._adapt_to_ghost_hit(key)
            return
        b1, b2 = self.b1.copies, self.b2.copies
        # A long list of a request's new blocks (neither held nor ghosts) moves nothing, which
        # a C-level test finds (the ghosts' dicts also hold discarded keys: a false alarm only
        # costs the loop). A short list is probed by the loop itself: building the views costs
        # more than its probes.
        if (
            num_keys > _PROBED_IN_C
            and t2.keys().isdisjoint(keys)
            and t1.keys().isdisjoint(keys)
            and (not b1 or b1.keys().isdisjoint(keys))
            and (not b2 or b2.keys().isdisjoint(keys))
        ):
            return
        refresh_t2 = t2.move_to_end  # bound once, outside the per-key loop
        # Last key first; a list (what the manager passes) is reversed in place, not copied.
        for key in reversed(keys) if isinstance(keys, list) else reversed(list(keys)):
            if key in t2:
                refresh_t2(key)
            elif key in t1:  # _use_recent, inlined: a request's first reuses arrive here
                if t1[key].ref_cnt >= 0:
                    t2[key] = t1.pop(key)
                else:
                    t1.move_to_end(key)
            elif key in b1 or key in b2:
                self._adapt_to_ghost_hit(key)

    def _use_recent(self, key: OffloadKey) -> None:
        """Step 3a: a touched t1 block is promoted to t2 if ready, else moved to t1's MRU end."""
        t1 = self.t1
        if t1[key].ref_cnt >= 0:
            self.t2[key] = t1.pop(key)
        else:
            t1.move_to_end(key)

    @override
    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: Set[OffloadKey],
        reused_keys: Set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        t1, t2 = self.t1, self.t2
        # One group is already head to tail (the contract): only several need merging.
        keys = key_groups[0] if len(key_groups) == 1 else order_request_keys(key_groups, req_context)
        refresh_t2 = t2.move_to_end  # bound once, as in touch
        for key in reversed(keys):
            # The request's small sets first (reuses, usually the most), then the list the key
            # most likely is in. A reuse promotes to t2 (or refreshes there); a store is not a
            # frequency hit: the block keeps its list, and takes its recency. The sets are
            # disjoint.
            if key in reused_keys:
                if key in t2:
                    refresh_t2(key)
                elif key in t1:
                    t2[key] = t1.pop(key)
            elif key in insertion_only_keys:
                if key in t1:
                    t1.move_to_end(key)
                elif key in t2:
                    refresh_t2(key)

    @override
    def evict(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        if n <= 0:
            return []
        t1, t2 = self.t1, self.t2
        target = int(self.target_t1_size)
        # Step 5 takes every victim from one list when that list has enough candidates: from t1
        # while its running size stays >= target, from t2 when t1 is below target already.
        if len(t1) - n + 1 >= target:
            entries, ghosts = t1, self.b1
        elif len(t1) < target:
            entries, ghosts = t2, self.b2
        else:
            return self._evict_from_both(n, protected)
        # The n oldest idle, unprotected entries of that list (inline: this runs per store).
        victims: list[tuple[OffloadKey, BlockStatus]] = []
        for entry in entries.items():
            if entry[1].ref_cnt == 0 and entry[0] not in protected:
                victims.append(entry)
                if len(victims) == n:
                    break
        else:
            return self._evict_from_both(n, protected)
        # Step 6 for victims of one list.
        for key, _ in victims:
            del entries[key]
        ghosts.extend(map(_FIRST, victims))
        ghosts.trim(self.cache_capacity)
        return victims

    def _evict_from_both(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        # Monotonic iterators: each list is walked at most once per call, never restarted.
        t1_idle: _Entries = (e for e in self.t1.items() if e[1].ref_cnt == 0 and e[0] not in protected)
        t2_idle: _Entries = (e for e in self.t2.items() if e[1].ref_cnt == 0 and e[0] not in protected)
        chosen: list[tuple[OffloadKey, BlockStatus, bool]] = []
        t1_size = len(self.t1)
        target = int(self.target_t1_size)
        for _ in range(n):
            entry = next(t1_idle, None) if t1_size >= target else None
            from_t1 = entry is not None
            if entry is None:
                entry = next(t2_idle, None)
            if entry is None:
                entry = next(t1_idle, None)
                from_t1 = True
                if entry is None:
                    return None
            if from_t1:
                t1_size -= 1
            chosen.append((entry[0], entry[1], from_t1))

        for entries, ghosts, from_list in ((self.t1, self.b1, True), (self.t2, self.b2, False)):
            keys = [key for key, _, from_t1 in chosen if from_t1 is from_list]
            for key in keys:
                del entries[key]
            ghosts.extend(keys)
            ghosts.trim(self.cache_capacity)
        return [(key, block) for key, block, _ in chosen]

    @override
    def clear(self) -> None:
        for entries in (self.t1, self.t2, self.b1, self.b2):
            entries.clear()
        self.target_t1_size = 0.0
