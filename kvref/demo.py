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
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

import typer

from kvref.base import (
    GPULoadStoreSpec,
    OffloadingManager,
    OffloadingStats,
    OffloadKey,
    ReqContext,
    make_offload_key,
)
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.manager import CPUOffloadingManager
from kvref.cpu.shared_region import SharedOffloadRegion
from kvref.demo_config import NUM_GROUPS, DemoConfig
from kvref.errors import OffloadProtocolError
from kvref.tiering.manager import create_tiering_manager
from kvref.worker import OffloadingWorker, TransferResult, TransferSpec

if TYPE_CHECKING:
    # torch is imported when the demo runs, not when the CLI loads it (`kvref demo --help`
    # stays fast); `kvref.cpu.gpu_worker` is the one module that imports it at module level.
    import torch

    from kvref.cpu.gpu_worker import CpuGpuOffloadingHandlers

__all__ = ["DemoConfig", "DemoReport", "run_demo", "run_config", "format_stats"]

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


@dataclass
class _Request:
    index: int
    context: ReqContext
    # Per GPU block of the prompt, its chained hash (the same for every group).
    block_hashes: list[bytes]
    # Per group, the GPU blocks allocated to the request (one per prompt GPU block).
    gpu_blocks: list[list[int]] = field(default_factory=list[list[int]])
    pending_stores: int = 0


@dataclass
class _StoreJob:
    request: _Request
    keys: list[OffloadKey]
    num_gpu_blocks: int


class _KVCache:
    """The model's KV tensors, the groups' layers, and the reference content of every block."""

    def __init__(self, config: DemoConfig, device: torch.device) -> None:
        import torch

        self.config = config
        self.device = device
        self.dtype = torch.bfloat16
        self.block_shape = (2, config.block_tokens, config.kv_heads, config.head_dim)
        # Per layer one tensor (num_blocks, K/V, tokens, heads, head_dim), as attention backends
        # allocate them; group 0 = the first half of the layers (full attention), group 1 the rest.
        self.tensors = [
            torch.zeros((config.num_gpu_blocks, *self.block_shape), dtype=self.dtype, device=device)
            for _ in range(config.layers)
        ]
        half = config.layers // 2
        self.group_layers = [list(range(half)), list(range(half, config.layers))]

    @property
    def page_bytes(self) -> int:
        return self.tensors[0][0].numel() * self.tensors[0].element_size()

    def content(self, block_hash: bytes, layer: int) -> torch.Tensor:
        """The block's KV values for `layer`: bf16 noise seeded by the block hash."""
        import torch

        digest = hashlib.blake2b(block_hash + layer.to_bytes(4, "big"), digest_size=8).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest, "big") >> 1)
        values = torch.randn(self.block_shape, generator=generator).to(self.dtype)
        return values.to(self.device)

    def compute(self, group: int, gpu_block: int, block_hash: bytes) -> None:
        """Play the model: write the block's KV for every layer of the group."""
        for layer in self.group_layers[group]:
            self.tensors[layer][gpu_block].copy_(self.content(block_hash, layer))

    def check(self, group: int, gpu_block: int, block_hash: bytes) -> list[str]:
        """Compare a GPU block with its reference content; describe each layer that differs."""
        import torch

        problems: list[str] = []
        for layer in self.group_layers[group]:
            got = self.tensors[layer][gpu_block].view(torch.int8)
            want = self.content(block_hash, layer).view(torch.int8)
            if not torch.equal(got, want):
                wrong = int((got != want).sum().item())
                problems.append(
                    f"layer {layer} GPU block {gpu_block} (hash {block_hash[:4].hex()}): "
                    f"{wrong} of {got.numel()} bytes differ"
                )
        return problems


