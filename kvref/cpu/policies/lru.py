"""Least-recently-used replacement with an index of idle blocks (vLLM: `cpu/policies/lru.py`).

vLLM shipped two LRUs. The first kept one `OrderedDict` of every block and scanned it from the
oldest end on each eviction, skipping blocks that were pending or being read, so an eviction cost
O(cache) when the old end was busy, and finishing a load did not refresh a block. The later one,
which kvref follows, keeps every block in a plain dict and only idle blocks (ref_cnt 0) in an
`OrderedDict` in LRU order: eviction walks that index and costs O(evicted + protected idle
blocks skipped), and a block re-enters at the most-recent end whenever it becomes idle, so a
completed store and the completion of its last load both count as a use, like a touch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Set

from typing_extensions import override

from kvref.base import OffloadKey
from kvref.cpu.policies.base import BlockStatus, CachePolicy

__all__ = ["LRUCachePolicy"]


class LRUCachePolicy(CachePolicy):
    """Evict the idle block used least recently.

    A use is a completed store, the completion of a block's last load, or a touch. Touching a
    block that is pending or being read changes nothing: it re-enters the order when it becomes
    idle, which is later than the touch.
    """

    @override
    def __init__(self, cache_capacity: int) -> None:
        # cache_capacity is unused: the manager bounds the blocks, and LRU keeps no ghosts.
        self.blocks: dict[OffloadKey, BlockStatus] = {}
        # Only idle blocks, least recently used first.
        self.evictable: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()

    @override
    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.blocks.get(key)

    @override
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.blocks[key] = block
        if block.ref_cnt == 0:
            self.evictable[key] = block

    @override
    def remove(self, key: OffloadKey) -> None:
        if self.blocks.pop(key, None) is not None:
            self.evictable.pop(key, None)

    @override
    def touch(self, keys: Collection[OffloadKey]) -> None:
        evictable = self.evictable
        for key in reversed(list(keys)):
            if key in evictable:
                evictable.move_to_end(key)

    @override
    def evict(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        if n <= 0:
            return []
        victims: list[tuple[OffloadKey, BlockStatus]] = []
        for key, block in self.evictable.items():
            if key in protected:
                continue
            assert block.ref_cnt == 0, f"LRU index holds {key.hex()} with ref_cnt {block.ref_cnt}"
            victims.append((key, block))
            if len(victims) == n:
                break
        else:
            return None
        blocks, evictable = self.blocks, self.evictable
        for key, _ in victims:
            del blocks[key]
            del evictable[key]
        return victims

    @override
    def clear(self) -> None:
        self.blocks.clear()
        self.evictable.clear()

    @override
    def mark_evictable(self, key: OffloadKey) -> None:
        # The key is not in the index (it was pending or being read): it goes in at the recent
        # end, which makes "became idle" a use.
        self.evictable[key] = self.blocks[key]

    @override
    def mark_non_evictable(self, key: OffloadKey) -> None:
        self.evictable.pop(key, None)
