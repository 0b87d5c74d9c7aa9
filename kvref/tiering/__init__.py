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
    from kvref.tiering.manager import CPUPrimaryTierOffloadingManager, TieringOffloadingManager

_EXPORTS: dict[str, str] = {
    "JobId": "kvref.tiering.base",
    "JobResult": "kvref.tiering.base",
    "ParentManager": "kvref.tiering.base",
    "PrimaryBlocks": "kvref.tiering.base",
    "SecondaryTierManager": "kvref.tiering.base",
    "TransferJob": "kvref.tiering.base",
    "CPUPrimaryTierOffloadingManager": "kvref.tiering.manager",
    "TieringOffloadingManager": "kvref.tiering.manager",
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
]