class _ServingLoop:
    """A scheduler + worker pair serving the script against one manager."""

    def __init__(
        self,
        config: DemoConfig,
        kv: _KVCache,
        manager: OffloadingManager,
        handlers: CpuGpuOffloadingHandlers,
        report: DemoReport,
        end_step: Callable[[], None] | None = None,
        has_pending_work: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        self.end_step = end_step
        self.has_pending_work = has_pending_work
        self.kv = kv
        self.manager = manager
        self.handlers = handlers
        self.report = report
        self.worker = OffloadingWorker()
        handlers.register_with(self.worker)
        self.rng = random.Random(config.seed)
        free = list(range(config.num_gpu_blocks))
        self.rng.shuffle(free)
        self.free_gpu_blocks = free
        self.next_job_id = 0
        self.stores: dict[int, _StoreJob] = {}
        # Jobs the worker refused at submission (reported only by transfer_async's False).
        self.rejected: list[TransferResult] = []
        # Key -> the GPU blocks it was last stored from, so reloads can target others.
        self.stored_from: dict[OffloadKey, list[int]] = {}
        self.hash_of: dict[OffloadKey, list[bytes]] = {}

    # --- script ---

    def request(self, index: int) -> _Request:
        config = self.config
        doc = self.rng.randrange(config.documents)
        tokens_per_block = config.block_tokens
        blocks: list[list[int]] = []
        for i in range(config.doc_blocks * config.block_size_factor):
            blocks.append([doc * 1_000_003 + i * tokens_per_block + t for t in range(tokens_per_block)])
        for i in range(config.suffix_blocks * config.block_size_factor):
            base = 10**9 + index * 1_000_003 + i * tokens_per_block
            blocks.append([base + t for t in range(tokens_per_block)])
        hashes: list[bytes] = []
        parent = b"kvref-demo"
        for tokens in blocks:
            parent = hashlib.blake2b(
                parent + b"".join(t.to_bytes(8, "big") for t in tokens), digest_size=16
            ).digest()
            hashes.append(parent)
        return _Request(index, ReqContext(f"req-{index}"), hashes)

    def keys(self, request: _Request, group: int) -> list[OffloadKey]:
        """One key per offloaded block: the hash of its last GPU block, and the group."""
        factor = self.config.block_size_factor
        hashes = request.block_hashes
        return [
            make_offload_key(hashes[end - 1], group)
            for end in range(factor, len(hashes) + 1, factor)
        ]

    # --- worker side ---

    def submit(self, spec: TransferSpec) -> int:
        """Hand a job to the worker (its result, success or not, comes from `poll`)."""
        self.next_job_id += 1
        if not self.worker.transfer_async(self.next_job_id, spec):
            media = (spec[0].medium(), spec[1].medium())
            failure = TransferResult(self.next_job_id, False, None, None, media, "submission failed")
            self.rejected.append(failure)
        return self.next_job_id

    def poll(self) -> list[TransferResult]:
        """Process finished jobs: complete stores, release their GPU blocks. Returns loads."""
        loads: list[TransferResult] = []
        results, self.rejected = [*self.rejected, *self.worker.get_finished()], []
        for result in results:
            if not result.success:
                self.report.failed_jobs.append(f"job {result.job_id}: {result.error}")
            store = self.stores.pop(result.job_id, None)
            if store is None:
                loads.append(result)
                continue
            self.report.store.add(result, store.num_gpu_blocks)
            self.manager.complete_store(store.keys, store.request.context, result.success)
            store.request.pending_stores -= 1
            if store.request.pending_stores == 0:
                self.release(store.request)
        return loads

    def release(self, request: _Request) -> None:
        for blocks in request.gpu_blocks:
            self.free_gpu_blocks.extend(blocks)
        request.gpu_blocks = []
        self.manager.on_request_finished(request.context)

    def allocate(self, n: int, avoid: Iterable[int] = ()) -> list[int]:
        avoided = set(avoid)
        while len(self.free_gpu_blocks) < n + len(avoided) and self.stores:
            # The GPU is full of blocks still being offloaded: wait for the oldest store.
            self.worker.wait([min(self.stores)])
            self.poll()
        chosen = [b for b in self.free_gpu_blocks if b not in avoided][:n]
        if len(chosen) < n:
            raise RuntimeError(f"out of GPU blocks: wanted {n}, {len(self.free_gpu_blocks)} free")
        taken = set(chosen)
        self.free_gpu_blocks = [b for b in self.free_gpu_blocks if b not in taken]
        return chosen

    # --- scheduler side ---

    def lookup_prefix(self, request: _Request) -> tuple[int, CPULoadStoreSpec | None]:
        """Find the leading offloaded blocks that hit in every group, and protect them.

        Returns the number of hit blocks per group and their load spec (`prepare_load` done).
        A block that hit can still be evicted before `prepare_load` protects it (a promotion
        staged by a later lookup makes room in the CPU tier): then the lookup starts over.
        """
        keys = [self.keys(request, g) for g in range(NUM_GROUPS)]
        for _ in range(100):
            hits = retried = 0
            for j in range(len(keys[0])):
                answers = [self.lookup_ready(keys[g][j], request.context) for g in range(NUM_GROUPS)]
                if not all(found for found, _ in answers):
                    break
                hits += 1
                retried += sum(was_retried for _, was_retried in answers)
                # As the connector does each step: recently used blocks are evicted last.
                self.manager.touch([keys[g][j] for g in range(NUM_GROUPS)], request.context)
            spec: CPULoadStoreSpec | None = None
            if hits:
                hit_keys = [key for g in range(NUM_GROUPS) for key in keys[g][:hits]]
                try:
                    loaded = self.manager.prepare_load(hit_keys, request.context)
                except OffloadProtocolError:
                    self.report.relookups += 1
                    continue
                assert isinstance(loaded, CPULoadStoreSpec), f"the CPU tier returned {loaded!r}"
                spec = loaded
            self.report.lookups += NUM_GROUPS * min(hits + 1, len(keys[0]))
            self.report.hits += NUM_GROUPS * hits
            self.report.retried_hits += retried
            return hits, spec
        raise RuntimeError(f"{request.context.req_id}: its hits kept being evicted")

    def lookup_ready(self, key: OffloadKey, context: ReqContext) -> tuple[bool, bool]:
        """Look a block up until it is settled: (present, whether it had to be retried).

        None means "present but not readable yet" (a store or a promotion in flight): a real
        scheduler defers the request to a later step; the demo ends the step and asks again.
        """
        for attempt in range(10_000):
            found = self.manager.lookup(key, context)
            if found is not None:
                return found, attempt > 0
            self.step(attempt + 1)
        raise RuntimeError(f"{context.req_id}: block {key.hex()} stayed in flight")

    def step(self, attempt: int) -> None:
        """End an engine step: collect finished jobs, let the manager submit staged work."""
        self.poll()
        if self.end_step is not None:
            self.end_step()
        if attempt:
            if self.stores:
                self.worker.wait(list(self.stores))
            else:
                # Secondary-tier I/O runs on its own threads: give it a moment.
                time.sleep(0.001)

    def load(
        self, request: _Request, hits: int, cpu_spec: CPULoadStoreSpec, gpu_prefix_hit: bool
    ) -> None:
        """Load the protected hit prefix into the request's GPU blocks and check every byte."""
        factor = self.config.block_size_factor
        keys = [key for g in range(NUM_GROUPS) for key in self.keys(request, g)[:hits]]
        # A GPU prefix-cache hit on the first GPU block: the load starts 1 block into the first
        # offloaded block (block_index 1, skip = 1 % factor).
        first = 1 if gpu_prefix_hit and factor > 1 else 0
        gpu_ids = [b for g in range(NUM_GROUPS) for b in request.gpu_blocks[g][first : hits * factor]]
        gpu_spec = GPULoadStoreSpec(gpu_ids, [hits * factor - first] * NUM_GROUPS, [first] * NUM_GROUPS)
        job = self.submit((cpu_spec, gpu_spec))
        self.worker.wait([job])
        finished: list[TransferResult] = []
        for attempt in range(10_000):
            finished += [r for r in self.poll() if r.job_id == job]
            if finished:
                break
            self.step(attempt)
        (result,) = finished
        self.report.load.add(result, len(gpu_ids))
        self.manager.complete_load(keys, request.context)
        for g in range(NUM_GROUPS):
            for i in range(first, hits * factor):
                self.verify(g, request.gpu_blocks[g][i], request.block_hashes[i])

    def verify(self, group: int, gpu_block: int, block_hash: bytes) -> None:
        self.report.verified_blocks += 1
        self.report.mismatches += self.kv.check(group, gpu_block, block_hash)

    def store(self, request: _Request) -> None:
        """Offload the request's offloaded blocks that the CPU tier does not hold yet."""
        factor = self.config.block_size_factor
        all_keys = [key for g in range(NUM_GROUPS) for key in self.keys(request, g)]
        output = self.manager.prepare_store(all_keys, request.context)
        if output is None:
            self.report.skipped_stores += len(all_keys)
            return
        self.report.evicted_blocks += len(output.evicted_keys)
        if not output.keys_to_store:
            return
        position = {key: (g, j) for g in range(NUM_GROUPS) for j, key in enumerate(self.keys(request, g))}
        gpu_ids: list[int] = []
        group_sizes = [0] * NUM_GROUPS
        for key in output.keys_to_store:
            g, j = position[key]
            blocks = request.gpu_blocks[g][j * factor : (j + 1) * factor]
            gpu_ids += blocks
            group_sizes[g] += factor
            self.stored_from[key] = blocks
            self.hash_of[key] = request.block_hashes[j * factor : (j + 1) * factor]
        gpu_spec = GPULoadStoreSpec(gpu_ids, group_sizes, [0] * NUM_GROUPS)
        store_spec = output.store_spec
        assert isinstance(store_spec, CPULoadStoreSpec), f"the CPU manager returned {store_spec!r}"
        job = self.submit((gpu_spec, store_spec))
        self.stores[job] = _StoreJob(request, list(output.keys_to_store), len(gpu_ids))
        request.pending_stores += 1
        self.report.stored_blocks += len(output.keys_to_store)

    def serve(self, index: int) -> None:
        config = self.config
        request = self.request(index)
        self.manager.on_new_request(request.context)
        hits, cpu_spec = self.lookup_prefix(request)
        num_gpu = len(request.block_hashes)
        request.gpu_blocks = [self.allocate(num_gpu) for _ in range(NUM_GROUPS)]
        gpu_prefix_hit = hits > 0 and index % 3 == 1
        for g in range(NUM_GROUPS):
            start = hits * config.block_size_factor
            if gpu_prefix_hit:
                self.kv.compute(g, request.gpu_blocks[g][0], request.block_hashes[0])
            for i in range(start, num_gpu):
                self.kv.compute(g, request.gpu_blocks[g][i], request.block_hashes[i])
        if cpu_spec is not None:
            self.load(request, hits, cpu_spec, gpu_prefix_hit)
        self.manager.touch(
            [key for g in range(NUM_GROUPS) for key in self.keys(request, g)], request.context
        )
        self.store(request)
        if request.pending_stores == 0:
            self.release(request)
        self.step(0)
        self.settle()

    def settle(self) -> None:
        """Keep stepping while secondary-tier I/O is in flight, as an idle engine does.

        Without this the outcome would depend on thread timing (a store the primary tier must
        refuse while a cascade still pins its blocks), and the demo would not replay the same.
        """
        if self.has_pending_work is None:
            return
        for attempt in range(1, 10_000):
            if not self.has_pending_work():
                return
            self.step(attempt)
        raise RuntimeError("secondary-tier work did not finish")

    def drain(self) -> None:
        for attempt in range(10_000):
            self.step(attempt)
            if not self.stores:
                return
        raise RuntimeError("stores did not finish")

    def sweep(self) -> None:
        """Reload every block still offloaded (in any tier) into other GPU blocks; check it."""
        factor = self.config.block_size_factor
        context = ReqContext("sweep")
        self.manager.on_new_request(context)
        for key, origin in sorted(self.stored_from.items()):
            found, _ = self.lookup_ready(key, context)
            if not found:
                continue
            g = int.from_bytes(key[-4:], "big")
            targets = self.allocate(factor, avoid=origin)
            cpu_spec = self.manager.prepare_load([key], context)
            assert isinstance(cpu_spec, CPULoadStoreSpec), f"the CPU manager returned {cpu_spec!r}"
            group_sizes = [factor if i == g else 0 for i in range(NUM_GROUPS)]
            job = self.submit((cpu_spec, GPULoadStoreSpec(targets, group_sizes, [0] * NUM_GROUPS)))
            self.worker.wait([job])
            for result in self.worker.get_finished():
                if not result.success:
                    self.report.failed_jobs.append(f"job {result.job_id}: {result.error}")
                self.report.load.add(result, factor)
            self.manager.complete_load([key], context)
            for target, block_hash in zip(targets, self.hash_of[key]):
                self.verify(g, target, block_hash)
            self.free_gpu_blocks += targets
            self.report.sweep_blocks += 1
            self.step(0)
        self.manager.on_request_finished(context)


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

    kv = _KVCache(config, device)
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

    kv = _KVCache(config, device)
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
    kv: _KVCache,
    manager: OffloadingManager,
    handlers: CpuGpuOffloadingHandlers,
    report: DemoReport,
    progress: Callable[[Iterable[int], str], Iterator[int]] | None,
    end_step: Callable[[], None] | None,
    has_pending_work: Callable[[], bool] | None = None,
) -> None:
    started = time.perf_counter()
    loop = _ServingLoop(config, kv, manager, handlers, report, end_step, has_pending_work)
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
