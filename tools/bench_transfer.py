"""Benchmark GPU<->CPU block transfer: GB/s per direction and both at once, against the ceiling.

For each block size (4 KiB to 16 MiB by default) the same number of bytes is moved through
kvref's worker (`kvref.cpu.gpu_worker.CPUOffloadingWorker`, `submit_store` / `submit_load`)
with consecutive block ids (merged into few copies) and with random ids (one copy per block),
and, in the same run, as one single contiguous copy of the same bytes: the practical ceiling
of the link (pinned host memory on CUDA). It prints GB/s, the ratio to the ceiling, and the
host cost of a submission per block (on CUDA that is pure submission cost: planning plus
enqueuing the copies), and saves a PNG plot of GB/s against block size.

Runs on CUDA when available, otherwise on the CPU (same worker, synchronous copies; figures
then measure host memcpy, not a GPU link). GB/s is wall-clock: from the first submission until
the last job's completion is observed, the way the engine experiences it.

    python tools/bench_transfer.py            # quick default
    python tools/bench_transfer.py --total-mib 1024 --repeats 5 --plot transfer.png
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvref.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor, GPULoadStoreSpec  # noqa: E402
from kvref.cpu.common import CPULoadStoreSpec  # noqa: E402
from kvref.cpu.gpu_worker import CPUOffloadingWorker  # noqa: E402
from kvref.cpu.transfer_plan import SideRows, layer_copies, plan_transfer  # noqa: E402

__all__ = ["main"]

DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
DIRECTIONS = ("store", "load", "both")


@dataclass(frozen=True)
class Row:
    """One block size and id pattern: wall GB/s per direction and host µs per block."""

    block_bytes: int
    pattern: str
    gbps: dict[str, float]
    submit_us_per_block: float
    plan_us_per_block: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(samples: Sequence[float]) -> float:
    # The fastest of several runs is the least disturbed by this shared machine's noise.
    return min(samples)


class Bench:
    """A worker and buffers for one block size; every measurement moves `num_blocks` blocks."""

    def __init__(self, device: torch.device, block_bytes: int, num_blocks: int) -> None:
        self.device = device
        self.block_bytes = block_bytes
        self.num_blocks = num_blocks
        gpu = torch.randint(-128, 128, (num_blocks, block_bytes), dtype=torch.int8, device=device)
        caches = CanonicalKVCaches(
            [CanonicalKVCacheTensor(gpu, block_bytes)], [[CanonicalKVCacheRef(0, block_bytes)]]
        )
        self.worker = CPUOffloadingWorker(caches, blocks_per_chunk=1, num_cpu_chunks=num_blocks)
        # The ceiling: one copy of the same bytes between two plain contiguous buffers.
        pin = device.type == "cuda"
        self.host_a = torch.zeros(num_blocks * block_bytes, dtype=torch.int8, pin_memory=pin)
        self.host_b = torch.zeros(num_blocks * block_bytes, dtype=torch.int8, pin_memory=pin)
        self.dev_a = torch.zeros(num_blocks * block_bytes, dtype=torch.int8, device=device)
        self.dev_b = torch.zeros(num_blocks * block_bytes, dtype=torch.int8, device=device)
        self._streams = (
            [torch.cuda.Stream(device), torch.cuda.Stream(device)] if device.type == "cuda" else []
        )
        self._next_job = 0

    def close(self) -> None:
        self.worker.shutdown()

    def _job(self) -> int:
        self._next_job += 1
        return self._next_job

    def ids(self, pattern: str, count: int, offset: int, rng: random.Random) -> tuple[list[int], list[int]]:
        """GPU and CPU block ids for `count` blocks within [offset, offset + count)."""
        gpu = list(range(offset, offset + count))
        cpu = list(range(offset, offset + count))
        if pattern == "random":
            rng.shuffle(gpu)
            rng.shuffle(cpu)
        return gpu, cpu

    def worker_run(self, direction: str, pattern: str, rng: random.Random) -> tuple[float, float]:
        """Move every block once; return (wall seconds, host seconds inside the submissions)."""
        jobs: list[tuple[str, int, GPULoadStoreSpec, CPULoadStoreSpec]] = []
        halves = [("store", 0, self.num_blocks // 2), ("load", self.num_blocks // 2, self.num_blocks - self.num_blocks // 2)]
        parts = halves if direction == "both" else [(direction, 0, self.num_blocks)]
        for part_direction, offset, count in parts:
            gpu_ids, cpu_ids = self.ids(pattern, count, offset, rng)
            gpu_spec = GPULoadStoreSpec(gpu_ids, [count], [0])
            jobs.append((part_direction, self._job(), gpu_spec, CPULoadStoreSpec(cpu_ids)))
        _sync(self.device)
        submit = 0.0
        start = time.perf_counter()
        for part_direction, job_id, gpu_spec, cpu_spec in jobs:
            t0 = time.perf_counter()
            if part_direction == "store":
                self.worker.submit_store(job_id, gpu_spec, cpu_spec)
            else:
                self.worker.submit_load(job_id, cpu_spec, gpu_spec)
            submit += time.perf_counter() - t0
        self.worker.wait({job_id for _, job_id, _, _ in jobs})
        wall = time.perf_counter() - start
        results = self.worker.get_finished()
        assert len(results) == len(jobs) and all(r.success for r in results), results
        return wall, submit

    def ceiling_run(self, direction: str) -> float:
        """One contiguous copy of the same bytes (two at once, on two streams, for "both")."""
        half = self.num_blocks // 2 * self.block_bytes
        _sync(self.device)
        start = time.perf_counter()
        if self.device.type == "cuda":
            streams = self._streams
            if direction in ("store", "both"):
                with torch.cuda.stream(streams[0]):
                    n = half if direction == "both" else self.host_a.numel()
                    self.host_a[:n].copy_(self.dev_a[:n], non_blocking=True)
            if direction in ("load", "both"):
                with torch.cuda.stream(streams[1]):
                    lo = half if direction == "both" else 0
                    self.dev_b[lo:].copy_(self.host_b[lo:], non_blocking=True)
            torch.cuda.synchronize(self.device)
        else:
            if direction in ("store", "both"):
                n = half if direction == "both" else self.host_a.numel()
                self.host_a[:n].copy_(self.dev_a[:n])
            if direction in ("load", "both"):
                lo = half if direction == "both" else 0
                self.dev_b[lo:].copy_(self.host_b[lo:])
        return time.perf_counter() - start


def plan_cost(block_bytes: int, num_blocks: int, rng: random.Random) -> float:
    """Seconds per block of `plan_transfer` alone, for random ids (no merging)."""
    gpu = list(range(num_blocks))
    cpu = list(range(num_blocks))
    rng.shuffle(gpu)
    rng.shuffle(cpu)
    layers = layer_copies([[CanonicalKVCacheRef(0, block_bytes)]], gpu_to_cpu=True, canonical_layout=False)
    rows = [SideRows(block_bytes, block_bytes, num_blocks)]

    def run() -> None:
        plan_transfer(
            gpu,
            cpu,
            group_sizes=[num_blocks],
            block_indices=[0],
            src_blocks_per_chunk=1,
            dst_blocks_per_chunk=1,
            layers=layers,
            src_rows=rows,
            dst_rows=rows,
        )

    return _best(_timed(run, 3)) / num_blocks


def _timed(fn: Callable[[], object], repeats: int) -> list[float]:
    samples: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench_transfer",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        default=",".join(f"{s >> 10}K" for s in DEFAULT_SIZES),
        help="comma-separated block sizes (e.g. 4K,64K,1M); default 4K..16M",
    )
    parser.add_argument(
        "--total-mib",
        type=int,
        default=None,
        help="MiB moved per measurement (default: 256 on CUDA, 32 on the CPU)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; the best is kept")
    parser.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the KV caches live"
    )
    parser.add_argument(
        "--plot", default="bench_transfer.png", help="PNG to write (empty string: no plot)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for host copies (default 1: on a small shared machine "
        "OpenMP-parallel memcpy mostly measures thread contention)",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device is available", file=sys.stderr)
        return 2
    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    total_mib: int = args.total_mib or (256 if device.type == "cuda" else 32)
    sizes = [parse_size(s) for s in str(args.sizes).split(",") if s.strip()]
    repeats: int = max(1, args.repeats)
    rng = random.Random(args.seed)
    torch.set_num_threads(max(1, args.threads))

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU (no GPU)"
    print(
        f"bench_transfer on {where}: {total_mib} MiB per figure, best of {repeats}, "
        f"{torch.get_num_threads()} host thread(s)"
    )
    print("GB/s = 1e9 bytes/s, wall clock; ratio = worker / one contiguous copy of the same bytes")
    header = (
        f"{'block':>6} {'ids':>11} | {'store GB/s':>10} {'x':>5} | {'load GB/s':>9} {'x':>5} | "
        f"{'both GB/s':>9} {'x':>5} | {'submit us/blk':>13} {'plan us/blk':>11}"
    )
    rows: list[Row] = []
    ceilings: dict[int, dict[str, float]] = {}
    for block_bytes in sizes:
        num_blocks = max(2, (total_mib << 20) // block_bytes)
        total = num_blocks * block_bytes
        bench = Bench(device, block_bytes, num_blocks)
        try:
            bench.worker_run("store", "random", rng)  # warm-up: allocator, page faults, streams
            for direction in DIRECTIONS:
                bench.ceiling_run(direction)
            plan_us = plan_cost(block_bytes, min(num_blocks, 4096), rng) * 1e6
            # Each worker run is paired with a ceiling run right before it, so a ratio compares
            # figures taken under the same machine load; the best of each is kept.
            ceiling_walls: dict[str, list[float]] = {d: [] for d in DIRECTIONS}
            pattern_rows: list[Row] = []
            for pattern in ("consecutive", "random"):
                gbps: dict[str, float] = {}
                submit_us = 0.0
                for direction in DIRECTIONS:
                    samples: list[tuple[float, float]] = []
                    for _ in range(repeats):
                        ceiling_walls[direction].append(bench.ceiling_run(direction))
                        samples.append(bench.worker_run(direction, pattern, rng))
                    gbps[direction] = total / _best([w for w, _ in samples]) / 1e9
                    if direction == "store":
                        submit_us = _best([s for _, s in samples]) / num_blocks * 1e6
                pattern_rows.append(Row(block_bytes, pattern, gbps, submit_us, plan_us))
            ceiling = {d: total / _best(ceiling_walls[d]) / 1e9 for d in DIRECTIONS}
            ceilings[block_bytes] = ceiling
            if not rows:
                print(header)
            print(
                f"{_label(block_bytes):>6} {'ceiling':>11} | {ceiling['store']:>10.2f} {'':>5} | "
                f"{ceiling['load']:>9.2f} {'':>5} | {ceiling['both']:>9.2f} {'':>5} |"
            )
            for row in pattern_rows:
                rows.append(row)
                print(
                    f"{_label(block_bytes):>6} {row.pattern:>11} | "
                    + " | ".join(
                        f"{row.gbps[d]:>{10 if d == 'store' else 9}.2f} "
                        f"{row.gbps[d] / ceiling[d]:>5.2f}"
                        for d in DIRECTIONS
                    )
                    + f" | {row.submit_us_per_block:>13.2f} {plan_us:>11.3f}"
                )
        finally:
            bench.close()

    if rows:
        _summarise(rows, ceilings, device)
    if args.plot and rows:
        series = {
            f"{direction} {pattern}": [(r.block_bytes, r.gbps[direction]) for r in rows if r.pattern == pattern]
            for direction in ("store", "load")
            for pattern in ("consecutive", "random")
        }
        series["both random"] = [(r.block_bytes, r.gbps["both"]) for r in rows if r.pattern == "random"]
        for direction in ("store", "load"):
            series[f"ceiling {direction}"] = [(b, c[direction]) for b, c in ceilings.items()]
        path = _plot(
            Path(args.plot),
            series,
            title=f"kvref GPU<->CPU transfer ({'CUDA' if device.type == 'cuda' else 'CPU'})",
        )
        print(f"plot: {path}")
    return 0


def _plot(out: Path, series: dict[str, list[tuple[int, float]]], *, title: str) -> Path:
    """Draw GB/s against block size (log2 axis) to `out` with matplotlib's Agg backend.

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    # matplotlib's annotations leave **kwargs untyped, which strict pyright rejects at every call.
    plt: Any = importlib.import_module("matplotlib.pyplot")
    figure, axes = plt.subplots(figsize=(8, 4.8), dpi=110)
    for label, points in series.items():
        style = "--" if label.startswith("ceiling") else "-"
        axes.plot([x for x, _ in points], [y for _, y in points], style, marker="o", label=label)
    sizes = sorted({x for points in series.values() for x, _ in points})
    axes.set_xscale("log", base=2)
    axes.set_xticks(sizes, [_label(size) for size in sizes])
    axes.set_ylim(bottom=0)
    axes.set_xlabel("block size")
    axes.set_ylabel("GB/s")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png")
    plt.close(figure)
    return out


