"""SharedOffloadRegion: create-or-join, sizes, views, pre-faulting and cleanup (in tmp dirs)."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from kvref.cpu import shared_region
from kvref.cpu.shared_region import SharedOffloadRegion, SharedRegionError


def make_region(tmp_path: Path, **kwargs: object) -> SharedOffloadRegion:
    options: dict[str, object] = {"num_blocks": 4, "rank_slot_bytes": 32, "directory": tmp_path}
    options.update(kwargs)
    return SharedOffloadRegion("test", **options)  # type: ignore[arg-type]


def test_creator_sizes_file_and_unlinks_it(tmp_path: Path) -> None:
    region = make_region(tmp_path, world_size=2)
    assert region.created
    assert region.path == tmp_path / "kvref_offload_test.mmap"
    assert region.row_stride == 64
    assert os.path.getsize(region.path) == 4 * 64
    region.cleanup()
    assert region.closed
    assert not region.path.exists()
    region.cleanup()  # safe twice


def test_kv_memoryview_is_2d_zero_copy_rows(tmp_path: Path) -> None:
    with make_region(tmp_path) as region:
        view = region.create_kv_memoryview()
        assert view.shape == (4, 32)
        assert view.strides == (32, 1)
        assert view is region.create_kv_memoryview()
        flat = view.cast("B")
        flat[2 * 32 : 3 * 32] = bytes(range(32))
        assert view[2, 5] == 5
        flat.release()
    assert not region.path.exists()


def test_joiner_sees_creator_bytes_and_does_not_unlink(tmp_path: Path) -> None:
    creator = make_region(tmp_path)
    joiner = make_region(tmp_path)
    assert not joiner.created
    creator.create_kv_memoryview().cast("B")[0:4] = b"abcd"
    assert bytes(joiner.create_kv_memoryview().cast("B")[0:4]) == b"abcd"
    joiner.cleanup()
    assert creator.path.exists()
    creator.cleanup()
    assert not creator.path.exists()


def test_concurrent_openers_agree_on_one_creator(tmp_path: Path) -> None:
    regions: list[SharedOffloadRegion] = []
    lock = threading.Lock()

    def open_one() -> None:
        region = make_region(tmp_path, num_blocks=64)
        with lock:
            regions.append(region)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(region.created for region in regions) == [False, False, False, True]
    for region in regions:
        region.cleanup()
    assert not (tmp_path / "kvref_offload_test.mmap").exists()


def test_join_rejects_file_of_another_size(tmp_path: Path) -> None:
    (tmp_path / "kvref_offload_test.mmap").write_bytes(b"\0" * 100)
    with pytest.raises(SharedRegionError, match=r"is 100 bytes but this process expects 128"):
        make_region(tmp_path)
    assert (tmp_path / "kvref_offload_test.mmap").exists()  # not ours: never unlinked


def test_join_times_out_on_a_file_never_sized(tmp_path: Path) -> None:
    (tmp_path / "kvref_offload_test.mmap").touch()
    with pytest.raises(SharedRegionError, match=r"did not reach its size of 128 bytes within"):
        make_region(tmp_path, join_timeout_s=0.05)


def test_join_waits_for_the_creator_to_size_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kvref_offload_test.mmap"
    path.touch()
    timer = threading.Timer(0.05, lambda: os.truncate(path, 128))
    timer.start()
    with make_region(tmp_path, join_timeout_s=5) as region:
        assert not region.created
    timer.join()


def test_creator_reports_missing_space_and_removes_its_file(tmp_path: Path) -> None:
    with pytest.raises(SharedRegionError, match=r"bytes free but the shared region needs"):
        make_region(tmp_path, num_blocks=1 << 40, rank_slot_bytes=1 << 20)
    assert not (tmp_path / "kvref_offload_test.mmap").exists()


def test_unusable_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SharedRegionError, match=r"cannot create the shared region"):
        make_region(tmp_path / "missing")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_blocks": 0}, "num_blocks must be >= 1"),
        ({"rank_slot_bytes": 0}, "rank_slot_bytes must be >= 1"),
        ({"world_size": 0}, "world_size must be >= 1"),
        ({"world_size": 2, "rank": 2}, r"rank must be None or in \[0, 2\)"),
        ({"join_timeout_s": -1}, "join_timeout_s must be >= 0"),
    ],
)
def test_invalid_arguments(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_region(tmp_path, **kwargs)


def test_invalid_instance_id(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="instance_id"):
        SharedOffloadRegion("../etc", 1, 1, directory=tmp_path)


def test_prefault_fallback_touches_pages_without_changing_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creator = make_region(tmp_path, num_blocks=8, rank_slot_bytes=4096, world_size=2)
    flat = creator.create_kv_memoryview().cast("B")
    flat[:] = bytes(i % 251 for i in range(len(flat)))
    # An advice value the kernel rejects with EINVAL takes the read-modify-write path.
    monkeypatch.setattr(shared_region, "_MADV_POPULATE_WRITE", 0x7FFF)
    for rank in (None, 0, 1):
        joiner = make_region(tmp_path, num_blocks=8, rank_slot_bytes=4096, world_size=2, rank=rank)
        joiner.cleanup()
    monkeypatch.setattr(shared_region, "_MADV_POPULATE_WRITE", None)
    make_region(tmp_path, num_blocks=8, rank_slot_bytes=4096, world_size=2).cleanup()
    assert bytes(flat) == bytes(i % 251 for i in range(len(flat)))
    flat.release()
    creator.cleanup()


def test_merge_page_ranges_aligns_and_merges() -> None:
    page = shared_region.mmap.PAGESIZE
    merged = shared_region._merge_page_ranges(  # pyright: ignore[reportPrivateUsage]
        [(10, 20), (page + 5, 10), (page + 100, page)]
    )
    assert merged == [(0, 30), (page, 100 + page)]


def test_cleanup_with_a_view_still_referenced_keeps_it_valid(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    region = make_region(tmp_path)
    rows = region.create_kv_memoryview().cast("B")
    with caplog.at_level(logging.WARNING):
        region.cleanup()
    assert "still referenced" in caplog.text
    assert not region.path.exists()
    rows[0] = 7  # the mapping outlives the region object while a view holds it
    assert rows[0] == 7
    rows.release()
    with pytest.raises(SharedRegionError, match="cleaned up"):
        region.create_kv_memoryview()


def test_worker_views_are_strided_pages_of_the_rank_slot(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="worker views are torch tensors")
    scheduler = make_region(tmp_path, num_blocks=3, rank_slot_bytes=16, world_size=2)
    worker = make_region(tmp_path, num_blocks=3, rank_slot_bytes=16, world_size=2, rank=1)
    keys_page = worker.create_next_worker_view(10)
    values_page = worker.create_next_worker_view(6)
    assert keys_page.shape == (3, 10) and keys_page.stride() == (32, 1)
    assert values_page.dtype == torch.int8
    keys_page[2].fill_(1)
    values_page[2].fill_(2)
    rows = scheduler.create_kv_memoryview()
    # block 2, rank 1's slot = bytes 16..31 of row 2: 10 key bytes then 6 value bytes
    assert [rows[2, i] for i in range(32)] == [0] * 16 + [1] * 10 + [2] * 6
    with pytest.raises(ValueError, match="does not fit in rank 1's slot: 0 of 16 bytes left"):
        worker.create_next_worker_view(1)
    with pytest.raises(ValueError, match="needs a worker rank"):
        scheduler.create_next_worker_view(4)
    worker.cleanup()
    keys_page[0].fill_(3)  # the tensor keeps the mapping alive after cleanup
    assert rows[0, 16] == 3
    scheduler.cleanup()


def test_canonical_views_are_the_same_bytes_on_every_rank(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="canonical views are torch tensors")
    rank0 = make_region(tmp_path, num_blocks=3, rank_slot_bytes=16, world_size=2, rank=0)
    rank1 = make_region(tmp_path, num_blocks=3, rank_slot_bytes=16, world_size=2, rank=1)
    first = rank0.create_next_canonical_view(20)
    assert first.shape == (3, 20) and first.stride() == (32, 1)
    assert rank0.create_next_canonical_view(12).storage_offset() == 20
    theirs = rank1.create_next_canonical_view(20)
    theirs[1, 19] = 5  # rank 1 writes into what is rank 0's slot in the worker layout
    assert first[1, 19] == 5
    with pytest.raises(ValueError, match="does not fit in the row: 0 of 32 bytes left"):
        rank0.create_next_canonical_view(1)
    rank1.cleanup()
    rank0.cleanup()


def test_vllm_names_describe_the_same_sizes(tmp_path: Path) -> None:
    with make_region(tmp_path, num_blocks=5, rank_slot_bytes=24, world_size=3, rank=2) as region:
        assert (region.num_chunks, region.cpu_page_size, region.total_size_bytes) == (5, 24, 5 * 72)
        assert region.page_size == shared_region.mmap.PAGESIZE
        assert region.BLOCK_SIZE_ALIGNMENT == shared_region.mmap.PAGESIZE


def test_worker_slot_ranges_are_page_rounded_rows_of_the_slot(tmp_path: Path) -> None:
    page = shared_region.mmap.PAGESIZE
    with make_region(tmp_path, num_blocks=3, rank_slot_bytes=page + 100, world_size=2, rank=1) as region:
        row = 2 * (page + 100)
        starts = [r * row + page + 100 for r in range(3)]
        expected: list[tuple[int, int]] = []
        for start in starts:
            aligned = start - start % page
            end = -(-(start + page + 100) // page) * page
            expected.append((aligned, end - aligned))
        assert list(region.iter_worker_slot_ranges()) == expected
        assert all(offset % page == 0 and length % page == 0 for offset, length in expected)
    with make_region(tmp_path) as scheduler, pytest.raises(ValueError, match="needs a worker rank"):
        next(scheduler.iter_worker_slot_ranges())
