"""Least-recently-used replacement with logical recency (vLLM 0.33: `cpu/policies/lru.py`).

Recency is logical: it is what requests did with a block, never when a transfer finished. A use
is the first store of a block, a `touch`, or a request's access (committed when the request
finishes). A touch re-ranks a block even while its store is pending or while it is being read;
a block that becomes idle (its store or its last load completed) keeps the rank it had.

Ranks are integers: a fresh use takes the next value of a counter. The blocks of a running
request share one provisional rank, taken when the request first names a block, ordered by
token position so that the request's tail is evicted before its head; `on_request_finished`
then gives every key of the request a fresh rank, tail first, so its head ends most recent.
A rank is stored as one int, `rank * _POSITION_SPAN - position` (vLLM keeps the pair
`(rank, -position)`; the order is the same and an int compares faster).

Idle blocks sit in a min-heap of `(rank, key)` with lazy invalidation: a re-ranked or pinned
block leaves its old entry behind, skipped when popped, and the heap is rebuilt from the idle
set once stale entries outnumber live ones. Eviction pops the lowest ranks: O(k log n) for k
entries popped. (kvref's earlier LRU, and vLLM's before 0.33, kept an `OrderedDict` and made a
block most recent whenever it became idle.)
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Sequence, Set
from dataclasses import dataclass

from typing_extensions import override

from kvref.base import MAX_OFFLOAD_KEY_POSITION, OffloadKey, ReqContext
from kvref.cpu.policies.base import BlockStatus, CachePolicy, order_request_keys

__all__ = ["LRUCachePolicy"]

# Positions are < MAX_OFFLOAD_KEY_POSITION (ReqContext enforces it), so a rank step spans them.
_POSITION_SPAN = MAX_OFFLOAD_KEY_POSITION + 1

_HeapEntry = tuple[int, OffloadKey]


@dataclass(slots=True)
class _RequestRank:
    """The provisional rank one policy gave one request (kept in the request's context)."""

    owner: object
    generation: int
    rank: int


class LRUCachePolicy(CachePolicy):
    """Evict the idle block whose last use is oldest (see the module docstring for "use").

    State:
        blocks: every held block.
        ranks: every held block's rank (lower is older).
        evictable: the idle blocks (ref_cnt 0).
        heap: `(rank, key)` entries, a superset of the idle blocks' current ones.
    """

    @override
    def __init__(self, cache_capacity: int) -> None:
        # cache_capacity is unused: the manager bounds the blocks, and LRU keeps no ghosts.
        self.blocks: dict[OffloadKey, BlockStatus] = {}
        self.ranks: dict[OffloadKey, int] = {}
        self.evictable: set[OffloadKey] = set()
        self.heap: list[_HeapEntry] = []
        self._next_rank = 0
        # Bumped by clear(), so ranks kept in request contexts from before are not reused.
        self._generation = 0

    def _request_rank(self, req_context: ReqContext) -> int:
        state = req_context.get_state(_RequestRank)
        if state is None or state.owner is not self or state.generation != self._generation:
            self._next_rank += 1
            state = _RequestRank(self, self._generation, self._next_rank)
            req_context.set_state(state)
        return state.rank

    def _update_heap(self, updated_evictable: Sequence[OffloadKey]) -> None:
        if not updated_evictable:
            return
        # Rebuilding is linear, cheaper than many pushes for a long prefix.
        if len(updated_evictable) >= max(64, len(self.evictable) // 4):
            self._rebuild_heap()
        else:
            ranks, heap = self.ranks, self.heap
            for key in updated_evictable:
                heapq.heappush(heap, (ranks[key], key))
            self._maybe_compact_heap()

    def _rebuild_heap(self) -> None:
        ranks = self.ranks
        self.heap = [(ranks[key], key) for key in self.evictable]
        heapq.heapify(self.heap)

    def _maybe_compact_heap(self) -> None:
        if len(self.heap) >= max(64, 2 * len(self.evictable)):
            self._rebuild_heap()

    def _use(self, keys: Iterable[OffloadKey]) -> None:
        """Give each held key a fresh rank, in iteration order (the last ends most recent)."""
        blocks, ranks, evictable = self.blocks, self.ranks, self.evictable
        rank = self._next_rank
        updated: list[OffloadKey] = []
        for key in keys:
            if key in blocks:
                rank += 1
                ranks[key] = rank * _POSITION_SPAN
                if key in evictable:
                    updated.append(key)
        self._next_rank = rank
        self._update_heap(updated)

    @override
    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.blocks.get(key)

    @override
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self._next_rank += 1
        self._add(key, block, self._next_rank * _POSITION_SPAN)

    def _add(self, key: OffloadKey, block: BlockStatus, rank: int) -> None:
        self.blocks[key] = block
        self.ranks[key] = rank
        if block.ref_cnt == 0:
            self.evictable.add(key)
            heapq.heappush(self.heap, (rank, key))

    @override
    def insert_for_request(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus], req_context: ReqContext
    ) -> None:
        position = req_context.get_offload_key_position
        for key, block in zip(keys, blocks):
            end = position(key)
            if end is None:
                self._next_rank += 1
                rank = self._next_rank * _POSITION_SPAN
            else:
                rank = self._request_rank(req_context) * _POSITION_SPAN - end
            self._add(key, block, rank)

    @override
    def remove(self, key: OffloadKey) -> None:
        if self.blocks.pop(key, None) is not None:
            del self.ranks[key]
            self.evictable.discard(key)

    @override
    def touch(self, keys: Collection[OffloadKey]) -> None:
        self._use(reversed(list(keys)))

    @override
    def on_request_access(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        base = self._request_rank(req_context) * _POSITION_SPAN
        position = req_context.get_offload_key_position
        ranks, evictable = self.ranks, self.evictable
        updated: list[OffloadKey] = []
        for key in keys:
            end = position(key)
            if end is None or key not in ranks:
                continue
            # Only ever younger: a later position of the same request ranks below an earlier one.
            rank = base - end
            if ranks[key] >= rank:
                continue
            ranks[key] = rank
            if key in evictable:
                updated.append(key)
        self._update_heap(updated)

    @override
    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: Set[OffloadKey],
        reused_keys: Set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        self._use(reversed(order_request_keys(key_groups, req_context)))

    @override
    def evict(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        if n <= 0:
            return []
        heap, ranks, evictable = self.heap, self.ranks, self.evictable
        selected: list[_HeapEntry] = []
        selected_keys: set[OffloadKey] = set()
        deferred: list[_HeapEntry] = []
        while heap and len(selected) < n:
            entry = heapq.heappop(heap)
            rank, key = entry
            if key not in evictable or ranks[key] != rank or key in selected_keys:
                # Stale (re-ranked, pinned or gone), or a duplicate left by a re-pin.
                continue
            if key in protected:
                deferred.append(entry)
                continue
            selected.append(entry)
            selected_keys.add(key)
        if len(selected) < n:
            for entry in selected:
                heapq.heappush(heap, entry)
            for entry in deferred:
                heapq.heappush(heap, entry)
            return None
        for entry in deferred:
            heapq.heappush(heap, entry)
        blocks = self.blocks
        victims: list[tuple[OffloadKey, BlockStatus]] = []
        for _, key in selected:
            block = blocks.pop(key)
            assert block.ref_cnt == 0, f"LRU index holds {key.hex()} with ref_cnt {block.ref_cnt}"
            evictable.remove(key)
            del ranks[key]
            victims.append((key, block))
        self._maybe_compact_heap()
        return victims

    @override
    def clear(self) -> None:
        self.blocks.clear()
        self.ranks.clear()
        self.evictable.clear()
        self.heap.clear()
        self._next_rank = 0
        self._generation += 1

    @override
    def mark_evictable(self, key: OffloadKey) -> None:
        # Becoming idle is not a use: the block enters the heap with the rank it already has.
        self.evictable.add(key)
        heapq.heappush(self.heap, (self.ranks[key], key))
        self._maybe_compact_heap()

    @override
    def mark_non_evictable(self, key: OffloadKey) -> None:
        # The heap entry goes stale; it is skipped when popped.
        self.evictable.discard(key)
