"""GPU<->CPU handlers: byte-exact round trips, ordering, failures and validation.

Everything runs on the CPU fallback (same handler classes, synchronous copies) unless marked
`cuda`; the CUDA tests repeat the key scenarios with streams, events and pinned memory.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from typing_extensions import override

from kvref.base import GPULoadStoreSpec
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.shared_region import SharedOffloadRegion
from kvref.cpu.gpu_worker import (
    DEFAULT_PIN_CHUNK_BYTES,
    HostMemoryPin,
    CpuGpuOffloadingHandlers,
    CPUViewSource,
    SingleDirectionOffloadingHandler,
)
from kvref.worker import OffloadingWorker, TransferProtocolError, TransferResult, TransferSpec

CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device; none is available")

NUM_GPU_BLOCKS = 24
NUM_CPU_BLOCKS = 12


def make_kv_caches(
    device: str = "cpu",
    shapes: Sequence[tuple[int, ...]] = ((4, 8), (4, 8), (2, 6)),
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> list[torch.Tensor]:
    """Model-shaped KV caches: (num_blocks, *per-block shape) of random values."""
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn((NUM_GPU_BLOCKS, *shape), generator=generator).to(dtype).to(device)
        for shape in shapes
    ]


def fill_random(tensors: Sequence[torch.Tensor], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for t in tensors:
        t.copy_(torch.randint(-128, 128, t.shape, dtype=torch.int8, generator=generator))


@dataclass
class Mapping:
    """One group's GPU blocks and the CPU blocks that hold them."""

    gpu_blocks: list[int]
    cpu_blocks: list[int]
    block_index: int


def specs(mappings: Sequence[Mapping]) -> tuple[GPULoadStoreSpec, CPULoadStoreSpec]:
    gpu = GPULoadStoreSpec(
        [b for m in mappings for b in m.gpu_blocks],
        [len(m.gpu_blocks) for m in mappings],
        [m.block_index for m in mappings],
    )
    return gpu, CPULoadStoreSpec([b for m in mappings for b in m.cpu_blocks])


def cpu_sub_block(handlers: CpuGpuOffloadingHandlers, t: int, block: int, sub: int) -> torch.Tensor:
    page = handlers.gpu_tensors[t].shape[1]
    return handlers.cpu_tensors[t][block, sub * page : (sub + 1) * page]


