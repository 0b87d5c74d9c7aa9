"""Two vLLM engines share KV blocks through Redis, with kvref's `RedisTier` in vLLM's own tiering.

    python examples/vllm_redis_tier.py                        # starts a throw-away redis-server
    python examples/vllm_redis_tier.py --url redis://host:6379
    python examples/vllm_redis_tier.py --url redis://node1:7000 --cluster

Each engine is a separate process running vLLM 0.33's real offloading code on the CPU: its
`TieringOffloadingSpec` builds a `TieringOffloadingManager` over a CPU primary tier with kvref's
`RedisTier` as the secondary tier, from the same `kv_connector_extra_config` a `vllm serve
--kv-transfer-config` line would carry, and `examples/vllm_engine.py` plays vLLM's scheduler and
GPU worker around it. Engine A serves a prompt; engine B, with an empty CPU tier of its own,
serves the same prompt and gets its blocks from Redis, byte for byte.

It needs vLLM 0.33 (`pip install 'kvref[vllm]'`; `make test` builds a CPU-only environment with
it, `.venv-vllm`) and a Redis server; without either it says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvref.tiering.redis.local import LocalRedisCluster, LocalRedisServer, redis_server_path

__all__ = ["main"]


def _vllm_missing() -> str | None:
    """None if vLLM 0.33 and kvref's vLLM tiers import here, else what is wrong."""
    try:
        importlib.import_module("kvref.integrations.vllm")  # the tier vLLM loads by module path
        importlib.import_module("examples.vllm_engine")
    except ImportError as exc:
        return str(exc)
    return None


def _engine_process(url: str, cluster: bool, role: str, prompt: str, blocks: int) -> int:
    from examples.vllm_engine import Engine, WrongBytes, prompt_keys

    tier = {"type": "RedisTier", "module_path": "kvref.integrations.vllm", "url": url, "cluster": cluster}
    engine = Engine([tier])
    keys = prompt_keys(prompt, blocks)
    try:
        hits = engine.serve(f"{role}-request", keys)
        engine.settle()
        print(json.dumps({"pid": os.getpid(), "role": role, "hits": hits, "blocks": blocks, "steps": engine.steps}))
        return 0
    except WrongBytes as exc:
        print(f"engine {role} (pid {os.getpid()}): {exc}")
        return 1
    finally:
        engine.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a Redis server or cluster node (default: start a throw-away redis-server)")
    parser.add_argument("--cluster", action="store_true", help="--url is a node of a Redis Cluster")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--role", choices=["A", "B"], help=argparse.SUPPRESS)
    # A prompt of this run's own, so blocks an earlier run left on the server are not hits.
    parser.add_argument("--prompt", default=f"a system prompt {os.getpid()}-{time.time_ns()}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    missing = _vllm_missing()
    if missing is not None:
        print(f"{missing}; or run this with the interpreter `make test` builds, "
              ".venv-vllm/bin/python. Nothing to show.")  # fmt: skip
        return 0
    if args.role is not None:
        return _engine_process(args.url, args.cluster, args.role, args.prompt, args.blocks)

    server: LocalRedisServer | LocalRedisCluster | None = None
    url = args.url
    if url is None:
        if redis_server_path() is None:
            print("No Redis server available: pass --url redis://host:port, or install redis-server "
                  "(Debian: apt-get install redis-server). Nothing to show.")  # fmt: skip
            return 0
        server = (LocalRedisCluster(3) if args.cluster else LocalRedisServer()).start()
        url = server.url
        print(f"started a throw-away redis-server{' cluster' if args.cluster else ''} at {url}")
    try:
        common = [sys.executable, __file__, "--url", url, "--blocks", str(args.blocks), "--prompt", args.prompt]
        if args.cluster:
            common.append("--cluster")
        outcomes: dict[str, dict[str, Any]] = {}
        for role in ("A", "B"):
            done = subprocess.run([*common, "--role", role], capture_output=True, text=True)
            if done.returncode != 0:
                print(f"engine {role} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
                return done.returncode or 1
            outcomes[role] = json.loads(done.stdout.strip().splitlines()[-1])
        for role, outcome in outcomes.items():
            print(f"engine {role} (pid {outcome['pid']}): {outcome['hits']} of {outcome['blocks']} blocks "
                  f"came from the offloading tiers, in {outcome['steps']} scheduler steps")  # fmt: skip
        if outcomes["A"]["hits"] != 0 or outcomes["B"]["hits"] != args.blocks:
            print("unexpected: engine B should find every block engine A stored")
            return 1
        print("engine B served the whole prompt from Redis, byte for byte")
        return 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
