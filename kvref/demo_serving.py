"""The serving loop `kvref demo` runs each phase with: a scripted scheduler and its worker.

`ServingLoop` plays both sides of an offloading connector against one manager: it draws each
request of the script, looks its blocks up, loads the hits into other GPU blocks and checks every
byte, "computes" the misses, stores them, and at the end reloads and checks every block still
offloaded. `KVCache` is the model's KV tensors and the reference content of every block. The
phases that build the managers and the report they fill are in `kvref.demo` and
`kvref.demo_report`.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvref.base import (
    GPULoadStoreSpec,
    OffloadingManager,
    OffloadKey,
    ReqContext,
    make_offload_key,
)
from kvref.cpu.common import CPULoadStoreSpec
from kvref.demo_config import NUM_GROUPS, DemoConfig
from kvref.demo_report import DemoReport
from kvref.errors import OffloadProtocolError
from kvref.worker import OffloadingWorker, TransferResult, TransferSpec

if TYPE_CHECKING:
    import torch

    from kvref.cpu.gpu_worker import CpuGpuOffloadingHandlers

__all__ = ["KVCache", "ServingLoop"]


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


class KVCache:
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


class ServingLoop:
    """A scheduler + worker pair serving the script against one manager."""

    def __init__(
        self,
        config: DemoConfig,
        kv: KVCache,
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
