"""FileSystemSecondaryTier in one process: round trips, the root's layout, sharing it, capacity,
O_DIRECT and its fallback, and fault injection (processes sharing a root: test_fs_engines.py).

Faults are injected by monkeypatching the `os` functions the I/O threads call (tests run as
root, so chmod would not deny anything). Whatever the fault, the scheduler-side calls never
raise, and a load either reports success with the exact bytes or reports failure.
"""

from __future__ import annotations

import errno
import json
import logging
import mmap
import multiprocessing
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.base import LookupResult, Medium, OffloadingEvent, OffloadKey, ReqContext, make_offload_key
from kvref.errors import KVRefError
from kvref.tiering.base import JobResult, TransferJob
from kvref.tiering.fs import (
    CONFIG_FILE_NAME,
    RECORD_HEADER_BYTES,
    FileSystemSecondaryTier,
    TierRootError,
)
from kvref.tiering.fs import block_io, tier as tier_module
from kvref.tiering.fs.block_io import Transfer
from kvref.tiering.fs.format import file_bytes, header_bytes
from kvref.tiering.run_identity import run_identity
from kvref.tiering.tier_reporting import KvrefTierMetrics
from tests.tiering.helpers import BLOCK_BYTES, CTX, content, make_spec, make_view, resolve, to_key, to_keys

SPEC = make_spec(kv_events=True)
NUM_BLOCKS = 8
RECORD = file_bytes(12, BLOCK_BYTES)  # the block file of a 12-byte test key
HEADER = RECORD_HEADER_BYTES + 12  # the bytes of its header the checksums cover
PAYLOAD = header_bytes(12)  # where its payload starts


def fs_tier(view: memoryview, root: Any, **options: Any) -> FileSystemSecondaryTier:
    """A tier of the test spec's engine under `root` (its blocks: under `root/<run identity>`)."""
    return FileSystemSecondaryTier(SPEC, view, "fs", root_dir=root, **options)


def metric(tier: FileSystemSecondaryTier, name: str) -> float:
    """The tier's value of metric `name` since it was last asked (0 if none)."""
    _, values = tier.get_stats().metric_sections()
    return values.get(name, {}).get(("fs",), 0)


def outcomes(results: Iterable[JobResult]) -> list[tuple[int, bool, Any]]:
    """(job id, success, successful keys) of each result: what a tier decides, not what it measured."""
    return [(result.job_id, result.success, result.successful_keys) for result in results]


RUN = r"kvref-tests_model_[0-9a-f]{12}_r0"
"""The run identity of the test spec's engine, as a pattern."""


def run_dir(root: Path) -> Path:
    """Where the test spec's engine keeps its blocks under `root`."""
    return root / run_identity(SPEC)


def aligned_view(num_blocks: int, block_bytes: int) -> memoryview:
    """A page-aligned primary, as vLLM's and kvref's shared regions are (zero-copy O_DIRECT)."""
    return memoryview(mmap.mmap(-1, num_blocks * block_bytes)).cast("B", (num_blocks, block_bytes))


class Harness:
    """A tier over a primary of `block_bytes` rows, with helpers to run jobs to completion."""

    def __init__(self, root: Path, view: memoryview | None = None, **kwargs: Any) -> None:
        self.root_dir = root
        self.view = view if view is not None else make_view(NUM_BLOCKS)
        self.block_bytes = self.view.strides[0] if self.view.strides else BLOCK_BYTES
        self.rows = self.view.cast("B")
        kwargs.setdefault("n_read_threads", 2)
        kwargs.setdefault("n_write_threads", 2)
        kwargs.setdefault("enable_kv_events", True)
        self.tier = fs_tier(self.view, root, **kwargs)
        self.root = self.tier.root_dir  # root_dir/<run identity>: where the blocks are
        self.job_ids = 0

    def row(self, block_id: int) -> bytes:
        size = self.block_bytes
        return bytes(self.rows[block_id * size : (block_id + 1) * size])

    def fill(self, keys: list[OffloadKey], block_ids: list[int]) -> None:
        size = self.block_bytes
        for key, block_id in zip(keys, block_ids):
            self.rows[block_id * size : (block_id + 1) * size] = content(key, size)

    def job(self, keys: list[OffloadKey], block_ids: list[int], promotion: bool) -> TransferJob:
        self.job_ids += 1
        return TransferJob(self.job_ids, tuple(keys), tuple(block_ids), promotion, CTX)

    def has(self, key: OffloadKey) -> bool:
        """Whether the tier answers HIT for `key`, once its lookup thread has checked."""
        return resolve(self.tier, key) is LookupResult.HIT

    def store(self, keys: list[OffloadKey], block_ids: list[int] | None = None) -> bool:
        block_ids = block_ids if block_ids is not None else list(range(len(keys)))
        self.fill(keys, block_ids)
        self.tier.submit_store(self.job(keys, block_ids, promotion=False))
        return self.finish()

    def load(self, keys: list[OffloadKey], block_ids: list[int]) -> bool:
        size = self.block_bytes
        for block_id in block_ids:
            self.rows[block_id * size : (block_id + 1) * size] = bytes(size)
        self.tier.submit_load(self.job(keys, block_ids, promotion=True))
        return self.finish()

    def finish(self) -> bool:
        self.tier.drain_jobs()
        results = list(self.tier.get_finished_jobs())
        assert [result.job_id for result in results] == [self.job_ids]
        self.last_result: JobResult = results[0]
        return results[0].success

    def files(self, suffix: str = ".kvb") -> list[Path]:
        return sorted(path for path in self.root.rglob(f"*{suffix}") if path.is_file())

    def close(self) -> None:
        self.tier.shutdown()
        self.rows.release()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Every test runs on both paths of the block-file I/O (the C extension and Python), but
    # those marked python_io: they inject faults or gates through `os`, which only the Python
    # path calls (test_fs_batch_io holds the two paths to each other).
    if "io_path" in metafunc.fixturenames:
        python_only = metafunc.definition.get_closest_marker("python_io") is not None
        metafunc.parametrize("io_path", ["python"] if python_only else ["native", "python"], indirect=True)


