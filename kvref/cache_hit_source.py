"""Where a cached prompt token's KV came from (vLLM: `vllm/v1/metrics/cache_hit_source.py`).

A manager's `get_load_source` answers with one, so that a hit served from disk after a
promotion into host memory is still counted as a disk hit.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

__all__ = ["CacheHitSource"]


class CacheHitSource(str, Enum):
    """The tier that supplied cached KV, in the order blocks are offloaded (nearest first)."""

    DEVICE = "device"
    HOST = "host"
    P2P = "p2p"
    DISK = "disk"
    # Last, so that mixed with a known tier it never hides the known one.
    EXTERNAL_UNSPECIFIED = "external_unspecified"

    @classmethod
    def outermost(cls, sources: Iterable[CacheHitSource]) -> CacheHitSource:
        """Return the tier in `sources` farthest from the accelerator."""
        return max(sources, key=_SOURCE_ORDER.__getitem__)


_SOURCE_ORDER = {source: rank for rank, source in enumerate(CacheHitSource)}
