"""What `kvref demo` counts and prints: one report per phase (see `kvref.demo`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvref.base import OffloadingStats
from kvref.demo_config import NUM_GROUPS, DemoConfig
from kvref.worker import TransferResult

if TYPE_CHECKING:
    import torch

__all__ = ["DemoReport", "DirectionStats", "format_report", "format_stats"]


@dataclass
class DirectionStats:
    """What one transfer direction moved."""

    jobs: int = 0
    gpu_blocks: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def add(self, result: TransferResult, gpu_blocks: int) -> None:
        self.jobs += 1
        self.gpu_blocks += gpu_blocks
        self.bytes += result.transfer_size or 0
        self.seconds += result.transfer_time or 0.0

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass
class DemoReport:
    """Counters of one demo phase."""

    name: str
    lookups: int = 0
    hits: int = 0
    # Hits that first answered "retry" (None): promotions from a secondary tier, or blocks
    # whose store was still in flight.
    retried_hits: int = 0
    # Lookups started over because a hit was evicted before it could be protected.
    relookups: int = 0
    stored_blocks: int = 0
    evicted_blocks: int = 0
    skipped_stores: int = 0
    verified_blocks: int = 0
    mismatches: list[str] = field(default_factory=list[str])
    failed_jobs: list[str] = field(default_factory=list[str])
    store: DirectionStats = field(default_factory=DirectionStats)
    load: DirectionStats = field(default_factory=DirectionStats)
    sweep_blocks: int = 0
    seconds: float = 0.0
    # The manager's own counters (`get_stats`) at the end of the phase, None if it keeps none.
    manager_stats: OffloadingStats | None = None

    @property
    def ok(self) -> bool:
        """Every byte matched, every job succeeded, and something was actually checked."""
        return not self.mismatches and not self.failed_jobs and self.verified_blocks > 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


def format_report(config: DemoConfig, device: torch.device, reports: Sequence[DemoReport]) -> str:
    """The short human-readable summary printed by `kvref demo`."""
    import torch

    page_kib = 2 * config.block_tokens * config.kv_heads * config.head_dim * 2 / 1024
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (no CUDA device)"
    lines = [
        f"kvref demo on {where}: {config.layers} layers in {NUM_GROUPS} KV groups, bf16 blocks of "
        f"{config.block_tokens} tokens ({page_kib:g} KiB per layer), offloaded block = "
        f"{config.block_size_factor} GPU blocks, {config.num_cpu_blocks} CPU blocks"
    ]
    for r in reports:
        lines.append(f"{r.name}: {config.requests} requests in {r.seconds:.2f} s")
        lines.append(
            f"  lookups {r.lookups} offloaded blocks, hits {r.hits} ({r.hit_rate:.0%}, "
            f"{r.retried_hits} after a retry: promoted or still being stored)"
            + (f", {r.relookups} looked up again after an eviction" if r.relookups else "")
        )
        lines.append(
            f"  stored {r.stored_blocks} offloaded blocks, evicted {r.evicted_blocks} from the "
            f"CPU tier, skipped {r.skipped_stores} (no room)"
        )
        for name, stats in (("GPU->CPU", r.store), ("CPU->GPU", r.load)):
            lines.append(
                f"  {name}: {stats.jobs} jobs, {stats.gpu_blocks} GPU blocks, "
                f"{stats.bytes / 1e6:.1f} MB, {stats.gbps:.2f} GB/s"
            )
        verdict = "OK" if r.ok else "FAILED"
        lines.append(
            f"  verified {r.verified_blocks} reloaded GPU blocks byte for byte "
            f"({r.sweep_blocks} offloaded blocks in the final sweep, reloaded into different "
            f"GPU blocks): {verdict}"
        )
        for problem in (r.mismatches + r.failed_jobs)[:10]:
            lines.append(f"    {problem}")
        if r.manager_stats is not None:
            lines.extend(format_stats(r.manager_stats))
    return "\n".join(lines)


def format_stats(stats: OffloadingStats, indent: str = "  ") -> list[str]:
    """The manager's `get_stats` counters, one line for the manager and one per tier."""
    lines = [
        f"{indent}manager stats: lookups {stats.lookups} (hits {stats.hits}, pending "
        f"{stats.pending}, misses {stats.misses}), blocks stored {stats.blocks_stored}, loaded "
        f"{stats.blocks_loaded}, evicted {stats.blocks_evicted}, stores refused "
        f"{stats.stores_refused}, usage {stats.used_blocks}/{stats.num_blocks} "
        f"({stats.usage:.0%})"
    ]
    for name, tier in stats.tiers.items():
        usage = "unbounded" if tier.usage is None else f"{tier.usage:.0%}"
        lines.append(
            f"{indent}  [{name}] lookups {tier.lookups} (hits {tier.hits}, misses {tier.misses}), "
            f"blocks stored {tier.blocks_stored}, loaded {tier.blocks_loaded}, evicted "
            f"{tier.blocks_evicted}, failed jobs {tier.failed_jobs}, usage {usage}"
        )
    return lines