@pytest.fixture(autouse=True)
def io_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    path: str = getattr(request, "param", "python")
    if path == "python":
        monkeypatch.setattr(block_io, "NATIVE_BATCH_IO", None)
    elif block_io.NATIVE_BATCH_IO is None:
        pytest.skip("the C extension kvref.tiering.fs._batch_io was not built (test_fs_batch_io says why)")
    return path


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "fs")
    yield h
    h.close()


def file_of(h: Harness, key: OffloadKey) -> Path:
    return Path(h.tier.block_path(key))


def age(path: Path, seconds: float) -> None:
    """Set `path`'s modification time `seconds` in the past."""
    when = time.time() - seconds
    os.utime(path, (when, when))


# --- normal operation ---


def test_store_then_load_round_trip(harness: Harness) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.tier.direct  # tmp_path is on a filesystem that takes O_DIRECT
    assert not harness.has(k1)
    assert harness.store([k1, k2], [0, 1])
    assert harness.has(k1)
    # One file per block: root/<hh>/<xxh3-128 of the key>.kvb, header page then payload page.
    assert [p.relative_to(harness.root).parts for p in harness.files()] == sorted(
        (p.parent.name, p.name) for p in map(Path, map(harness.tier.block_path, (k1, k2)))
    )
    assert all(re.fullmatch(r"[0-9a-f]{2}/([0-9a-f]{32})\.kvb", str(p.relative_to(harness.root))) for p in harness.files())
    assert all(p.parent.name == p.name[:2] for p in harness.files())
    assert [p.stat().st_size for p in harness.files()] == [RECORD, RECORD] == [2 * 4096] * 2
    assert harness.tier.location(k2) == (str(file_of(harness, k2)), PAYLOAD, RECORD)
    assert harness.load([k2, k1], [5, 6])
    assert harness.row(5) == content(k2) and harness.row(6) == content(k1)
    assert harness.tier.take_events() == [OffloadingEvent([k1, k2], Medium.STORAGE, removed=False, ownership="fs")]
    assert harness.files(".tmp") == []


@pytest.mark.parametrize("block_bytes", [4096, 3 * 4096, 1000])
def test_a_page_aligned_primary_moves_blocks_without_copies(tmp_path: Path, block_bytes: int) -> None:
    h = Harness(tmp_path / "fs", aligned_view(4, block_bytes), huge_page_staging=False)
    try:
        assert h.tier.direct
        # Rows of whole pages go straight between the device and the row; others through a
        # bounce buffer (O_DIRECT takes only whole pages).
        assert h.tier.transfer is (Transfer.ZERO_COPY if block_bytes % 4096 == 0 else Transfer.BOUNCE)
        keys = to_keys([1, 2])
        assert h.store(keys)
        assert [p.stat().st_size for p in h.files()] == [file_bytes(12, block_bytes)] * 2
        assert h.load(keys, [3, 2]) and (h.row(3), h.row(2)) == tuple(content(k, block_bytes) for k in keys)
    finally:
        h.close()


