"""Multi-tier offloading: a CPU primary tier in front of secondary tiers (memory, filesystem, Redis).

See `kvref.tiering.base` for the design principles and the secondary-tier contract, and
`kvref.tiering.manager` for the data flow and how the end of a scheduler step is signalled.
"""

from __future__ import annotations

from kvref.tiering.base import (
    JobId,
    JobMetadata,
    JobResult,
    PrimaryBlocks,
    SecondaryTierManager,
    TierStats,
)
from kvref.tiering.factory import (
    TierFactory,
    create_secondary_tier,
    register_tier,
    registered_tier_types,
)
from kvref.tiering.fs import FileSystemSecondaryTier, TierRootError
from kvref.tiering.manager import (
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
    create_tiering_manager,
)
from kvref.tiering.memory import InMemorySecondaryTier
from kvref.tiering.redis import RedisSecondaryTier

__all__ = [
    "JobId",
    "JobMetadata",
    "JobResult",
    "PrimaryBlocks",
    "SecondaryTierManager",
    "TierStats",
    "InMemorySecondaryTier",
    "FileSystemSecondaryTier",
    "RedisSecondaryTier",
    "TierRootError",
    "TierFactory",
    "register_tier",
    "registered_tier_types",
    "create_secondary_tier",
    "CPUPrimaryTierOffloadingManager",
    "TieringOffloadingManager",
    "create_tiering_manager",
]
