"""FileSystemSecondaryTier stays off the page cache: after an engine stores 256 MiB and its jobs
finish, at most 10% of those bytes are in the page cache, with O_DIRECT and with the buffered
fallback a root that refuses O_DIRECT gets (forced here by refusing the probe); the same after
loading them back. Residency is counted with `mincore(2)`, as `fincore` counts it.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import shutil
from pathlib import Path

import pytest

from kvref.base import ReqContext, make_offload_key
from kvref.tiering.base import TransferJob
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.fs import tier as tier_module
from tests.tiering.helpers import make_spec

CTX = ReqContext(req_id="page-cache")
BLOCK_BYTES = 1 << 20
NUM_BLOCKS = 256  # 256 MiB, as the bound is stated
JOB_BLOCKS = 16
MAX_RESIDENT_SHARE = 0.10

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_bytes(path: Path) -> int:
    """Bytes of `path`'s data in the page cache now (mapping a file faults nothing in)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if not size:
            return 0
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vector = (ctypes.c_ubyte * pages)()
            assert _libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
            return min(size, sum(byte & 1 for byte in vector) * mmap.PAGESIZE)
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)


def root_resident_bytes(root: Path) -> int:
    return sum(resident_bytes(path) for path in root.rglob("*.kvb"))


def on_a_disk(tmp_path: Path) -> Path:
    """`tmp_path`, unless it is on tmpfs (where the page cache is the storage): then a directory
    beside the tests, on the checkout's disk."""
    mounts: list[tuple[str, str]] = []
    with open("/proc/self/mounts") as table:
        for line in table:
            fields = line.split()
            mounts.append((fields[1], fields[2]))
    resolved = str(tmp_path.resolve())
    _point, fs_type = max(
        ((point, fs) for point, fs in mounts if resolved == point or resolved.startswith(point.rstrip("/") + "/")),
        key=lambda mount: len(mount[0]),
    )
    if fs_type != "tmpfs":
        return tmp_path
    return Path(__file__).resolve().parents[2] / ".pytest_cache" / f"page-cache-{os.getpid()}"


def refuse_o_direct(root: Path) -> bool:
    return False


def run(tier: FileSystemSecondaryTier, promotion: bool, first_id: int) -> None:
    job_id = first_id
    for first in range(0, NUM_BLOCKS, JOB_BLOCKS):
        ids = list(range(first, first + JOB_BLOCKS))
        keys = tuple(make_offload_key(i.to_bytes(32, "big"), 0) for i in ids)
        (tier.submit_load if promotion else tier.submit_store)(TransferJob(job_id, keys, ids, promotion, CTX))
        job_id += 1
    tier.drain_jobs()
    results = list(tier.get_finished_jobs())
    assert len(results) == job_id - first_id and all(result.success for result in results)


@pytest.mark.parametrize("mode", ["o_direct", "buffered_fallback"])
def test_stored_and_loaded_blocks_leave_the_page_cache(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fallback = mode == "buffered_fallback"
    if fallback:
        monkeypatch.setattr(tier_module, "probe_o_direct", refuse_o_direct)
    directory = on_a_disk(tmp_path)
    root = directory / "fs"
    rows = mmap.mmap(-1, 2 * NUM_BLOCKS * BLOCK_BYTES)  # page-aligned, as vLLM's primary is
    view = memoryview(rows).cast("B", (2 * NUM_BLOCKS, BLOCK_BYTES))
    stored = NUM_BLOCKS * BLOCK_BYTES
    pattern = os.urandom(BLOCK_BYTES)
    for i in range(NUM_BLOCKS):
        rows[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES] = pattern[i:] + pattern[:i]  # each block its own
    caplog.set_level(logging.WARNING, logger=tier_module.__name__)
    tier = FileSystemSecondaryTier(make_spec(), view, "fs", root_dir=root)
    try:
        assert tier.direct is not fallback
        # An engine stores 256 MiB; once its jobs have finished, its blocks are on the disk only.
        run(tier, False, 0)
        after_store = root_resident_bytes(root)
        assert after_store <= MAX_RESIDENT_SHARE * stored, f"{after_store / stored:.1%} of the stored bytes cached"
        # Loaded back (into other rows): right bytes, and the reads left nothing cached either.
        ids = list(range(NUM_BLOCKS))
        keys = tuple(make_offload_key(i.to_bytes(32, "big"), 0) for i in ids)
        for first in range(0, NUM_BLOCKS, JOB_BLOCKS):
            batch = slice(first, first + JOB_BLOCKS)
            rows_to = [NUM_BLOCKS + i for i in ids[batch]]
            tier.submit_load(TransferJob(1000 + first, keys[batch], rows_to, True, CTX))
        tier.drain_jobs()
        assert all(result.success for result in tier.get_finished_jobs())
        half = NUM_BLOCKS * BLOCK_BYTES
        assert rows[half : 2 * half] == rows[:half]
        after_load = root_resident_bytes(root)
        assert after_load <= MAX_RESIDENT_SHARE * stored, f"{after_load / stored:.1%} of the loaded bytes cached"
    finally:
        tier.shutdown()
        view.release()
        rows.close()
        if directory != tmp_path:
            shutil.rmtree(directory, ignore_errors=True)
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    if fallback:
        assert len(warnings) == 1 and "O_DIRECT" in warnings[0].getMessage(), [r.getMessage() for r in warnings]
    else:
        assert not warnings, [r.getMessage() for r in warnings]