@pytest.mark.python_io
def test_pending_write_answers_none_and_lookup_never_waits(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    real_publish = block_io.publish_file

    def slow_publish(src: str, dst: str) -> None:
        gate.wait(5)
        real_publish(src, dst)

    monkeypatch.setattr(block_io, "publish_file", slow_publish)
    k1 = to_key(1)
    harness.fill([k1], [0])
    harness.tier.submit_store(harness.job([k1], [0], promotion=False))
    assert harness.tier.lookup(k1, CTX) is LookupResult.RETRY  # the write is stuck in an I/O thread
    assert resolve(harness.tier, k1, timeout_s=0.05) is LookupResult.RETRY  # not held yet
    assert list(harness.tier.get_finished_jobs()) == []
    gate.set()
    harness.tier.drain_jobs()
    assert outcomes(harness.tier.get_finished_jobs()) == [(harness.job_ids, True, None)]
    assert harness.has(k1)


def test_stored_blocks_are_not_written_twice(harness: Harness) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.store([k1])
    first = file_of(harness, k1)
    inode = first.stat().st_ino
    age(first, 100)
    assert harness.store([k1, k2, k2], [0, 1, 2])
    assert len(harness.files()) == 2 and first.stat().st_ino == inode
    assert time.time() - first.stat().st_mtime < 50  # storing it again counts as a use


def test_load_of_a_missing_block_fails_and_loads_the_others(harness: Harness) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.store([k1])
    assert not harness.load([k1, k2], [3, 4])
    # As vLLM's: the job fails, and the block that was there is loaded and reported as such.
    assert harness.last_result.successful_keys == (k1,)
    assert harness.row(3) == content(k1)
    assert harness.has(k1)  # k1 itself is fine
    assert not harness.load([k2], [4])
    assert harness.last_result.successful_keys is None  # nothing loaded: no partial success


@pytest.mark.parametrize("first_write_fails", [False, True])
def test_a_store_of_a_block_being_written_ends_with_that_write(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, first_write_fails: bool
) -> None:
    # Reported stored means a lookup finds the block: a second job naming a block the first is
    # still writing is not done before that write is (found by kvref.testing.vllm's programs).
    gate = threading.Event()
    real_write = block_io.BlockIO.write_blocks

    def gated_write(io: block_io.BlockIO, paths: Any, keys: Any, block_ids: Any, make_room: Any) -> Any:
        assert gate.wait(5)
        if first_write_fails:
            return [OSError(errno.EIO, "simulated")] * len(paths)
        return real_write(io, paths, keys, block_ids, make_room)

    monkeypatch.setattr(block_io.BlockIO, "write_blocks", gated_write)
    k = to_key(1)
    harness.fill([k, k], [0, 1])
    harness.tier.submit_store(harness.job([k], [0], promotion=False))
    harness.tier.submit_store(harness.job([k], [1], promotion=False))
    assert list(harness.tier.get_finished_jobs()) == []  # the second waits for the first's write
    assert harness.tier.lookup(k, CTX) is LookupResult.RETRY
    gate.set()
    harness.tier.drain_jobs()
    results = list(harness.tier.get_finished_jobs())  # both, in the first poll after the drain
    assert sorted((r.job_id, r.success) for r in results) == [(1, not first_write_fails), (2, not first_write_fails)]
    assert harness.has(k) is (not first_write_fails)


@pytest.mark.python_io
def test_fsync_makes_each_file_and_its_name_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The Python path's calls (test_fs_batch_io traces the C extension's with strace).
    synced: list[bool] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.path.isdir(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    h = Harness(tmp_path / "fs", fsync=True)
    assert h.store(to_keys([1, 2]))
    # Per block: the file before its rename, then its directory after it (two writers interleave).
    assert sorted(synced) == [False, False, True, True]
    h.close()


# --- capacity ---


def test_capacity_evicts_least_recently_used_blocks(tmp_path: Path) -> None:
    h = Harness(tmp_path / "fs", capacity_bytes=2 * RECORD)
    k1, k2, k3 = to_keys([1, 2, 3])
    assert h.store([k1], [0]) and h.store([k2], [1])
    age(file_of(h, k1), 20)
    age(file_of(h, k2), 10)
    h.tier.touch([k1], CTX)  # k1 is now the most recent
    h.tier.drain_jobs()
    h.tier.take_events()
    assert h.store([k3], [2])
    assert [h.has(k) for k in (k1, k2, k3)] == [True, False, True]
    assert h.tier.take_events() == [
        OffloadingEvent([k2], Medium.STORAGE, removed=True, ownership="fs"),
        OffloadingEvent([k3], Medium.STORAGE, removed=False, ownership="fs"),
    ]
    assert metric(h.tier, KvrefTierMetrics.CHUNKS_EVICTED) == 1
    assert len(h.files()) == 2 and h.tier.used_bytes == 2 * RECORD
    assert metric(h.tier, KvrefTierMetrics.USAGE_PERC) == 1.0
    h.close()


def test_a_load_marks_a_block_used(tmp_path: Path) -> None:
    h = Harness(tmp_path / "fs", capacity_bytes=2 * RECORD)
    k1, k2, k3 = to_keys([1, 2, 3])
    assert h.store([k1], [0]) and h.store([k2], [1])
    age(file_of(h, k1), 20)
    age(file_of(h, k2), 10)
    assert h.load([k1], [4])
    assert h.store([k3], [2])
    assert [h.has(k) for k in (k1, k2, k3)] == [True, False, True]
    h.close()


def test_touches_are_marked_at_most_once_a_second(harness: Harness) -> None:
    k1 = to_key(1)
    assert harness.store([k1])
    path = file_of(harness, k1)
    harness.tier.touch([k1], CTX)
    harness.tier.drain_jobs()
    age(path, 30)
    harness.tier.touch([k1, to_key(9)], CTX)  # marked a moment ago: no metadata write; 9 absent
    harness.tier.drain_jobs()
    assert time.time() - path.stat().st_mtime > 25


def test_a_job_never_evicts_its_own_blocks(tmp_path: Path) -> None:
    h = Harness(tmp_path / "fs", capacity_bytes=2 * RECORD)
    k1, k2, k3 = to_keys([1, 2, 3])
    assert h.store([k1], [0])
    # k1 is stored already and named by the job: k2 fits, k3 finds no room.
    assert not h.store([k1, k2, k3])
    assert [h.has(k) for k in (k1, k2, k3)] == [True, True, False]
    h.close()


def test_capacity_counts_the_files_of_every_writer(tmp_path: Path) -> None:
    # Another engine's blocks and its write in flight count: the root is bounded as a whole.
    other = Harness(tmp_path / "fs")
    assert other.store(to_keys([1, 2]))
    h = Harness(tmp_path / "fs", capacity_bytes=3 * RECORD)
    in_flight = file_of(h, to_key(7)).parent / f"{file_of(h, to_key(7)).name}.host-1-abcd.tmp"
    in_flight.parent.mkdir(exist_ok=True)
    in_flight.write_bytes(bytes(RECORD))
    assert h.store([to_key(3)], [0])  # 2 files + 1 in flight: the oldest block goes
    assert sorted(h.has(k) for k in to_keys([1, 2, 3])) == [False, True, True]
    assert in_flight.exists()  # a fresh temporary file of a live writer stays
    other.close()
    h.close()


@pytest.mark.python_io
def test_capacity_never_evicts_blocks_being_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(tmp_path / "fs", capacity_bytes=RECORD)
    k1, k2 = to_keys([1, 2])
    assert h.store([k1])
    gate = threading.Event()
    real_preadv = os.preadv

    def slow_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        gate.wait(5)
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", slow_preadv)
    h.tier.submit_load(h.job([k1], [3], promotion=True))
    load_id = h.job_ids
    h.tier.submit_store(h.job([k2], [1], promotion=False))  # k1 is being read: no room
    gate.set()
    h.tier.drain_jobs()
    assert sorted(outcomes(h.tier.get_finished_jobs())) == [(load_id, True, None), (h.job_ids, False, None)]
    assert h.has(k1) and not h.has(k2)
    h.close()


def test_many_domains_bound_the_root_and_evict_old_blocks_first(tmp_path: Path) -> None:
    # 512 files of capacity: 8 domains of 64 files. Filling it twice over leaves the root at
    # most at capacity, and the second fill's blocks (newer) survive far more than the first's.
    capacity = 512 * RECORD
    h = Harness(tmp_path / "fs", make_view(64), capacity_bytes=capacity, n_write_threads=4)
    try:
        assert h.tier._capacity.domains == 8  # pyright: ignore[reportPrivateUsage]
        first = to_keys(range(512))
        second = to_keys(range(512, 1024))
        for start in range(0, 512, 64):
            assert h.store(first[start : start + 64])
        for key in first:  # (uneven domains evicted a few already)
            if file_of(h, key).exists():
                age(file_of(h, key), 100)
        for start in range(0, 512, 64):
            assert h.store(second[start : start + 64])
        assert sum(p.stat().st_size for p in h.files()) <= capacity
        kept_first = sum(h.has(k) for k in first)
        kept_second = sum(h.has(k) for k in second)
        # Uneven domains keep some old blocks; none is kept while its domain evicts a new one.
        assert kept_second > 4 * kept_first and kept_first + kept_second == len(h.files())
    finally:
        h.close()


# --- sharing a root ---


def test_tiers_on_one_root_share_blocks(tmp_path: Path) -> None:
    a = Harness(tmp_path / "fs")
    b = Harness(tmp_path / "fs")  # no lock: a second tier on the root is welcome
    k1, k2 = to_keys([1, 2])
    assert not b.has(k1)
    assert a.store([k1])
    assert [b.has(k) for k in (k1, k2)] == [True, False]
    assert b.load([k1], [3]) and b.row(3) == content(k1)
    assert b.store([k1, k2])  # k1 is there already: only k2 is written
    assert a.load([k2], [4]) and a.row(4) == content(k2)
    # What one evicts or loses is a miss for the other.
    file_of(a, k2).unlink()
    assert not a.has(k2) and not b.has(k2)
    a.close()
    b.close()


def test_blocks_another_engine_evicts_are_announced_removed_once_seen_gone(tmp_path: Path) -> None:
    # A's events said it stored k1; B's eviction of k1 must not leave A's consumers believing it.
    a = Harness(tmp_path / "fs", capacity_bytes=8 * RECORD)
    b = Harness(tmp_path / "fs", capacity_bytes=2 * RECORD)
    k1 = to_key(1)
    assert a.store([k1])
    assert a.tier.take_events() == [OffloadingEvent([k1], Medium.STORAGE, removed=False, ownership="fs")]
    age(file_of(a, k1), 10)
    assert b.store(to_keys([2, 3]))  # one domain: k1 is the oldest and goes
    assert not file_of(a, k1).exists() and metric(b.tier, KvrefTierMetrics.CHUNKS_EVICTED) == 1
    assert b.tier.take_events() == [OffloadingEvent(to_keys([2, 3]), Medium.STORAGE, removed=False, ownership="fs")]
    assert a.store([to_key(4)])  # A's next listing finds k1 gone
    assert a.tier.take_events() == [
        OffloadingEvent([k1], Medium.STORAGE, removed=True, ownership="fs"),
        OffloadingEvent([to_key(4)], Medium.STORAGE, removed=False, ownership="fs"),
    ]
    assert metric(a.tier, KvrefTierMetrics.CHUNKS_EVICTED) == 0  # A evicted nothing itself
    a.close()
    b.close()


# --- restart ---


def test_blocks_survive_a_restart(tmp_path: Path) -> None:
    keys = to_keys([1, 2, 3])
    first = Harness(tmp_path / "fs")
    assert first.store(keys)
    first.close()
    second = Harness(tmp_path / "fs")
    assert [second.has(key) for key in keys] == [True, True, True]
    assert second.load(keys, [5, 6, 7])
    assert [second.row(i) for i in (5, 6, 7)] == [content(key) for key in keys]
    second.close()


@pytest.mark.parametrize("capacity", [None, 8 * RECORD])
def test_stale_temporary_files_of_dead_writers_are_deleted(tmp_path: Path, capacity: int | None) -> None:
    k1 = to_key(1)
    first = Harness(tmp_path / "fs")
    assert first.store([k1])
    path = file_of(first, k1)
    first.close()
    # Dead writers (another host, another pid) left these; the fresh one is a live writer's.
    stale = path.with_name(f"{path.name}.deadhost-123-0a0a0a0a.tmp")
    stale.write_bytes(b"partial")
    age(stale, 120)
    fresh = path.with_name(f"{'e' * 32}.kvb.livehost-456-0b0b0b0b.tmp")
    fresh.write_bytes(b"partial")
    probe = first.root / ".o_direct_probe.deadhost-123-0a0a0a0a.tmp"  # killed while opening
    probe.write_bytes(bytes(4096))
    age(probe, 120)
    second = Harness(tmp_path / "fs", capacity_bytes=capacity, stale_tmp_s=60)
    second.tier.drain_jobs()  # the start-up sweep runs on an I/O thread
    assert not stale.exists() and not probe.exists() and fresh.exists() and path.exists()
    age(fresh, 120)
    # Later, whoever writes to that directory finds it (unbounded roots: at most every
    # stale_tmp_s / 2 per directory; bounded ones list their domain before each write).
    if capacity is None:
        second.tier._capacity._last_tmp_sweep[int(path.parent.name, 16)] = 0.0  # pyright: ignore[reportPrivateUsage]
    same_dir = next(k for k in to_keys(range(2, 5000)) if file_of(second, k).parent == path.parent)
    assert second.store([same_dir])
    assert not fresh.exists()
    assert second.has(k1)
    second.close()


def test_restart_with_another_block_size_is_refused(tmp_path: Path) -> None:
    Harness(tmp_path / "fs").close()
    with pytest.raises(TierRootError, match=rf"root_dir '.*fs/{RUN}' is not usable: .*kvref_fs_tier.json says it holds blocks written as"):
        fs_tier(make_view(2, 128), tmp_path / "fs")


@pytest.mark.parametrize("version", [2, 3])
def test_root_of_a_previous_format_is_refused_not_misread(tmp_path: Path, version: int) -> None:
    # Formats 2 and 3 kept many blocks per segment file: never read as format 4.
    root = run_dir(tmp_path / "fs")
    root.mkdir(parents=True)
    (root / CONFIG_FILE_NAME).write_text(json.dumps({"format": version, "block_bytes": BLOCK_BYTES}))
    with pytest.raises(OSError, match=rf"written as \{{'format': {version}.*needs \{{'format': 4"):
        fs_tier(make_view(2), tmp_path / "fs")


@pytest.mark.parametrize("theirs", [BLOCK_BYTES, 2 * BLOCK_BYTES])
def test_openers_racing_on_a_new_root_keep_the_first_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, theirs: int
) -> None:
    # Another opener (another host) publishes the config between this one's read (none yet) and
    # its own publish. Its file keeps its inode, which the other host may be reading (replaced,
    # JuiceFS fails that read with EBADF): this opener checks it instead, and leaves no file.
    from kvref.tiering.fs import root as root_module

    root = tmp_path / "root"
    root.mkdir()
    config = root / CONFIG_FILE_NAME
    publish = root_module.publish_file

    def another_opener_first(source: str, target: str) -> None:
        config.write_text(json.dumps({"format": 4, "block_bytes": theirs}))
        publish(source, target)

    monkeypatch.setattr(root_module, "publish_file", another_opener_first)
    if theirs == BLOCK_BYTES:
        root_module.open_root(root, BLOCK_BYTES)
    else:
        with pytest.raises(TierRootError, match="says it holds blocks written as"):
            root_module.open_root(root, BLOCK_BYTES)
    assert json.loads(config.read_text()) == {"format": 4, "block_bytes": theirs}
    inode = config.stat().st_ino
    monkeypatch.setattr(root_module, "publish_file", publish)
    if theirs == BLOCK_BYTES:
        root_module.open_root(root, BLOCK_BYTES)  # an existing root: read, never rewritten
    assert config.stat().st_ino == inode
    assert sorted(path.name for path in root.iterdir()) == [CONFIG_FILE_NAME]


