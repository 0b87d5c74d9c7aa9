"""The fs tier's staging buffers on transparent huge pages (`kvref.tiering.fs.huge_pages`)."""

from __future__ import annotations

import ctypes
import mmap
import re
import threading
from pathlib import Path

import pytest

from kvref.tiering.base import PrimaryBlocks
from kvref.tiering.fs.block_io import BlockIO, Transfer
from kvref.tiering.fs.format import header_bytes
from kvref.tiering.fs.huge_pages import HUGE_PAGE_BYTES, StagingBuffer, transparent_huge_pages
from tests.tiering.helpers import content, to_keys
from tests.tiering.test_fs import Harness, aligned_view


def address_of(view: memoryview) -> int:
    anchor = ctypes.c_char.from_buffer(view)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


def huge_bytes_at(address: int) -> int:
    """AnonHugePages of the mapping holding `address`, from /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        bounds = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if bounds:
            inside = int(bounds[1], 16) <= address < int(bounds[2], 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("payload", [4096, 256 << 10, 2 << 20, 3 << 20])
def test_the_payload_starts_a_huge_page_and_lies_on_huge_pages(payload: int) -> None:
    lead = 8192
    buffer = StagingBuffer(lead + payload + 4096, lead, payload)
    try:
        assert len(buffer.view) == lead + payload + 4096 and not buffer.view.readonly
        start = address_of(buffer.view)
        assert start % mmap.PAGESIZE == 0 and (start + lead) % HUGE_PAGE_BYTES == 0
        assert bytes(buffer.view[:16]) == bytes(16)
        buffer.view[-1] = 7  # writable to its last byte
        if transparent_huge_pages():  # the kernel of this project's machines grants them
            assert huge_bytes_at(start + lead) >= -(-payload // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    finally:
        buffer.close()


def test_a_payload_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        StagingBuffer(8192, 4096, 8192)
    with pytest.raises(ValueError, match="do not fit"):
        StagingBuffer(8192, 100, 4096)


@pytest.mark.parametrize("staging", [None, True, False])
def test_the_tier_says_how_it_moves_payloads_and_loads_right_bytes_either_way(tmp_path: Path, staging: bool | None) -> None:
    h = Harness(tmp_path / "fs", aligned_view(6, 8192), huge_page_staging=staging)
    try:
        assert h.tier.direct
        expected = staging if staging is not None else transparent_huge_pages()
        assert h.tier.transfer is (Transfer.HUGE_PAGES if expected else Transfer.ZERO_COPY)
        assert h.tier.transfer.value in repr(h.tier)
        keys = to_keys([1, 2, 3])
        assert h.store(keys)
        assert h.load(keys, [5, 4, 3])
        assert [h.row(i) for i in (5, 4, 3)] == [content(key, 8192) for key in keys]
    finally:
        h.close()


def test_huge_page_staging_must_be_a_bool_or_none(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="huge_page_staging"):
        Harness(tmp_path / "fs", aligned_view(2, 4096), huge_page_staging="yes")


@pytest.mark.parametrize(("block_bytes", "shared"), [(256 << 10, True), (2 << 20, False)])
def test_prepared_staging_buffers_are_one_per_thread_and_small_ones_share_huge_pages(
    block_bytes: int, shared: bool
) -> None:
    io = BlockIO(
        PrimaryBlocks(aligned_view(2, block_bytes)),
        direct=True,
        keep_page_cache=False,
        fsync=False,
        token="t",
        huge_page_staging=True,
    )
    threads = 5
    io.prepare_threads(threads, 0)
    taken: list[tuple[int, int]] = []
    lock = threading.Lock()

    def take() -> None:
        buffer = io._buffer()  # pyright: ignore[reportPrivateUsage]
        with lock:
            taken.append((address_of(buffer), len(buffer)))

    workers = [threading.Thread(target=take) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    spans = sorted(taken)
    assert len({start for start, _ in spans}) == threads  # a buffer of its own per thread
    assert all(start % mmap.PAGESIZE == 0 for start, _ in spans)
    ends = [start + size for start, size in spans]
    assert all(end <= next_start for end, (next_start, _) in zip(ends, spans[1:]))  # no overlap
    slot = spans[0][1]
    if shared:  # back to back in one mapping: seven 276 KiB slots to a huge page
        assert [start - spans[0][0] for start, _ in spans] == [i * slot for i in range(threads)]
    else:  # each payload starts a huge page of its own
        assert all((start + header_bytes(32)) % HUGE_PAGE_BYTES == 0 for start, _ in spans)
    if transparent_huge_pages():
        payload = spans[0][0] + (0 if shared else header_bytes(32))
        assert huge_bytes_at(payload) >= HUGE_PAGE_BYTES
    # A thread beyond those prepared makes its own.
    extra: list[int] = []
    worker = threading.Thread(target=lambda: extra.append(address_of(io._buffer())))  # pyright: ignore[reportPrivateUsage]
    worker.start()
    worker.join()
    assert extra and extra[0] not in {start for start, _ in spans}
