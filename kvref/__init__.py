"""kvref: a typed reference of vLLM 0.33's KV-cache offloading, and `kvref audit`.

The public API is listed in `__all__`; everything else is an implementation detail. Names are
imported on first use (PEP 562): `kvref audit` and a pre-commit hook need none of the library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvref._lazy import lazy_exports

if TYPE_CHECKING:
    from kvref.base import (
        BlockIDsLoadStoreSpec,
        CacheHitSource,
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
        CanonicalPageMapping,
        ConfigInfo,
        ConfigInfoMapping,
        CopyRun,
        get_offload_block_hash,
        get_offload_group_idx,
        GPULoadStoreSpec,
        LoadStoreSpec,
        Locality,
        LookupResult,
        make_offload_key,
        Medium,
        OffloadingConnectorStats,
        OffloadingCounterMetadata,
        OffloadingEvent,
        OffloadingGaugeMetadata,
        OffloadingHistogramMetadata,
        OffloadingManager,
        OffloadingMetricMetadata,
        OffloadingSpec,
        OffloadingWorker,
        OffloadKey,
        OffloadPolicy,
        PrepareStoreOutput,
        ReqContext,
        RequestOffloadingContext,
        ScheduleEndContext,
        TierFilter,
        TierMatcher,
        TransferResult,
    )
    from kvref.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )
    from kvref.errors import (
        KVRefError,
        OffloadProtocolError,
    )
    from kvref.cpu.common import (
        CPULoadStoreSpec,
        CPUOffloadingInfo,
        CPUOffloadingMetrics,
    )
    from kvref.cpu.manager import (
        CPUOffloadingManager,
    )
    from kvref.cpu.policies.base import (
        CachePolicy,
        ChunkStatus,
    )
    from kvref.cpu.policies.lru import (
        LRUCachePolicy,
    )
    from kvref.cpu.policies.arc import (
        ARCCachePolicy,
    )
    from kvref.cpu.policies.factory import (
        CachePolicyFactory,
    )
    from kvref.cpu.shared_region import (
        SharedOffloadRegion,
        SharedRegionError,
    )
    from kvref.tiering.base import (
        JobResult,
        ParentManager,
        SecondaryTierManager,
        TransferJob,
    )
    from kvref.tiering.manager import (
        CPUPrimaryTierOffloadingManager,
        TieringOffloadingManager,
    )

_EXPORTS: dict[str, str] = {
    "OffloadKey": "kvref.base",
    "make_offload_key": "kvref.base",
    "get_offload_block_hash": "kvref.base",
    "get_offload_group_idx": "kvref.base",
    "Medium": "kvref.base",
    "Locality": "kvref.base",
    "TierMatcher": "kvref.base",
    "TierFilter": "kvref.base",
    "ReqContext": "kvref.base",
    "LookupResult": "kvref.base",
    "OffloadPolicy": "kvref.base",
    "RequestOffloadingContext": "kvref.base",
    "ScheduleEndContext": "kvref.base",
    "LoadStoreSpec": "kvref.base",
    "BlockIDsLoadStoreSpec": "kvref.base",
    "GPULoadStoreSpec": "kvref.base",
    "PrepareStoreOutput": "kvref.base",
    "OffloadingEvent": "kvref.base",
    "OffloadingMetricMetadata": "kvref.base",
    "OffloadingCounterMetadata": "kvref.base",
    "OffloadingGaugeMetadata": "kvref.base",
    "OffloadingHistogramMetadata": "kvref.base",
    "ConfigInfo": "kvref.base",
    "ConfigInfoMapping": "kvref.base",
    "CacheHitSource": "kvref.base",
    "OffloadingConnectorStats": "kvref.base",
    "OffloadingManager": "kvref.base",
    "CanonicalKVCacheTensor": "kvref.base",
    "CopyRun": "kvref.base",
    "CanonicalPageMapping": "kvref.base",
    "CanonicalKVCacheRef": "kvref.base",
    "CanonicalKVCaches": "kvref.base",
    "TransferResult": "kvref.base",
    "OffloadingWorker": "kvref.base",
    "OffloadingSpec": "kvref.base",
    "OffloadingConfig": "kvref.config",
    "OffloadingGroupConfig": "kvref.config",
    "OffloadingModelConfig": "kvref.config",
    "OffloadingCacheConfig": "kvref.config",
    "OffloadingParallelConfig": "kvref.config",
    "KVRefError": "kvref.errors",
    "OffloadProtocolError": "kvref.errors",
    "CPULoadStoreSpec": "kvref.cpu.common",
    "CPUOffloadingInfo": "kvref.cpu.common",
    "CPUOffloadingMetrics": "kvref.cpu.common",
    "CPUOffloadingManager": "kvref.cpu.manager",
    "CachePolicy": "kvref.cpu.policies.base",
    "ChunkStatus": "kvref.cpu.policies.base",
    "LRUCachePolicy": "kvref.cpu.policies.lru",
    "ARCCachePolicy": "kvref.cpu.policies.arc",
    "CachePolicyFactory": "kvref.cpu.policies.factory",
    "SharedOffloadRegion": "kvref.cpu.shared_region",
    "SharedRegionError": "kvref.cpu.shared_region",
    "SecondaryTierManager": "kvref.tiering.base",
    "ParentManager": "kvref.tiering.base",
    "TransferJob": "kvref.tiering.base",
    "JobResult": "kvref.tiering.base",
    "CPUPrimaryTierOffloadingManager": "kvref.tiering.manager",
    "TieringOffloadingManager": "kvref.tiering.manager",
}
if not TYPE_CHECKING:  # checkers see the imports above, not a catch-all `__getattr__`
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "OffloadKey",
    "make_offload_key",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "Medium",
    "Locality",
    "TierMatcher",
    "TierFilter",
    "ReqContext",
    "LookupResult",
    "OffloadPolicy",
    "RequestOffloadingContext",
    "ScheduleEndContext",
    "LoadStoreSpec",
    "BlockIDsLoadStoreSpec",
    "GPULoadStoreSpec",
    "PrepareStoreOutput",
    "OffloadingEvent",
    "OffloadingMetricMetadata",
    "OffloadingCounterMetadata",
    "OffloadingGaugeMetadata",
    "OffloadingHistogramMetadata",
    "ConfigInfo",
    "ConfigInfoMapping",
    "CacheHitSource",
    "OffloadingConnectorStats",
    "OffloadingManager",
    "CanonicalKVCacheTensor",
    "CopyRun",
    "CanonicalPageMapping",
    "CanonicalKVCacheRef",
    "CanonicalKVCaches",
    "TransferResult",
    "OffloadingWorker",
    "OffloadingSpec",
    "OffloadingConfig",
    "OffloadingGroupConfig",
    "OffloadingModelConfig",
    "OffloadingCacheConfig",
    "OffloadingParallelConfig",
    "KVRefError",
    "OffloadProtocolError",
    "CPULoadStoreSpec",
    "CPUOffloadingInfo",
    "CPUOffloadingMetrics",
    "CPUOffloadingManager",
    "CachePolicy",
    "ChunkStatus",
    "LRUCachePolicy",
    "ARCCachePolicy",
    "CachePolicyFactory",
    "SharedOffloadRegion",
    "SharedRegionError",
    "SecondaryTierManager",
    "ParentManager",
    "TransferJob",
    "JobResult",
    "CPUPrimaryTierOffloadingManager",
    "TieringOffloadingManager",
]