def test_a_file_of_another_format_or_block_size_is_never_read(harness: Harness) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.store([k1, k2])
    for key, (start, value) in ((k1, (8, 3)), (k2, (16, 2 * BLOCK_BYTES))):
        path = file_of(harness, key)
        data = bytearray(path.read_bytes())
        width = 2 if start == 8 else 8  # the format field, then the payload length field
        data[start : start + width] = value.to_bytes(width, "little")
        path.write_bytes(bytes(data))
    assert not harness.load([k1, k2], [3, 4])
    assert harness.last_result.successful_keys is None
    assert [harness.has(k) for k in (k1, k2)] == [False, False]
    assert harness.files() == []  # deleted: a miss for every engine


# --- construction errors ---


def test_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "fs").mkdir()
    run_dir(tmp_path / "fs").write_text("x")
    with pytest.raises(TierRootError, match=rf"root_dir '.*fs/{RUN}' is not usable: it is not a directory"):
        fs_tier(make_view(2), tmp_path / "fs")


def test_root_under_a_file_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match=rf"root_dir '.*file/sub/fs/{RUN}' is not usable: Not a directory") as info:
        fs_tier(make_view(2), tmp_path / "file" / "sub" / "fs")
    assert info.value.errno == errno.ENOTDIR
    assert isinstance(info.value, KVRefError)


