"""Smoke tests of the tools that import vLLM (the others are in tests/tools): they run tiny here.

Their figures are measured, not tested: these only keep the tools from rotting.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kvref.tiering.redis.local import LocalRedisServer
from tests.tools.test_tools import NEEDS_VLLM

_ROOT = Path(__file__).resolve().parents[2]


def run_tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(_ROOT / "tools" / name), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=_ROOT,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
    )


def test_vllm_tools_answer_help() -> None:
    for name in sorted(NEEDS_VLLM | {"vllm_suite.py", "vllm_env.py"}):
        done = run_tool(name, "--help")
        assert done.returncode == 0 and "usage" in done.stdout.lower(), (name, done.stderr)


def test_bench_vllm_tiers_runs_tiny(redis_server: LocalRedisServer, tmp_path: Path) -> None:
    done = run_tool(
        "bench_vllm_tiers.py", "--fs-total", "8M", "--fs-blocks", "256K", "--repeats", "1",
        "--engines", "2", "--engines-block", "256K", "--engine-repeats", "1", "--cold", "fadvise",
        "--redis-total", "8M", "--redis-block", "256K", "--url", redis_server.url, "--dir", str(tmp_path), "--plain",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for line in (
        "vLLM fs (16+16 threads, O_DIRECT)",
        "kvref FileSystemTier (32+32, O_DIRECT)",
        "tier roots of finished rounds: kept until the run ends",
        "kvref FileSystemTier / vLLM fs",
        "256 KiB: kvref FileSystemTier >= 1.0x of vLLM fs, store and load",
        "kvref FileSystemTier >= 0.8x of the device",
        "plain C block files, 32 / 64 thr",  # kvref's threads at 256 KiB
        "plain C + checksum, copy / vLLM fs",
        "2 engines loading at once from one root",
        "cold loads: os.sync(), then posix_fadvise(DONTNEED)",
        "kvref RedisTier",
        "RedisTier >= 0.8x of redis-py pipeline",
    ):
        assert line in done.stdout, line
    assert not list(tmp_path.iterdir()), "the benchmark left files behind"
