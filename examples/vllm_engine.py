"""A vLLM engine's KV-offloading scheduler side, on the CPU, driving vLLM 0.33's real code.

`Engine` builds vLLM's `TieringOffloadingSpec` from the same `kv_connector_extra_config` a
`vllm serve --kv-transfer-config` line carries (a CPU primary tier over vLLM's shared mmap
region, and the configured secondary tiers: vLLM's own or out-of-tree ones such as
`kvref.integrations.vllm.RedisTier`), and plays vLLM's scheduler and GPU worker around the
`TieringOffloadingManager` it gets: it looks a request's blocks up as vLLM's OffloadingConnector
does, "loads" the hits from the CPU tier (checking their bytes), and "stores" the rest by writing
their rows into the CPU tier, from where vLLM cascades them to the secondary tiers.

Used by `examples/vllm_redis_tier.py` and by kvref's tests next to vLLM (tests/vllm). Needs vLLM
0.33 (`pip install 'kvref[vllm]'`).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

__all__ = ["Engine", "WrongBytes", "block_content", "prompt_keys"]

_STEP_TIMEOUT_S = 20.0


class WrongBytes(AssertionError):
    """A block loaded from the offloading tiers does not hold the bytes that were stored."""


def prompt_keys(prompt: str, count: int) -> list[OffloadKey]:
    """The chained block hashes of a prompt's first `count` blocks (as vLLM computes them)."""
    keys: list[OffloadKey] = []
    parent = b""
    for index in range(count):
        parent = hashlib.sha256(parent + f"{prompt}/{index}".encode()).digest()
        keys.append(make_offload_key(parent, 0))
    return keys


def block_content(key: bytes, size: int) -> bytes:
    """The KV bytes every engine agrees a block holds (a stand-in for what the GPU computed)."""
    seed = hashlib.blake2b(key, digest_size=32).digest()
    return (seed * (size // 32 + 1))[:size]


class Engine:
    """The scheduler side of one vLLM engine's KV offloading, as vLLM's OffloadingConnector drives it.

    Args:
        secondary_tiers: the `secondary_tiers` list of vLLM's `kv_connector_extra_config`.
        num_chunks: CPU primary tier capacity, in blocks (one block per chunk).
        block_bytes: KV bytes of one block (rounded up to vLLM's alignment).
        enable_kv_events: vLLM's global KV-events flag.
        model: the model name (engines share blocks only with the same model and layout).
    """

    _ids = itertools.count()

    def __init__(
        self,
        secondary_tiers: Sequence[Mapping[str, Any]],
        *,
        num_chunks: int = 32,
        block_bytes: int = 64 << 10,
        enable_kv_events: bool = False,
        model: str = "kvref-example/model",
    ) -> None:
        config = OffloadingConfig(
            groups=(OffloadingGroupConfig(16, ("layer",), 0),),
            worker_kv_bytes_per_block=block_bytes,
            enable_kv_cache_events=enable_kv_events,
            extra_config={
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": num_chunks * block_bytes,
                "secondary_tiers": [dict(tier) for tier in secondary_tiers],
            },
            engine_id=f"kvref-example-{os.getpid()}-{next(self._ids)}",
            model=OffloadingModelConfig(name=model, dtype="float16", max_model_len=1 << 16),
            cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
            parallel=OffloadingParallelConfig(
                rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                is_parallelism_agnostic=False,
            ),  # fmt: skip
            replicated_layout=False,
        )
        self.spec = TieringOffloadingSpec(config)
        manager = self.spec.get_manager()
        assert isinstance(manager, TieringOffloadingManager)
        self.manager = manager
        view = manager.primary_tier.get_kv_memoryview()
        assert view.strides is not None
        self.block_bytes: int = view.strides[0]
        self._rows = view.cast("B")
        self.steps = 0

    def step(self) -> None:
        """End a scheduler step (vLLM then submits promotions and collects finished jobs)."""
        with self.manager.lock:
            self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))
        self.steps += 1

    def _row(self, chunk_id: int) -> memoryview:
        return self._rows[chunk_id * self.block_bytes : (chunk_id + 1) * self.block_bytes]

    def _lookup(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> int | None:
        # vLLM's OffloadingConnector (`_maximal_prefix_lookup`): count hits from the start; a
        # RETRY or HIT_PENDING defers the request to a later step; a MISS ends the prefix.
        hits, deferred = 0, False
        for key in keys:
            result = self.manager.lookup(key, ctx)
            if result is LookupResult.MISS:
                break
            if result is LookupResult.RETRY:
                deferred = True
                continue
            hits += 1
            deferred |= result is LookupResult.HIT_PENDING
        return None if deferred else hits

    def serve(self, req_id: str, keys: Sequence[OffloadKey]) -> int:
        """Serve one request: load its offloaded prefix, store the rest; return the blocks hit.

        Raises:
            WrongBytes: a block loaded from the CPU tier holds other bytes than were stored.
            TimeoutError: its lookups did not settle within the step timeout.
        """
        ctx = ReqContext(req_id=req_id)
        manager = self.manager
        with manager.lock:
            manager.on_new_request(ctx)
        deadline = time.monotonic() + _STEP_TIMEOUT_S
        while True:
            with manager.lock:
                hits = self._lookup(keys, ctx)
            if hits is not None:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"request {req_id}: lookups still deferred after {_STEP_TIMEOUT_S} s")
            self.step()
            time.sleep(0.001)
        with manager.lock:
            if hits:
                spec = manager.prepare_load(keys[:hits], ctx)
                assert isinstance(spec, CPULoadStoreSpec)
                for key, chunk_id in zip(keys[:hits], spec.chunk_ids.tolist()):
                    if bytes(self._row(chunk_id)) != block_content(key, self.block_bytes):
                        raise WrongBytes(f"request {req_id}: block {key.hex()} loaded wrong bytes")
                manager.complete_load(keys[:hits], ctx)
            manager.touch(keys, ctx)
            output = manager.prepare_store(keys[hits:], ctx)
            if output is not None and output.keys_to_store:
                assert isinstance(output.store_spec, CPULoadStoreSpec)
                for key, chunk_id in zip(output.keys_to_store, output.store_spec.chunk_ids.tolist()):
                    self._row(chunk_id)[:] = block_content(key, self.block_bytes)  # the GPU's copy
                manager.complete_store(output.keys_to_store, ctx)  # cascades to the secondary tiers
            manager.on_request_finished(ctx)
        self.step()
        return hits

    def settle(self, timeout_s: float = _STEP_TIMEOUT_S) -> None:
        """Step until no transfer is in flight (every cascade and promotion finished)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.manager.lock:
                if not self.manager.has_pending_work():
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"transfers still in flight after {timeout_s} s")
            self.step()
            time.sleep(0.001)

    def close(self) -> None:
        self._rows.release()
        self.manager.shutdown()