def _open_tier_as_nobody(root: str, result: Any) -> None:
    # Runs in a forked child: drop root, so the directory's permissions apply for real.
    try:
        if os.geteuid() == 0:
            os.setgid(65534)
            os.setuid(65534)
        fs_tier(make_view(2), root).shutdown()
        result.put("opened")
    except OSError as exc:
        result.put(f"{type(exc).__name__}: {exc}")


def test_root_without_write_permission_is_refused() -> None:
    # Outside pytest's tmp_path, whose parents only root may enter: the child, not root, must
    # reach the directory and be refused by its own permissions.
    base = Path(tempfile.mkdtemp(prefix="kvref-perm-"))
    try:
        os.chmod(base, 0o755)
        parent = base / "locked"
        (parent / "fs").mkdir(parents=True)
        mode = 0o755 if os.geteuid() == 0 else 0o555
        os.chmod(parent / "fs", mode)
        os.chmod(parent, mode)
        context = multiprocessing.get_context("fork")
        result = context.SimpleQueue()
        # An existing root the process cannot write to, and a missing one it cannot create.
        for root in (parent / "fs", parent / "new" / "fs"):
            child = context.Process(target=_open_tier_as_nobody, args=(str(root), result))
            child.start()
            child.join(30)
            outcome = result.get()
            assert outcome.startswith("TierRootError:"), outcome
            assert re.search(rf"root_dir '{root}/{RUN}' is not usable: Permission denied", outcome), outcome
    finally:
        os.chmod(base / "locked", 0o755)
        shutil.rmtree(base)


def test_corrupt_config_is_refused_naming_the_file(tmp_path: Path) -> None:
    run_dir(tmp_path / "fs").mkdir(parents=True)
    config = run_dir(tmp_path / "fs") / CONFIG_FILE_NAME
    config.write_text("{not json")
    with pytest.raises(TierRootError, match=rf"{re.escape(str(config))} is not a kvref fs tier config"):
        fs_tier(make_view(2), tmp_path / "fs")


