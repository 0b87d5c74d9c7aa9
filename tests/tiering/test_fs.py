"""FileSystemSecondaryTier: round trips, the on-disk index, capacity, and fault injection.

Faults are injected by monkeypatching the `os` functions the I/O threads call (tests run as
root, so chmod would not deny anything). Whatever the fault, the scheduler-side calls never
raise, and a load either reports success with the exact bytes or reports failure.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.base import OffloadingEvent, OffloadKey, ReqContext, make_offload_key
from kvref.tiering.fs import segment_io
from kvref.tiering.fs.pool import DualQueuePool, IOTask
from kvref.tiering.base import JobMetadata, JobResult
from kvref.errors import KVRefError
from kvref.tiering.fs import (
    CONFIG_FILE_NAME,
    LOCK_FILE_NAME,
    RECORD_HEADER_BYTES,
    FileSystemSecondaryTier,
    TierRootError,
)
from tests.tiering.helpers import BLOCK_BYTES, content, make_view, to_key, to_keys

CTX = ReqContext(req_id="r1")
NUM_BLOCKS = 8
RECORD = RECORD_HEADER_BYTES + 12 + BLOCK_BYTES  # one record of a 12-byte test key


class Harness:
    """A tier over a bytearray primary, with helpers to run jobs to completion."""

    def __init__(self, root: Path, **kwargs: Any) -> None:
        self.root = root
        self.view = make_view(NUM_BLOCKS)
        self.rows = self.view.cast("B")
        kwargs.setdefault("n_read_threads", 2)
        kwargs.setdefault("n_write_threads", 2)
        kwargs.setdefault("enable_events", True)
        self.tier = FileSystemSecondaryTier(self.view, root, **kwargs)
        self.job_ids = 0

    def row(self, block_id: int) -> bytes:
        return bytes(self.rows[block_id * BLOCK_BYTES : (block_id + 1) * BLOCK_BYTES])

    def fill(self, keys: list[OffloadKey], block_ids: list[int]) -> None:
        for key, block_id in zip(keys, block_ids):
            self.rows[block_id * BLOCK_BYTES : (block_id + 1) * BLOCK_BYTES] = content(key)

    def job(self, keys: list[OffloadKey], block_ids: list[int], promotion: bool) -> JobMetadata:
        self.job_ids += 1
        return JobMetadata(self.job_ids, tuple(keys), tuple(block_ids), promotion, CTX)

    def store(self, keys: list[OffloadKey], block_ids: list[int] | None = None) -> bool:
        block_ids = block_ids if block_ids is not None else list(range(len(keys)))
        self.fill(keys, block_ids)
        self.tier.submit_store(self.job(keys, block_ids, promotion=False))
        return self.finish()

    def load(self, keys: list[OffloadKey], block_ids: list[int]) -> bool:
        for block_id in block_ids:
            self.rows[block_id * BLOCK_BYTES : (block_id + 1) * BLOCK_BYTES] = bytes(BLOCK_BYTES)
        self.tier.submit_load(self.job(keys, block_ids, promotion=True))
        return self.finish()

    def finish(self) -> bool:
        self.tier.drain_jobs()
        results = list(self.tier.get_finished_jobs())
        assert [result.job_id for result in results] == [self.job_ids]
        self.last_result: JobResult = results[0]
        return results[0].success

    def files(self, suffix: str = ".kvs") -> list[Path]:
        return sorted(path for path in self.root.rglob(f"*{suffix}") if path.is_file())

    def close(self) -> None:
        self.tier.shutdown()
        self.rows.release()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "fs")
    yield h
    h.close()


def file_of(h: Harness, key: OffloadKey) -> Path:
    location = h.tier.location(key)
    assert location is not None
    return Path(location[0])


def record_of(h: Harness, key: OffloadKey) -> tuple[Path, int, int]:
    location = h.tier.location(key)
    assert location is not None
    return Path(location[0]), location[1], location[2]


# --- normal operation ---


def test_store_then_load_round_trip(harness: Harness) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.tier.lookup(k1, CTX) is False
    assert harness.store([k1, k2], [0, 1])
    assert harness.tier.lookup(k1, CTX) is True
    assert len(harness.files()) == 1  # one segment per store job
    assert record_of(harness, k2)[1:] == (RECORD, RECORD)
    # fan-out: root/<ff>/<ff>/<generation>.kvs
    assert all(len(p.relative_to(harness.root).parts) == 3 for p in harness.files())
    assert harness.load([k2, k1], [5, 6])
    assert harness.row(5) == content(k2) and harness.row(6) == content(k1)
    assert harness.tier.take_events() == [OffloadingEvent([k1, k2], "fs", removed=False)]


def test_pending_write_answers_none_and_lookup_never_waits(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    real_replace = os.replace

    def slow_replace(src: str, dst: str) -> None:
        gate.wait(5)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", slow_replace)
    k1 = to_key(1)
    harness.fill([k1], [0])
    harness.tier.submit_store(harness.job([k1], [0], promotion=False))
    assert harness.tier.lookup(k1, CTX) is None  # the write is stuck in an I/O thread
    assert list(harness.tier.get_finished_jobs()) == []
    gate.set()
    harness.tier.drain_jobs()
    assert list(harness.tier.get_finished_jobs()) == [JobResult(harness.job_ids, True)]
    assert harness.tier.lookup(k1, CTX) is True


def test_stored_keys_are_not_written_twice(harness: Harness) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.store([k1])
    first = harness.files()
    assert harness.store([k1, k2, k2], [0, 1, 2])
    assert len(harness.files()) == 2 and first[0] in harness.files()


def test_load_of_a_missing_block_fails_and_loads_the_others(harness: Harness) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.store([k1])
    assert not harness.load([k1, k2], [3, 4])
    # As vLLM's: the job fails, and the block that was there is loaded and reported as such.
    assert harness.last_result.successful_keys == (k1,)
    assert harness.row(3) == content(k1)
    assert harness.tier.lookup(k1, CTX) is True  # k1 itself is fine
    assert not harness.load([k2], [4])
    assert harness.last_result.successful_keys is None  # nothing loaded: no partial success


@pytest.mark.parametrize("first_write_fails", [False, True])
def test_a_store_of_a_block_being_written_ends_with_that_write(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, first_write_fails: bool
) -> None:
    # Reported stored means a lookup finds the block: a second job naming a block the first is
    # still writing is not done before that write is (found by kvref.testing.vllm's programs).
    gate = threading.Event()
    real_write = segment_io.SegmentIO.write_segment

    def gated_write(io: segment_io.SegmentIO, path: str, records: Any) -> bool:
        assert gate.wait(5)
        return False if first_write_fails else real_write(io, path, records)

    monkeypatch.setattr(segment_io.SegmentIO, "write_segment", gated_write)
    k = to_key(1)
    harness.fill([k, k], [0, 1])
    harness.tier.submit_store(harness.job([k], [0], promotion=False))
    harness.tier.submit_store(harness.job([k], [1], promotion=False))
    assert list(harness.tier.get_finished_jobs()) == []  # the second waits for the first's write
    assert harness.tier.lookup(k, CTX) is None
    gate.set()
    harness.tier.drain_jobs()
    results = list(harness.tier.get_finished_jobs())  # both, in the first poll after the drain
    assert sorted((r.job_id, r.success) for r in results) == [(1, not first_write_fails), (2, not first_write_fails)]
    assert harness.tier.lookup(k, CTX) is (not first_write_fails)


def test_capacity_evicts_least_recently_used_segments(tmp_path: Path) -> None:
    h = Harness(tmp_path / "fs", capacity_bytes=2 * RECORD)
    k1, k2, k3 = to_keys([1, 2, 3])
    assert h.store([k1], [0]) and h.store([k2], [1])
    h.tier.touch([k1], CTX)
    h.tier.take_events()
    assert h.store([k3], [2])
    assert [h.tier.lookup(k, CTX) for k in (k1, k2, k3)] == [True, False, True]
    assert h.tier.take_events() == [
        OffloadingEvent([k2], "fs", removed=True),
        OffloadingEvent([k3], "fs", removed=False),
    ]
    h.tier.drain_jobs()
    assert len(h.files()) == 2 and h.tier.used_bytes == 2 * RECORD
    h.close()


def test_store_jobs_are_split_into_segments(tmp_path: Path) -> None:
    h = Harness(tmp_path / "fs", max_segment_bytes=2 * RECORD)
    keys = to_keys(range(5))
    assert h.store(keys)
    assert h.tier.num_segments == 3 and len(h.files()) == 3
    assert h.load(keys, [3, 4, 5, 6, 7])
    assert [h.row(i) for i in range(3, 8)] == [content(key) for key in keys]
    h.close()


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
    assert sorted(h.tier.get_finished_jobs(), key=lambda r: r.job_id) == [
        JobResult(load_id, True),
        JobResult(h.job_ids, False),
    ]
    assert h.tier.lookup(k1, CTX) is True and h.tier.lookup(k2, CTX) is False
    h.close()


def test_reads_are_not_starved_by_writes() -> None:
    pool = DualQueuePool(1, 1, "test")
    # One gate per write, so the test decides when each write may finish (no timing races).
    gates = [threading.Event() for _ in range(10)]
    started = threading.Semaphore(0)
    done: list[str] = []
    lock = threading.Lock()

    def task(name: str, gate: threading.Event | None) -> IOTask:
        def run() -> None:
            started.release()
            if gate is not None:
                assert gate.wait(10)
            with lock:
                done.append(name)

        return IOTask(run, lambda: None)

    for i in range(10):
        pool.submit(task(f"w{i}", gates[i]), read=False)
    assert started.acquire(timeout=10) and started.acquire(timeout=10)  # both threads busy
    pool.submit(task("r", None), read=True)
    gates[0].set()
    gates[1].set()
    # The read must run next, while eight writes are still queued.
    for _ in range(200):
        with lock:
            if "r" in done:
                break
        threading.Event().wait(0.01)
    for gate in gates:
        gate.set()
    pool.drain()
    pool.shutdown()
    # Only the two writes that were already running may finish before the read.
    assert set(done[: done.index("r")]) <= {"w0", "w1"}, done
    assert len(done) == 11


def test_shutdown_fails_queued_jobs_and_later_submits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(tmp_path / "fs", n_read_threads=1, n_write_threads=1, max_segment_bytes=RECORD)
    gate = threading.Event()
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (gate.wait(5), real_replace(src, dst)))  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
    keys = to_keys(range(6))
    h.fill(keys, list(range(6)))
    h.tier.submit_store(h.job(keys, list(range(6)), promotion=False))
    threading.Timer(0.05, gate.set).start()
    h.tier.shutdown()  # two blocks are being written, four queued: cancelled
    assert list(h.tier.get_finished_jobs()) == [JobResult(h.job_ids, False)]
    h.tier.submit_store(h.job([to_key(9)], [0], promotion=False))
    assert list(h.tier.get_finished_jobs()) == [JobResult(h.job_ids, False)]
    h.tier.shutdown()  # idempotent
    h.rows.release()


# --- restart ---


def test_blocks_survive_a_restart(tmp_path: Path) -> None:
    keys = to_keys([1, 2, 3])
    first = Harness(tmp_path / "fs")
    assert first.store(keys)
    first.close()
    second = Harness(tmp_path / "fs")
    assert [second.tier.lookup(key, CTX) for key in keys] == [True, True, True]
    assert second.load(keys, [5, 6, 7])
    assert [second.row(i) for i in (5, 6, 7)] == [content(key) for key in keys]
    second.close()


def test_restart_removes_stale_temp_files_and_keeps_the_newest_copy(tmp_path: Path) -> None:
    k1, k2 = to_keys([1, 2])
    first = Harness(tmp_path / "fs")
    assert first.store([k1, k2])
    path = file_of(first, k1)
    first.close()
    # A crash mid-write leaves a temp file; a crash mid-eviction can leave an older copy.
    stale = path.with_name(f"{'f' * 16}.kvs.tmp")
    stale.write_bytes(b"partial")
    older = path.with_name(f"{0:016x}.kvs")
    older.write_bytes(path.read_bytes())
    second = Harness(tmp_path / "fs")
    assert not stale.exists() and not older.exists() and path.exists()
    assert second.tier.lookup(k1, CTX) is True and len(second.tier) == 2
    assert second.tier.num_segments == 1
    second.close()


def test_restart_skips_damaged_records_and_unknown_names(tmp_path: Path) -> None:
    k1, k2 = to_keys([1, 2])
    first = Harness(tmp_path / "fs")
    assert first.store([k1, k2])
    path = file_of(first, k1)
    first.close()
    path.write_bytes(path.read_bytes()[:-1])  # k2's record is cut short
    (path.parent / "notes.txt").write_text("not a block")
    (path.parent / "zz.kvs").write_text("not hex")
    second = Harness(tmp_path / "fs")
    assert second.tier.lookup(k1, CTX) is True
    assert second.tier.lookup(k2, CTX) is False
    assert second.load([k1], [4]) and second.row(4) == content(k1)
    second.close()


def test_restart_drops_segments_of_another_block_size(tmp_path: Path) -> None:
    k1 = to_key(1)
    first = Harness(tmp_path / "fs")
    assert first.store([k1])
    path = file_of(first, k1)
    first.close()
    data = bytearray(path.read_bytes())
    data[16:24] = (BLOCK_BYTES * 2).to_bytes(8, "little") # payload length field
    path.write_bytes(bytes(data) + bytes(BLOCK_BYTES))
    second = Harness(tmp_path / "fs")
    assert second.tier.lookup(k1, CTX) is False and not path.exists()
    second.close()


def test_restart_with_another_block_size_is_refused(tmp_path: Path) -> None:
    Harness(tmp_path / "fs").close()
    with pytest.raises(TierRootError, match=r"root_dir '.*fs' is not usable: it holds blocks written as"):
        FileSystemSecondaryTier(make_view(2, 128), tmp_path / "fs")


def test_root_of_the_previous_format_is_refused_not_misread(tmp_path: Path) -> None:
    # Format 2 checksummed payloads only (CRC-32): its records are never read as format 3.
    root = tmp_path / "fs"
    root.mkdir()
    (root / CONFIG_FILE_NAME).write_text(json.dumps({"format": 2, "block_bytes": BLOCK_BYTES}))
    with pytest.raises(OSError, match=r"written as \{'format': 2.*needs \{'format': 3"):
        FileSystemSecondaryTier(make_view(2), root)


def test_records_of_the_previous_format_are_skipped(tmp_path: Path) -> None:
    k1 = to_key(1)
    first = Harness(tmp_path / "fs")
    assert first.store([k1])
    path = file_of(first, k1)
    first.close()
    data = bytearray(path.read_bytes())
    data[8:10] = (2).to_bytes(2, "little")  # the format field, where format 2 had it too
    path.write_bytes(bytes(data))
    second = Harness(tmp_path / "fs")
    assert second.tier.lookup(k1, CTX) is False
    second.close()


def test_restart_over_capacity_evicts_the_oldest(tmp_path: Path) -> None:
    keys = to_keys([1, 2, 3])
    first = Harness(tmp_path / "fs")
    for i, key in enumerate(keys):
        assert first.store([key], [i])
        os.utime(file_of(first, key), (1000 - i, 1000 - i))  # the first stored is the newest
    first.close()
    second = Harness(tmp_path / "fs", capacity_bytes=2 * RECORD)
    assert [second.tier.lookup(key, CTX) for key in keys] == [True, True, False]
    second.close()


# --- construction errors ---


def test_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(TierRootError, match=r"root_dir '.*file' is not usable: it is not a directory"):
        FileSystemSecondaryTier(make_view(2), tmp_path / "file")


def test_root_under_a_file_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match=r"root_dir '.*file/sub/fs' is not usable: Not a directory") as info:
        FileSystemSecondaryTier(make_view(2), tmp_path / "file" / "sub" / "fs")
    assert info.value.errno == errno.ENOTDIR
    assert isinstance(info.value, KVRefError)


def _open_tier_as_nobody(root: str, result: Any) -> None:
    # Runs in a forked child: drop root, so the directory's permissions apply for real.
    try:
        if os.geteuid() == 0:
            os.setgid(65534)
            os.setuid(65534)
        FileSystemSecondaryTier(make_view(2), root).shutdown()
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
        # Readable and searchable by everyone; writable by its owner only (not even by the
        # owner when the test does not run as root).
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
            assert f"root_dir '{root}' is not usable: Permission denied" in outcome, outcome
    finally:
        os.chmod(base / "locked", 0o755)
        shutil.rmtree(base)


def test_corrupt_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "fs").mkdir()
    (tmp_path / "fs" / CONFIG_FILE_NAME).write_text("{not json")
    with pytest.raises(TierRootError, match="is not valid JSON"):
        FileSystemSecondaryTier(make_view(2), tmp_path / "fs")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_read_threads": 0}, "n_read_threads must be None or an integer >= 1, got 0"),
        ({"n_write_threads": 2.5}, "n_write_threads must be None or an integer >= 1, got 2.5"),
        ({"capacity_bytes": 10}, "capacity_bytes must be None or at least one block"),
        ({"capacity_bytes": "1G"}, "capacity_bytes must be None or an integer >= 1, got '1G'"),
        ({"max_segment_bytes": 0}, "max_segment_bytes must be an integer >= 1, got 0"),
        ({"max_segment_bytes": True}, "max_segment_bytes must be an integer >= 1, got True"),
        ({"fsync": "no"}, "fsync must be true or false, got 'no'"),
        ({"enable_events": 1}, "enable_events must be true or false, got 1"),
        ({"name": ""}, "name must be a non-empty string, got ''"),
        ({"name": 7}, "name must be a non-empty string, got 7"),
    ],
)
def test_invalid_arguments(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        FileSystemSecondaryTier(make_view(2), tmp_path / "fs", **kwargs)
    assert not (tmp_path / "fs").exists()  # refused before touching the disk


@pytest.mark.parametrize(
    ("cores", "readers", "writers"),
    [(1, 1, 1), (2, 2, 1), (3, 3, 1), (6, 4, 3), (8, 4, 4), (64, 4, 4)],
)
def test_io_threads_default_to_a_reader_per_core_and_a_writer_per_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, readers: int, writers: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
    h = Harness(tmp_path / "fs", n_read_threads=None, n_write_threads=None)
    try:
        assert (h.tier.n_read_threads, h.tier.n_write_threads) == (readers, writers)
        assert h.store([to_key(1)]) and h.load([to_key(1)], [3])
    finally:
        h.close()
    h = Harness(tmp_path / "fs", n_read_threads=3, n_write_threads=None)
    assert (h.tier.n_read_threads, h.tier.n_write_threads) == (3, writers)
    h.close()


@pytest.mark.parametrize("root_dir", ["", 42, None])
def test_invalid_root_dir(tmp_path: Path, root_dir: Any) -> None:
    with pytest.raises(ValueError, match="root_dir must be a non-empty path"):
        FileSystemSecondaryTier(make_view(2), root_dir)


# --- fault injection: the scheduler side never raises and never gets wrong bytes ---


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def corrupt_payload(path: Path, offset: int, size: int) -> None:
    flip(path, offset + size - 1)


def corrupt_header(path: Path, offset: int, size: int) -> None:
    flip(path, offset)


def truncate(path: Path, offset: int, size: int) -> None:
    os.truncate(path, offset + size // 2)


def other_key(path: Path, offset: int, size: int) -> None:
    # Right size, right checksum, another key: a record that is not the one indexed.
    flip(path, offset + RECORD_HEADER_BYTES + 7)


# Pieces: the default (a whole run in one preadv), a few bytes (every header a piece of its own,
# payloads cut), one record (pieces straddle records).
PIECES = [segment_io.READ_PIECE_BYTES, 16, RECORD]


@pytest.mark.parametrize("piece", PIECES)
@pytest.mark.parametrize("damage", [corrupt_payload, corrupt_header, truncate, other_key])
def test_damaged_record_fails_the_load_and_becomes_a_miss(
    harness: Harness, damage: Any, piece: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The load reads straight into the rows and verifies piece by piece: the damaged block's
    # bytes may be in its row, but the job fails, so they are never reported as loaded.
    monkeypatch.setattr(segment_io, "READ_PIECE_BYTES", piece)
    k1, k2 = to_keys([1, 2])
    assert harness.store([k1, k2])
    harness.tier.take_events()
    damage(*record_of(harness, k2))  # k2 is the segment's second (last) record
    assert not harness.load([k1, k2], [4, 5])
    assert harness.row(4) == content(k1)
    assert harness.last_result.successful_keys == (k1,)  # only the block verified whole
    assert harness.tier.lookup(k2, CTX) is False  # never offered again
    assert harness.tier.lookup(k1, CTX) is True
    assert harness.tier.take_events() == [OffloadingEvent([k2], "fs", removed=True)]
    # The block can be stored again and then loads correctly.
    assert harness.store([k2], [0])
    assert harness.load([k2], [6]) and harness.row(6) == content(k2)


def test_vanished_segment_fails_the_load_and_is_forgotten(harness: Harness) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.store([k1, k2])
    file_of(harness, k1).unlink()
    assert not harness.load([k1, k2], [4, 5])
    assert [harness.tier.lookup(k, CTX) for k in (k1, k2)] == [False, False]
    assert harness.tier.num_segments == 0 and harness.tier.used_bytes == 0


def test_crash_between_write_and_rename(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(src: str, dst: str) -> None:
        raise OSError(errno.EIO, "simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    k1 = to_key(1)
    assert not harness.store([k1])
    assert harness.tier.lookup(k1, CTX) is False
    assert harness.files() == [] and harness.files(".tmp") == []
    monkeypatch.undo()
    assert harness.store([k1])


def test_disk_full_fails_the_store(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, buffers: list[memoryview]) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", full)
    keys = to_keys([1, 2, 3])
    assert not harness.store(keys)
    assert [harness.tier.lookup(key, CTX) for key in keys] == [False, False, False]
    assert harness.files(".tmp") == [] and harness.tier.used_bytes == 0
    assert harness.tier.take_events() == []  # never announced
    monkeypatch.undo()
    assert harness.store(keys)


def test_partial_writes_are_completed(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    real_writev = os.writev

    def short_writev(fd: int, buffers: list[memoryview]) -> int:
        return real_writev(fd, [bytes(buffers[0])[:5]])  # 5 bytes at a time

    monkeypatch.setattr(os, "writev", short_writev)
    k1 = to_key(1)
    assert harness.store([k1])
    monkeypatch.undo()
    assert harness.load([k1], [3]) and harness.row(3) == content(k1)


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
    assert harness.tier.lookup(k1, CTX) is False
    denied.update(write=False, read=True)
    assert harness.store([k2])
    assert not harness.load([k2], [4])
    assert harness.tier.lookup(k2, CTX) is False  # an unreadable block is a miss afterwards


def test_partial_reads_are_completed(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    real_preadv = os.preadv

    def short_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        return real_preadv(fd, [buffers[0][:7]], offset)  # 7 bytes at a time

    k1 = to_key(1)
    assert harness.store([k1])
    monkeypatch.setattr(os, "preadv", short_preadv)
    assert harness.load([k1], [3]) and harness.row(3) == content(k1)


@pytest.mark.parametrize("piece", [1, 7, RECORD_HEADER_BYTES + 12, RECORD - 1, RECORD, RECORD + 1, 4 * RECORD])
def test_runs_are_read_in_pieces_of_bounded_size(
    harness: Harness, piece: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = to_keys([1, 2, 3, 4])
    assert harness.store(keys)
    real_preadv = os.preadv
    sizes: list[int] = []

    def counting_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        sizes.append(sum(len(buffer) for buffer in buffers))
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(segment_io, "READ_PIECE_BYTES", piece)
    monkeypatch.setattr(os, "preadv", counting_preadv)
    assert harness.load(keys, [7, 6, 5, 4])
    assert [harness.row(b) for b in (7, 6, 5, 4)] == [content(k) for k in keys]
    assert sum(sizes) == 4 * RECORD  # every byte read once
    # A piece never exceeds the bound, except a header longer than it (never cut).
    assert max(sizes) <= max(piece, RECORD_HEADER_BYTES + 12)


def test_large_loads_are_split_into_read_tasks(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = to_keys(range(1, 7))
    assert harness.store(keys)
    real_open = os.open
    opened: list[str] = []

    def counting_open(path: str, flags: int, mode: int = 0o777) -> int:
        if not flags & os.O_WRONLY:
            opened.append(path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(segment_io, "READ_TASK_BYTES", 2 * RECORD)
    monkeypatch.setattr(os, "open", counting_open)
    # Records 1, 2, 3 and 5 (4 is skipped: two runs), loaded in scrambled order.
    wanted = [keys[4], keys[0], keys[2], keys[1]]
    assert harness.load(wanted, [4, 5, 6, 7])
    assert [harness.row(b) for b in (4, 5, 6, 7)] == [content(k) for k in wanted]
    assert len(opened) == 2  # 2 records per task: one open each


def test_dropped_blocks_stay_dropped_after_a_restart(tmp_path: Path) -> None:
    k1, k2, k3 = to_keys([1, 2, 3])
    first = Harness(tmp_path / "fs")
    assert first.store([k1, k2]) and first.store([k3], [2])
    corrupt_payload(*record_of(first, k2))  # its segment lives on (k1): the record is marked dead
    corrupt_payload(*record_of(first, k3))  # its segment empties: deleted, even at shutdown
    assert not first.load([k2], [4]) and not first.load([k3], [5])
    first.close()
    second = Harness(tmp_path / "fs")
    assert [second.tier.lookup(k, CTX) for k in (k1, k2, k3)] == [True, False, False]
    assert second.tier.num_segments == 1
    second.close()


# --- damage anywhere in a record never yields wrong bytes (issue 13, point 8) ---

GROUP_0 = make_offload_key(b"prefix01", 0)
GROUP_1 = make_offload_key(b"prefix01", 1)


@settings(max_examples=120, deadline=None)
@given(
    record=st.integers(0, 1),
    position=st.integers(0, RECORD - 1),
    bit=st.integers(0, 7),
    restart=st.booleans(),
    piece=st.sampled_from(PIECES),
)
def test_a_flipped_bit_anywhere_never_serves_wrong_bytes(
    record: int, position: int, bit: int, restart: bool, piece: int
) -> None:
    # Two blocks whose keys differ in one bit of the group index, in two segments, the damaged
    # one newest: a flipped key bit could turn group 0's record into group 1's.
    with (
        tempfile.TemporaryDirectory(prefix="kvref-flip-") as tmp,
        mock.patch.object(segment_io, "READ_PIECE_BYTES", piece),
    ):
        h = Harness(Path(tmp) / "fs")
        try:
            damaged, other = (GROUP_0, GROUP_1) if record == 0 else (GROUP_1, GROUP_0)
            assert h.store([other], [0])
            assert h.store([damaged], [1])
            path, offset, _size = record_of(h, damaged)
            data = bytearray(path.read_bytes())
            data[offset + position] ^= 1 << bit
            path.write_bytes(bytes(data))
            if restart:
                h.tier.shutdown()
                h.tier = FileSystemSecondaryTier(h.view, h.root, n_read_threads=1, n_write_threads=1)
            for key in (GROUP_0, GROUP_1):
                if h.tier.lookup(key, CTX) is True and h.load([key], [5]):
                    assert h.row(5) == content(key), f"{key.hex()} loaded another block's bytes"
            # The undamaged block is never lost to its neighbour's damage.
            assert h.tier.lookup(other, CTX) is True
            assert h.load([other], [6]) and h.row(6) == content(other)
        finally:
            h.close()


# --- a full disk (point 8) ---


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
    for name in ("write", "pwrite", "writev"):
        monkeypatch.setattr(os, name, no_space)
    monkeypatch.setattr(os, "open", open_without_creating)
    monkeypatch.setattr(Path, "write_text", no_space)
    second = Harness(tmp_path / "fs")
    assert [second.tier.lookup(key, CTX) for key in keys] == [True, True]
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
    with pytest.raises(TierRootError, match=r"root_dir '.*fs' is not usable: No space left on device"):
        FileSystemSecondaryTier(make_view(2), tmp_path / "fs")
    assert [p.name for p in (tmp_path / "fs").iterdir()] == [LOCK_FILE_NAME]


# --- one process per root (point 8) ---


def test_a_second_tier_on_the_same_root_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = Harness(tmp_path / "fs")
    with pytest.raises(TierRootError, match=rf"another fs tier holds it \(pid {os.getpid()}\b"):
        FileSystemSecondaryTier(make_view(2), tmp_path / "fs")
    first.close()
    FileSystemSecondaryTier(make_view(2), tmp_path / "fs").shutdown()  # free again


def _try_to_open(root: str, result: Any) -> None:
    try:
        tier = FileSystemSecondaryTier(make_view(2), root, n_read_threads=1, n_write_threads=1)
    except OSError as exc:
        result.put(f"refused: {exc}")
    else:
        result.put(f"opened: {len(tier)} blocks")
        tier.shutdown()


def test_another_process_is_refused_while_the_root_is_held(tmp_path: Path) -> None:
    first = Harness(tmp_path / "fs")
    assert first.store(to_keys([1]))
    context = multiprocessing.get_context("spawn")
    result = context.SimpleQueue()
    child = context.Process(target=_try_to_open, args=(str(first.root), result))
    child.start()
    child.join(60)
    outcome = result.get()
    assert outcome.startswith("refused: ") and f"(pid {os.getpid()}," in outcome, outcome
    # The holder's data and temporary files were left alone.
    assert first.tier.lookup(to_key(1), CTX) is True and first.load(to_keys([1]), [3])
    first.close()
    child = context.Process(target=_try_to_open, args=(str(first.root), result))
    child.start()
    child.join(60)
    assert result.get() == "opened: 1 blocks"
