"""kvref: a typed reference of KV-cache offloading, and `kvref audit`.

The public API is listed in `__all__`; everything else is an implementation detail.
"""

from __future__ import annotations

from kvref.base import (
    BlockIDsLoadStoreSpec,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
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
