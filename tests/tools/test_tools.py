"""Smoke tests of the maintenance tools: the benchmarks run tiny, and every other tool answers
--help.

The figures themselves are not asserted (benchmarks are measured, not tested); these tests only
keep the tools from rotting as the library changes under them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
# Tools that import vLLM run in its environment: tests/vllm/test_vllm_tools.py covers them.
NEEDS_VLLM = frozenset({"bench_vllm_tiers.py", "conformance_rules.py"})
RUNNABLE = sorted(p for p in TOOLS.glob("*.py") if not p.name.startswith("_") and p.name not in NEEDS_VLLM)
# Tools a test below (or tests/tools/test_bench_disk.py) runs for real: their --help adds nothing.
RUN_TINY = frozenset({"bench_manager.py", "bench_transfer.py", "profile_audit_stages.py", "bench_tiering.py"})
HELP_ONLY = [p for p in RUNNABLE if p.name not in RUN_TINY]


def run_tool(tool: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(tool), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=TOOLS.parent,
        check=False,
    )


def test_there_are_tools() -> None:
    assert {p.name for p in RUNNABLE} >= {"bench_manager.py", "bench_tiering.py", "bench_transfer.py"}


@pytest.mark.parametrize("tool", HELP_ONLY, ids=[p.name for p in HELP_ONLY])
def test_tool_answers_help(tool: Path) -> None:
    result = run_tool(tool, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout.lower()


def test_bench_manager_runs_tiny() -> None:
    result = run_tool(
        TOOLS / "bench_manager.py", "--sizes", "200", "--policies", "lru", "--repeat", "1"
    )
    assert result.returncode == 0, result.stderr
    assert "lru" in result.stdout


def test_bench_transfer_runs_tiny(tmp_path: Path) -> None:
    plot = tmp_path / "transfer.png"
    result = run_tool(
        TOOLS / "bench_transfer.py", "--sizes", "4K,64K", "--total-mib", "1", "--repeats", "1",
        "--device", "cpu", "--plot", str(plot),
    )
    assert result.returncode == 0, result.stderr
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_profile_audit_stages_runs_on_a_directory() -> None:
    result = run_tool(TOOLS / "profile_audit_stages.py", "--path", "kvref/audit", "--step", "4")
    assert result.returncode == 0, result.stderr
    for stage in ("parse", "free", "extraction", "pickling"):
        assert stage in result.stdout
    # The cold run's stages, each with its wall seconds.
    for stage in ("start-up", "configure and discover", "summarise", "index", "check", "report"):
        assert re.search(rf"^  {stage} +\d+\.\d{{3}} s", result.stdout, re.MULTILINE), stage