def unit_pairs(mapping: Mapping, factor: int) -> list[tuple[int, int, int]]:
    """(GPU block, CPU block, sub-block) for every GPU block of a group."""
    skip = mapping.block_index % factor
    return [
        (gpu, mapping.cpu_blocks[(skip + i) // factor], (skip + i) % factor)
        for i, gpu in enumerate(mapping.gpu_blocks)
    ]


def drain(handler: SingleDirectionOffloadingHandler) -> list[TransferResult]:
    """Poll until every submitted job is reported (bounded, like vLLM's GPU tests)."""
    results: list[TransferResult] = []
    for _ in range(100_000):
        results += handler.get_finished()
        if handler.num_in_flight == 0:
            return results
    raise AssertionError("transfers did not finish")


def round_trip(
    handlers: CpuGpuOffloadingHandlers,
    groups: list[list[int]],
    stores: Sequence[Mapping],
    reload_gpu_blocks: Sequence[list[int]],
) -> None:
    """Store `stores`, reload them into other GPU blocks, and check every byte on the way."""
    factor = handlers.block_size_factor
    gpu_before = [t.clone() for t in handlers.gpu_tensors]
    cpu_before = [t.clone() for t in handlers.cpu_tensors]
    store = handlers.gpu_to_cpu_handler
    assert store.transfer_async(1, specs(stores))
    store.wait([1])
    (result,) = store.get_finished()
    units = sum(len(m.gpu_blocks) for m in stores)
    assert result.success and result.job_id == 1 and result.transfer_type == ("GPU", "CPU")
    assert result.transfer_size == sum(
        len(m.gpu_blocks) * handlers.gpu_tensors[t].shape[1]
        for m, tensors in zip(stores, groups)
        for t in tensors
    )
    assert result.transfer_time is not None and result.transfer_time >= 0
    assert result.transfer_size is not None and (result.transfer_size > 0) == (units > 0)

    written: set[tuple[int, int, int]] = set()
    for mapping, tensors in zip(stores, groups):
        for gpu, cpu, sub in unit_pairs(mapping, factor):
            for t in tensors:
                assert torch.equal(cpu_sub_block(handlers, t, cpu, sub).cpu(), gpu_before[t][gpu].cpu())
                written.add((t, cpu, sub))
    for t, before in enumerate(cpu_before):
        page = handlers.gpu_tensors[t].shape[1]
        for block in range(handlers.num_cpu_blocks):
            for sub in range(factor):
                if (t, block, sub) not in written:
                    got = handlers.cpu_tensors[t][block, sub * page : (sub + 1) * page]
                    assert torch.equal(got, before[block, sub * page : (sub + 1) * page])
    for t, before in enumerate(gpu_before):
        assert torch.equal(handlers.gpu_tensors[t], before), "a store must not touch the GPU"

    reloads = [
        Mapping(new, m.cpu_blocks, m.block_index) for m, new in zip(stores, reload_gpu_blocks)
    ]
    load = handlers.cpu_to_gpu_handler
    assert load.transfer_async(2, (specs(reloads)[1], specs(reloads)[0]))
    load.wait([2])
    (result,) = load.get_finished()
    assert result.success and result.transfer_type == ("CPU", "GPU")

    loaded: set[tuple[int, int]] = set()
    for old, new, tensors in zip(stores, reloads, groups):
        for (src_gpu, _, _), (dst_gpu, _, _) in zip(unit_pairs(old, factor), unit_pairs(new, factor)):
            for t in tensors:
                assert torch.equal(handlers.gpu_tensors[t][dst_gpu], gpu_before[t][src_gpu])
                loaded.add((t, dst_gpu))
    for t, before in enumerate(gpu_before):
        for block in range(NUM_GPU_BLOCKS):
            if (t, block) not in loaded:
                assert torch.equal(handlers.gpu_tensors[t][block], before[block])


def make_handlers(
    factor: int,
    groups: list[list[int]],
    device: str = "cpu",
    cpu_rows: torch.Tensor | CPUViewSource | None = None,
    pin_chunk_bytes: int = DEFAULT_PIN_CHUNK_BYTES,
    shapes: Sequence[tuple[int, ...]] = ((4, 8), (4, 8), (2, 6)),
) -> CpuGpuOffloadingHandlers:
    handlers = CpuGpuOffloadingHandlers(
        make_kv_caches(device, shapes),
        block_size_factor=factor,
        num_cpu_blocks=NUM_CPU_BLOCKS if cpu_rows is None else None,
        group_tensors=groups,
        cpu_rows=cpu_rows,
        pin_chunk_bytes=pin_chunk_bytes,
    )
    fill_random(handlers.cpu_tensors, seed=99)
    return handlers


# ---- round trips (CPU fallback) ----


@pytest.mark.parametrize("factor", [1, 3])
def test_round_trip_single_group_consecutive_blocks(factor: int) -> None:
    handlers = make_handlers(factor, [[0, 1, 2]])
    n = 2 * factor
    round_trip(
        handlers,
        [[0, 1, 2]],
        [Mapping(list(range(3, 3 + n)), [4, 5], 0)],
        [list(range(12, 12 + n))],
    )


@pytest.mark.parametrize("factor", [1, 3])
def test_round_trip_several_groups_with_unaligned_starts(factor: int) -> None:
    groups = [[0, 1], [2]]
    handlers = make_handlers(factor, groups)
    # Group 0 starts 2 GPU blocks into its first CPU block; group 1 one block in.
    first = Mapping([9, 3, 4, 17], [7, 2] if factor == 3 else [7, 2, 0, 5], 5)
    second = Mapping([1, 20], [11] if factor == 3 else [11, 6], 4)
    round_trip(handlers, groups, [first, second], [[0, 5, 6, 7], [22, 23]])


@pytest.mark.parametrize("factor", [1, 3])
def test_empty_groups_move_nothing_and_consume_no_ids(factor: int) -> None:
    groups = [[0], [1], [2]]
    handlers = make_handlers(factor, groups)
    round_trip(
        handlers,
        groups,
        [Mapping([], [], 7), Mapping([2, 3], [3], 0) if factor == 3 else Mapping([2, 3], [3, 8], 0), Mapping([], [], 0)],
        [[], [10, 11], []],
    )


def test_a_transfer_of_no_blocks_still_reports_a_result() -> None:
    handlers = make_handlers(1, [[0, 1, 2]])
    store = handlers.gpu_to_cpu_handler
    assert store.transfer_async(5, specs([Mapping([], [], 0)]))
    (result,) = store.get_finished()
    assert (result.job_id, result.success, result.transfer_size) == (5, True, 0)


def test_shared_cpu_rows_hold_every_tensor_page_back_to_back() -> None:
    # A caller-owned (num_cpu_blocks, row_bytes) buffer, with slack at the end of each row.
    kv_bytes = sum(t.view(torch.int8).view(NUM_GPU_BLOCKS, -1).shape[1] for t in make_kv_caches())
    rows = torch.zeros((NUM_CPU_BLOCKS, 3 * kv_bytes + 40), dtype=torch.int8)
    handlers = make_handlers(3, [[0, 1], [2]], cpu_rows=rows)
    assert handlers.cpu_tensors[1].stride(0) == rows.stride(0)
    round_trip(
        handlers,
        [[0, 1], [2]],
        [Mapping([3, 4, 5, 6], [1, 2], 0), Mapping([7, 8], [3], 1)],
        [[10, 11, 12, 13], [20, 21]],
    )


class FakeRegion:
    """A `CPUViewSource` like the tiering `SharedOffloadRegion`: views into one row buffer."""

    def __init__(self, num_blocks: int, row_bytes: int) -> None:
        self.rows = torch.zeros((num_blocks, row_bytes), dtype=torch.int8)
        self.cursor = 0

    def create_worker_view(self, page_bytes: int) -> torch.Tensor:
        view = self.rows[:, self.cursor : self.cursor + page_bytes]
        self.cursor += page_bytes
        return view


def test_cpu_rows_can_come_from_a_region() -> None:
    region = FakeRegion(NUM_CPU_BLOCKS, 4096)
    assert isinstance(region, CPUViewSource)
    handlers = make_handlers(1, [[0, 1, 2]], cpu_rows=region)
    assert handlers.num_cpu_blocks == NUM_CPU_BLOCKS
    round_trip(handlers, [[0, 1, 2]], [Mapping([0, 1, 2, 9], [0, 1, 2, 3], 0)], [[20, 21, 22, 23]])
    assert region.rows.abs().sum() > 0


def test_cpu_rows_in_the_shared_region_are_what_secondary_tiers_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kv_bytes = [t.view(torch.int8).view(NUM_GPU_BLOCKS, -1).shape[1] for t in make_kv_caches()]
    factor = 2
    # Two worker ranks share each row; this process is rank 1, so its pages sit after rank 0's.
    slot = factor * sum(kv_bytes)
    region = SharedOffloadRegion("gpu-worker-test", NUM_CPU_BLOCKS, slot, world_size=2, rank=1, directory=tmp_path)
    try:
        handlers = make_handlers(factor, [[0, 1], [2]], cpu_rows=region)
        assert isinstance(region, CPUViewSource)
        stores = [Mapping([3, 4, 5, 6], [1, 2], 0), Mapping([7, 8], [3], 0)]
        round_trip(handlers, [[0, 1], [2]], stores, [[10, 11, 12, 13], [20, 21]])
        flat = region.create_kv_memoryview().cast("B")
        # Row 1, past rank 0's slot and tensor 0's page: tensor 1's page of CPU block 1.
        start = 1 * region.row_stride + slot + factor * kv_bytes[0]
        got = bytearray(flat[start : start + factor * kv_bytes[1]])
        # CPU block 1 of group 0 holds GPU blocks 3 and 4.
        assert torch.equal(torch.frombuffer(got, dtype=torch.int8), handlers.gpu_tensors[1][3:5].flatten())
        handlers.shutdown()
        del flat
    finally:
        region.cleanup()
    assert not region.path.exists()
    # The handlers let go of every view, so the region could really unmap.
    assert "still referenced" not in caplog.text


def test_copies_split_at_pinned_chunk_boundaries_keep_every_byte() -> None:
    kv = [t.view(torch.int8).view(NUM_GPU_BLOCKS, -1) for t in make_kv_caches()]
    cpu = [torch.zeros((NUM_CPU_BLOCKS, t.shape[1] * 2), dtype=torch.int8) for t in kv]
    # Pretend the rows of tensor 0 were registered in chunks ending inside rows 2 and 5.
    base = cpu[0].data_ptr()
    boundaries = [base + 2 * cpu[0].stride(0) + 8, base + 5 * cpu[0].stride(0)]
    handler = SingleDirectionOffloadingHandler(
        kv, cpu, block_size_factor=2, group_tensors=[[0, 1, 2]], gpu_to_cpu=True, host_boundaries=boundaries
    )
    gpu_blocks = list(range(2, 14))
    handler.transfer_async(1, specs([Mapping(gpu_blocks, list(range(6)), 0)]))
    assert handler.get_finished()[0].success
    for t in range(3):
        assert torch.equal(cpu[t][:6].reshape(12, -1), kv[t][2:14])


# ---- random mappings ----


Transfer = tuple[int, list[list[int]], list[Mapping], list[list[int]]]


@st.composite
def random_transfers(draw: st.DrawFn) -> Transfer:
    """A block-size factor, a group layout, one store per group and fresh GPU blocks to reload."""
    factor = draw(st.sampled_from([1, 2, 3]))
    groups = draw(st.sampled_from([[[0, 1, 2]], [[0, 1], [2]], [[0], [1], [2]]]))
    free_gpu = draw(st.permutations(range(NUM_GPU_BLOCKS)))
    free_cpu = draw(st.permutations(range(NUM_CPU_BLOCKS)))
    # Sorted pools hand out consecutive ids, which the planner merges into single copies.
    if draw(st.booleans()):
        free_gpu = sorted(free_gpu)
    if draw(st.booleans()):
        free_cpu = sorted(free_cpu)
    stores: list[Mapping] = []
    stored = 0
    for _ in groups:
        size = draw(st.integers(0, 5))
        index = draw(st.integers(0, 7))
        cpu_count = -(-(size + index % factor) // factor)
        # Keep room to reload every stored block into different GPU blocks.
        if size == 0 or cpu_count > len(free_cpu) or stored + 2 * size > len(free_gpu):
            size, cpu_count = 0, 0
        stored += size
        stores.append(Mapping(free_gpu[:size], free_cpu[:cpu_count], index))
        free_gpu, free_cpu = free_gpu[size:], free_cpu[cpu_count:]
    reloads: list[list[int]] = []
    for mapping in stores:
        reloads.append(free_gpu[: len(mapping.gpu_blocks)])
        free_gpu = free_gpu[len(mapping.gpu_blocks) :]
    return factor, groups, stores, reloads


@given(random_transfers())
def test_random_mappings_round_trip_exactly(transfer: Transfer) -> None:
    factor, groups, stores, reloads = transfer
    handlers = make_handlers(factor, groups)
    round_trip(handlers, groups, stores, reloads)


# ---- ordering, failures, lifecycle ----


def test_results_come_in_submission_order_with_their_sizes() -> None:
    handlers = make_handlers(1, [[0, 1, 2]])
    store = handlers.gpu_to_cpu_handler
    page_bytes = sum(t.shape[1] for t in handlers.gpu_tensors)
    for job_id, blocks in [(30, [0]), (10, [1, 2, 3]), (20, [4, 5])]:
        store.transfer_async(job_id, specs([Mapping(blocks, [b + 6 for b in blocks], 0)]))
    assert store.num_in_flight == 3
    results = drain(store)
    assert [(r.job_id, r.transfer_size) for r in results] == [
        (30, page_bytes),
        (10, 3 * page_bytes),
        (20, 2 * page_bytes),
    ]
    assert store.get_finished() == []


def test_job_ids_are_unique_until_reported() -> None:
    handlers = make_handlers(1, [[0, 1, 2]])
    store = handlers.gpu_to_cpu_handler
    store.transfer_async(1, specs([Mapping([0], [0], 0)]))
    with pytest.raises(TransferProtocolError, match="job 1 is still in flight"):
        store.transfer_async(1, specs([Mapping([1], [1], 0)]))
    store.get_finished()
    assert store.transfer_async(1, specs([Mapping([1], [1], 0)]))


def test_a_bad_spec_fails_its_job_through_the_worker_and_later_jobs_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handlers = make_handlers(3, [[0, 1, 2]])
    worker = OffloadingWorker()
    handlers.register_with(worker)
    gpu, cpu = specs([Mapping([0, 1, 2, 3], [0, 1], 0)])
    # One CPU block short: the False is the job's only report (logged with the reason).
    assert worker.transfer_async(1, (gpu, CPULoadStoreSpec([0]))) is False
    assert "dst_block_ids is too short" in caplog.text
    assert worker.transfer_async(2, (gpu, cpu))
    assert worker.transfer_async(3, (cpu, GPULoadStoreSpec([5, 6, 7, 8], [4], [0])))
    results = worker.get_finished()
    assert [(r.job_id, r.success) for r in results] == [(2, True), (3, True)]
    for t in handlers.gpu_tensors:
        assert torch.equal(t[5:9], t[0:4])


@pytest.mark.parametrize(
    ("spec_pair", "match"),
    [
        (lambda: (CPULoadStoreSpec([0]), CPULoadStoreSpec([0])), "moves GPU->CPU, got a CPU->CPU"),
        (lambda: (GPULoadStoreSpec([0], [1, 0], [0, 0]), CPULoadStoreSpec([0])), "2 groups"),
        (lambda: (GPULoadStoreSpec([99], [1], [0]), CPULoadStoreSpec([0])), "block id 99"),
        (lambda: (GPULoadStoreSpec([0], [1], [0]), CPULoadStoreSpec([12])), "block id 12"),
    ],
)
def test_the_handler_rejects_specs_that_do_not_fit(
    spec_pair: Callable[[], tuple[GPULoadStoreSpec | CPULoadStoreSpec, CPULoadStoreSpec]],
    match: str,
) -> None:
    handlers = make_handlers(1, [[0, 1, 2]])
    with pytest.raises(ValueError, match=match):
        handlers.gpu_to_cpu_handler.transfer_async(1, spec_pair())
    assert handlers.gpu_to_cpu_handler.num_in_flight == 0


def test_shutdown_finishes_then_refuses_new_jobs() -> None:
    handlers = make_handlers(1, [[0, 1, 2]])
    handlers.gpu_to_cpu_handler.transfer_async(1, specs([Mapping([0], [0], 0)]))
    handlers.shutdown()
    handlers.shutdown()
    with pytest.raises(TransferProtocolError, match="after shutdown"):
        handlers.gpu_to_cpu_handler.transfer_async(2, specs([Mapping([0], [0], 0)]))
    assert handlers.gpu_to_cpu_handler.num_in_flight == 0


def test_wait_ignores_unknown_jobs() -> None:
    handlers = make_handlers(1, [[0, 1, 2]])
    handlers.cpu_to_gpu_handler.wait([42])


# ---- validation ----


def int8_rows(blocks: int, page: int, device: str = "cpu") -> torch.Tensor:
    return torch.zeros((blocks, page), dtype=torch.int8, device=device)


def test_handler_validates_its_groups() -> None:
    with pytest.raises(ValueError, match=r"group_tensors\[1\] = \[0, 2\] names tensors outside \[0, 2\)"):
        SingleDirectionOffloadingHandler(
            [int8_rows(4, 8), int8_rows(4, 8)],
            [int8_rows(2, 8), int8_rows(2, 8)],
            block_size_factor=1,
            group_tensors=[[1], [0, 2]],
            gpu_to_cpu=False,
        )


@pytest.mark.parametrize(
    ("gpu", "cpu", "factor", "match"),
    [
        ([], [], 1, "must be non-empty and co-indexed"),
        ([int8_rows(4, 8)], [], 1, "must be non-empty and co-indexed"),
        ([int8_rows(4, 8).float()], [int8_rows(2, 8)], 1, r"gpu_tensors\[0\] must be a 2-D int8"),
        ([int8_rows(4, 8)], [int8_rows(2, 8).view(2, 2, 4)], 1, r"cpu_tensors\[0\] must be a 2-D int8"),
        ([int8_rows(4, 8)], [int8_rows(2, 8)], 2, r"pages are 8 bytes; with block_size_factor=2"),
        ([int8_rows(4, 8)], [int8_rows(2, 16)[:, ::2]], 1, "rows must be contiguous"),
        ([int8_rows(4, 8), int8_rows(5, 8)], [int8_rows(2, 8), int8_rows(2, 8)], 1, "tensor 1 has 5 GPU"),
        ([int8_rows(4, 8)], [int8_rows(2, 8)], 0, "block_size_factor must be a positive integer"),
        ([int8_rows(4, 8, "meta")], [int8_rows(2, 8)], 1, "must be on a CUDA device"),
        ([int8_rows(4, 8)], [int8_rows(2, 8, "meta")], 1, r"cpu_tensors\[0\] must be on the CPU"),
    ],
)
def test_handler_validates_its_tensors(
    gpu: list[torch.Tensor], cpu: list[torch.Tensor], factor: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        SingleDirectionOffloadingHandler(
            gpu, cpu, block_size_factor=factor, group_tensors=[[0]], gpu_to_cpu=True
        )


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: CpuGpuOffloadingHandlers([], num_cpu_blocks=2), "at least one tensor"),
        (lambda: CpuGpuOffloadingHandlers(make_kv_caches()), "num_cpu_blocks must be a positive"),
        (
            lambda: CpuGpuOffloadingHandlers(make_kv_caches(), num_cpu_blocks=2, block_size_factor=0),
            "block_size_factor must be a positive integer",
        ),
        (
            lambda: CpuGpuOffloadingHandlers(make_kv_caches(), num_cpu_blocks=2, pin_memory=True),
            "pin_memory=True needs CUDA KV caches",
        ),
        (
            lambda: CpuGpuOffloadingHandlers(
                make_kv_caches(), cpu_rows=torch.zeros((2, 10), dtype=torch.int8)
            ),
            "cpu_rows rows are 10 bytes; the KV caches need",
        ),
        (
            lambda: CpuGpuOffloadingHandlers(make_kv_caches(), cpu_rows=torch.zeros((2, 4096))),
            "cpu_rows must be a 2-D int8 CPU tensor",
        ),
        (
            lambda: CpuGpuOffloadingHandlers(
                make_kv_caches(), num_cpu_blocks=3, cpu_rows=torch.zeros((2, 4096), dtype=torch.int8)
            ),
            "num_cpu_blocks=3 but cpu_rows has 2 blocks",
        ),
        (
            lambda: CpuGpuOffloadingHandlers(
                [torch.zeros(4, 6, 2).transpose(1, 2)], num_cpu_blocks=2
            ),
            r"kv_caches\[0\] .* cannot be viewed as \(num_blocks, page_bytes\)",
        ),
        (
            lambda: CpuGpuOffloadingHandlers([torch.zeros(0, 4)], num_cpu_blocks=2),
            "leading num_blocks dimension",
        ),
    ],
)
def test_handlers_validate_their_arguments(
    build: Callable[[], CpuGpuOffloadingHandlers], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_kv_caches_of_any_dtype_are_viewed_as_bytes_without_copying() -> None:
    kv = make_kv_caches(shapes=((2, 3, 4),), dtype=torch.float16)
    handlers = CpuGpuOffloadingHandlers(kv, num_cpu_blocks=4)
    assert handlers.gpu_tensors[0].shape == (NUM_GPU_BLOCKS, 2 * 3 * 4 * 2)
    assert handlers.gpu_tensors[0].data_ptr() == kv[0].data_ptr()
    assert handlers.cpu_tensors[0].shape == (4, 48)
    assert not handlers.is_pinned


# ---- CUDA ----


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("factor", [1, 3])
def test_cuda_round_trip_with_pinned_rows(factor: int) -> None:
    groups = [[0, 1], [2]]
    handlers = make_handlers(factor, groups, device="cuda")
    assert handlers.is_pinned
    assert all(t.is_pinned() for t in handlers.cpu_tensors)
    first = Mapping([9, 3, 4, 17], [7, 2] if factor == 3 else [7, 2, 0, 5], 5)
    second = Mapping([1, 20], [11] if factor == 3 else [11, 6], 4)
    round_trip(handlers, groups, [first, second], [[0, 5, 6, 7], [22, 23]])
    handlers.shutdown()
    assert not handlers.is_pinned


@pytest.mark.cuda
@requires_cuda
def test_cuda_store_waits_for_the_compute_stream() -> None:
    handlers = make_handlers(1, [[0, 1, 2]], device="cuda")
    gpu = handlers.gpu_tensors[0]
    # Queue slow work on the compute stream that ends by writing block 0, then offload it at
    # once: the store must see the final bytes, not what was there at submission.
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        big = torch.mm(big, big).clamp_(-1, 1)
    gpu[0].copy_(torch.full_like(gpu[0], 7))
    handlers.gpu_to_cpu_handler.transfer_async(1, specs([Mapping([0], [0], 0)]))
    handlers.gpu_to_cpu_handler.wait([1])
    assert torch.equal(handlers.cpu_tensors[0][0], torch.full_like(handlers.cpu_tensors[0][0], 7))


@pytest.mark.cuda
@requires_cuda
def test_cuda_jobs_finish_in_order_and_measure_time() -> None:
    handlers = make_handlers(1, [[0, 1, 2]], device="cuda")
    store = handlers.gpu_to_cpu_handler
    for job_id in range(8):
        store.transfer_async(job_id, specs([Mapping([job_id], [job_id % NUM_CPU_BLOCKS], 0)]))
    store.wait([7])
    results = drain(store)
    assert [r.job_id for r in results] == list(range(8))
    times = [r.transfer_time for r in results]
    assert all(t is not None and t >= 0 for t in times)
    assert sum(t or 0.0 for t in times) > 0


@pytest.mark.cuda
@requires_cuda
@given(random_transfers())
def test_cuda_random_mappings_round_trip_exactly(transfer: Transfer) -> None:
    factor, groups, stores, reloads = transfer
    handlers = make_handlers(factor, groups, device="cuda")
    round_trip(handlers, groups, stores, reloads)
    handlers.shutdown()


@pytest.mark.cuda
@requires_cuda
def test_cuda_pins_in_bounded_chunks_and_unregisters() -> None:
    # Pages of 8, 8 and 3 KiB over 12 CPU blocks, pinned one 4 KiB page per registration:
    # rows straddle registrations, and copies must be split there.
    shapes = ((64, 64), (64, 64), (24, 64))
    handlers = make_handlers(1, [[0, 1, 2]], device="cuda", pin_chunk_bytes=1000, shapes=shapes)
    assert handlers.is_pinned
    round_trip(handlers, [[0, 1, 2]], [Mapping(list(range(10)), list(range(10)), 0)], [list(range(12, 22))])
    rows = handlers.cpu_tensors[0]
    handlers.shutdown()
    assert not rows.is_pinned()
    assert handlers.cpu_tensors == []


# ---- pinning (a scripted cudart stands in for the CUDA runtime) ----


class FakeCudart:
    """Records cudaHostRegister/Unregister calls; fails the registration at `fail_at`."""

    def __init__(self, fail_at: int | None = None, fail_code: int = 2) -> None:
        self.registered: dict[int, int] = {}
        self.calls: list[tuple[str, int, int]] = []
        self.fail_at = fail_at
        self.fail_code = fail_code

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.calls.append(("register", ptr, size))
        if self.fail_at is not None and ptr <= self.fail_at < ptr + size:
            return self.fail_code
        self.registered[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        self.calls.append(("unregister", ptr, 0))
        self.registered.pop(ptr)
        return 0


PAGE = mmap.PAGESIZE


def test_pinning_registers_page_aligned_bounded_chunks_and_unregisters_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cudart = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    # From mid-page 10 * PAGE + 100, 10 pages long, in chunks of at most 3.5 pages -> 3 pages,
    # cut at absolute multiples of 3 pages so no two registrations share a page.
    start = 10 * PAGE + 100
    pin = HostMemoryPin(start, 10 * PAGE, chunk_bytes=3 * PAGE + PAGE // 2)
    assert pin.pinned and pin.error is None
    assert pin.boundaries == [12 * PAGE, 15 * PAGE, 18 * PAGE]
    assert cudart.registered == {
        start: 12 * PAGE - start,
        12 * PAGE: 3 * PAGE,
        15 * PAGE: 3 * PAGE,
        18 * PAGE: start + 10 * PAGE - 18 * PAGE,
    }
    pin.close()
    pin.close()
    assert cudart.registered == {} and not pin.pinned


def test_a_failed_chunk_rolls_back_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    cudart = FakeCudart(fail_at=16 * PAGE)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    pin = HostMemoryPin(10 * PAGE, 10 * PAGE, chunk_bytes=3 * PAGE)
    assert not pin.pinned
    assert pin.error is not None and "cudaError 2" in pin.error
    assert cudart.registered == {}
    assert len([c for c in cudart.calls if c[0] == "unregister"]) == 2


def test_memory_already_pinned_by_its_owner_is_used_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    cudart = FakeCudart(fail_at=10 * PAGE, fail_code=712)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    pin = HostMemoryPin(10 * PAGE, 10 * PAGE, chunk_bytes=3 * PAGE)
    assert pin.pinned and pin.boundaries == []
    pin.close()
    assert [c[0] for c in cudart.calls] == ["register"]  # nothing of the owner's is unregistered


def test_pin_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        HostMemoryPin(0, 10, chunk_bytes=0)


# ---- stateful: a worker over both handlers, against a naive model ----


class WorkerMachine(RuleBasedStateMachine):
    """Random interleavings of stores, loads, bad jobs, polls and waits through one worker.

    The model applies each accepted job block by block to shadow copies of the tensors (the
    obvious way, without the planner); the real tensors must match it after every step, and
    every job must be reported exactly once, stores and loads each in submission order: a
    refused job by `transfer_async`'s False only, an accepted one by one result.
    """

    FACTOR = 2
    GROUPS = ((0, 1), (2,))

    def __init__(self) -> None:
        super().__init__()
        self.handlers = make_handlers(self.FACTOR, [list(g) for g in self.GROUPS])
        self.worker = OffloadingWorker()
        self.handlers.register_with(self.worker)
        self.gpu_model = [t.clone() for t in self.handlers.gpu_tensors]
        self.cpu_model = [t.clone() for t in self.handlers.cpu_tensors]
        self.next_job = 0
        self.submitted: dict[str, list[int]] = {"store": [], "load": [], "bad": []}
        self.reported: list[TransferResult] = []

    def _mapping(self, data: st.DataObject) -> tuple[int, Mapping]:
        group = data.draw(st.integers(0, len(self.GROUPS) - 1))
        size = data.draw(st.integers(1, 5))
        index = data.draw(st.integers(0, 3))
        cpu_count = -(-(size + index % self.FACTOR) // self.FACTOR)
        gpu = data.draw(st.lists(st.integers(0, NUM_GPU_BLOCKS - 1), min_size=size, max_size=size, unique=True))
        cpu = data.draw(
            st.lists(st.integers(0, NUM_CPU_BLOCKS - 1), min_size=cpu_count, max_size=cpu_count, unique=True)
        )
        return group, Mapping(gpu, cpu, index)

    def _specs(self, group: int, mapping: Mapping) -> tuple[GPULoadStoreSpec, CPULoadStoreSpec]:
        empty = Mapping([], [], 0)
        return specs([mapping if g == group else empty for g in range(len(self.GROUPS))])

    def _apply(self, group: int, mapping: Mapping, to_cpu: bool) -> None:
        for gpu, cpu, sub in unit_pairs(mapping, self.FACTOR):
            for t in self.GROUPS[group]:
                page = self.gpu_model[t].shape[1]
                cpu_page = self.cpu_model[t][cpu, sub * page : (sub + 1) * page]
                if to_cpu:
                    cpu_page.copy_(self.gpu_model[t][gpu])
                else:
                    self.gpu_model[t][gpu].copy_(cpu_page)

    def _submit(self, kind: str, spec: TransferSpec) -> bool:
        self.next_job += 1
        self.submitted[kind].append(self.next_job)
        return self.worker.transfer_async(self.next_job, spec)

    @rule(data=st.data())
    def store(self, data: st.DataObject) -> None:
        group, mapping = self._mapping(data)
        gpu, cpu = self._specs(group, mapping)
        assert self._submit("store", (gpu, cpu))
        self._apply(group, mapping, to_cpu=True)

    @rule(data=st.data())
    def load(self, data: st.DataObject) -> None:
        group, mapping = self._mapping(data)
        gpu, cpu = self._specs(group, mapping)
        assert self._submit("load", (cpu, gpu))
        self._apply(group, mapping, to_cpu=False)

    @rule(data=st.data())
    def bad_job(self, data: st.DataObject) -> None:
        # One CPU block too many: the handler raises, the worker answers False, and that is
        # the job's only report.
        group, mapping = self._mapping(data)
        gpu, _ = self._specs(group, mapping)
        too_many = CPULoadStoreSpec([*mapping.cpu_blocks, 0])
        assert not self._submit("bad", (gpu, too_many))

    @rule()
    def poll(self) -> None:
        self.reported += self.worker.get_finished()

    @rule()
    def wait_for_everything(self) -> None:
        self.worker.wait(self.submitted["store"] + self.submitted["load"])
        self.reported += self.worker.get_finished()

    @invariant()
    def tensors_match_the_model(self) -> None:
        for real, model in zip(self.handlers.gpu_tensors + self.handlers.cpu_tensors, self.gpu_model + self.cpu_model):
            assert torch.equal(real, model)

    @invariant()
    def every_job_is_reported_once_in_order(self) -> None:
        ids = [r.job_id for r in self.reported]
        assert len(ids) == len(set(ids))
        assert not set(ids) & set(self.submitted["bad"]), "a refused job was reported again"
        assert all(r.success for r in self.reported)
        by_type = {
            "store": [r.job_id for r in self.reported if r.transfer_type == ("GPU", "CPU")],
            "load": [r.job_id for r in self.reported if r.transfer_type == ("CPU", "GPU")],
        }
        for kind, reported in by_type.items():
            assert reported == self.submitted[kind][: len(reported)], kind

    @override
    def teardown(self) -> None:
        self.reported += self.worker.get_finished()
        reported = [r.job_id for r in self.reported] + self.submitted["bad"]
        assert sorted(reported) == list(range(1, self.next_job + 1))
        self.worker.shutdown()
        self.handlers.shutdown()


WorkerMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)
test_worker_state_machine = WorkerMachine.TestCase
