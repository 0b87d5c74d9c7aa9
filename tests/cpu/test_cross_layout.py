"""A chunk stored under one tensor-parallel layout loads under another, byte for byte.

Ranks are simulated in one process: each rank has its own KV caches (its head shard of one
ground truth), its own `CPUOffloadingWorker` in the canonical layout, and its own handle on one
shared region, which a scheduler-side handle creates and keeps, as the engine's does. Every
layer here is certified parallelism-agnostic (attention heads split or replicated across TP,
and MLA's latent, which every rank holds whole and the ranks take turns writing).
"""

from __future__ import annotations

import tempfile
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.base import CanonicalKVCaches, GPULoadStoreSpec
from kvref.canonical import AttentionLayerSpec, LayerSpec, ParallelLayout, canonical_kv_caches
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.gpu_worker import CPUOffloadingWorker
from kvref.cpu.shared_region import SharedOffloadRegion

NUM_GPU_BLOCKS = 8
NUM_CHUNKS = 6
BLOCK_SIZE = 4
HEAD_SIZE = 8
LATENT = 12
ROW_BYTES = 4096  # a page; divisible by every world size below
DTYPE = torch.float16


@dataclass(frozen=True)
class Model:
    """The ground truth: every layer's full KV for every GPU block of the writers."""

    total_heads: int
    hnd: bool  # attention caches in HND order (heads before tokens) instead of NHD
    full_attention: torch.Tensor  # (blocks, 2, tokens, heads, head_size)
    full_latent: torch.Tensor  # (blocks, tokens, latent): MLA, replicated across TP

    @staticmethod
    def random(total_heads: int, hnd: bool, seed: int) -> Model:
        generator = torch.Generator().manual_seed(seed)
        attention = torch.randn((NUM_GPU_BLOCKS, 2, BLOCK_SIZE, total_heads, HEAD_SIZE), generator=generator)
        latent = torch.randn((NUM_GPU_BLOCKS, BLOCK_SIZE, LATENT), generator=generator)
        return Model(total_heads, hnd, attention.to(DTYPE), latent.to(DTYPE))

    def heads_of(self, tp: int, rank: int) -> slice:
        """The heads rank `rank` holds at tensor-parallel size `tp` (replicated when tp > heads)."""
        local = max(1, self.total_heads // tp)
        shard = rank // max(1, tp // self.total_heads)
        return slice(shard * local, (shard + 1) * local)

    def rank_caches(self, tp: int, rank: int, device: str = "cpu") -> dict[str, torch.Tensor]:
        """A rank's caches, shaped as its attention backend would."""
        shard = self.full_attention[:, :, :, self.heads_of(tp, rank), :].to(device)
        if self.hnd:
            # Allocated heads-major, viewed as (blocks, 2, tokens, heads, head_size).
            attention = shard.permute(0, 1, 3, 2, 4).contiguous().permute(0, 1, 3, 2, 4)
        else:
            attention = shard.contiguous()
        return {"attn": attention, "mla": self.full_latent.to(device)}

    def specs(self, tp: int) -> dict[str, LayerSpec]:
        heads = max(1, self.total_heads // tp)
        return {
            "attn": AttentionLayerSpec(BLOCK_SIZE, heads, HEAD_SIZE, 2),
            "mla": AttentionLayerSpec(BLOCK_SIZE, 1, LATENT, 2, use_mla=True),
        }


def worker_caches(model: Model, tp: int, rank: int, caches: dict[str, torch.Tensor]) -> CanonicalKVCaches:
    layout = ParallelLayout(rank=rank, tp_size=tp, total_kv_heads=model.total_heads)
    return canonical_kv_caches([["attn"], ["mla"]], model.specs(tp), caches, NUM_GPU_BLOCKS, layout)


@contextmanager
def shared_region(directory: Path) -> Generator[SharedOffloadRegion]:
    """The scheduler side's handle: it creates the file and keeps it while ranks come and go."""
    with SharedOffloadRegion("cross", NUM_CHUNKS, ROW_BYTES, directory=directory) as region:
        yield region


def rank_worker(
    model: Model, tp: int, rank: int, caches: dict[str, torch.Tensor], directory: Path, bpc: int
) -> CPUOffloadingWorker:
    region = SharedOffloadRegion(
        "cross", NUM_CHUNKS, ROW_BYTES // tp, world_size=tp, rank=rank, directory=directory, prefault=False
    )
    return CPUOffloadingWorker(
        worker_caches(model, tp, rank, caches), bpc, NUM_CHUNKS, mmap_region=region, canonical_layout=True
    )


def specs(
    gpu_blocks: Sequence[int], chunks: Sequence[int], bpc: int
) -> tuple[GPULoadStoreSpec, CPULoadStoreSpec]:
    """Both groups move the same GPU blocks into the same chunks."""
    return GPULoadStoreSpec([*gpu_blocks, *gpu_blocks], [len(gpu_blocks)] * 2, [0, 0]), CPULoadStoreSpec(
        [*chunks, *chunks]
    )


def store_all_ranks(
    model: Model,
    tp: int,
    gpu_blocks: list[int],
    chunks: list[int],
    directory: Path,
    bpc: int,
    device: str = "cpu",
) -> None:
    for rank in range(tp):
        worker = rank_worker(model, tp, rank, model.rank_caches(tp, rank, device), directory, bpc)
        gpu_spec, cpu_spec = specs(gpu_blocks, chunks, bpc)
        assert worker.submit_store(rank, gpu_spec, cpu_spec)
        worker.wait({rank})
        assert [r.job_id for r in worker.get_finished()] == [rank]
        worker.shutdown()


def load_and_check(
    model: Model,
    tp: int,
    stored: list[int],
    loaded_into: list[int],
    chunks: list[int],
    directory: Path,
    bpc: int,
    device: str = "cpu",
) -> None:
    for rank in range(tp):
        truth = model.rank_caches(tp, rank, device)
        caches = {name: torch.zeros_like(t) for name, t in truth.items()}
        if model.hnd:  # keep the backend's HND strides in the empty caches too
            caches["attn"] = truth["attn"].clone().zero_()
            assert caches["attn"].stride() == truth["attn"].stride()
        worker = rank_worker(model, tp, rank, caches, directory, bpc)
        gpu_spec, cpu_spec = specs(loaded_into, chunks, bpc)
        assert worker.submit_load(rank, cpu_spec, gpu_spec, expedited=rank % 2 == 1)
        worker.wait({rank})
        assert [r.job_id for r in worker.get_finished()] == [rank]
        worker.shutdown()
        for name in ("attn", "mla"):
            got = caches[name][loaded_into].view(torch.int16)
            want = truth[name][stored].view(torch.int16)
            assert torch.equal(got, want), f"tp={tp} rank={rank} layer {name}: bytes differ"


def cross_tp(directory: Path, writer_tp: int, reader_tp: int, hnd: bool, device: str = "cpu") -> None:
    model = Model.random(total_heads=4, hnd=hnd, seed=writer_tp * 10 + reader_tp)
    gpu_blocks, chunks = [5, 1, 6, 2], [3, 0]
    with shared_region(directory):
        store_all_ranks(model, writer_tp, gpu_blocks, chunks, directory, 2, device)
        load_and_check(model, reader_tp, gpu_blocks, [0, 7, 3, 4], chunks, directory, 2, device)


TP_PAIRS = [(2, 1), (2, 4), (4, 2), (1, 4)]


@pytest.mark.parametrize(("writer_tp", "reader_tp"), TP_PAIRS)
@pytest.mark.parametrize("hnd", [False, True], ids=["nhd", "hnd"])
def test_a_chunk_stored_at_one_tp_loads_at_another(
    tmp_path: Path, writer_tp: int, reader_tp: int, hnd: bool
) -> None:
    cross_tp(tmp_path, writer_tp, reader_tp, hnd)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is available")
@pytest.mark.parametrize(("writer_tp", "reader_tp"), TP_PAIRS)
def test_cuda_a_chunk_stored_at_one_tp_loads_at_another(
    tmp_path: Path, writer_tp: int, reader_tp: int
) -> None:
    cross_tp(tmp_path, writer_tp, reader_tp, hnd=True, device="cuda")


def test_replicated_heads_are_written_once_per_page_by_rotating_writers(tmp_path: Path) -> None:
    # 2 KV heads at TP=4: ranks (0, 1) and (2, 3) hold identical heads and take turns writing.
    model = Model.random(total_heads=2, hnd=False, seed=7)
    caches = worker_caches(model, 4, 1, model.rank_caches(4, 1))
    mapping = caches.group_data_refs[0][0].mapping
    assert mapping is not None and (mapping.num_writers, mapping.writer_index) == (2, 1)
    assert mapping.parallelism_agnostic
    with shared_region(tmp_path):
        store_all_ranks(model, 4, [0, 1, 2, 3], [0, 1, 2, 3], tmp_path, 1)
        load_and_check(model, 1, [0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3], tmp_path, 1)


@dataclass(frozen=True)
class CrossCase:
    total_heads: int
    writer_tp: int
    reader_tp: int
    hnd: bool
    bpc: int
    stored: list[int]
    loaded_into: list[int]
    chunks: list[int]
    seed: int


@st.composite
def cross_cases(draw: st.DrawFn) -> CrossCase:
    bpc = draw(st.sampled_from([1, 2]))
    num_chunks = draw(st.integers(1, min(NUM_CHUNKS, NUM_GPU_BLOCKS // bpc)))
    chunks = draw(st.permutations(range(NUM_CHUNKS)))[:num_chunks]
    stored = draw(st.permutations(range(NUM_GPU_BLOCKS)))[: num_chunks * bpc]
    loaded_into = draw(st.permutations(range(NUM_GPU_BLOCKS)))[: num_chunks * bpc]
    return CrossCase(
        total_heads=draw(st.sampled_from([1, 2, 4])),
        writer_tp=draw(st.sampled_from([1, 2, 4])),
        reader_tp=draw(st.sampled_from([1, 2, 4])),
        hnd=draw(st.booleans()),
        bpc=bpc,
        stored=stored,
        loaded_into=loaded_into,
        chunks=chunks,
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=12, deadline=None)
@given(cross_cases())
def test_generated_layouts_and_blocks_round_trip_across_tp(case: CrossCase) -> None:
    model = Model.random(case.total_heads, case.hnd, case.seed)
    with tempfile.TemporaryDirectory() as directory, shared_region(Path(directory)):
        store_all_ranks(model, case.writer_tp, case.stored, case.chunks, Path(directory), case.bpc)
        load_and_check(
            model, case.reader_tp, case.stored, case.loaded_into, case.chunks, Path(directory), case.bpc
        )
