"""An in-memory offloading manager: a fixed pool of CPU slots and a pluggable eviction policy."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from typing_extensions import override

from kvref.base import (
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.policies.base import CachePolicy, ChunkStatus
from kvref.errors import OffloadProtocolError

from .policy import FifoPolicy

__all__ = ["DictOffloadingManager"]


class DictOffloadingManager(OffloadingManager):
    """Tracks up to `num_chunks` offloaded chunks; evicts with `policy` (FIFO by default)."""

    def __init__(self, num_chunks: int, policy: CachePolicy | None = None) -> None:
        self.num_chunks = num_chunks
        self.policy = policy if policy is not None else FifoPolicy(num_chunks)
        self._free = list(range(num_chunks - 1, -1, -1))
        self._events: list[OffloadingEvent] = []

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        chunk = self.policy.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.is_ready else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        chunks: list[ChunkStatus] = []
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is None or not chunk.is_ready:
                state = "absent" if chunk is None else "pending"
                raise OffloadProtocolError("prepare_load", key, state)
            chunks.append(chunk)
        for chunk in chunks:
            chunk.ref_cnt += 1
        return CPULoadStoreSpec(chunk.chunk_id for chunk in chunks)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is not None and chunk.ref_cnt > 0:
                chunk.ref_cnt -= 1

    @override
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        new_keys = [key for key in keys if self.policy.get(key) is None]
        evicted: list[OffloadKey] = []
        need = len(new_keys) - len(self._free)
        if need > 0:
            victims = self.policy.evict(need, set(keys))
            if victims is None:
                return None
            for key, chunk in victims:
                self._free.append(chunk.chunk_id)
                evicted.append(key)
            self._events.append(OffloadingEvent(evicted, Medium.CPU, removed=True))
        chunk_ids: list[int] = []
        for key in new_keys:
            chunk = ChunkStatus(self._free.pop())
            self.policy.insert(key, chunk, req_context)
            chunk_ids.append(chunk.chunk_id)
        return PrepareStoreOutput(new_keys, CPULoadStoreSpec(chunk_ids), evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        done: list[OffloadKey] = []
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is None or chunk.is_ready:
                continue
            if success:
                chunk.ref_cnt = 0
                done.append(key)
            else:
                self.policy.remove(key)
                self._free.append(chunk.chunk_id)
        if done:
            self._events.append(OffloadingEvent(done, Medium.CPU, removed=False))

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def take_events(self) -> Iterable[OffloadingEvent]:
        events, self._events = self._events, []
        return events