@settings(max_examples=60, deadline=None)
@given(garbage=st.binary(min_size=1, max_size=64))
def test_a_garbled_config_is_refused_naming_the_file_never_a_bare_error(garbage: bytes) -> None:
    # Invalid UTF-8 used to escape as a bare UnicodeDecodeError naming no file.
    with tempfile.TemporaryDirectory(prefix="kvref-config-") as tmp:
        config = run_dir(Path(tmp)) / CONFIG_FILE_NAME
        config.parent.mkdir()
        config.write_bytes(garbage)
        try:
            fs_tier(make_view(2), tmp, n_read_threads=1, n_write_threads=1).shutdown()
        except TierRootError as exc:
            assert str(config) in str(exc)
        else:
            raise AssertionError(f"{garbage!r} accepted as a config")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_read_threads": 0}, "n_read_threads must be None or an integer >= 1, got 0"),
        ({"n_write_threads": 2.5}, "n_write_threads must be None or an integer >= 1, got 2.5"),
        ({"capacity_bytes": 10}, "capacity_bytes must be None or at least one block file"),
        ({"capacity_bytes": "1G"}, "capacity_bytes must be None or an integer >= 1, got '1G'"),
        ({"fsync": "no"}, "fsync must be true or false, got 'no'"),
        ({"page_cache": 1}, "page_cache must be true or false, got 1"),
        ({"stale_tmp_s": 0}, "stale_tmp_s must be a number of seconds in (0, 3600], got 0"),
        ({"stale_tmp_s": 7200}, "stale_tmp_s must be a number of seconds in (0, 3600], got 7200"),
        ({"stale_tmp_s": "1h"}, "stale_tmp_s must be a number of seconds in (0, 3600], got '1h'"),
        ({"enable_kv_events": 1}, "enable_kv_events must be true or false, got 1"),
        ({"locality": "local"}, "locality must be None or a Locality ('LOCAL' or 'REMOTE'), got 'local'"),
    ],
)
def test_invalid_arguments(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        fs_tier(make_view(2), tmp_path / "fs", **kwargs)
    assert not (tmp_path / "fs").exists()  # refused before touching the disk


@pytest.mark.parametrize("root_dir", ["", 42, None])
def test_invalid_root_dir(tmp_path: Path, root_dir: Any) -> None:
    with pytest.raises(ValueError, match="root_dir must be a non-empty path"):
        fs_tier(make_view(2), root_dir)


# --- O_DIRECT and its fallback ---


@pytest.mark.python_io
def test_without_o_direct_io_is_buffered_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tier_module, "probe_o_direct", lambda root: False)  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
    drops: list[int] = []
    real_fadvise = os.posix_fadvise

    def counting_fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        drops.append(advice)
        real_fadvise(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", counting_fadvise)
    with caplog.at_level(logging.WARNING, logger="kvref.tiering.fs.tier"):
        h = Harness(tmp_path / "fs")
    warnings = [r.getMessage() for r in caplog.records if "O_DIRECT" in r.getMessage()]
    assert len(warnings) == 1 and "buffered I/O" in warnings[0]
    keys = to_keys([1, 2])
    assert not h.tier.direct and h.store(keys) and h.load(keys, [3, 4])
    assert (h.row(3), h.row(4)) == (content(keys[0]), content(keys[1]))
    # Every write and read dropped its pages.
    assert drops == [os.POSIX_FADV_DONTNEED] * 4
    h.close()


@pytest.mark.python_io
def test_page_cache_option_keeps_pages_and_skips_the_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "posix_fadvise", lambda *args: pytest.fail("dropped pages"))  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
    h = Harness(tmp_path / "fs", page_cache=True)
    assert not h.tier.direct
    assert h.store([to_key(1)]) and h.load([to_key(1)], [3]) and h.row(3) == content(to_key(1))
    h.close()


