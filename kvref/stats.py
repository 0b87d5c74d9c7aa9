"""What a manager's `get_stats` returns: cumulative counters, per manager and per tier.

Part of the contract in `kvref.base`, which exports every name here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["OffloadingStats", "TierStats"]


@dataclass
class TierStats:
    """Cumulative counters of one tier, as the tiering manager saw them (and the tier reports).

    Attributes:
        name: the tier's medium name ("CPU" for the primary).
        lookups: blocks asked for in this tier by `lookup`.
        hits: lookups it held the block for (the primary: loadable; a secondary tier: it could
            be promoted, which `lookup` then stages).
        misses: lookups it did not hold (a block still being written counts neither way).
        blocks_stored: blocks written into the tier (GPU stores for the primary, blocks of
            successful cascades for a secondary tier, including ones it already held).
        blocks_loaded: blocks read out of the tier (GPU loads for the primary, promoted blocks
            for a secondary tier).
        blocks_evicted: blocks the tier evicted to make room.
        failed_jobs: jobs that failed (stores and promotions; the primary: failed GPU stores).
        usage: the fraction of the tier's capacity in use, or None when it has no bound or
            does not say.
    """

    name: str
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    blocks_stored: int = 0
    blocks_loaded: int = 0
    blocks_evicted: int = 0
    failed_jobs: int = 0
    usage: float | None = None


@dataclass(frozen=True, slots=True)
class OffloadingStats:
    """Counters of one manager (or one tier of it), cumulative since the manager was built.

    Counters only grow (a `reset_cache` does not reset them), so a scraper can export them as
    Prometheus counters and take rates; `num_blocks`/`used_blocks` are gauges. vLLM's
    `get_stats` returns increments since the previous call instead; kvref leaves the
    differencing to the scraper so that two readers do not steal each other's counts.

    A manager composed of several storage tiers reports its primary tier's counters in the
    top-level fields and one `TierStats` per tier in `tiers`, keyed by the tier's name (e.g.
    "CPU", "fs"); a single-tier manager leaves `tiers` empty.

    Attributes:
        lookups: `lookup` calls answered.
        hits: lookups answered True (ready to load).
        pending: lookups answered None (present, not yet readable).
        misses: lookups answered False.
        blocks_stored: blocks whose store completed successfully.
        blocks_loaded: blocks handed out by `prepare_load`.
        blocks_evicted: blocks evicted to make room.
        stores_refused: `prepare_store` calls answered None (no room).
        num_blocks: capacity in blocks (0 when unbounded or unknown).
        used_blocks: blocks held (pending, idle or being read).
        tiers: per-tier counters, by tier name (a tiering manager: the primary, "CPU", first).
    """

    lookups: int = 0
    hits: int = 0
    pending: int = 0
    misses: int = 0
    blocks_stored: int = 0
    blocks_loaded: int = 0
    blocks_evicted: int = 0
    stores_refused: int = 0
    num_blocks: int = 0
    used_blocks: int = 0
    tiers: Mapping[str, TierStats] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def usage(self) -> float:
        """`used_blocks / num_blocks`, 0.0 when there is no capacity."""
        return self.used_blocks / self.num_blocks if self.num_blocks > 0 else 0.0

    @property
    def hit_rate(self) -> float:
        """`hits / lookups`, 0.0 before the first lookup."""
        return self.hits / self.lookups if self.lookups else 0.0