def _summarise(rows: list[Row], ceilings: dict[int, dict[str, float]], device: torch.device) -> None:
    big = [r for r in rows if r.block_bytes >= 256 << 10]
    if big:
        worst = min(
            (r.gbps[d] / ceilings[r.block_bytes][d], r, d) for r in big for d in ("store", "load")
        )
        print(
            f"worst single-direction ratio at >= 256 KiB blocks: {worst[0]:.2f}x "
            f"({worst[2]} {worst[1].pattern} {_label(worst[1].block_bytes)})"
        )
    smallest = min(rows, key=lambda r: (r.block_bytes, r.pattern != "random"))
    if smallest.submit_us_per_block > 0:
        cap = smallest.block_bytes / (smallest.submit_us_per_block * 1e-6) / 1e9
        kind = "submission" if device.type == "cuda" else "submission, copy included"
        print(
            f"host cost per {_label(smallest.block_bytes)} random block: "
            f"{smallest.submit_us_per_block:.2f} us ({kind}); it alone caps a direction at "
            f"{cap:.1f} GB/s"
        )


def _label(nbytes: int) -> str:
    return f"{nbytes >> 20}M" if nbytes >= 1 << 20 else f"{nbytes >> 10}K"


if __name__ == "__main__":
    raise SystemExit(main())
