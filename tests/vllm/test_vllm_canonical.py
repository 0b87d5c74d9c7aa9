"""kvref derives the canonical page mapping vLLM 0.33 derives, for every rank of generated layouts.

vLLM's derivation (`offloading/canonical_mapping.py`) is run on vLLM's own layer specs, kvref's on
kvref's, over the same KV-cache tensors; the mappings must agree field for field, whether
certified or failed closed (None).
"""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.distributed.kv_transfer.kv_connector.v1.offloading import canonical_mapping as vllm_mapping
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode, MLAAttentionSpec

from kvref.canonical import AttentionLayerSpec, ParallelLayout, layer_mapping

NUM_BLOCKS = 3


@st.composite
def layouts(draw: st.DrawFn) -> tuple[ParallelLayout, int, int, int, bool, bool, str]:
    """Mostly certifiable layouts, with one in five of each way to fail closed mixed in."""
    rarely = st.sampled_from([False, False, False, False, True])
    tp = draw(st.sampled_from([1, 2, 4]))
    total_heads = 3 if draw(rarely) else draw(st.sampled_from([1, 2, 4, 8]))
    layout = ParallelLayout(
        rank=0,
        tp_size=tp,
        total_kv_heads=total_heads,
        pcp_size=2 if draw(rarely) else 1,
        dcp_size=draw(st.sampled_from([2, 4])) if draw(rarely) else 1,
        cp_kv_cache_interleave_size=8 if draw(rarely) else draw(st.sampled_from([1, 2])),
    )
    block_size = draw(st.sampled_from([2, 4]))
    heads = draw(st.sampled_from([1, 2, 4])) if draw(rarely) else max(1, total_heads // tp)
    head_size = draw(st.sampled_from([4, 8]))
    use_mla = draw(st.booleans())
    shapes = ["split-nhd", "split-hnd", "packed-nhd", "packed-hnd"]
    shape = "other" if draw(rarely) else draw(st.sampled_from(shapes))
    return layout, block_size, heads if not use_mla else 1, head_size, use_mla, draw(rarely), shape


def kv_cache(shape: str, block_size: int, heads: int, head_size: int) -> torch.Tensor:
    n, bs, h, d = NUM_BLOCKS, block_size, heads, head_size
    dtype = torch.float16
    if shape == "split-nhd":
        return torch.zeros((n, 2, bs, h, d), dtype=dtype)
    if shape == "split-hnd":
        return torch.zeros((n, 2, h, bs, d), dtype=dtype).transpose(2, 3)
    if shape == "packed-nhd":
        return torch.zeros((n, bs, h, 2 * d), dtype=dtype).transpose(1, 2)
    if shape == "packed-hnd":
        return torch.zeros((n, h, bs, 2 * d), dtype=dtype)
    return torch.zeros((n, bs, 2 * h * d), dtype=dtype)


def as_fields(mapping: Any) -> tuple[Any, ...] | None:
    """A mapping of either library as plain values (runs as tuples)."""
    if mapping is None:
        return None
    runs = tuple(astuple(run) for run in mapping.runs)
    return (
        mapping.canonical_page_size_bytes,
        mapping.local_page_size_bytes,
        runs,
        mapping.num_writers,
        mapping.writer_index,
        mapping.parallelism_agnostic,
    )


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_kvref_derives_vllm_mapping_for_every_rank(
    case: tuple[ParallelLayout, int, int, int, bool, bool, str],
) -> None:
    layout, block_size, heads, head_size, use_mla, quant, shape = case
    cache = kv_cache(shape, block_size, heads, head_size)
    quant_mode = KVQuantMode.INT8_PER_TOKEN_HEAD if quant else KVQuantMode.NONE
    vllm_spec: Any
    if use_mla:
        vllm_spec = MLAAttentionSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=head_size,
            dtype=torch.float16,
            kv_quant_mode=quant_mode,
        )
    else:
        vllm_spec = FullAttentionSpec(
            block_size=block_size,
            num_kv_heads=heads,
            head_size=head_size,
            dtype=torch.float16,
            kv_quant_mode=quant_mode,
        )
    spec = AttentionLayerSpec(block_size, heads, head_size, 2, use_mla=use_mla, per_token_head_quant=quant)
    assert spec.real_page_size_bytes == vllm_spec.real_page_size_bytes
    rank_context: Any = vllm_mapping._RankContext  # pyright: ignore[reportPrivateUsage]
    vllm_layer_mapping: Any = vllm_mapping._layer_mapping  # pyright: ignore[reportPrivateUsage]
    for rank in range(layout.group_size):
        context = rank_context(
            tp_size=layout.tp_size,
            dcp_size=layout.dcp_size,
            pcp_size=layout.pcp_size,
            interleave=layout.cp_kv_cache_interleave_size,
            total_kv_heads=layout.total_kv_heads,
            rank=rank,
        )
        ours = layer_mapping(
            spec,
            None if use_mla else cache,
            NUM_BLOCKS,
            ParallelLayout(
                rank=rank,
                tp_size=layout.tp_size,
                total_kv_heads=layout.total_kv_heads,
                pcp_size=layout.pcp_size,
                dcp_size=layout.dcp_size,
                cp_kv_cache_interleave_size=layout.cp_kv_cache_interleave_size,
            ),
        )
        theirs = vllm_layer_mapping(vllm_spec, cache, NUM_BLOCKS, context)
        assert as_fields(ours) == as_fields(theirs), f"rank {rank}"
