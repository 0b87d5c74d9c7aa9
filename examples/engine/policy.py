"""First-in first-out eviction for the CPU tier: the oldest idle chunk goes first."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from typing_extensions import override

from kvref.base import OffloadKey, ReqContext
from kvref.cpu.policies.base import CachePolicy, ChunkStatus

__all__ = ["FifoPolicy"]


class FifoPolicy(CachePolicy):
    """Evicts in insertion order; `touch` does not change the order (that is FIFO)."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._chunks: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()

    @override
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self._chunks.get(key)

    @override
    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self._chunks[key] = chunk

    def remove(self, key: OffloadKey) -> None:
        self._chunks.pop(key, None)

    # The base takes Collection[OffloadKey]; Sequence rejects sets and dict views that the
    # manager is allowed to pass.
    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        return None

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        victims = [(key, chunk) for key, chunk in self._chunks.items() if chunk.ref_cnt == 0 and key not in protected][:n]
        if len(victims) < n:
            return None
        for key, _ in victims:
            del self._chunks[key]
        return victims

    @override
    def clear(self) -> None:
        self._chunks.clear()
