"""What `kvref demo` counts and prints: one report per phase (see `kvref.demo`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvref.base import OffloadingConnectorStats, TransferResult
from kvref.demo_config import NUM_GROUPS, DemoConfig

if TYPE_CHECKING:
    import torch

__all__ = ["DemoReport", "DirectionStats", "format_report", "format_stats"]


def _new_problems() -> list[str]:
    return []


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
    # Hits that first answered HIT_PENDING or RETRY: promotions from a secondary tier, or chunks
    # whose store was still in flight.
    retried_hits: int = 0
    stored_blocks: int = 0
    # Different chunks stored (a chunk whose promotion found no room is computed and stored again).
    distinct_stored_blocks: int = 0
    evicted_blocks: int = 0
    skipped_stores: int = 0
    verified_blocks: int = 0
    mismatches: list[str] = field(default_factory=_new_problems)
    failed_jobs: list[str] = field(default_factory=_new_problems)
    store: DirectionStats = field(default_factory=DirectionStats)
    load: DirectionStats = field(default_factory=DirectionStats)
    sweep_blocks: int = 0
    seconds: float = 0.0
    # The manager's metric observations (`get_stats`), summed over the phase.
    manager_stats: OffloadingConnectorStats | None = None

    @property
    def ok(self) -> bool:
        """Every byte matched, every job succeeded, and something was actually checked."""
        return not self.mismatches and not self.failed_jobs and self.verified_blocks > 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def add_stats(self, stats: OffloadingConnectorStats | None) -> None:
        """Sum one `get_stats` (observations since the previous call) into the phase's."""
        if stats is None or stats.is_empty():
            return
        if self.manager_stats is None:
            self.manager_stats = OffloadingConnectorStats()
        self.manager_stats.aggregate(stats)


def format_report(config: DemoConfig, device: torch.device, reports: Sequence[DemoReport]) -> str:
    """The short human-readable summary printed by `kvref demo`."""
    import torch

    page_kib = 2 * config.block_tokens * config.kv_heads * config.head_dim * 2 / 1024
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (no CUDA device)"
    lines = [
        f"kvref demo on {where}: {config.layers} layers in {NUM_GROUPS} KV groups, bf16 blocks of "
        f"{config.block_tokens} tokens ({page_kib:g} KiB per layer), offloaded chunk = "
        f"{config.block_size_factor} GPU blocks, {config.num_cpu_blocks} CPU chunks"
    ]
    for r in reports:
        lines.append(f"{r.name}: {config.requests} requests in {r.seconds:.2f} s")
        lines.append(
            f"  lookups {r.lookups} offloaded chunks, hits {r.hits} ({r.hit_rate:.0%}, "
            f"{r.retried_hits} after HIT_PENDING or RETRY: promoted or still being stored)"
        )
        lines.append(
            f"  stored {r.stored_blocks} chunks, evicted {r.evicted_blocks} from the CPU tier, "
            f"skipped {r.skipped_stores} (no room)"
        )
        for name, stats in (("GPU->CPU", r.store), ("CPU->GPU", r.load)):
            lines.append(
                f"  {name}: {stats.jobs} jobs, {stats.gpu_blocks} GPU blocks, "
                f"{stats.bytes / 1e6:.1f} MB, {stats.gbps:.2f} GB/s"
            )
        verdict = "OK" if r.ok else "FAILED"
        lines.append(
            f"  verified {r.verified_blocks} reloaded GPU blocks byte for byte "
            f"({r.sweep_blocks} chunks in the final sweep, reloaded into different "
            f"GPU blocks): {verdict}"
        )
        for problem in (r.mismatches + r.failed_jobs)[:10]:
            lines.append(f"    {problem}")
        if r.manager_stats is not None:
            lines.extend(format_stats(r.manager_stats))
    return "\n".join(lines)


def format_stats(stats: OffloadingConnectorStats, indent: str = "  ") -> list[str]:
    """The manager's metrics (`get_stats`, summed over the phase): one line per metric, each
    tier's value after its label, a histogram as its sample count and mean."""
    types, values = stats.metric_sections()
    lines = [f"{indent}manager stats:"]
    for name in sorted(values):
        parts: list[str] = []
        for labels, value in values[name].items():
            label = f"{'/'.join(labels)}=" if labels else ""
            if types[name] == "histogram":
                samples: list[float] = value
                mean = sum(samples) / len(samples) if samples else 0.0
                parts.append(f"{label}{len(samples)} (mean {mean:.3g})")
            else:
                parts.append(f"{label}{value:.3g}" if isinstance(value, float) else f"{label}{value}")
        lines.append(f"{indent}  {name.removeprefix('vllm:kv_offload_')}: {', '.join(parts)}")
    return lines
