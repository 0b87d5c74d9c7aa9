"""Smoke test of `tools/bench_tiering.py`'s disk parts: cold loads against the device's O_DIRECT
baseline, the buffered fallback, and page-cache residency, run tiny (figures are measured, not
tested; the residency bound has its own test in tests/tiering/test_fs_page_cache.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"
TINY = (
    "--total", "8M", "--block-sizes", "256K", "--repeats", "1", "--fallback", "--cold", "fadvise",
    "--residency-total", "8M", "--steps", "5",
)  # fmt: skip


def test_bench_tiering_runs_tiny(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(TOOLS / "bench_tiering.py"), *TINY, "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=TOOLS.parent,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for line in (
        "O_DIRECT files, 1 MiB x 8 streams",
        "FileSystemSecondaryTier (defaults)",
        "the tier, buffered fallback",
        "256 KiB: the tier >= 0.8x of the device",
        "cold loads: os.sync(), then posix_fadvise(DONTNEED)",
        "page cache <= 10% of the stored bytes, O_DIRECT:",
        "page cache <= 10% of the stored bytes, buffered fallback (O_DIRECT refused):",
        "scheduler-thread cost per call",
    ):
        assert line in done.stdout, line
    assert not list(tmp_path.iterdir()), "the benchmark left files behind"
