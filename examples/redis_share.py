"""Two engine processes share offloaded KV blocks through Redis.

    python examples/redis_share.py                       # starts a throw-away redis-server
    python examples/redis_share.py --url redis://host:6379

Each engine's `EngineSpec` describes its model and builds its `TieringOffloadingManager` (a CPU
primary over its own memory, and the Redis tier its configuration names), as vLLM's
`TieringOffloadingSpec` does. Engine A stores blocks: GPU -> CPU primary (simulated by writing
the rows) -> cascade to the Redis tier. Engine B (another process, another primary) has never
seen them: its lookups go to Redis (RETRY until the tier's existence check answers), the blocks
are promoted into its primary (HIT_PENDING), and it checks that it reads exactly the bytes A
stored. Without a server (no --url and no
`redis-server` installed) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from typing_extensions import override

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvref.base import (
    LookupResult,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from kvref.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from kvref.cpu.common import CPULoadStoreSpec
from kvref.tiering.base import PrimaryBlocks
from kvref.tiering.factory import create_tiering_manager
from kvref.tiering.manager import CPUPrimaryTierOffloadingManager, TieringOffloadingManager
from kvref.tiering.redis.local import LocalRedisServer, redis_server_path
from kvref.tiering.redis.resp import ConnectOptions, RespConnection, encode_command
from kvref.tiering.redis.routing import parse_server_url

__all__ = ["main", "block_content", "prompt_keys", "EngineSpec"]

_TIMEOUT_S = 20.0
_END_OF_STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def prompt_keys(prompt: str, count: int) -> list[OffloadKey]:
    """The chained block hashes of a prompt's first `count` blocks (as an engine computes them)."""
    keys: list[OffloadKey] = []
    parent = b""
    for index in range(count):
        parent = hashlib.sha256(parent + f"{prompt}/{index}".encode()).digest()
        keys.append(make_offload_key(parent, 0))
    return keys


