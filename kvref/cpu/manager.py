"""The CPU offloading manager: a fixed pool of CPU blocks behind a `CachePolicy` (vLLM: `cpu/manager.py`).

The manager owns what every policy shares: slot allocation, reference counts, the count of idle
blocks, events and protocol checks. The policy owns the key -> block mapping and decides which
idle blocks to evict. Block states (kv-offload.md section 4):

    absent --prepare_store--> pending (ref_cnt -1) --complete_store--> idle (0) <--> reading (n > 0)
      ^                          | complete_store(success=False): dropped, slot freed
      +---- evicted (idle and not named by the evicting prepare_store) <----+
"""

from __future__ import annotations

import operator
from collections.abc import Collection

from typing_extensions import override

from kvref.base import (
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from kvref.cpu.common import CPU_MEDIUM, CPULoadStoreSpec
from kvref.cpu.policies.base import BlockStatus, CachePolicy
from kvref.cpu.policies.factory import CachePolicyName, create_cache_policy
from kvref.errors import OffloadProtocolError

__all__ = ["CPUOffloadingManager", "describe_block"]


def describe_block(block: BlockStatus | None) -> str:
    """Name the state of a block as protocol errors report it: absent, pending, idle, reading(n)."""
    if block is None:
        return "absent"
    if block.ref_cnt < 0:
        return "pending"
    return f"reading({block.ref_cnt})" if block.ref_cnt else "idle"


def _non_negative_int(name: str, value: int) -> int:
    # operator.index admits any integer type (numpy's included) and nothing else.
    try:
        number = operator.index(value)
    except TypeError:
        number = -1
    if number < 0 or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return number


class CPUOffloadingManager(OffloadingManager):
    """Offloads blocks to `num_blocks` CPU slots, evicting idle blocks as the policy chooses.

    Args:
        num_blocks: how many CPU blocks (slots) there are, >= 0.
        cache_policy: which idle blocks to evict first: "lru" or "arc" (or a name given to
            `register_cache_policy`).
        enable_events: buffer stored/removed events for `take_events` (off: none are kept).

    Raises:
        ValueError: `num_blocks` is negative or `cache_policy` is not a known policy.
    """

    def __init__(
        self, num_blocks: int, cache_policy: CachePolicyName = "lru", enable_events: bool = False
    ) -> None:
        self._num_blocks: int = _non_negative_int("num_blocks", num_blocks)
        self.medium: str = CPU_MEDIUM
        # Slots [0, _num_allocated_blocks) have been handed out at least once (the bump pointer).
        self._num_allocated_blocks: int = 0
        # Freed slots, reused last-freed-first.
        self._free_list: list[int] = []
        # Blocks with ref_cnt 0: what eviction can reclaim, counted so a hopeless prepare_store
        # fails without asking the policy.
        self._num_idle_blocks: int = 0
        self._policy: CachePolicy = create_cache_policy(cache_policy, num_blocks)
        self._events: list[OffloadingEvent] | None = [] if enable_events else None

    @override
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_blocks={self._num_blocks}, "
            f"policy={type(self._policy).__name__}, free={self.num_free_blocks}, "
            f"idle={self._num_idle_blocks})"
        )

    # --- read-only views (tests, metrics) ---

    @property
    def num_blocks(self) -> int:
        """The number of CPU blocks (slots)."""
        return self._num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Slots that hold no block at all."""
        return len(self._free_list) + self._num_blocks - self._num_allocated_blocks

    @property
    def num_idle_blocks(self) -> int:
        """Blocks that are stored, readable and not being read: the eviction candidates."""
        return self._num_idle_blocks

    @property
    def policy(self) -> CachePolicy:
        """The cache policy (for inspection; mutate it only through the manager)."""
        return self._policy

    # --- block pool ---

    def _allocate_block_ids(self, n: int) -> list[int]:
        num_fresh = min(n, self._num_blocks - self._num_allocated_blocks)
        start = self._num_allocated_blocks
        block_ids = list(range(start, start + num_fresh))
        self._num_allocated_blocks += num_fresh
        free_list = self._free_list
        assert len(free_list) >= n - num_fresh, f"{n} slots wanted, {self.num_free_blocks} free"
        block_ids.extend(free_list.pop() for _ in range(n - num_fresh))
        return block_ids

    def _free_block(self, block: BlockStatus) -> None:
        self._free_list.append(block.block_id)

    def _protocol_error(self, operation: str, key: OffloadKey, detail: str) -> OffloadProtocolError:
        return OffloadProtocolError(operation, key, describe_block(self._policy.get(key)), detail)

    def _emit(self, keys: list[OffloadKey], removed: bool) -> None:
        if self._events is not None and keys:
            self._events.append(OffloadingEvent(keys, self.medium, removed))

    # --- OffloadingManager interface ---

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        block = self._policy.get(key)
        if block is None:
            return False
        return True if block.ref_cnt >= 0 else None

    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        get = self._policy.get
        blocks: list[BlockStatus] = []
        for key in keys:
            block = get(key)
            if block is None or block.ref_cnt < 0:
                raise self._protocol_error("prepare_load", key, "only stored blocks can be loaded")
            blocks.append(block)
        # Validated every key: from here on nothing can fail half-way.
        for key, block in zip(keys, blocks):
            if block.ref_cnt == 0:
                self._num_idle_blocks -= 1
                self._policy.mark_non_evictable(key)
            block.ref_cnt += 1
        return CPULoadStoreSpec(block.block_id for block in blocks)

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._policy.touch(keys)

    @override
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        get = self._policy.get
        blocks: list[BlockStatus] = []
        for key in keys:
            block = get(key)
            if block is None or block.ref_cnt <= 0:
                raise self._protocol_error("complete_load", key, "no load of it is in progress")
            blocks.append(block)
        if len(blocks) > 1 and len(set(keys)) < len(blocks):
            self._check_repeated_releases(keys)
        # Validated every key: from here on nothing can fail half-way.
        for key, block in zip(keys, blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._num_idle_blocks += 1
                self._policy.mark_evictable(key)

    def _check_repeated_releases(self, keys: Collection[OffloadKey]) -> None:
        # A key listed n times releases n loads: it must have at least n in progress.
        releases: dict[OffloadKey, int] = {}
        for key in keys:
            releases[key] = releases.get(key, 0) + 1
        for key, count in releases.items():
            block = self._policy.get(key)
            assert block is not None
            if block.ref_cnt < count:
                raise self._protocol_error(
                    "complete_load", key, f"listed {count} times but only {block.ref_cnt} loads are in progress"
                )

    @override
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        get = self._policy.get
        # dict.fromkeys drops repeated keys (each needs one slot) and gives a set view for free.
        requested = dict.fromkeys(keys)
        keys_to_store = [key for key in requested if get(key) is None]
        if not keys_to_store:
            return PrepareStoreOutput([], CPULoadStoreSpec(()), [])

        evicted_keys: list[OffloadKey] = []
        num_to_evict = len(keys_to_store) - self.num_free_blocks
        if num_to_evict > 0:
            if num_to_evict > self._num_idle_blocks:
                return None
            # Keys named by this call must survive it, stored ones included.
            evicted = self._policy.evict(num_to_evict, requested.keys())
            if evicted is None:
                return None
            self._num_idle_blocks -= len(evicted)
            for key, block in evicted:
                self._free_block(block)
                evicted_keys.append(key)
            self._emit(evicted_keys, removed=True)

        block_ids = self._allocate_block_ids(len(keys_to_store))
        insert = self._policy.insert
        for key, block_id in zip(keys_to_store, block_ids):
            insert(key, BlockStatus(block_id))
        return PrepareStoreOutput(keys_to_store, CPULoadStoreSpec(block_ids), evicted_keys)

    @override
    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        policy = self._policy
        if not success:
            for key in keys:
                block = policy.get(key)
                if block is not None and block.ref_cnt < 0:
                    policy.remove(key)
                    self._free_block(block)
            return
        stored_keys: list[OffloadKey] = []
        for key in keys:
            block = policy.get(key)
            if block is not None and block.ref_cnt < 0:
                block.ref_cnt = 0
                self._num_idle_blocks += 1
                policy.mark_evictable(key)
                stored_keys.append(key)
        self._emit(stored_keys, removed=False)

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    @override
    def take_events(self) -> list[OffloadingEvent]:
        if not self._events:
            return []
        events, self._events = self._events, []
        return events

    @override
    def reset_cache(self) -> None:
        """Drop every block, and every buffered event.

        Like vLLM, no removal event is emitted: the engine announces a reset itself (vLLM's
        `AllBlocksCleared`), and events still buffered would describe blocks that no longer exist,
        so they are dropped rather than delivered after the reset.
        """
        self._policy.clear()
        self._num_idle_blocks = 0
        self._free_list.clear()
        self._num_allocated_blocks = 0
        if self._events is not None:
            self._events = []