@pytest.mark.parametrize(
    ("direct", "cores", "readers", "writers"),
    [(True, 2, 32, 32), (False, 1, 1, 1), (False, 2, 2, 1), (False, 6, 4, 3), (False, 64, 4, 4)],
)
def test_io_thread_defaults(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    direct: bool,
    cores: int,
    readers: int,
    writers: int,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
    h = Harness(tmp_path / "fs", n_read_threads=None, n_write_threads=None, page_cache=not direct)
    try:
        assert h.tier.direct is direct
        assert (h.tier.n_read_threads, h.tier.n_write_threads) == (readers, writers)
        assert h.store([to_key(1)]) and h.load([to_key(1)], [3])
    finally:
        h.close()


@pytest.mark.parametrize(
    ("block_bytes", "readers", "writers"),
    [
        (4096, 32, 32),
        (256 << 10, 32, 32),
        (512 << 10, 32, 32),
        (1 << 20, 16, 16),
        (2 << 20, 8, 8),
        (4 << 20, 12, 4),
        (8 << 20, 14, 2),
    ],
)
def test_o_direct_threads_hold_about_32_mib_of_loads_and_16_mib_of_stores(
    tmp_path: Path, block_bytes: int, readers: int, writers: int
) -> None:
    h = Harness(tmp_path / "fs", aligned_view(2, block_bytes), n_read_threads=None, n_write_threads=None)
    try:
        assert h.tier.direct
        assert (h.tier.n_read_threads, h.tier.n_write_threads) == (readers, writers)
        assert h.store([to_key(1)]) and h.load([to_key(1)], [1])
        assert h.row(1) == content(to_key(1), block_bytes)
    finally:
        h.close()


@pytest.mark.parametrize(("page_cache", "capacity"), [(False, None), (True, None), (False, 1 << 30)])
def test_pipelined_stores_run_on_write_threads_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io_path: str, page_cache: bool, capacity: int | None
) -> None:
    """Where stores are pipelined (O_DIRECT, the C path, a root without a capacity) they need
    fewer requests in flight, and read threads leave them to the write threads; elsewhere any
    idle thread stores."""
    threads: list[str] = []
    real_write = block_io.BlockIO.write_blocks
    gate = threading.Barrier(2, timeout=0.5)

    def spy(self: block_io.BlockIO, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        try:
            gate.wait()  # two stores at once, if two threads take stores
        except threading.BrokenBarrierError:
            pass
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(block_io.BlockIO, "write_blocks", spy)
    monkeypatch.setattr(tier_module, "_TASK_BYTES", 2 * BLOCK_BYTES)  # two blocks a task
    h = Harness(tmp_path / "fs", n_read_threads=3, n_write_threads=1, page_cache=page_cache, capacity_bytes=capacity)
    try:
        assert h.tier.direct is not page_cache
        keys = to_keys(range(6))
        assert h.store(keys)
        kinds = {name.rsplit("-", 1)[1][0] for name in threads}
        if io_path == "native" and not page_cache and capacity is None:
            assert kinds == {"w"}, threads
        else:
            assert "r" in kinds, threads  # (the write thread may be busy with the start-up sweep)
        assert h.load(keys[:2], [6, 7]) and h.row(6) == content(keys[0])
    finally:
        h.close()


@pytest.mark.python_io
def test_shutdown_fails_queued_jobs_and_later_submits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(tmp_path / "fs", n_read_threads=1, n_write_threads=1)
    gate = threading.Event()
    real_publish = block_io.publish_file
    monkeypatch.setattr(tier_module, "_TASK_BYTES", BLOCK_BYTES)  # a task per block
    monkeypatch.setattr(block_io, "publish_file", lambda src, dst: (gate.wait(5), real_publish(src, dst)))  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
    keys = to_keys(range(6))
    h.fill(keys, list(range(6)))
    h.tier.submit_store(h.job(keys, list(range(6)), promotion=False))
    threading.Timer(0.05, gate.set).start()
    h.tier.shutdown()  # two blocks are being written, four queued: cancelled
    assert outcomes(h.tier.get_finished_jobs()) == [(h.job_ids, False, None)]
    h.tier.submit_store(h.job([to_key(9)], [0], promotion=False))
    assert outcomes(h.tier.get_finished_jobs()) == [(h.job_ids, False, None)]
    assert not h.has(to_key(9)) and h.files(".tmp") == []
    h.tier.shutdown()  # idempotent
    h.rows.release()


# --- fault injection: the scheduler side never raises and never gets wrong bytes ---


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def corrupt_payload(path: Path) -> None:
    flip(path, PAYLOAD + BLOCK_BYTES - 1)


def corrupt_header(path: Path) -> None:
    flip(path, 0)


def corrupt_checksum(path: Path) -> None:
    flip(path, RECORD_HEADER_BYTES - 1)


def truncate(path: Path) -> None:
    os.truncate(path, PAYLOAD + BLOCK_BYTES // 2)


def extend(path: Path) -> None:
    with open(path, "ab") as file:
        file.write(bytes(4096))


def other_key(path: Path) -> None:
    # Right size, another key: a file that is not the block its name promises.
    flip(path, RECORD_HEADER_BYTES + 7)


def emptied(path: Path) -> None:
    os.truncate(path, 0)


@pytest.mark.parametrize("damage", [corrupt_payload, corrupt_header, corrupt_checksum, truncate, extend, other_key, emptied])
def test_damaged_file_fails_the_load_and_becomes_a_miss(harness: Harness, damage: Any) -> None:
    # The load reads straight into the rows and then verifies: the damaged block's bytes may be
    # in its row, but the job fails, so they are never reported as loaded.
    k1, k2 = to_keys([1, 2])
    assert harness.store([k1, k2])
    harness.tier.take_events()
    damage(file_of(harness, k2))
    assert not harness.load([k1, k2], [4, 5])
    assert harness.row(4) == content(k1)
    assert harness.last_result.successful_keys == (k1,)  # only the block verified whole
    assert not harness.has(k2)  # never offered again, by any engine:
    assert not file_of(harness, k2).exists()  # the file is gone
    assert harness.has(k1)
    assert harness.tier.take_events() == [OffloadingEvent([k2], Medium.STORAGE, removed=True, ownership="fs")]
    # The block can be stored again and then loads correctly.
    assert harness.store([k2], [0])
    assert harness.load([k2], [6]) and harness.row(6) == content(k2)


@pytest.mark.python_io
def test_a_damaged_file_replaced_meanwhile_is_not_deleted(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # Another engine stored a good copy after this one opened the damaged file: keep the copy.
    # (The C extension's read cannot be interrupted between its steps; it compares the same
    # inode numbers, and test_fs_batch_io holds the two paths to each other.)
    k1 = to_key(1)
    assert harness.store([k1])
    path = file_of(harness, k1)
    good = path.read_bytes()
    corrupt_payload(path)
    real_read = block_io.BlockIO._read_verified  # pyright: ignore[reportPrivateUsage]

    def read_then_replace(io: block_io.BlockIO, fd: int, key: bytes, block_id: int) -> Any:
        problem = real_read(io, fd, key, block_id)
        replacement = path.with_name("replacement")
        replacement.write_bytes(good)
        os.replace(replacement, path)
        return problem

    monkeypatch.setattr(block_io.BlockIO, "_read_verified", read_then_replace)
    assert not harness.load([k1], [3])
    monkeypatch.undo()
    assert path.exists() and harness.load([k1], [3]) and harness.row(3) == content(k1)


@pytest.mark.parametrize("what", ["file", "directory", "root"])
def test_files_deleted_by_hand_fail_loads_and_are_stored_again(harness: Harness, what: str) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.store([k1, k2])
    path = file_of(harness, k1)
    if what == "file":
        path.unlink()
    elif what == "directory":
        shutil.rmtree(path.parent)
    else:
        shutil.rmtree(harness.root)
    assert not harness.load([k1], [4])
    assert not harness.has(k1)
    assert harness.store([k1], [0])  # directories are made again as needed
    assert harness.load([k1], [4]) and harness.row(4) == content(k1)


def test_lookups_are_answered_by_the_lookup_thread_and_a_failed_load_turns_them_to_miss(harness: Harness) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.store([k1, k2])
    request = ReqContext(req_id="asks-twice")
    # The first lookup never touches the disk: it answers RETRY, and the step's end sends it.
    assert harness.tier.lookup(k1, request) is LookupResult.RETRY
    assert resolve(harness.tier, k1, request) is LookupResult.HIT
    file_of(harness, k1).unlink()  # another engine evicts it: the verdict still says HIT
    assert harness.tier.lookup(k1, request) is LookupResult.HIT
    assert not harness.load([k1, k2], [4, 5])
    assert harness.last_result.successful_keys == (k2,)
    # As vLLM's fs tier: the lost chunk is a MISS from now on, not promoted again and again.
    assert harness.tier.lookup(k1, request) is LookupResult.MISS
    assert resolve(harness.tier, k2, request) is LookupResult.HIT
    harness.tier.on_request_finished(request)
    assert harness.store([k1], [0]) and harness.has(k1)  # a new request sees the new truth


@pytest.mark.python_io
def test_a_block_another_writer_published_first_is_kept_and_the_store_succeeds(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_publish = block_io.publish_file
    published: list[int] = []

    def publish_second(src: str, dst: str) -> None:
        shutil.copyfile(src, dst)  # the other writer's identical copy lands first ...
        published.append(os.stat(dst).st_ino)
        real_publish(src, dst)  # ... and ours never replaces it (hosts may cache its name)

    monkeypatch.setattr(block_io, "publish_file", publish_second)
    k1 = to_key(1)
    assert harness.store([k1])
    monkeypatch.undo()
    assert [file_of(harness, k1).stat().st_ino] == published
    assert harness.files(".tmp") == [] and harness.load([k1], [3]) and harness.row(3) == content(k1)


@pytest.mark.python_io
def test_crash_between_write_and_rename(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(src: str, dst: str) -> None:
        raise OSError(errno.EIO, "simulated crash before rename")

    monkeypatch.setattr(block_io, "publish_file", crash)
    k1 = to_key(1)
    assert not harness.store([k1])
    assert not harness.has(k1)
    assert harness.files() == [] and harness.files(".tmp") == []
    monkeypatch.undo()
    assert harness.store([k1])


@pytest.mark.python_io
def test_disk_full_fails_the_store(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, buffers: list[memoryview], offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    keys = to_keys([1, 2, 3])
    assert not harness.store(keys)
    assert [harness.has(key) for key in keys] == [False, False, False]
    assert harness.files(".tmp") == [] and harness.files() == []
    assert harness.tier.take_events() == []  # never announced
    monkeypatch.undo()
    assert harness.store(keys)


@pytest.mark.python_io
def test_partial_writes_and_reads_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Buffered I/O: O_DIRECT would refuse a piece that is not whole pages.
    h = Harness(tmp_path / "fs", page_cache=True)
    real_pwritev, real_preadv = os.pwritev, os.preadv
    monkeypatch.setattr(os, "pwritev", lambda fd, bufs, off: real_pwritev(fd, [bytes(bufs[0])[:5]], off))  # pyright: ignore
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: real_preadv(fd, [bufs[0][:7]], off))  # pyright: ignore
    k1 = to_key(1)
    assert h.store([k1])
    assert h.load([k1], [3]) and h.row(3) == content(k1)
    monkeypatch.undo()
    assert file_of(h, k1).stat().st_size == RECORD
    h.close()


@pytest.mark.python_io
def test_permission_denied_on_write_and_read(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open
    root = str(harness.root)
    denied = {"write": True, "read": False}

    def guarded_open(path: str, flags: int, mode: int = 0o777) -> int:
        writing = bool(flags & os.O_WRONLY)
        if str(path).startswith(root) and denied["write" if writing else "read"]:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", guarded_open)
    k1, k2 = to_keys([1, 2])
    assert not harness.store([k1])
    assert not harness.has(k1)
    denied.update(write=False, read=True)
    assert harness.store([k2])
    assert not harness.load([k2], [4])
    assert not harness.has(k2)  # an unreadable block is a miss afterwards
    assert file_of(harness, k2).exists()  # but not deleted: another engine may read it


@pytest.mark.python_io
@pytest.mark.parametrize("err", [errno.ENOENT, errno.ESTALE])
def test_a_file_another_host_deletes_while_read_is_a_miss_not_barred(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    # A read of a file another host deleted (evicted) meanwhile fails with ENOENT on JuiceFS,
    # ESTALE on NFS: the block is gone, not unreadable, so it loads once it is stored again.
    k1 = to_key(1)
    assert harness.store([k1])

    def deleted_meanwhile(fd: int, buffers: list[memoryview], offset: int) -> int:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "preadv", deleted_meanwhile)
    assert not harness.load([k1], [3])
    monkeypatch.undo()
    # Here again (as if stored again): not barred, a new request finds it.
    assert resolve(harness.tier, k1, ReqContext(req_id="after-the-delete")) is LookupResult.HIT
    assert harness.load([k1], [3]) and harness.row(3) == content(k1)


# --- damage anywhere in a file never yields wrong bytes ---

GROUP_0 = make_offload_key(b"prefix01", 0)
GROUP_1 = make_offload_key(b"prefix01", 1)


@settings(max_examples=120, deadline=None)
@given(
    position=st.integers(0, RECORD - 1),
    bit=st.integers(0, 7),
    damaged_group=st.integers(0, 1),
    restart=st.booleans(),
)
def test_a_flipped_bit_anywhere_never_serves_wrong_bytes(
    position: int, bit: int, damaged_group: int, restart: bool
) -> None:
    # Two blocks whose keys differ in one bit of the group index: a flipped key bit could turn
    # group 0's file into group 1's.
    with tempfile.TemporaryDirectory(prefix="kvref-flip-") as tmp:
        h = Harness(Path(tmp) / "fs")
        try:
            damaged, other = (GROUP_0, GROUP_1) if damaged_group == 0 else (GROUP_1, GROUP_0)
            assert h.store([other], [0])
            assert h.store([damaged], [1])
            path = file_of(h, damaged)
            data = bytearray(path.read_bytes())
            data[position] ^= 1 << bit
            path.write_bytes(bytes(data))
            if restart:
                h.tier.shutdown()
                h.tier = fs_tier(h.view, h.root_dir, n_read_threads=1, n_write_threads=1)
            for key in (GROUP_0, GROUP_1):
                if h.has(key) and h.load([key], [5]):
                    assert h.row(5) == content(key), f"{key.hex()} loaded another block's bytes"
            # The undamaged block is never lost to its neighbour's damage.
            assert h.has(other)
            assert h.load([other], [6]) and h.row(6) == content(other)
        finally:
            h.close()


# --- a full disk ---


@pytest.mark.python_io
def test_restart_on_a_full_disk_starts_and_serves_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = to_keys([1, 2])
    first = Harness(tmp_path / "fs")
    assert first.store(keys)
    first.close()

    def no_space(*args: object, **kwargs: object) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    real_open = os.open

    def open_without_creating(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        if flags & os.O_CREAT and not os.path.exists(path):
            no_space()
        return real_open(path, flags, mode, **kwargs)

    # Nothing that allocates space works: writes, new files, the config rewrite.
    for name in ("write", "pwrite", "writev", "pwritev"):
        monkeypatch.setattr(os, name, no_space)
    monkeypatch.setattr(os, "open", open_without_creating)
    monkeypatch.setattr(Path, "write_text", no_space)
    second = Harness(tmp_path / "fs")
    assert second.tier.direct  # probed by reading, which needs no space
    assert [second.has(key) for key in keys] == [True, True]
    assert second.load(keys, [4, 5])
    assert (second.row(4), second.row(5)) == (content(keys[0]), content(keys[1]))
    assert not second.store([to_key(3)], [0])  # stores fail as jobs, nothing raises
    monkeypatch.undo()
    assert second.store([to_key(3)], [0])
    second.close()


def test_a_new_root_on_a_full_disk_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(self: Path, data: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", no_space)
    with pytest.raises(TierRootError, match=rf"root_dir '.*fs/{RUN}' is not usable: No space left on device"):
        fs_tier(make_view(2), tmp_path / "fs")
    assert list(run_dir(tmp_path / "fs").iterdir()) == []