def block_content(key: OffloadKey, size: int) -> bytes:
    """The KV bytes both engines agree a block holds (a stand-in for the GPU's data)."""
    chunks = [hashlib.sha256(key + i.to_bytes(8, "big")).digest() for i in range(size // 32 + 1)]
    return b"".join(chunks)[:size]


class AnonymousRegion:
    """The primary's memory: shared anonymous memory, page-aligned (vLLM's lives in /dev/shm)."""

    def __init__(self, num_chunks: int, chunk_bytes: int) -> None:
        self._memory = mmap.mmap(-1, num_chunks * chunk_bytes)
        self._shape = (num_chunks, chunk_bytes)

    def create_kv_memoryview(self) -> memoryview:
        return memoryview(self._memory).cast("B", self._shape)

    def cleanup(self) -> None:
        self._memory.close()


class EngineSpec(OffloadingSpec):
    """One engine's offloading: a model on one rank, one block per chunk, `num_chunks` chunks of
    `block_bytes` in host memory, and the secondary tiers of `extra_config["secondary_tiers"]`."""

    def __init__(self, num_chunks: int, block_bytes: int, secondary_tiers: list[dict[str, Any]]) -> None:
        super().__init__(
            OffloadingConfig(
                groups=(OffloadingGroupConfig(16, ("model.layers",), 0),),
                worker_kv_bytes_per_block=block_bytes,
                enable_kv_cache_events=False,
                extra_config={"secondary_tiers": secondary_tiers},
                engine_id=f"redis-share-{os.getpid()}",
                model=OffloadingModelConfig(name="example/model", dtype="bfloat16"),
                cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
                parallel=OffloadingParallelConfig(
                    rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                    data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                    is_parallelism_agnostic=False,
                ),  # fmt: skip
            )
        )
        self.num_chunks = num_chunks
        self.block_bytes = block_bytes

    @override
    def get_manager(self) -> TieringOffloadingManager:
        primary = CPUPrimaryTierOffloadingManager(self.num_chunks, AnonymousRegion(self.num_chunks, self.block_bytes))
        return create_tiering_manager(primary, list(self.extra_config["secondary_tiers"]), self)

    @override
    def get_worker(self, kv_caches: Any) -> OffloadingWorker:
        raise NotImplementedError("this example simulates the GPU by writing the CPU rows")


def step(manager: TieringOffloadingManager) -> None:
    """End a scheduler step: finished jobs are collected, staged promotions submitted."""
    with manager.lock:
        manager.on_schedule_end(_END_OF_STEP)


def run_store(manager: TieringOffloadingManager, keys: list[OffloadKey], block_bytes: int) -> None:
    ctx = ReqContext("engine-a")
    with manager.lock:
        manager.on_new_request(ctx)
        output = manager.prepare_store(keys, ctx)
    assert output is not None and isinstance(output.store_spec, CPULoadStoreSpec)
    rows = PrimaryBlocks(manager.primary_tier.get_kv_memoryview())
    for key, chunk_id in zip(output.keys_to_store, output.store_spec.chunk_ids):
        rows.row(chunk_id)[:] = block_content(key, block_bytes)  # what the GPU would copy
    rows.release()
    with manager.lock:
        manager.complete_store(output.keys_to_store, ctx)  # cascades to Redis
        manager.on_request_finished(ctx)
    deadline = time.monotonic() + _TIMEOUT_S
    while manager.has_pending_work():
        if time.monotonic() > deadline:
            raise TimeoutError("the Redis tier did not finish in time")
        step(manager)
        time.sleep(0.002)
    print(f"engine A (pid {os.getpid()}): stored {len(keys)} blocks of {block_bytes} bytes in Redis")


def run_load(manager: TieringOffloadingManager, keys: list[OffloadKey], block_bytes: int) -> bool:
    ctx = ReqContext("engine-b")
    with manager.lock:
        manager.on_new_request(ctx)
    deadline = time.monotonic() + _TIMEOUT_S
    steps = 0
    while True:
        with manager.lock:
            answers = [manager.lookup(key, ctx) for key in keys]
        if all(answer is LookupResult.HIT for answer in answers):
            break
        if LookupResult.MISS in answers:
            print(f"engine B (pid {os.getpid()}): block {answers.index(LookupResult.MISS)} is not in Redis")
            return False
        if time.monotonic() > deadline:
            raise TimeoutError("promotion from Redis did not finish in time")
        step(manager)  # sends this step's existence checks and submits its promotions
        steps += 1
        time.sleep(0.002)
    with manager.lock:
        spec = manager.prepare_load(keys, ctx)
    rows = PrimaryBlocks(manager.primary_tier.get_kv_memoryview())
    identical = all(
        bytes(rows.row(chunk_id)) == block_content(key, block_bytes) for key, chunk_id in zip(keys, spec.chunk_ids)
    )
    rows.release()
    with manager.lock:
        manager.complete_load(keys, ctx)
        manager.on_request_finished(ctx)
    verdict = "identical bytes" if identical else "DIFFERENT bytes"
    print(f"engine B (pid {os.getpid()}): promoted {len(keys)} blocks from Redis in {steps} steps: {verdict}")
    return identical


def server_answers(url: str) -> str | None:
    """Return None if the server at `url` answers PING, else why not."""
    server = parse_server_url(url)
    connection = RespConnection(
        server.address, ConnectOptions(1.0, 1.0, server.username, server.password, server.db)
    )
    try:
        connection.connect()
        connection.send([encode_command(b"PING")])
        reply = connection.read_reply()
        return None if reply == b"PONG" else f"PING answered {reply!r}"
    except OSError as exc:
        return str(exc) or type(exc).__name__
    finally:
        connection.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a Redis server (default: start a throw-away redis-server)")
    parser.add_argument("--namespace", default=f"redis-share-demo-{os.getpid()}")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block-bytes", type=int, default=256 << 10)
    parser.add_argument("--role", choices=["both", "store", "load"], default="both", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    keys = prompt_keys("the shared system prompt", args.blocks)

    if args.role != "both":
        tiers = [{"type": "redis", "url": args.url, "namespace": args.namespace}]
        manager = EngineSpec(args.blocks, args.block_bytes, tiers).get_manager()
        try:
            if args.role == "store":
                run_store(manager, keys, args.block_bytes)
                return 0
            return 0 if run_load(manager, keys, args.block_bytes) else 1
        finally:
            manager.shutdown()

    server: LocalRedisServer | None = None
    url = args.url
    if url is None:
        if redis_server_path() is None:
            print("No Redis server available: pass --url redis://host:port, or install redis-server "
                  "(Debian: apt-get install redis-server). Nothing to show.")  # fmt: skip
            return 0
        server = LocalRedisServer().start()
        url = server.url
        print(f"started a throw-away redis-server at {url}")
    try:
        problem = server_answers(url)
        if problem is not None:
            print(f"No Redis server answers at {url}: {problem}")
            return 1
        common = [sys.executable, __file__, "--url", url, "--namespace", args.namespace,
                  "--blocks", str(args.blocks), "--block-bytes", str(args.block_bytes)]  # fmt: skip
        for role in ("store", "load"):
            code = subprocess.call([*common, "--role", role])
            if code != 0:
                return code
        return 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
