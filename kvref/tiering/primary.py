"""`CPUPrimaryTierOffloadingManager`: the CPU tier of a tiering setup, in the secondary tiers'
words (vLLM 0.33: in `tiering/manager.py`).

A `CPUOffloadingManager` over a shared memory region. The inherited prepare/complete
load/store are the GPU-facing interface; read/write name the same operations as a secondary
tier sees them (it *reads* the primary to store a chunk, and *writes* it to promote one), so
that the tiering manager never calls `prepare_load` inside a store path.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from typing_extensions import override

from kvref.base import OffloadKey, PrepareStoreOutput, ReqContext
from kvref.cpu.common import CPULoadStoreSpec, CPUOffloadingInfo
from kvref.cpu.manager import CPUOffloadingManager

__all__ = ["CPUPrimaryTierOffloadingManager", "KVMemoryRegion"]


class KVMemoryRegion(Protocol):
    """The memory of the primary tier: `kvref.cpu.shared_region.SharedOffloadRegion`, or any
    region that hands out one view of its chunks and cleans up after itself."""

    def create_kv_memoryview(self) -> memoryview:
        """Return a (num_chunks, row_bytes) view of the chunks."""
        ...

    def cleanup(self) -> None:
        """Release the memory (unlinking it if this process created it)."""
        ...


class CPUPrimaryTierOffloadingManager(CPUOffloadingManager):
    """The CPU tier of a tiering setup: a `CPUOffloadingManager` over a shared region.

    Args:
        num_chunks: the chunk slots (rows of `mmap_region`).
        mmap_region: the chunks' memory; the manager owns it and cleans it up in `shutdown`.
        cache_policy, cache_policy_module_path, enable_events, info: as `CPUOffloadingManager`.
    """

    def __init__(
        self,
        num_chunks: int,
        mmap_region: KVMemoryRegion,
        cache_policy: str = "lru",
        cache_policy_module_path: str | None = None,
        enable_events: bool = False,
        info: CPUOffloadingInfo | None = None,
    ) -> None:
        super().__init__(
            num_chunks=num_chunks,
            cache_policy=cache_policy,
            cache_policy_module_path=cache_policy_module_path,
            enable_events=enable_events,
            info=info,
        )
        self._mmap_region = mmap_region
        self._kv_memoryview = mmap_region.create_kv_memoryview()

    def prepare_read(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        """Pin chunks for a copy out to a secondary tier.

        A cascade's read is the tiering's own business, not a request's access: it does not
        change recency.
        """
        return self._prepare_load(keys, req_context, record_access=False)

    def complete_read(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """`complete_load` once a secondary tier's copy out finished."""
        self.complete_load(keys, req_context)

    def prepare_write(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """`prepare_store` for chunks a secondary tier is about to copy in (a promotion)."""
        return self.prepare_store(keys, req_context)

    def complete_write(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """`complete_store` once a secondary tier's copy in finished (or failed)."""
        self.complete_store(keys, req_context, success)

    def get_kv_memoryview(self) -> memoryview:
        """Return the (num_chunks, row_bytes) view over the primary's memory: a secondary tier
        addresses chunk c as `view[c]`."""
        return self._kv_memoryview

    @override
    def shutdown(self) -> None:
        super().shutdown()
        self._kv_memoryview.release()
        self._mmap_region.cleanup()
