"""Smoke test of `tools/bench_tiering.py`'s disk parts: cold loads against the device's O_DIRECT
baseline, the buffered fallback, and page-cache residency, run tiny (figures are measured, not
tested; the residency bound has its own test in tests/tiering/test_fs_page_cache.py)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvref.tiering.fs.format import file_bytes
from kvref.tiering.fs.pool import default_threads

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
        "transparent huge pages: ",
        "tier roots of finished rounds: kept until the run ends",
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



def test_drop_page_cache_methods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [str(TOOLS), *sys.path])
    disk_bench = importlib.import_module("_disk_bench")
    methods: dict[str, str] = disk_bench.COLD_METHODS
    assert set(disk_bench.COLD_CHOICES) == {"auto", *methods}
    # Only drop_caches_all drops the metadata caches; the default drops file data, as fadvise.
    assert "dentries and inodes" in methods["drop_caches_all"]
    assert "dentries" not in methods["drop_caches"]
    (tmp_path / "block").write_bytes(b"x" * 8192)
    assert disk_bench.drop_page_cache([tmp_path], "fadvise") == "fadvise"
    assert disk_bench.drop_page_cache([tmp_path]) == ("drop_caches" if os.geteuid() == 0 else "fadvise")
    with pytest.raises(ValueError, match="drop_caches_all"):
        disk_bench.drop_page_cache([tmp_path], "drop_cache")


def test_spent_roots_stay_until_the_run_ends_unless_the_disk_lacks_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [str(TOOLS), *sys.path])
    disk_bench = importlib.import_module("_disk_bench")
    root = tmp_path / "tier-0"
    root.mkdir()
    (root / "block").write_bytes(b"x" * 4096)
    kept = disk_bench.SpentRoots(tmp_path, 1 << 20)
    kept.done(root)
    assert kept.keep and root.exists() and "kept until the run ends" in kept.line
    deleted = disk_bench.SpentRoots(tmp_path, 1 << 62)  # more than any disk here
    deleted.done(root)
    assert not deleted.keep and not root.exists() and "deleted at once" in deleted.line


def test_bench_tiering_plain_block_files_run_beside_the_tier(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable, str(TOOLS / "bench_tiering.py"), "--total", "8M", "--block-sizes", "1M", "--repeats", "1",
            "--cold", "fadvise", "--skip-residency", "--skip-behind", "--skip-scheduler", "--plain", "--dir", str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=TOOLS.parent,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    writers, readers = (default_threads(read=read, direct=True, file_bytes=file_bytes(32, 1 << 20)) for read in (False, True))
    assert f"plain C block files, {writers} / {readers + writers} thr" in done.stdout  # the tier's threads
    assert "the same, + checksum and copy" in done.stdout
    assert not list(tmp_path.iterdir()), "the benchmark left files behind"


@pytest.mark.parametrize("work", [False, True])
def test_plain_block_files_are_the_tiers_size_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, work: bool
) -> None:
    monkeypatch.setattr(sys, "path", [str(TOOLS), *sys.path])
    disk_bench = importlib.import_module("_disk_bench")
    plain = disk_bench.PlainBlockFiles(tmp_path, 12, 64 << 10, (3, 5), work=work)
    root = tmp_path / "root"
    assert plain.write(root) > 0
    files = sorted(path for path in root.rglob("*") if path.is_file())
    assert len(files) == 12 and all(path.suffix == ".blk" for path in files)  # renamed into place
    assert {path.stat().st_size for path in files} == {4096 + (64 << 10)}  # a header page + payload
    assert plain.read(root) > 0
    files[0].unlink()
    with pytest.raises(OSError, match="open"):
        plain.read(root)  # a missing file is an error, not a short phase
