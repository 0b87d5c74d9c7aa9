"""kvref: a typed reference of KV-cache offloading, and `kvref audit`.

The public API is listed in `__all__`; everything else is an implementation detail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvref._lazy import lazy_exports

if TYPE_CHECKING:
    from kvref.base import (
        BlockIDsLoadStoreSpec,
        GPULoadStoreSpec,
        LoadStoreSpec,
        OffloadingEvent,
        OffloadingManager,
        OffloadingStats,
        OffloadKey,
        OffloadPolicy,
        PrepareStoreOutput,
        ReqContext,
        RequestOffloadingContext,
        get_offload_block_hash,
        get_offload_group_idx,
        make_offload_key,
    )
    from kvref.cpu.common import CPULoadStoreSpec
    from kvref.cpu.manager import CPUOffloadingManager
    from kvref.cpu.policies.arc import ARCCachePolicy
    from kvref.cpu.policies.base import BlockStatus, CachePolicy
    from kvref.cpu.policies.factory import CachePolicyName, register_cache_policy
    from kvref.cpu.policies.lru import LRUCachePolicy
    from kvref.errors import KVRefError, OffloadProtocolError
    from kvref.reuse_manager import FilterReusedOffloadingManager
    from kvref.cpu.shared_region import SharedOffloadRegion, SharedRegionError
    from kvref.tiering import (
        CPUPrimaryTierOffloadingManager,
        FileSystemSecondaryTier,
        InMemorySecondaryTier,
        JobMetadata,
        JobResult,
        SecondaryTierManager,
        TieringOffloadingManager,
        TierRootError,
        TierStats,
        create_secondary_tier,
        create_tiering_manager,
        register_tier,
    )

    # transfer (torch-free; the torch handlers are in kvref.cpu.gpu_worker, imported on demand)
    from kvref.cpu.transfer_plan import TensorGeometry, TransferPlan, plan_transfer
    from kvref.worker import (
        OffloadingHandler,
        OffloadingWorker,
        TransferProtocolError,
        TransferResult,
        TransferSpec,
        TransferType,
    )

# Imported on first use (PEP 562): `kvref audit` and a pre-commit hook need none of this,
# and importing it all cost a noticeable share of a warm audit.
_EXPORTS: dict[str, str] = {
    # kvref.base
    "BlockIDsLoadStoreSpec": "kvref.base",
    "GPULoadStoreSpec": "kvref.base",
    "LoadStoreSpec": "kvref.base",
    "OffloadingEvent": "kvref.base",
    "OffloadingManager": "kvref.base",
    "OffloadingStats": "kvref.base",
    "OffloadKey": "kvref.base",
    "OffloadPolicy": "kvref.base",
    "PrepareStoreOutput": "kvref.base",
    "ReqContext": "kvref.base",
    "RequestOffloadingContext": "kvref.base",
    "get_offload_block_hash": "kvref.base",
    "get_offload_group_idx": "kvref.base",
    "make_offload_key": "kvref.base",
    # kvref.cpu.common
    "CPULoadStoreSpec": "kvref.cpu.common",
    # kvref.cpu.manager
    "CPUOffloadingManager": "kvref.cpu.manager",
    # kvref.cpu.policies.arc
    "ARCCachePolicy": "kvref.cpu.policies.arc",
    # kvref.cpu.policies.base
    "BlockStatus": "kvref.cpu.policies.base",
    "CachePolicy": "kvref.cpu.policies.base",
    # kvref.cpu.policies.factory
    "CachePolicyName": "kvref.cpu.policies.factory",
    "register_cache_policy": "kvref.cpu.policies.factory",
    # kvref.cpu.policies.lru
    "LRUCachePolicy": "kvref.cpu.policies.lru",
    # kvref.errors
    "KVRefError": "kvref.errors",
    "OffloadProtocolError": "kvref.errors",
    # kvref.reuse_manager
    "FilterReusedOffloadingManager": "kvref.reuse_manager",
    # kvref.cpu.shared_region
    "SharedOffloadRegion": "kvref.cpu.shared_region",
    "SharedRegionError": "kvref.cpu.shared_region",
    # kvref.tiering
    "CPUPrimaryTierOffloadingManager": "kvref.tiering",
    "FileSystemSecondaryTier": "kvref.tiering",
    "InMemorySecondaryTier": "kvref.tiering",
    "JobMetadata": "kvref.tiering",
    "JobResult": "kvref.tiering",
    "SecondaryTierManager": "kvref.tiering",
    "TieringOffloadingManager": "kvref.tiering",
    "TierRootError": "kvref.tiering",
    "TierStats": "kvref.tiering",
    "create_secondary_tier": "kvref.tiering",
    "create_tiering_manager": "kvref.tiering",
    "register_tier": "kvref.tiering",
    # kvref.cpu.transfer_plan
    "TensorGeometry": "kvref.cpu.transfer_plan",
    "TransferPlan": "kvref.cpu.transfer_plan",
    "plan_transfer": "kvref.cpu.transfer_plan",
    # kvref.worker
    "OffloadingHandler": "kvref.worker",
    "OffloadingWorker": "kvref.worker",
    "TransferProtocolError": "kvref.worker",
    "TransferResult": "kvref.worker",
    "TransferSpec": "kvref.worker",
    "TransferType": "kvref.worker",
}
if not TYPE_CHECKING:  # checkers see the imports above, not a catch-all `__getattr__`
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    # base
    "OffloadKey",
    "make_offload_key",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "ReqContext",
    "LoadStoreSpec",
    "BlockIDsLoadStoreSpec",
    "GPULoadStoreSpec",
    "PrepareStoreOutput",
    "OffloadingEvent",
    "OffloadPolicy",
    "RequestOffloadingContext",
    "OffloadingManager",
    "OffloadingStats",
    # errors
    "KVRefError",
    "OffloadProtocolError",
    # cpu tier
    "CPULoadStoreSpec",
    "BlockStatus",
    "CachePolicy",
    "CPUOffloadingManager",
    "CachePolicyName",
    "LRUCachePolicy",
    "ARCCachePolicy",
    "register_cache_policy",
    "FilterReusedOffloadingManager",
    # tiering
    "SharedOffloadRegion",
    "SharedRegionError",
    "SecondaryTierManager",
    "JobMetadata",
    "JobResult",
    "InMemorySecondaryTier",
    "FileSystemSecondaryTier",
    "create_secondary_tier",
    "register_tier",
    "CPUPrimaryTierOffloadingManager",
    "TieringOffloadingManager",
    "create_tiering_manager",
    "TierStats",
    "TierRootError",
    # transfer
    "TransferSpec",
    "TransferType",
    "TransferResult",
    "TransferProtocolError",
    "OffloadingHandler",
    "OffloadingWorker",
    "TensorGeometry",
    "TransferPlan",
    "plan_transfer",
]
