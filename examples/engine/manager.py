"""An in-memory offloading manager: a fixed pool of CPU slots and a pluggable eviction policy."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from typing_extensions import override

from kvref.base import (
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.policies.base import BlockStatus, CachePolicy
from kvref.errors import OffloadProtocolError

from .policy import FifoPolicy

__all__ = ["DictOffloadingManager"]


class DictOffloadingManager(OffloadingManager):
    """Tracks up to `num_blocks` offloaded blocks; evicts with `policy` (FIFO by default)."""

    def __init__(self, num_blocks: int, policy: CachePolicy | None = None) -> None:
        self.num_blocks = num_blocks
        self.policy = policy if policy is not None else FifoPolicy(num_blocks)
        self._free = list(range(num_blocks - 1, -1, -1))
        self._events: list[OffloadingEvent] = []

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        block = self.policy.get(key)
        if block is None:
            return False
        return True if block.is_ready else None

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        blocks: list[BlockStatus] = []
        for key in keys:
            block = self.policy.get(key)
            if block is None or not block.is_ready:
                state = "absent" if block is None else "pending"
                raise OffloadProtocolError("prepare_load", key, state)
            blocks.append(block)
        for block in blocks:
            block.ref_cnt += 1
        return CPULoadStoreSpec(block.block_id for block in blocks)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            block = self.policy.get(key)
            if block is not None and block.ref_cnt > 0:
                block.ref_cnt -= 1

    @override
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        new_keys = [key for key in keys if self.policy.get(key) is None]
        evicted: list[OffloadKey] = []
        need = len(new_keys) - len(self._free)
        if need > 0:
            victims = self.policy.evict(need, set(keys))
            if victims is None:
                return None
            for key, block in victims:
                self._free.append(block.block_id)
                evicted.append(key)
            self._events.append(OffloadingEvent(evicted, "CPU", removed=True))
        block_ids: list[int] = []
        for key in new_keys:
            block = BlockStatus(self._free.pop())
            self.policy.insert(key, block)
            block_ids.append(block.block_id)
        return PrepareStoreOutput(new_keys, CPULoadStoreSpec(block_ids), evicted)

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        done: list[OffloadKey] = []
        for key in keys:
            block = self.policy.get(key)
            if block is None or block.is_ready:
                continue
            if success:
                block.ref_cnt = 0
                done.append(key)
            else:
                self.policy.remove(key)
                self._free.append(block.block_id)
        if done:
            self._events.append(OffloadingEvent(done, "CPU", removed=False))

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def take_events(self) -> Iterable[OffloadingEvent]:
        events, self._events = self._events, []
        return events
