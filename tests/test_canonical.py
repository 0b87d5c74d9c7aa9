"""The canonical KV-cache model: each layer's page mapping and the per-group references.

The expected runs are vLLM 0.33's own examples (tests/v1/kv_offload/cpu/test_canonical_layout.py);
`tests/vllm/test_vllm_canonical.py` compares the derivation with vLLM's on generated layouts.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.base import CanonicalPageMapping, CopyRun
from kvref.canonical import (
    AttentionLayerSpec,
    OpaqueLayerSpec,
    ParallelLayout,
    canonical_kv_caches,
    derive_canonical_mappings,
    layer_mapping,
    opaque_fallback_mapping,
)
from kvref.canonical.mapping import is_exact_partition, run_intervals, verify_tiling

NUM_BLOCKS = 3
TOKENS = 4


def split_nhd_cache(heads: int, head_size: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """(blocks, K/V, tokens, heads, head_size), contiguous: K and V halves, tokens major."""
    return torch.zeros((NUM_BLOCKS, 2, TOKENS, heads, head_size), dtype=dtype)


def split_hnd_cache(heads: int, head_size: int) -> torch.Tensor:
    """The same shape with heads major in memory."""
    return torch.zeros((NUM_BLOCKS, 2, heads, TOKENS, head_size), dtype=torch.float16).transpose(2, 3)


def attention(heads: int, head_size: int = 32, **kwargs: bool) -> AttentionLayerSpec:
    return AttentionLayerSpec(TOKENS, heads, head_size, 2, **kwargs)


def test_tp2_nhd_scatters_each_rank_heads_per_token() -> None:
    # vLLM's _nhd_shard_mapping(2, rank): 4 heads of 64 bytes, K and V runs of 4 token rows.
    for rank in (0, 1):
        layout = ParallelLayout(rank=rank, tp_size=2, total_kv_heads=4)
        mapping = layer_mapping(attention(2), split_nhd_cache(2, 32), NUM_BLOCKS, layout)
        assert mapping == CanonicalPageMapping(
            2048,
            1024,
            (CopyRun(0, rank * 128, 128, 4, 128, 256), CopyRun(512, 1024 + rank * 128, 128, 4, 128, 256)),
            1,
            0,
            True,
        )


def test_a_single_rank_page_is_one_whole_page_run() -> None:
    layout = ParallelLayout(rank=0, tp_size=1, total_kv_heads=4)
    mapping = layer_mapping(attention(4), split_nhd_cache(4, 32), NUM_BLOCKS, layout)
    assert mapping is not None
    assert mapping.runs == (CopyRun(0, 0, 2048, 1, 2048, 2048),)
    assert mapping.parallelism_agnostic


def test_hnd_runs_are_per_head_and_land_where_tp1_puts_them() -> None:
    layout = ParallelLayout(rank=1, tp_size=2, total_kv_heads=4)
    mapping = layer_mapping(attention(2), split_hnd_cache(2, 32), NUM_BLOCKS, layout)
    assert mapping is not None
    # Rank 1 holds heads 2, 3: each K head's 4 tokens (256 bytes) is one run; V follows at 2048.
    assert mapping.runs == (CopyRun(0, 512, 512, 1, 512, 512), CopyRun(512, 1536, 512, 1, 512, 512))


def test_replicated_heads_rotate_writers() -> None:
    for rank, writer in [(0, 0), (1, 1), (2, 0), (3, 1)]:
        layout = ParallelLayout(rank=rank, tp_size=4, total_kv_heads=2)
        mapping = layer_mapping(attention(1), split_nhd_cache(1, 32), NUM_BLOCKS, layout)
        assert mapping is not None
        assert (mapping.num_writers, mapping.writer_index) == (2, writer)
        assert [mapping.is_writer(block) for block in range(4)] == [b % 2 == writer for b in range(4)]


def test_mla_latent_is_written_in_turn_by_every_tp_rank() -> None:
    spec = AttentionLayerSpec(TOKENS, 1, 16, 2, use_mla=True)
    mappings = [
        layer_mapping(spec, None, NUM_BLOCKS, ParallelLayout(rank=r, tp_size=4, total_kv_heads=8))
        for r in range(4)
    ]
    assert [(m.num_writers, m.writer_index) for m in mappings if m is not None] == [(4, r) for r in range(4)]
    assert all(m is not None and m.runs == (CopyRun(0, 0, 128, 1, 128, 128),) for m in mappings)


def test_context_parallel_pages_interleave_tokens_and_are_not_agnostic() -> None:
    # DCP=2 over 2 replicated heads at TP=2: each rank holds every other token of the block.
    mappings = [
        layer_mapping(
            attention(1),
            split_nhd_cache(1, 32),
            NUM_BLOCKS,
            ParallelLayout(rank=r, tp_size=2, total_kv_heads=1, dcp_size=2),
        )
        for r in range(2)
    ]
    assert all(
        m is not None and not m.parallelism_agnostic and m.canonical_page_size_bytes == 1024 for m in mappings
    )
    verify_tiling("attn", [m for m in mappings if m is not None])
    first = mappings[1]
    assert first is not None and first.runs[0] == CopyRun(0, 64, 64, 1, 64, 64)  # token 1 of 8


@pytest.mark.parametrize(
    ("spec", "cache", "layout"),
    [
        (attention(2), split_nhd_cache(2, 32), ParallelLayout(rank=0, tp_size=2, total_kv_heads=3)),
        (
            attention(2, per_token_head_quant=True),
            split_nhd_cache(2, 32),
            ParallelLayout(rank=0, tp_size=2, total_kv_heads=4),
        ),
        (
            attention(2),
            torch.zeros((NUM_BLOCKS, TOKENS, 2, 64), dtype=torch.float16),
            ParallelLayout(rank=0, tp_size=2, total_kv_heads=4),
        ),
        (OpaqueLayerSpec(1024), None, ParallelLayout(rank=0, tp_size=2, total_kv_heads=4)),
    ],
    ids=["heads-not-divisible", "per-token-head-quant", "unknown-shape", "opaque"],
)
def test_layouts_that_cannot_be_certified_fall_back_to_this_rank_page(
    spec: AttentionLayerSpec | OpaqueLayerSpec, cache: torch.Tensor | None, layout: ParallelLayout
) -> None:
    mappings = derive_canonical_mappings(
        layout, {"layer": spec}, {} if cache is None else {"layer": cache}, NUM_BLOCKS
    )
    page = spec.real_page_size_bytes
    assert mappings == {"layer": opaque_fallback_mapping(page, 2, 0)}
    assert not mappings["layer"].parallelism_agnostic
    assert mappings["layer"].runs == (CopyRun(0, 0, page, 1, page, page),)


def test_pipeline_parallelism_has_no_canonical_mappings() -> None:
    layout = ParallelLayout(rank=0, tp_size=2, total_kv_heads=4, pp_size=2)
    assert (
        derive_canonical_mappings(layout, {"a": attention(2)}, {"a": split_nhd_cache(2, 32)}, NUM_BLOCKS)
        == {}
    )


@st.composite
def certified_layouts(draw: st.DrawFn) -> tuple[AttentionLayerSpec, torch.Tensor | None, ParallelLayout]:
    tp = draw(st.sampled_from([1, 2, 4]))
    pcp = draw(st.sampled_from([1, 2]))
    dcp = draw(st.sampled_from([d for d in (1, 2, 4) if tp % d == 0]))
    interleave = draw(st.sampled_from([1, 2, 4]))
    total_heads = draw(st.sampled_from([1, 2, 4, 8]))
    layout = ParallelLayout(
        rank=0,
        tp_size=tp,
        total_kv_heads=total_heads,
        pcp_size=pcp,
        dcp_size=dcp,
        cp_kv_cache_interleave_size=interleave,
    )
    if draw(st.booleans()):
        return AttentionLayerSpec(TOKENS, 1, 16, 2, use_mla=True), None, layout
    heads = max(1, total_heads // tp)
    cache = draw(
        st.sampled_from(
            [
                split_nhd_cache(heads, 8),
                split_hnd_cache(heads, 8),
                torch.zeros((NUM_BLOCKS, heads, TOKENS, 16), dtype=torch.float16),  # packed K|V, HND
                torch.zeros((NUM_BLOCKS, TOKENS, heads, 16), dtype=torch.float16).transpose(
                    1, 2
                ),  # packed, NHD
            ]
        )
    )
    return AttentionLayerSpec(TOKENS, heads, 8, 2), cache, layout


@settings(max_examples=60, deadline=None)
@given(certified_layouts())
def test_every_rank_covers_its_page_and_every_block_writers_tile_the_canonical_page(
    case: tuple[AttentionLayerSpec, torch.Tensor | None, ParallelLayout],
) -> None:
    spec, cache, layout = case
    per_rank = [
        layer_mapping(spec, cache, NUM_BLOCKS, replace(layout, rank=r)) for r in range(layout.group_size)
    ]
    mappings = [m for m in per_rank if m is not None]
    if len(mappings) < layout.group_size:
        return  # not certified (fails closed), e.g. DCP over heads that are not replicated
    for mapping in mappings:
        assert is_exact_partition(run_intervals(mapping.runs, canonical=False), spec.real_page_size_bytes)
        assert mapping.parallelism_agnostic == (layout.cp_size == 1)
    verify_tiling("layer", mappings)


def test_layout_and_spec_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match=r"ParallelLayout.rank must be in \[0, tp_size \* pcp_size = 4\)"):
        ParallelLayout(rank=4, tp_size=2, total_kv_heads=4, pcp_size=2)
    with pytest.raises(ValueError, match="ParallelLayout.dcp_size must be >= 1"):
        ParallelLayout(rank=0, tp_size=2, total_kv_heads=4, dcp_size=0)
    with pytest.raises(ValueError, match="AttentionLayerSpec.head_size must be >= 1"):
        AttentionLayerSpec(4, 1, 0, 2)
    with pytest.raises(ValueError, match="page_size_padded"):
        AttentionLayerSpec(4, 1, 8, 2, page_size_padded=8)
    with pytest.raises(ValueError, match="OpaqueLayerSpec.real_page_size_bytes"):
        OpaqueLayerSpec(0)


# --- the per-group references ---


def test_each_layer_gets_a_mapped_reference_into_its_own_tensor() -> None:
    caches = {"a": split_nhd_cache(2, 32), "b": split_nhd_cache(2, 32)}
    layout = ParallelLayout(rank=1, tp_size=2, total_kv_heads=4)
    result = canonical_kv_caches(
        [["a"], ["b"]], {"a": attention(2), "b": attention(2)}, caches, NUM_BLOCKS, layout
    )
    assert [(t.tensor.shape, t.tensor.dtype, t.page_size_bytes) for t in result.tensors] == [
        ((NUM_BLOCKS, 1024), torch.int8, 1024)
    ] * 2
    assert [[(r.tensor_idx, r.page_size_bytes) for r in refs] for refs in result.group_data_refs] == [
        [(0, 1024)],
        [(1, 1024)],
    ]
    mapping = result.group_data_refs[1][0].mapping
    assert mapping is not None and mapping.writer_index == 0 and mapping.runs[0].canonical_offset == 128
    # The rows are the caches' own bytes, not a copy.
    result.tensors[1].tensor[2, 5] = 7
    assert caches["b"].view(torch.int8).reshape(NUM_BLOCKS, -1)[2, 5] == 7


def test_layers_aliasing_the_same_bytes_share_one_tensor() -> None:
    shared = split_nhd_cache(2, 32)
    result = canonical_kv_caches(
        [["a"], ["b"]], {"a": attention(2), "b": attention(2)}, {"a": shared, "b": shared}, NUM_BLOCKS
    )
    assert len(result.tensors) == 1
    assert [[r.tensor_idx for r in refs] for refs in result.group_data_refs] == [[0], [0]]
    assert all(r.mapping is None for refs in result.group_data_refs for r in refs)


def test_padded_pages_keep_the_row_and_reference_the_unpadded_page() -> None:
    spec = OpaqueLayerSpec(100, page_size_padded=128)
    cache = torch.zeros((NUM_BLOCKS, 128), dtype=torch.int8)
    result = canonical_kv_caches([["state"]], {"state": spec}, {"state": cache}, NUM_BLOCKS)
    assert result.tensors[0].page_size_bytes == 128 and result.group_data_refs[0][0].page_size_bytes == 100


def test_kernel_blocks_are_regrouped_into_manager_blocks() -> None:
    # A backend splitting each 4-token block into two 2-token kernel blocks.
    cache = torch.arange(NUM_BLOCKS * 2 * 2 * 2 * 2 * 32, dtype=torch.float16).reshape(
        NUM_BLOCKS * 2, 2, 2, 2, 32
    )
    result = canonical_kv_caches([["a"]], {"a": attention(2)}, {"a": cache}, NUM_BLOCKS)
    rows = result.tensors[0].tensor
    assert rows.shape == (NUM_BLOCKS, 1024)
    assert torch.equal(rows[1], cache[2:4].reshape(-1).view(torch.int8))


def test_a_packed_layout_is_offloaded_as_whole_blocks() -> None:
    # Two layers interleaved per block: each layer's rows stride over both layers' pages.
    storage = torch.zeros((NUM_BLOCKS, 2, 2, TOKENS, 2, 32), dtype=torch.float16)
    caches = {"a": storage[:, 0], "b": storage[:, 1]}
    result = canonical_kv_caches([["a", "b"]], {"a": attention(2), "b": attention(2)}, caches, NUM_BLOCKS)
    assert [(t.tensor.shape, t.page_size_bytes) for t in result.tensors] == [((NUM_BLOCKS, 2048), 2048)]
    assert [[(r.tensor_idx, r.page_size_bytes) for r in refs] for refs in result.group_data_refs] == [
        [(0, 2048)]
    ]


def test_missing_layers_and_wrong_block_counts_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"layers \['b'\] need both a spec"):
        canonical_kv_caches([["a", "b"]], {"a": attention(2)}, {"a": split_nhd_cache(2, 32)}, NUM_BLOCKS)
    with pytest.raises(ValueError, match="does not hold 2 blocks"):
        canonical_kv_caches([["a"]], {"a": attention(2)}, {"a": split_nhd_cache(2, 32)}, 2)
