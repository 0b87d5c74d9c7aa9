"""Pinning host memory in place: chunking, all-or-nothing registration, and the region's pins.

A scripted CUDA runtime stands in for `torch.cuda.cudart()`, so this runs without a GPU.
"""

from __future__ import annotations

import logging
import math
import mmap
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvref.cpu.host_register import (
    MIN_HOST_REGISTER_SAVED_BYTES,
    host_register,
    pin_mmap_region,
    pin_rows,
    register_ranges,
    row_aligned_chunks,
)
from kvref.cpu.kv_views import private_rows
from kvref.cpu.shared_region import SharedOffloadRegion

PAGE = mmap.PAGESIZE


class FakeCudart:
    """Records registrations; refuses the one covering `fail_at`."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.registered: dict[int, int] = {}
        self.fail_at = fail_at

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        if self.fail_at is not None and ptr <= self.fail_at < ptr + size:
            return 2
        assert ptr not in self.registered
        self.registered[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        self.registered.pop(ptr)
        return 0


@pytest.fixture
def cudart(monkeypatch: pytest.MonkeyPatch) -> FakeCudart:
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    return fake


def test_without_cuda_nothing_is_registered() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert host_register(4096, 4096) is False


def test_a_refused_range_rolls_back_the_ones_before(
    cudart: FakeCudart, caplog: pytest.LogCaptureFixture
) -> None:
    cudart.fail_at = 3 * PAGE
    with caplog.at_level(logging.WARNING):
        assert register_ranges([(PAGE, PAGE), (2 * PAGE, PAGE), (3 * PAGE, PAGE)]) is None
    assert cudart.registered == {}
    assert "cudaError 2" in caplog.text
    assert register_ranges([(PAGE, PAGE), (2 * PAGE, PAGE)]) == [PAGE, 2 * PAGE]


@given(
    num_rows=st.integers(1, 40),
    row_stride=st.integers(1, 3 * PAGE),
    max_chunk=st.integers(1, 8 * PAGE),
)
def test_chunks_tile_the_rows_and_end_on_rows_at_page_boundaries(
    num_rows: int, row_stride: int, max_chunk: int
) -> None:
    total = num_rows * row_stride
    chunks = list(row_aligned_chunks(total, row_stride, PAGE, max_chunk))
    assert chunks[0][0] == 0 and sum(length for _, length in chunks) == total
    assert all(a + n == b for (a, n), (b, _) in zip(chunks, chunks[1:]))
    for offset, _ in chunks[1:]:
        assert offset % row_stride == 0 and offset % PAGE == 0
    rows_filling_pages = PAGE // math.gcd(row_stride, PAGE) * row_stride
    assert all(length <= max(max_chunk, rows_filling_pages) for _, length in chunks)


def make_region(tmp_path: Path, slot: int, rank: int | None = 0) -> SharedOffloadRegion:
    return SharedOffloadRegion("pin", 4, slot, world_size=2, rank=rank, directory=tmp_path, prefault=False)


def test_the_whole_region_is_pinned_and_unpinned_on_cleanup(tmp_path: Path, cudart: FakeCudart) -> None:
    region = make_region(tmp_path, PAGE)
    pin_mmap_region(region)
    base = region.base_tensor.data_ptr()
    assert region.is_pinned and cudart.registered == {base: region.total_size_bytes}
    assert region.pinned_addresses == [base]
    region.cleanup()
    assert cudart.registered == {} and not region.is_pinned


def test_only_the_rank_slots_are_pinned_when_that_saves_enough(tmp_path: Path, cudart: FakeCudart) -> None:
    small = make_region(tmp_path, PAGE, rank=1)
    pin_mmap_region(small, worker_slot_only=True)  # saves a page a row: not worth a call per row
    assert len(cudart.registered) == 1
    small.cleanup()
    slot = MIN_HOST_REGISTER_SAVED_BYTES
    big = make_region(tmp_path, slot, rank=1)
    pin_mmap_region(big, worker_slot_only=True)
    base = big.base_tensor.data_ptr()
    assert cudart.registered == {base + offset: length for offset, length in big.iter_worker_slot_ranges()}
    assert len(cudart.registered) == 4
    big.cleanup()
    assert cudart.registered == {}


def test_a_region_that_cannot_be_pinned_stays_pageable(tmp_path: Path, cudart: FakeCudart) -> None:
    region = make_region(tmp_path, MIN_HOST_REGISTER_SAVED_BYTES, rank=0)
    cudart.fail_at = region.base_tensor.data_ptr() + 3 * region.row_stride
    pin_mmap_region(region, worker_slot_only=True)
    assert not region.is_pinned and region.pinned_addresses == [] and cudart.registered == {}
    region.cleanup()


def test_private_rows_are_pinned_per_tensor(cudart: FakeCudart) -> None:
    rows = [private_rows(3, 100), private_rows(2, PAGE)]
    assert all(t.data_ptr() % PAGE == 0 for t in rows)  # an anonymous mapping starts on a page
    addresses = pin_rows(rows)
    assert addresses == [t.data_ptr() for t in rows]
    assert cudart.registered == {rows[0].data_ptr(): 300, rows[1].data_ptr(): 2 * PAGE}
