"""Two engine processes share offloaded KV blocks through Redis.

    python examples/redis_share.py                       # starts a throw-away redis-server
    python examples/redis_share.py --url redis://host:6379

Engine A (a process with its own primary region) stores blocks: GPU -> CPU primary (simulated by
writing the rows) -> cascade to the Redis tier. Engine B (another process, another region) has
never seen them: its lookups go to Redis, the blocks are promoted into its primary, and it
checks that it reads exactly the bytes A stored. Without a server (no --url and no
`redis-server` installed) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvref.base import OffloadKey, ReqContext, make_offload_key
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.shared_region import SharedOffloadRegion
from kvref.tiering.base import PrimaryBlocks
from kvref.tiering.manager import TieringOffloadingManager, create_tiering_manager
from kvref.tiering.redis.local import LocalRedisServer, redis_server_path
from kvref.tiering.redis.resp import ConnectOptions, RespConnection, encode_command
from kvref.tiering.redis.routing import parse_server_url

__all__ = ["main", "block_content", "prompt_keys"]

_TIMEOUT_S = 20.0


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


def make_engine(url: str, namespace: str, num_blocks: int, block_bytes: int, region_dir: str) -> TieringOffloadingManager:
    region = SharedOffloadRegion(
        f"redis-share-{os.getpid()}", num_blocks, block_bytes, directory=region_dir, prefault=False
    )
    return create_tiering_manager(region, [{"type": "redis", "url": url, "namespace": namespace}])


def step_until(
    manager: TieringOffloadingManager, done: Callable[[], bool], probe: OffloadKey, ctx: ReqContext
) -> None:
    """End steps (which also collects finished jobs) until `done()` is true."""
    deadline = time.monotonic() + _TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("the Redis tier did not finish in time")
        manager.end_step()
        manager.lookup(probe, ctx)  # a step's first lookup collects finished jobs
        time.sleep(0.002)


def run_store(manager: TieringOffloadingManager, keys: list[OffloadKey], block_bytes: int) -> None:
    ctx = ReqContext("engine-a")
    output = manager.prepare_store(keys, ctx)
    assert output is not None and isinstance(output.store_spec, CPULoadStoreSpec)
    rows = PrimaryBlocks(manager.primary.get_kv_memoryview())
    for key, block_id in zip(output.keys_to_store, output.store_spec.block_ids):
        rows.row(block_id)[:] = block_content(key, block_bytes)  # what the GPU would copy
    manager.complete_store(output.keys_to_store, ctx)  # cascades to Redis
    step_until(manager, lambda: manager.num_inflight_jobs == 0, keys[0], ctx)
    print(f"engine A (pid {os.getpid()}): stored {len(keys)} blocks of {block_bytes} bytes in Redis")


def run_load(manager: TieringOffloadingManager, keys: list[OffloadKey], block_bytes: int) -> bool:
    ctx = ReqContext("engine-b")
    deadline = time.monotonic() + _TIMEOUT_S
    steps = 0
    while True:
        answers = [manager.lookup(key, ctx) for key in keys]
        if all(answer is True for answer in answers):
            break
        if False in answers:
            print(f"engine B (pid {os.getpid()}): block {answers.index(False)} is not in Redis")
            return False
        if time.monotonic() > deadline:
            raise TimeoutError("promotion from Redis did not finish in time")
        manager.end_step()  # submits the promotions staged by this step's lookups
        steps += 1
        time.sleep(0.002)
    spec = manager.prepare_load(keys, ctx)
    rows = PrimaryBlocks(manager.primary.get_kv_memoryview())
    identical = all(
        bytes(rows.row(block_id)) == block_content(key, block_bytes)
        for key, block_id in zip(keys, spec.block_ids)
    )
    manager.complete_load(keys, ctx)
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
        with tempfile.TemporaryDirectory(prefix="kvref-region-") as region_dir:
            manager = make_engine(args.url, args.namespace, args.blocks, args.block_bytes, region_dir)
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
