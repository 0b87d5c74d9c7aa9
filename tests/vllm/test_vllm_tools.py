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
        "bench_vllm_tiers.py", "--total", "8M", "--block", "256K", "--repeats", "1",
        "--url", redis_server.url, "--dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for line in ("kvref FileSystemTier", "kvref RedisTier", "FileSystemTier >= 1.0x of vLLM fs"):
        assert line in done.stdout
