"""`CPUPrimaryTierOffloadingManager`: the CPU tier of a tiering setup, in the secondary tiers' words.

A `CPUOffloadingManager` over a `SharedOffloadRegion`, with the vocabulary of the tiers below it
(a secondary tier *reads* the primary to store a block and *writes* it to promote one) and the
memoryview through which they copy. `kvref.tiering.manager` drives it.
"""

from __future__ import annotations

from collections.abc import Collection

from typing_extensions import override

from kvref.base import OffloadKey, PrepareStoreOutput, ReqContext
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.manager import CPUOffloadingManager
from kvref.cpu.policies.factory import CachePolicyName
from kvref.cpu.shared_region import SharedOffloadRegion
from kvref.errors import KVRefError

__all__ = ["CPUPrimaryTierOffloadingManager"]


class CPUPrimaryTierOffloadingManager(CPUOffloadingManager):
    """The CPU tier of a tiering setup: a `CPUOffloadingManager` over a shared region.

    Adds the secondary tiers' vocabulary (a secondary tier *reads* the primary to store a block,
    and *writes* it to promote one) and the memoryview through which they copy.

    Args:
        region: the shared memory holding the blocks (one per row); the manager owns it from now
            on and cleans it up in `shutdown`.
        cache_policy: "lru" or "arc".
        enable_events: buffer stored/removed events of the CPU medium.
    """

    def __init__(
        self,
        region: SharedOffloadRegion,
        cache_policy: CachePolicyName = "lru",
        enable_events: bool = False,
    ) -> None:
        super().__init__(region.num_blocks, cache_policy, enable_events)
        self.region = region
        self._kv_view: memoryview | None = region.create_kv_memoryview()

    def prepare_read(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        """`prepare_load` for a secondary tier that is about to copy the blocks out."""
        return self.prepare_load(keys, req_context)

    def complete_read(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """`complete_load` once a secondary tier's copy out finished."""
        self.complete_load(keys, req_context)

    def prepare_write(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """`prepare_store` for blocks a secondary tier is about to copy in (a promotion)."""
        return self.prepare_store(keys, req_context)

    def complete_write(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """`complete_store` once a secondary tier's copy in finished (or failed)."""
        self.complete_store(keys, req_context, success)

    def get_kv_memoryview(self) -> memoryview:
        """Return the `(num_blocks, row_bytes)` view secondary tiers copy through.

        Raises:
            KVRefError: the manager was shut down.
        """
        if self._kv_view is None:
            raise KVRefError("the primary tier was shut down; its memory is released")
        return self._kv_view

    @override
    def shutdown(self) -> None:
        """Release the view and clean up the region (unlinking it if this process created it)."""
        self._kv_view = None
        self.region.cleanup()
