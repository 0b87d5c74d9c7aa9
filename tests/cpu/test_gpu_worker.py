"""The CPU<->GPU worker: byte-exact round trips, queues, results, misuse and shutdown.

Everything runs on the CPU (the same classes and code path, synchronous copies) unless marked
`cuda`; the CUDA tests repeat the key scenarios with streams, events and pinned memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LoadStoreSpec,
)
from kvref.cpu import gpu_worker
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.gpu_worker import CPUOffloadingWorker, SingleDirectionOffloadingHandler, TransferProtocolError
from kvref.cpu.shared_region import SharedOffloadRegion

CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device; none is available")

NUM_GPU_BLOCKS = 24
NUM_CHUNKS = 12
SHAPES = ((4, 8), (4, 8), (2, 6))  # per tensor, a block's shape in bfloat16
GROUPS = ((0, 1), (2,))


def make_caches(
    device: str = "cpu", groups: Sequence[Sequence[int]] = GROUPS, seed: int = 0
) -> CanonicalKVCaches:
    """Model-shaped KV caches of random values, one group per entry of `groups`."""
    generator = torch.Generator().manual_seed(seed)
    tensors = [
        torch.randn((NUM_GPU_BLOCKS, *shape), generator=generator).to(torch.bfloat16).to(device)
        for shape in SHAPES
    ]
    pages = [t[0].numel() * t.element_size() for t in tensors]
    return CanonicalKVCaches(
        [CanonicalKVCacheTensor(t, page) for t, page in zip(tensors, pages)],
        [[CanonicalKVCacheRef(i, pages[i]) for i in group] for group in groups],
    )


def gpu_bytes(caches: CanonicalKVCaches, t: int, block: int) -> bytes:
    return caches.tensors[t].tensor[block].cpu().view(torch.int8).numpy().tobytes()


def store_spec(
    gpu: Sequence[Sequence[int]], chunks: Sequence[Sequence[int]], indices: Sequence[int]
) -> tuple[GPULoadStoreSpec, CPULoadStoreSpec]:
    return (
        GPULoadStoreSpec([b for g in gpu for b in g], [len(g) for g in gpu], indices),
        CPULoadStoreSpec([c for g in chunks for c in g]),
    )


def drain(worker: CPUOffloadingWorker) -> list[int]:
    results = worker.get_finished()
    assert all(r.success for r in results)
    return [r.job_id for r in results]


def round_trip(
    worker: CPUOffloadingWorker,
    caches: CanonicalKVCaches,
    stored: Sequence[Sequence[int]],
    chunks: Sequence[Sequence[int]],
    indices: Sequence[int],
    loaded_into: Sequence[Sequence[int]],
) -> None:
    """Store `stored` into `chunks`, reload them into `loaded_into`, compare every byte."""
    before = {(t, b): gpu_bytes(caches, t, b) for t in range(len(SHAPES)) for b in range(NUM_GPU_BLOCKS)}
    gpu_spec, cpu_spec = store_spec(stored, chunks, indices)
    assert worker.submit_store(1, gpu_spec, cpu_spec)
    worker.wait({1})
    assert drain(worker) == [1]
    load_gpu, _ = store_spec(loaded_into, chunks, indices)
    assert worker.submit_load(2, cpu_spec, load_gpu)
    assert drain(worker) == [2]
    for group, tensors in enumerate(GROUPS):
        for t in tensors:
            for source, target in zip(stored[group], loaded_into[group]):
                assert gpu_bytes(caches, t, target) == before[(t, source)]
    # Blocks no load wrote keep their bytes.
    written = {(t, b) for group, tensors in enumerate(GROUPS) for t in tensors for b in loaded_into[group]}
    for (t, b), data in before.items():
        if (t, b) not in written:
            assert gpu_bytes(caches, t, b) == data


@pytest.mark.parametrize("bpc", [1, 3])
def test_blocks_round_trip_through_private_rows(bpc: int) -> None:
    caches = make_caches()
    worker = CPUOffloadingWorker(caches, bpc, NUM_CHUNKS)
    # Group 0 starts one GPU block into its first chunk; group 1 is chunk-aligned.
    stored = [[9, 3, 4, 17, 8], [1, 20]]
    chunks = [[7, 2] if bpc == 3 else [7, 2, 0, 5, 6], [11] if bpc == 3 else [11, 10]]
    round_trip(worker, caches, stored, chunks, [4, 0], [[0, 5, 6, 7, 10], [22, 23]])
    worker.shutdown()


def test_an_empty_group_moves_nothing_and_takes_no_ids() -> None:
    caches = make_caches()
    worker = CPUOffloadingWorker(caches, 2, NUM_CHUNKS)
    round_trip(worker, caches, [[], [5, 6]], [[], [3]], [0, 0], [[], [0, 1]])


def test_a_result_reports_the_bytes_and_the_time_of_its_job() -> None:
    caches = make_caches()
    worker = CPUOffloadingWorker(caches, 1, NUM_CHUNKS)
    gpu_spec, cpu_spec = store_spec([[1, 2, 3], [4]], [[0, 1, 2], [3]], [0, 0])
    assert worker.submit_store(7, gpu_spec, cpu_spec)
    (result,) = worker.get_finished()
    pages = [t.page_size_bytes for t in caches.tensors]
    assert (result.job_id, result.success, result.transfer_size) == (
        7,
        True,
        3 * (pages[0] + pages[1]) + pages[2],
    )
    assert result.transfer_time is not None and result.transfer_time > 0
    assert worker.get_finished() == []


class GatedEvent:
    """A host event that stays incomplete until its job is released (a slow copy)."""

    released: set[int] = set()
    created: list[GatedEvent] = []

    def __init__(self) -> None:
        self.job: int | None = None
        GatedEvent.created.append(self)

    def record(self) -> None:
        return None

    def query(self) -> bool:
        return self.job in GatedEvent.released

    def synchronize(self) -> None:
        return None

    def elapsed_ms(self, end: object) -> float:
        return 1.0


def test_an_expedited_load_does_not_wait_behind_regular_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_worker, "HostEvent", GatedEvent)
    monkeypatch.setattr(GatedEvent, "released", set[int]())
    monkeypatch.setattr(GatedEvent, "created", [])
    worker = CPUOffloadingWorker(make_caches(groups=[(0, 1, 2)]), 1, NUM_CHUNKS)

    def load(job_id: int, expedited: bool) -> None:
        spec = GPULoadStoreSpec([job_id], [1], [0])
        assert worker.submit_load(job_id, CPULoadStoreSpec([job_id]), spec, expedited=expedited)
        for event in GatedEvent.created[-2:]:
            event.job = job_id

    load(1, expedited=False)  # a regular load still copying
    load(2, expedited=True)
    load(3, expedited=False)
    GatedEvent.released.update({2, 3})
    # The expedited load is done; regular load 3 is done too, but its queue reports in order.
    assert drain(worker) == [2]
    GatedEvent.released.add(1)
    assert drain(worker) == [1, 3]


def test_job_ids_are_unique_until_reported_across_directions() -> None:
    worker = CPUOffloadingWorker(make_caches(), 1, NUM_CHUNKS)
    gpu_spec, cpu_spec = store_spec([[1], [2]], [[1], [2]], [0, 0])
    assert worker.submit_store(5, gpu_spec, cpu_spec)
    with pytest.raises(TransferProtocolError, match="job 5 is still in flight"):
        worker.submit_load(5, cpu_spec, gpu_spec, expedited=True)
    assert drain(worker) == [5]
    assert worker.submit_load(5, cpu_spec, gpu_spec)  # reported: the id is free again
    worker.wait({5, 99})  # an unknown id is ignored; results stay queued after a wait
    assert drain(worker) == [5]


class DiskSpec(LoadStoreSpec):
    """A medium this worker does not serve."""


Submit = Callable[[CPUOffloadingWorker], bool]


REFUSED: dict[str, tuple[Submit, type[Exception], str]] = {
    "wrong-medium": (
        lambda w: w.submit_store(1, GPULoadStoreSpec([1], [1, 0], [0, 0]), DiskSpec()),
        TypeError,
        "dst_spec must be a BlockIDsLoadStoreSpec",
    ),
    "cpu-as-gpu": (
        lambda w: w.submit_load(1, CPULoadStoreSpec([1]), CPULoadStoreSpec([1])),  # pyright: ignore[reportArgumentType]
        TypeError,
        "GPU side must be a GPULoadStoreSpec",
    ),
    "group-count": (
        lambda w: w.submit_store(1, GPULoadStoreSpec([1], [1], [0]), CPULoadStoreSpec([1])),
        ValueError,
        "one entry per KV-cache group",
    ),
    "id-out-of-range": (
        lambda w: w.submit_store(1, GPULoadStoreSpec([1, 99], [1, 1], [0, 0]), CPULoadStoreSpec([1, 2])),
        ValueError,
        r"outside \[0, 24\)",
    ),
    "ids-left-over": (
        lambda w: w.submit_store(1, GPULoadStoreSpec([1, 2], [1, 1], [0, 0]), CPULoadStoreSpec([1, 2, 3])),
        ValueError,
        "consume 2",
    ),
}


@pytest.mark.parametrize(("submit", "error", "match"), list(REFUSED.values()), ids=list(REFUSED))
def test_specs_that_do_not_fit_are_refused_before_anything_moves(
    submit: Submit, error: type[Exception], match: str
) -> None:
    caches = make_caches()
    worker = CPUOffloadingWorker(caches, 1, NUM_CHUNKS)
    before = [t.tensor.clone() for t in caches.tensors]
    with pytest.raises(error, match=match):
        submit(worker)
    assert all(torch.equal(a, t.tensor) for a, t in zip(before, caches.tensors))
    gpu_spec, cpu_spec = store_spec([[1], [2]], [[1], [2]], [0, 0])
    assert worker.submit_store(1, gpu_spec, cpu_spec)  # the refused job's id was not taken
    assert drain(worker) == [1]


def test_region_rows_are_what_the_scheduler_side_reads(tmp_path: Path) -> None:
    caches = make_caches()
    pages = [t.page_size_bytes for t in caches.tensors]
    slot = sum(pages) + 8
    with SharedOffloadRegion("w", NUM_CHUNKS, slot, world_size=2, directory=tmp_path) as scheduler:
        region = SharedOffloadRegion("w", NUM_CHUNKS, slot, world_size=2, rank=1, directory=tmp_path)
        worker = CPUOffloadingWorker(caches, 1, NUM_CHUNKS, mmap_region=region)
        gpu_spec, cpu_spec = store_spec([[3], [4]], [[5], [6]], [0, 0])
        assert worker.submit_store(1, gpu_spec, cpu_spec)
        rows = bytes(scheduler.create_kv_memoryview())
        row = 2 * slot
        # Chunk 5, rank 1's slot: tensor 0's page, then tensor 1's; tensor 2's page is in chunk 6.
        start = 5 * row + slot
        assert rows[start : start + pages[0]] == gpu_bytes(caches, 0, 3)
        assert rows[start + pages[0] : start + pages[0] + pages[1]] == gpu_bytes(caches, 1, 3)
        start = 6 * row + slot + pages[0] + pages[1]
        assert rows[start : start + pages[2]] == gpu_bytes(caches, 2, 4)
        worker.shutdown()
        assert region.closed  # the worker owned it


def test_worker_arguments_are_validated(tmp_path: Path) -> None:
    caches = make_caches()
    with pytest.raises(ValueError, match="canonical_layout=True needs an mmap_region"):
        CPUOffloadingWorker(caches, 1, NUM_CHUNKS, canonical_layout=True)
    with pytest.raises(ValueError, match="must be >= 1"):
        CPUOffloadingWorker(caches, 0, NUM_CHUNKS)
    with SharedOffloadRegion("v", 4, 4096, rank=0, directory=tmp_path) as region:
        with pytest.raises(ValueError, match="num_cpu_chunks=12 but the region has 4 chunks"):
            CPUOffloadingWorker(caches, 1, NUM_CHUNKS, mmap_region=region)
    strided = torch.zeros((NUM_GPU_BLOCKS, 8, 4), dtype=torch.bfloat16).transpose(1, 2)
    bad = CanonicalKVCaches([CanonicalKVCacheTensor(strided, 64)], [[CanonicalKVCacheRef(0, 64)]])
    with pytest.raises(ValueError, match="cannot be viewed as rows of 64 bytes"):
        CPUOffloadingWorker(bad, 1, NUM_CHUNKS)
    too_big = CanonicalKVCaches([caches.tensors[0]], [[CanonicalKVCacheRef(0, 1000)]])
    with pytest.raises(ValueError, match="a 1000-byte page does not fit"):
        CPUOffloadingWorker(too_big, 1, NUM_CHUNKS)


def test_handler_validates_its_tensors() -> None:
    gpu = [torch.zeros((4, 16), dtype=torch.int8)]
    refs = [[CanonicalKVCacheRef(0, 16)]]
    with pytest.raises(ValueError, match="rows are 16 bytes; with blocks_per_chunk=2 they must be 32"):
        SingleDirectionOffloadingHandler(
            gpu, [torch.zeros((4, 16), dtype=torch.int8)], 2, refs, gpu_to_cpu=True
        )
    with pytest.raises(ValueError, match="must be int8 rows"):
        SingleDirectionOffloadingHandler(gpu, [torch.zeros((4, 16))], 1, refs, gpu_to_cpu=True)


def test_shutdown_drains_releases_and_refuses_new_jobs(tmp_path: Path) -> None:
    region = SharedOffloadRegion("s", NUM_CHUNKS, 4096, rank=0, directory=tmp_path)
    worker = CPUOffloadingWorker(make_caches(), 1, NUM_CHUNKS, mmap_region=region)
    gpu_spec, cpu_spec = store_spec([[1], [2]], [[1], [2]], [0, 0])
    worker.submit_store(1, gpu_spec, cpu_spec)
    worker.shutdown()
    worker.shutdown()
    assert region.closed
    with pytest.raises(TransferProtocolError, match="shut down"):
        worker.submit_store(2, gpu_spec, cpu_spec)


def test_a_handler_failing_to_drain_is_logged_and_the_region_still_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    region = SharedOffloadRegion("f", NUM_CHUNKS, 4096, rank=0, directory=tmp_path)
    worker = CPUOffloadingWorker(make_caches(), 1, NUM_CHUNKS, mmap_region=region)

    def lost() -> None:
        raise RuntimeError("device lost")

    monkeypatch.setattr(worker._store_handler, "shutdown", lost)  # pyright: ignore[reportPrivateUsage]
    with caplog.at_level(logging.ERROR):
        worker.shutdown()
    assert "Failed to shut down store offloading handler" in caplog.text
    assert region.closed


# ---- generated transfers ----


@st.composite
def transfers(draw: st.DrawFn) -> tuple[int, list[list[int]], list[list[int]], list[int], list[list[int]]]:
    """(blocks per chunk, stored GPU blocks per group, chunks, block indices, reload targets)."""
    bpc = draw(st.integers(1, 3))
    free_chunks = draw(st.permutations(range(NUM_CHUNKS)))
    free_sources = draw(st.permutations(range(NUM_GPU_BLOCKS)))
    free_targets = draw(st.permutations(range(NUM_GPU_BLOCKS)))
    stored: list[list[int]] = []
    chunks: list[list[int]] = []
    indices: list[int] = []
    targets: list[list[int]] = []
    for _ in GROUPS:
        index = draw(st.integers(0, 2 * bpc))
        size = draw(st.integers(0, 5))
        count = -(-(size + index % bpc) // bpc) if size else 0
        chunks.append([free_chunks.pop() for _ in range(count)])
        stored.append([free_sources.pop() for _ in range(size)])
        targets.append([free_targets.pop() for _ in range(size)])
        indices.append(index)
    return bpc, stored, chunks, indices, targets


@settings(max_examples=25, deadline=None)
@given(transfers())
def test_generated_block_lists_round_trip_byte_for_byte(
    case: tuple[int, list[list[int]], list[list[int]], list[int], list[list[int]]],
) -> None:
    bpc, stored, chunks, indices, targets = case
    caches = make_caches()
    worker = CPUOffloadingWorker(caches, bpc, NUM_CHUNKS)
    round_trip(worker, caches, stored, chunks, indices, targets)
    worker.shutdown()


# ---- CUDA ----


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("bpc", [1, 3])
def test_cuda_round_trip_with_pinned_rows(bpc: int) -> None:
    caches = make_caches("cuda")
    worker = CPUOffloadingWorker(caches, bpc, NUM_CHUNKS)
    assert worker._private_pins  # pyright: ignore[reportPrivateUsage]
    stored = [[9, 3, 4, 17, 8], [1, 20]]
    chunks = [[7, 2] if bpc == 3 else [7, 2, 0, 5, 6], [11] if bpc == 3 else [11, 10]]
    round_trip(worker, caches, stored, chunks, [4, 0], [[0, 5, 6, 7, 10], [22, 23]])
    worker.shutdown()


@pytest.mark.cuda
@requires_cuda
def test_cuda_store_and_load_wait_for_the_compute_stream() -> None:
    caches = make_caches("cuda", groups=[(0, 1, 2)])
    worker = CPUOffloadingWorker(caches, 1, NUM_CHUNKS)
    gpu = caches.tensors[0].tensor
    # Slow work on the compute stream that ends by writing block 0; the store must see it.
    torch.cuda._sleep(50_000_000)  # pyright: ignore[reportPrivateUsage, reportUnknownMemberType]
    gpu[0].fill_(7)
    assert worker.submit_store(1, GPULoadStoreSpec([0], [1], [0]), CPULoadStoreSpec([0]))
    worker.wait({1})
    assert drain(worker) == [1]
    # Slow work that ends by zeroing block 1; the load into block 1 must land after it.
    torch.cuda._sleep(50_000_000)  # pyright: ignore[reportPrivateUsage, reportUnknownMemberType]
    gpu[1].zero_()
    assert worker.submit_load(2, CPULoadStoreSpec([0]), GPULoadStoreSpec([1], [1], [0]))
    worker.wait({2})
    torch.cuda.synchronize()
    assert torch.equal(gpu[1], torch.full_like(gpu[1], 7))
    worker.shutdown()


@pytest.mark.cuda
@requires_cuda
def test_cuda_jobs_finish_in_order_and_measure_time(tmp_path: Path) -> None:
    region = SharedOffloadRegion("c", NUM_CHUNKS, 4096, rank=0, directory=tmp_path)
    worker = CPUOffloadingWorker(make_caches("cuda", groups=[(0, 1, 2)]), 1, NUM_CHUNKS, mmap_region=region)
    assert region.is_pinned
    for job_id in range(8):
        worker.submit_store(
            job_id, GPULoadStoreSpec([job_id], [1], [0]), CPULoadStoreSpec([job_id % NUM_CHUNKS])
        )
    worker.wait({7})
    results = worker.get_finished()
    assert [r.job_id for r in results] == list(range(8))
    assert all(r.transfer_time is not None and r.transfer_time >= 0 for r in results)
    worker.shutdown()
    assert not region.is_pinned
