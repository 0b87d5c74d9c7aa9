"""kvref's `RedisTier` inside vLLM's own tiering manager: sharing between engines, and faults.

Engines here are vLLM's real offloading code driven as its scheduler drives it
(examples/vllm_engine.py). Every block an engine loads is checked byte for byte, so "no wrong
bytes" holds throughout; an exception raised inside vLLM's manager (its assertions on job
reports, say) would fail the test where it happens.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from examples.vllm_engine import Engine, prompt_keys
from kvref.tiering.redis.local import LocalRedisCluster, LocalRedisServer
from kvref.tiering.redis.value_format import HEADER_BYTES

_ROOT = Path(__file__).resolve().parents[2]
_BLOCK_BYTES = 64 << 10


def redis_tier(url: str, namespace: str, **options: Any) -> dict[str, Any]:
    return {
        "type": "RedisTier",
        "module_path": "kvref.integrations.vllm",
        "url": url,
        "namespace": namespace,
        "connect_timeout_s": 0.3,
        "socket_timeout_s": 0.3,
        **options,
    }


def engine(url: str, namespace: str, **options: Any) -> Engine:
    return Engine([redis_tier(url, namespace, **options)], num_chunks=16, block_bytes=_BLOCK_BYTES)


def serve_alone(url: str, namespace: str, prompt: str, blocks: int) -> int:
    """A fresh engine (empty CPU tier) serves one request; return its hits."""
    fresh = engine(url, namespace)
    try:
        hits = fresh.serve("probe", prompt_keys(prompt, blocks))
        fresh.settle()
        return hits
    finally:
        fresh.close()


# --- two processes share blocks ---


def _run_example(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(_ROOT), "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run(
        [sys.executable, str(_ROOT / "examples" / "vllm_redis_tier.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_two_engine_processes_share_blocks(redis_server: LocalRedisServer) -> None:
    out = _run_example("--url", redis_server.url, "--blocks", "8")
    assert "engine A (pid" in out and ": 0 of 8 blocks came from the offloading tiers" in out
    assert "engine B served the whole prompt from Redis, byte for byte" in out


def test_two_engine_processes_share_blocks_through_a_cluster(redis_cluster: LocalRedisCluster) -> None:
    out = _run_example("--url", redis_cluster.url, "--cluster", "--blocks", "12")
    assert ": 12 of 12 blocks came from the offloading tiers" in out
    # The blocks really are spread over the nodes.
    holding = [node for node in redis_cluster.nodes if node.command("DBSIZE") != 0]
    assert len(holding) >= 2


# --- faults ---


def test_server_killed_and_restarted_mid_run(tmp_path: Path) -> None:
    namespace = f"restart-{uuid.uuid4().hex}"
    with LocalRedisServer() as server:
        running = engine(server.url, namespace)
        try:
            assert running.serve("before", prompt_keys("before", 8)) == 0
            running.settle()
            assert serve_alone(server.url, namespace, "before", 8) == 8  # stored in Redis

            server.kill()  # mid-run: the engine keeps serving from its CPU tier
            assert running.serve("during-1", prompt_keys("during", 6)) == 0
            assert running.serve("during-2", prompt_keys("during", 6)) == 6  # from the CPU tier
            for index in range(3):  # more than the CPU tier holds: cascades fail, nothing raises
                running.serve(f"during-more-{index}", prompt_keys(f"during-{index}", 6))
            running.settle()

            server.start()  # same port, empty (nothing persisted)
            # Recovered within moments (a server that just failed is retried after a brief
            # hold-off): blocks stored from now on reach Redis, for any engine.
            deadline = time.monotonic() + 5.0
            for attempt in itertools.count():
                prompt = f"after-{attempt}"
                assert running.serve(prompt, prompt_keys(prompt, 8)) == 0
                running.settle()
                if serve_alone(server.url, namespace, prompt, 8) == 8:
                    break
                assert time.monotonic() < deadline, "stores did not reach the restarted server"
                time.sleep(0.05)
        finally:
            running.close()
        assert serve_alone(server.url, namespace, "before", 8) == 0  # lost with the old server


def test_values_corrupted_in_place_are_misses_and_deleted(redis_server: LocalRedisServer) -> None:
    namespace = f"corrupt-{uuid.uuid4().hex}"
    writer = engine(redis_server.url, namespace)
    keys = prompt_keys("corrupt", 8)
    try:
        assert writer.serve("write", keys) == 0
        writer.settle()
    finally:
        writer.close()
    prefix = f"{namespace}:{writer.block_bytes}:"
    damaged = keys[5]
    redis_key = prefix + damaged.hex()
    old = redis_server.command("GETRANGE", redis_key, str(HEADER_BYTES + 100), str(HEADER_BYTES + 100))
    assert isinstance(old, bytes) and len(old) == 1
    redis_server.command("SETRANGE", redis_key, str(HEADER_BYTES + 100), bytes([old[0] ^ 0xFF]))

    # The damaged block fails its promotion; the five before it were loaded and kept. The
    # tier deleted the damaged value, and the request, computing the block again, stored it
    # again: whole, as any engine now finds it.
    assert serve_alone(redis_server.url, namespace, "corrupt", 8) == 5
    position = str(HEADER_BYTES + 100)
    assert redis_server.command("GETRANGE", redis_key, position, position) == old
    assert serve_alone(redis_server.url, namespace, "corrupt", 8) == 8


def test_maxmemory_eviction_is_only_ever_a_miss(tmp_path: Path) -> None:
    namespace = f"maxmemory-{uuid.uuid4().hex}"
    with LocalRedisServer(["--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru"]) as server:
        writer = engine(server.url, namespace)
        try:
            for index in range(12):  # 12 prompts x 6 blocks x 64 KiB = 4.5 MiB > 2 MiB
                writer.serve(f"w{index}", prompt_keys(f"prompt-{index}", 6))
                writer.settle()
        finally:
            writer.close()
        info = server.command("INFO", "stats")
        assert isinstance(info, bytes) and b"evicted_keys:0\r\n" not in info
        # Engines that never saw these prompts, newest first (each one stores what it missed,
        # evicting more): every hit loads the right bytes, evicted blocks are misses, and what
        # the server kept is served. (Redis's LRU is approximate: which blocks it kept is not.)
        hits = [serve_alone(server.url, namespace, f"prompt-{index}", 6) for index in reversed(range(12))]
        assert 0 < sum(hits) < 12 * 6
