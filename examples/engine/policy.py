"""First-in first-out eviction for the CPU tier: the oldest idle block goes first."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence, Set

from typing_extensions import override

from kvref.base import OffloadKey
from kvref.cpu.policies.base import BlockStatus, CachePolicy

__all__ = ["FifoPolicy"]


class FifoPolicy(CachePolicy):
    """Evicts in insertion order; `touch` does not change the order (that is FIFO)."""

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity
        self._blocks: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()

    @override
    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    @override
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self._blocks[key] = block

    def remove(self, key: OffloadKey) -> None:
        self._blocks.pop(key, None)

    # The base takes Collection[OffloadKey]; Sequence rejects sets and dict views that the
    # manager is allowed to pass.
    def touch(self, keys: Sequence[OffloadKey]) -> None:
        return None

    def evict(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        victims = [
            (key, block)
            for key, block in self._blocks.items()
            if block.ref_cnt == 0 and key not in protected
        ][:n]
        if len(victims) < n:
            return None
        for key, _ in victims:
            del self._blocks[key]
        return victims

    @override
    def clear(self) -> None:
        self._blocks.clear()
