"""`kvref demo`: an end-to-end offload round trip through a scripted serving loop.

It builds a small model-shaped KV cache (several layers in two KV-cache groups, bf16 blocks) on
the GPU when there is one and on the CPU otherwise, wires the transfer handlers
(`kvref.cpu.gpu_worker`) into an `OffloadingWorker`, and serves a script of requests that share
document prefixes through the scheduler-side CPU manager:

1. look the request's offloaded blocks up (a hit prefix), and load the hits from the CPU tier
   into freshly allocated, *different* GPU blocks (some requests pretend their first GPU block
   was a GPU prefix-cache hit, so their load starts mid-way into an offloaded block);
2. check every loaded byte against the original content of the block;
3. "compute" the misses (fill the GPU blocks with the block's content) and offload the request:
   `prepare_store` (evicting idle blocks when the CPU tier is full), a GPU->CPU job, and
   `complete_store` once the job is reported finished;
4. at the end, reload every block still offloaded into different GPU blocks and check it.

Block content is a deterministic function of the block's chained hash and layer, so any reload
can be checked without keeping copies. The exit status is 0 when every byte matched and every
transfer succeeded, 1 otherwise, 2 for bad arguments (options: `kvref demo --help`, in kvref.cli).

Where the parts live: this module runs the phases (which manager, which rows) and prints the
result; the serving loop that drives each phase is `kvref.demo_serving`, the report it fills and
its formatting `kvref.demo_report`, the settings `kvref.demo_config`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TextIO

import typer

from kvref.base import OffloadingManager
from kvref.cpu.manager import CPUOffloadingManager
from kvref.cpu.shared_region import SharedOffloadRegion
from kvref.demo_config import DemoConfig
from kvref.demo_report import DemoReport, format_report, format_stats
from kvref.demo_serving import KVCache, ServingLoop
from kvref.tiering.manager import create_tiering_manager

if TYPE_CHECKING:
    # torch is imported when the demo runs, not when the CLI loads it (`kvref demo --help`
    # stays fast); only `kvref.cpu.gpu_worker` and its helpers import it at module level.
    import torch

    from kvref.cpu.gpu_worker import CpuGpuOffloadingHandlers

__all__ = ["DemoConfig", "DemoReport", "run_demo", "run_config", "format_stats"]


def _device(config: DemoConfig) -> torch.device:
    with warnings.catch_warnings():
        # CPU wheels of torch warn on import when numpy is absent; kvref never uses numpy.
        warnings.filterwarnings("ignore", message=".*NumPy.*")
        import torch

    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA device")
    use_cuda = config.device != "cpu" and torch.cuda.is_available()
    return torch.device("cuda" if use_cuda else "cpu")


def run_demo(
    config: DemoConfig, progress: Callable[[Iterable[int], str], Iterator[int]] | None = None
) -> list[DemoReport]:
    """Run every phase of the demo and return their reports (see the module docstring).

    Args:
        config: model shape and script.
        progress: wraps each phase's request loop (e.g. in a progress bar); None: plain.
    """
    config.validate()
    device = _device(config)
    reports = [_cpu_phase(config, device, progress)]
    if config.tiering:
        reports.append(_tiering_phase(config, device, progress))
    return reports


def _cpu_phase(
    config: DemoConfig,
    device: torch.device,
    progress: Callable[[Iterable[int], str], Iterator[int]] | None,
) -> DemoReport:
    """The CPU tier alone: its own pinned rows, one `CPUOffloadingManager`."""
    from kvref.cpu.gpu_worker import CpuGpuOffloadingHandlers

    kv = KVCache(config, device)
    manager = CPUOffloadingManager(config.num_cpu_blocks, cache_policy="lru")
    handlers = CpuGpuOffloadingHandlers(
        kv.tensors,
        block_size_factor=config.block_size_factor,
        num_cpu_blocks=config.num_cpu_blocks,
        group_tensors=kv.group_layers,
    )
    report = DemoReport("CPU tier (CPUOffloadingManager, LRU)")
    _run_phase(config, kv, manager, handlers, report, progress, None)
    return report


def _tiering_phase(
    config: DemoConfig,
    device: torch.device,
    progress: Callable[[Iterable[int], str], Iterator[int]] | None,
) -> DemoReport:
    """CPU primary over a shared region plus a filesystem tier: blocks the CPU tier evicts are
    promoted back from disk, then loaded into the GPU from the same region rows."""
    from kvref.cpu.gpu_worker import CpuGpuOffloadingHandlers

    kv = KVCache(config, device)
    report = DemoReport("Tiering (CPU primary + filesystem tier)")
    with tempfile.TemporaryDirectory(prefix="kvref-demo-") as tmp:
        rank_slot_bytes = config.layers * kv.page_bytes * config.block_size_factor
        region = SharedOffloadRegion(
            f"demo-{os.getpid()}", config.num_cpu_blocks, rank_slot_bytes, rank=0, directory=tmp
        )
        # The manager owns the region from here on (it cleans it up on shutdown).
        manager = create_tiering_manager(region, [{"type": "fs", "root_dir": os.path.join(tmp, "fs")}])
        try:
            # The GPU<->CPU copies go straight into the region rows the filesystem tier reads.
            handlers = CpuGpuOffloadingHandlers(
                kv.tensors,
                block_size_factor=config.block_size_factor,
                group_tensors=kv.group_layers,
                cpu_rows=region,
            )
        except BaseException:
            manager.shutdown()
            raise
        _run_phase(
            config, kv, manager, handlers, report, progress, manager.end_step, manager.has_pending_work
        )
    return report


def _run_phase(
    config: DemoConfig,
    kv: KVCache,
    manager: OffloadingManager,
    handlers: CpuGpuOffloadingHandlers,
    report: DemoReport,
    progress: Callable[[Iterable[int], str], Iterator[int]] | None,
    end_step: Callable[[], None] | None,
    has_pending_work: Callable[[], bool] | None = None,
) -> None:
    started = time.perf_counter()
    loop = ServingLoop(config, kv, manager, handlers, report, end_step, has_pending_work)
    try:
        requests: Iterable[int] = range(config.requests)
        for index in progress(requests, report.name) if progress else requests:
            loop.serve(index)
        loop.drain()
        loop.sweep()
        report.manager_stats = manager.get_stats()
    finally:
        # Handlers first: copies must finish and views be dropped before the rows go away.
        loop.worker.shutdown()
        handlers.shutdown()
        manager.shutdown()
    report.seconds = time.perf_counter() - started


def _progress_bar(out: TextIO) -> Callable[[Iterable[int], str], Iterator[int]] | None:
    if not out.isatty():
        return None

    def wrap(items: Iterable[int], label: str) -> Iterator[int]:
        with typer.progressbar(list(items), label=label, file=out) as bar:
            yield from bar

    return wrap


def run_config(config: DemoConfig) -> int:
    """Run the demo and print its report; 0 when every byte matched, 1 on a mismatch or failed
    transfer, 2 on a setting out of range (one line on stderr). `kvref demo` parses options."""
    try:
        config.validate()
        device = _device(config)
    except ValueError as exc:
        print(f"kvref demo: {exc}", file=sys.stderr)
        return 2
    reports = run_demo(config, _progress_bar(sys.stderr))
    print(format_report(config, device, reports))
    return 0 if all(r.ok for r in reports) else 1
