"""Multi-tier offloading: a CPU primary tier in front of secondary tiers (memory, filesystem, Redis).

See `kvref.tiering.base` for the data flow and the secondary-tier contract, and
`kvref.tiering.manager` for the tiering manager. Names are imported on first use (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvref._lazy import lazy_exports

if TYPE_CHECKING:
    from kvref.tiering.base import (
        JobId,
        JobResult,
        ParentManager,
        PrimaryBlocks,
        SecondaryTierManager,
        TransferJob,
    )
    from kvref.tiering.factory import SecondaryTierFactory, create_tiering_manager
    from kvref.tiering.fs import FileSystemSecondaryTier
    from kvref.tiering.manager import CPUPrimaryTierOffloadingManager, TieringOffloadingManager
    from kvref.tiering.memory import InMemorySecondaryTier
    from kvref.tiering.redis import RedisSecondaryTier

_EXPORTS: dict[str, str] = {
    "JobId": "kvref.tiering.base",
    "JobResult": "kvref.tiering.base",
    "ParentManager": "kvref.tiering.base",
    "PrimaryBlocks": "kvref.tiering.base",
    "SecondaryTierManager": "kvref.tiering.base",
    "TransferJob": "kvref.tiering.base",
    "CPUPrimaryTierOffloadingManager": "kvref.tiering.manager",
    "TieringOffloadingManager": "kvref.tiering.manager",
    "SecondaryTierFactory": "kvref.tiering.factory",
    "create_tiering_manager": "kvref.tiering.factory",
    "InMemorySecondaryTier": "kvref.tiering.memory",
    "FileSystemSecondaryTier": "kvref.tiering.fs",
    "RedisSecondaryTier": "kvref.tiering.redis",
}
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "JobId",
    "JobResult",
    "ParentManager",
    "PrimaryBlocks",
    "SecondaryTierManager",
    "TransferJob",
    "CPUPrimaryTierOffloadingManager",
    "TieringOffloadingManager",
    "SecondaryTierFactory",
    "create_tiering_manager",
    "InMemorySecondaryTier",
    "FileSystemSecondaryTier",
    "RedisSecondaryTier",
]
