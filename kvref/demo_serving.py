"""The serving loop `kvref demo` runs each phase with: a scripted scheduler and its worker.

`ServingLoop` plays both sides of vLLM's offloading connector against one manager and one
worker: it draws each request of the script, looks its chunks up, loads the hits into other GPU
blocks and checks every byte, "computes" the misses, stores them, ends each scheduler step, and
at the end reloads and checks every chunk still offloaded. It holds the manager's `lock` around
every call, and across a lookup that HITs and the `prepare_load` that pins it, as the connector
must. `KVCache` is the model's KV tensors and the reference content of every block.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvref.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingWorker,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    TransferResult,
    make_offload_key,
)
from kvref.cpu.common import CPULoadStoreSpec
from kvref.demo_config import NUM_GROUPS, DemoConfig
from kvref.demo_report import DemoReport

if TYPE_CHECKING:
    import torch

__all__ = ["KVCache", "ServingLoop"]

# How many steps a chunk may stay HIT_PENDING or RETRY before the demo gives up on it.
_MAX_STEPS = 10_000


def _new_blocks() -> list[list[int]]:
    return []


@dataclass
class _Request:
    index: int
    context: ReqContext
    # Per GPU block of the prompt, its chained hash (the same for every group).
    block_hashes: list[bytes]
    # Per group, the GPU blocks allocated to the request (one per prompt GPU block).
    gpu_blocks: list[list[int]] = field(default_factory=_new_blocks)
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

    def canonical(self) -> CanonicalKVCaches:
        """The tensors as vLLM hands them to an offloading worker: each with its page size, and
        per KV-cache group one reference per layer."""
        tensors = [CanonicalKVCacheTensor(tensor, self.page_bytes) for tensor in self.tensors]
        refs = [[CanonicalKVCacheRef(layer, self.page_bytes) for layer in layers] for layers in self.group_layers]
        return CanonicalKVCaches(tensors, refs)

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
        self, config: DemoConfig, kv: KVCache, manager: OffloadingManager, worker: OffloadingWorker, report: DemoReport
    ) -> None:
        self.config = config
        self.kv = kv
        self.manager = manager
        self.worker = worker
        self.report = report
        self.rng = random.Random(config.seed)
        free = list(range(config.num_gpu_blocks))
        self.rng.shuffle(free)
        self.free_gpu_blocks = free
        self.next_job_id = 0
        self.stores: dict[int, _StoreJob] = {}
        self.new_req_ids: list[str] = []  # scheduled for the first time this step
        # Jobs the worker refused at submission (its submit_* answered False).
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
            parent = hashlib.blake2b(parent + b"".join(t.to_bytes(8, "big") for t in tokens), digest_size=16).digest()
            hashes.append(parent)
        return _Request(index, ReqContext(f"req-{index}"), hashes)

    def keys(self, request: _Request, group: int) -> list[OffloadKey]:
        """One key per offloaded chunk: the hash of its last GPU block, and the group."""
        factor = self.config.block_size_factor
        hashes = request.block_hashes
        return [make_offload_key(hashes[end - 1], group) for end in range(factor, len(hashes) + 1, factor)]

    # --- worker side ---

    def submit_store(self, gpu_spec: GPULoadStoreSpec, cpu_spec: LoadStoreSpec) -> int:
        self.next_job_id += 1
        if not self.worker.submit_store(self.next_job_id, gpu_spec, cpu_spec):
            self.rejected.append(TransferResult(self.next_job_id, False))
        return self.next_job_id

    def submit_load(self, cpu_spec: LoadStoreSpec, gpu_spec: GPULoadStoreSpec) -> int:
        """Submit a load the step waits for: expedited, so it does not queue behind others."""
        self.next_job_id += 1
        if not self.worker.submit_load(self.next_job_id, cpu_spec, gpu_spec, expedited=True):
            self.rejected.append(TransferResult(self.next_job_id, False))
        return self.next_job_id

    def poll(self) -> list[TransferResult]:
        """Process finished jobs: complete stores, release their GPU blocks. Returns loads."""
        loads: list[TransferResult] = []
        results, self.rejected = [*self.rejected, *self.worker.get_finished()], []
        for result in results:
            if not result.success:
                self.report.failed_jobs.append(f"job {result.job_id} failed")
            store = self.stores.pop(result.job_id, None)
            if store is None:
                loads.append(result)
                continue
            self.report.store.add(result, store.num_gpu_blocks)
            with self.manager.lock:
                self.manager.complete_store(store.keys, store.request.context, result.success)
            store.request.pending_stores -= 1
            if store.request.pending_stores == 0:
                self.release(store.request)
        return loads

    def release(self, request: _Request) -> None:
        for blocks in request.gpu_blocks:
            self.free_gpu_blocks.extend(blocks)
        request.gpu_blocks = []
        with self.manager.lock:
            self.manager.on_request_finished(request.context)

    def allocate(self, n: int, avoid: list[int] | None = None) -> list[int]:
        avoided = set(avoid or ())
        while len(self.free_gpu_blocks) < n + len(avoided) and self.stores:
            # The GPU is full of blocks still being offloaded: wait for the oldest store.
            self.worker.wait({min(self.stores)})
            self.poll()
        chosen = [b for b in self.free_gpu_blocks if b not in avoided][:n]
        if len(chosen) < n:
            raise RuntimeError(f"out of GPU blocks: wanted {n}, {len(self.free_gpu_blocks)} free")
        taken = set(chosen)
        self.free_gpu_blocks = [b for b in self.free_gpu_blocks if b not in taken]
        return chosen

    # --- scheduler side ---

    def step(self, waiting: bool = False) -> None:
        """End a scheduler step: collect finished jobs, then the manager's end-of-step hook
        (where the tiering manager submits the promotions the step's lookups staged)."""
        self.poll()
        with self.manager.lock:
            self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=self.new_req_ids, preempted_req_ids=()))
        self.new_req_ids = []
        if waiting:
            if self.stores:
                self.worker.wait(set(self.stores))
            else:
                time.sleep(0.001)  # a secondary tier's I/O runs on threads of its own

    def settle(self, keys: list[OffloadKey], context: ReqContext) -> LookupResult:
        """Step until the manager knows each key (no HIT_PENDING or RETRY), as a scheduler
        defers a request to later steps. Returns the first key's final answer."""
        for _ in range(_MAX_STEPS):
            with self.manager.lock:
                answers = [self.manager.lookup(key, context) for key in keys]
            if all(answer in (LookupResult.HIT, LookupResult.MISS) for answer in answers):
                return answers[0]
            self.report.retried_hits += 1
            self.step(waiting=True)
        raise RuntimeError(f"{context.req_id}: chunks stayed pending")

    def lookup_prefix(self, request: _Request) -> tuple[int, CPULoadStoreSpec | None]:
        """Find the leading offloaded chunks that hit in every group, and pin them.

        The chunks are first settled (pending ones asked again step after step); then, under
        one hold of the lock, the prefix is looked up once more and pinned by `prepare_load`,
        so that no eviction separates a HIT from its pin.

        Returns the number of hit chunks per group and their load spec.
        """
        keys = [self.keys(request, g) for g in range(NUM_GROUPS)]
        for j in range(len(keys[0])):
            if self.settle([keys[g][j] for g in range(NUM_GROUPS)], request.context) is not LookupResult.HIT:
                break
        with self.manager.lock:
            hits = 0
            for j in range(len(keys[0])):
                if not all(self.manager.lookup(keys[g][j], request.context) is LookupResult.HIT for g in range(NUM_GROUPS)):
                    break
                hits += 1
            spec: CPULoadStoreSpec | None = None
            if hits:
                hit_keys = [key for g in range(NUM_GROUPS) for key in keys[g][:hits]]
                loaded = self.manager.prepare_load(hit_keys, request.context)
                assert isinstance(loaded, CPULoadStoreSpec), f"the CPU tier returned {loaded!r}"
                spec = loaded
        self.report.lookups += NUM_GROUPS * min(hits + 1, len(keys[0]))
        self.report.hits += NUM_GROUPS * hits
        return hits, spec

    def load(self, request: _Request, hits: int, cpu_spec: CPULoadStoreSpec, gpu_prefix_hit: bool) -> None:
        """Load the pinned hit prefix into the request's GPU blocks and check every byte."""
        factor = self.config.block_size_factor
        keys = [key for g in range(NUM_GROUPS) for key in self.keys(request, g)[:hits]]
        # A GPU prefix-cache hit on the first GPU block: the load starts 1 block into the first
        # offloaded chunk (block_index 1, skip = 1 % factor).
        first = 1 if gpu_prefix_hit and factor > 1 else 0
        gpu_ids = [b for g in range(NUM_GROUPS) for b in request.gpu_blocks[g][first : hits * factor]]
        gpu_spec = GPULoadStoreSpec(gpu_ids, [hits * factor - first] * NUM_GROUPS, [first] * NUM_GROUPS)
        job = self.submit_load(cpu_spec, gpu_spec)
        self.worker.wait({job})
        finished: list[TransferResult] = []
        for _ in range(_MAX_STEPS):
            finished += [result for result in self.poll() if result.job_id == job]
            if finished:
                break
            self.step(waiting=True)
        (result,) = finished
        self.report.load.add(result, len(gpu_ids))
        with self.manager.lock:
            self.manager.complete_load(keys, request.context)
        for g in range(NUM_GROUPS):
            for i in range(first, hits * factor):
                self.verify(g, request.gpu_blocks[g][i], request.block_hashes[i])

    def verify(self, group: int, gpu_block: int, block_hash: bytes) -> None:
        self.report.verified_blocks += 1
        self.report.mismatches += self.kv.check(group, gpu_block, block_hash)

    def store(self, request: _Request) -> None:
        """Offload the request's chunks that the CPU tier does not hold yet."""
        factor = self.config.block_size_factor
        all_keys = [key for g in range(NUM_GROUPS) for key in self.keys(request, g)]
        with self.manager.lock:
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
        job = self.submit_store(GPULoadStoreSpec(gpu_ids, group_sizes, [0] * NUM_GROUPS), output.store_spec)
        self.stores[job] = _StoreJob(request, list(output.keys_to_store), len(gpu_ids))
        request.pending_stores += 1
        self.report.stored_blocks += len(output.keys_to_store)

    def serve(self, index: int) -> None:
        config = self.config
        request = self.request(index)
        with self.manager.lock:
            self.manager.on_new_request(request.context)
        for g in range(NUM_GROUPS):  # where each key ends in the prompt: prefix order
            for j, key in enumerate(self.keys(request, g)):
                request.context.set_offload_key_position(key, (j + 1) * config.block_size_factor * config.block_tokens)
        self.new_req_ids.append(request.context.req_id)
        hits, cpu_spec = self.lookup_prefix(request)
        num_gpu = len(request.block_hashes)
        request.gpu_blocks = [self.allocate(num_gpu) for _ in range(NUM_GROUPS)]
        gpu_prefix_hit = hits > 0 and index % 3 == 1
        for g in range(NUM_GROUPS):
            if gpu_prefix_hit:
                self.kv.compute(g, request.gpu_blocks[g][0], request.block_hashes[0])
            for i in range(hits * config.block_size_factor, num_gpu):
                self.kv.compute(g, request.gpu_blocks[g][i], request.block_hashes[i])
        if cpu_spec is not None:
            self.load(request, hits, cpu_spec, gpu_prefix_hit)
        with self.manager.lock:
            self.manager.touch([key for g in range(NUM_GROUPS) for key in self.keys(request, g)], request.context)
        self.store(request)
        if request.pending_stores == 0:
            self.release(request)
        self.step()
        self.keep_stepping()

    def keep_stepping(self) -> None:
        """Step while the manager has work in flight (`has_pending_work`), as an idle engine does.

        Without this the outcome would depend on thread timing (a store the primary tier must
        refuse while a cascade still pins its chunks), and the demo would not replay the same.
        """
        for _ in range(_MAX_STEPS):
            with self.manager.lock:
                pending = self.manager.has_pending_work()
            if not pending:
                return
            self.step(waiting=True)
        raise RuntimeError("the manager's work did not finish")

    def drain(self) -> None:
        for _ in range(_MAX_STEPS):
            self.step(waiting=True)
            if not self.stores:
                self.keep_stepping()
                return
        raise RuntimeError("stores did not finish")

    def sweep(self) -> None:
        """Reload every chunk still offloaded (in any tier) into other GPU blocks; check it."""
        factor = self.config.block_size_factor
        self.report.distinct_stored_blocks = len(self.stored_from)
        context = ReqContext("sweep")
        with self.manager.lock:
            self.manager.on_new_request(context)
        for key, origin in sorted(self.stored_from.items()):
            if self.settle([key], context) is not LookupResult.HIT:
                continue
            g = int.from_bytes(key[-4:], "big")
            targets = self.allocate(factor, avoid=origin)
            with self.manager.lock:
                if self.manager.lookup(key, context) is not LookupResult.HIT:
                    self.free_gpu_blocks += targets
                    continue
                cpu_spec = self.manager.prepare_load([key], context)
            group_sizes = [factor if i == g else 0 for i in range(NUM_GROUPS)]
            job = self.submit_load(cpu_spec, GPULoadStoreSpec(targets, group_sizes, [0] * NUM_GROUPS))
            self.worker.wait({job})
            for result in [*self.rejected, *self.worker.get_finished()]:
                if not result.success:
                    self.report.failed_jobs.append(f"job {result.job_id} failed")
                self.report.load.add(result, factor)
            self.rejected = []
            with self.manager.lock:
                self.manager.complete_load([key], context)
            for target, block_hash in zip(targets, self.hash_of[key]):
                self.verify(g, target, block_hash)
            self.free_gpu_blocks += targets
            self.report.sweep_blocks += 1
            self.step()
        with self.manager.lock:
            self.manager.on_request_finished(context)
