"""`kvref demo`: an end-to-end offload round trip through a scripted serving loop.

It builds a small model-shaped KV cache (several layers in two KV-cache groups, bf16 blocks) on
the GPU when there is one and on the CPU otherwise, hands it to an `OffloadingWorker` as vLLM
does (`CanonicalKVCaches`, `kvref.cpu.gpu_worker.CPUOffloadingWorker`), and serves a script of
requests that share document prefixes, first through the CPU manager alone, then through the
tiering manager with a filesystem tier:

1. look the request's offloaded chunks up (a hit prefix; HIT_PENDING and RETRY are asked again
   at a later step), pin the hits with `prepare_load` under the same hold of the manager's lock,
   and load them into freshly allocated, *different* GPU blocks (some requests pretend their
   first GPU block was a GPU prefix-cache hit, so their load starts mid-way into a chunk);
2. check every loaded byte against the original content of the block;
3. "compute" the misses (fill the GPU blocks with the block's content) and offload the request:
   `prepare_store` (evicting idle chunks when the CPU tier is full), a store job, and
   `complete_store` once the job is reported finished; `on_schedule_end` ends each step;
4. at the end, reload every chunk still offloaded into different GPU blocks and check it.

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
from typing_extensions import override

from kvref.base import CanonicalKVCaches, OffloadingManager, OffloadingSpec, OffloadingWorker
from kvref.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from kvref.cpu.manager import CPUOffloadingManager
from kvref.cpu.shared_region import SharedOffloadRegion
from kvref.demo_config import NUM_GROUPS, DemoConfig
from kvref.demo_report import DemoReport, format_report, format_stats
from kvref.demo_serving import KVCache, ServingLoop
from kvref.tiering.factory import create_tiering_manager
from kvref.tiering.primary import CPUPrimaryTierOffloadingManager

if TYPE_CHECKING:
    # torch is imported when the demo runs, not when the CLI loads it (`kvref demo --help`
    # stays fast); only `kvref.cpu.gpu_worker` and its helpers import it at module level.
    import torch

__all__ = ["DemoConfig", "DemoReport", "DemoSpec", "run_demo", "run_config", "format_stats"]


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


class DemoSpec(OffloadingSpec):
    """The demo engine's offloading configuration: what its tiers read of it (the model, the
    KV-cache groups, the chunk size), and the manager and worker of the running phase."""

    def __init__(self, config: DemoConfig, page_bytes: int) -> None:
        groups = tuple(
            OffloadingGroupConfig(config.block_tokens, tuple(f"layer.{i}" for i in range(g, config.layers, NUM_GROUPS)), g)
            for g in range(NUM_GROUPS)
        )
        super().__init__(
            OffloadingConfig(
                groups=groups,
                worker_kv_bytes_per_block=page_bytes * config.layers // NUM_GROUPS,
                enable_kv_cache_events=False,
                extra_config={},
                engine_id=f"kvref-demo-{os.getpid()}",
                model=OffloadingModelConfig(name="kvref-demo", dtype="bfloat16"),
                cache=OffloadingCacheConfig(tokens_per_hash=config.block_tokens, blocks_per_chunk=config.block_size_factor),
                parallel=OffloadingParallelConfig(
                    rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                    data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                    is_parallelism_agnostic=False,
                ),  # fmt: skip
            )
        )
        self.manager: OffloadingManager | None = None
        self.worker: OffloadingWorker | None = None

    @override
    def get_manager(self) -> OffloadingManager:
        assert self.manager is not None, "the phase builds the manager first"
        return self.manager

    @override
    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        assert self.worker is not None, "the phase builds the worker first"
        return self.worker


def _cpu_phase(
    config: DemoConfig,
    device: torch.device,
    progress: Callable[[Iterable[int], str], Iterator[int]] | None,
) -> DemoReport:
    """The CPU tier alone: a `CPUOffloadingManager`, and a worker with CPU rows of its own."""
    from kvref.cpu.gpu_worker import CPUOffloadingWorker

    kv = KVCache(config, device)
    manager = CPUOffloadingManager(config.num_cpu_blocks, cache_policy="lru")
    worker = CPUOffloadingWorker(kv.canonical(), config.block_size_factor, config.num_cpu_blocks)
    report = DemoReport("CPU tier (CPUOffloadingManager, LRU)")
    _run_phase(config, kv, manager, worker, report, progress)
    return report


def _tiering_phase(
    config: DemoConfig,
    device: torch.device,
    progress: Callable[[Iterable[int], str], Iterator[int]] | None,
) -> DemoReport:
    """CPU primary over a shared region plus a filesystem tier: chunks the CPU tier evicts are
    promoted back from disk, then loaded into the GPU from the same region rows."""
    from kvref.cpu.gpu_worker import CPUOffloadingWorker

    kv = KVCache(config, device)
    report = DemoReport("Tiering (CPU primary + filesystem tier)")
    spec = DemoSpec(config, kv.page_bytes)
    with tempfile.TemporaryDirectory(prefix="kvref-demo-") as tmp:
        region_id, chunk_bytes = f"demo-{os.getpid()}", config.layers * kv.page_bytes * config.block_size_factor
        # The scheduler side creates the region (rank None: whole rows); the worker joins it as
        # rank 0. Each owns its mapping and cleans it up on shutdown.
        primary = CPUPrimaryTierOffloadingManager(
            config.num_cpu_blocks, SharedOffloadRegion(region_id, config.num_cpu_blocks, chunk_bytes, directory=tmp)
        )
        manager = spec.manager = create_tiering_manager(primary, [{"type": "fs", "root_dir": os.path.join(tmp, "fs")}], spec)
        try:
            region = SharedOffloadRegion(region_id, config.num_cpu_blocks, chunk_bytes, rank=0, directory=tmp)
            # The GPU<->CPU copies go straight into the region rows the filesystem tier reads.
            spec.worker = CPUOffloadingWorker(kv.canonical(), config.block_size_factor, config.num_cpu_blocks, region)
        except BaseException:
            manager.shutdown()
            raise
        _run_phase(config, kv, manager, spec.worker, report, progress)
    return report


def _run_phase(
    config: DemoConfig,
    kv: KVCache,
    manager: OffloadingManager,
    worker: OffloadingWorker,
    report: DemoReport,
    progress: Callable[[Iterable[int], str], Iterator[int]] | None,
) -> None:
    started = time.perf_counter()
    loop = ServingLoop(config, kv, manager, worker, report)
    try:
        requests: Iterable[int] = range(config.requests)
        for index in progress(requests, report.name) if progress else requests:
            loop.serve(index)
            with manager.lock:
                report.add_stats(manager.get_stats())  # once per step, as the engine reads it
        loop.drain()
        loop.sweep()
        with manager.lock:
            report.add_stats(manager.get_stats())
    finally:
        # The worker first: copies must finish before the rows go away; the manager then
        # stops its tiers and releases the primary's memory (`shutdown` without the lock).
        worker.shutdown()
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
