"""Derive each layer's `CanonicalPageMapping` (vLLM 0.33: `offloading/canonical_mapping.py`).

The only place in the offloading stack that reasons about parallelism (TP, DCP, PCP); what
follows it consumes byte mappings. A layer's canonical page is its whole offloaded block without
parallelism: all KV heads, all `block_size * dcp_size * pcp_size` tokens, in the worker's page
encoding. A layer whose layout is not recognized gets an opaque fallback (fail closed): this
worker's page whole, at an offset of its own, which only the same layout can load.

A mapping is derived for every rank of the grid, and the tiling is checked before this rank's is
returned: whichever ranks a block elects as writers must tile its canonical page exactly once,
and each rank's runs must cover its local page exactly.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace

with warnings.catch_warnings():
    # CPU wheels of torch warn on import when numpy is absent; kvref does not need numpy.
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

from kvref.base import CanonicalPageMapping, CopyRun
from kvref.canonical.layers import AttentionLayerSpec, LayerSpec, ParallelLayout

__all__ = ["ByteRegion", "derive_canonical_mappings", "layer_mapping", "opaque_fallback_mapping"]


@dataclass(frozen=True)
class ByteRegion:
    """A byte region of a page that repeats once per token.

    Attributes:
        local_offset: where the region starts in this worker's page.
        canonical_offset: where its first token goes in the canonical page.
        bytes_per_token: the region's bytes per token.
        canonical_token_stride: bytes from one canonical token's copy to the next.
    """

    local_offset: int
    canonical_offset: int
    bytes_per_token: int
    canonical_token_stride: int


def coalesce_runs(runs: list[CopyRun]) -> tuple[CopyRun, ...]:
    """Collapse fragments contiguous within and across runs, so fewer copies are needed (a
    single-rank mapping becomes one whole-page run)."""
    out: list[CopyRun] = []
    for run in runs:
        if run.num_fragments > 1 and run.local_stride == run.fragment_size == run.canonical_stride:
            size = run.fragment_size * run.num_fragments
            run = CopyRun(run.local_offset, run.canonical_offset, size, 1, size, size)
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.num_fragments == 1
            and run.num_fragments == 1
            and prev.local_offset + prev.fragment_size == run.local_offset
            and prev.canonical_offset + prev.fragment_size == run.canonical_offset
        ):
            size = prev.fragment_size + run.fragment_size
            out[-1] = CopyRun(prev.local_offset, prev.canonical_offset, size, 1, size, size)
        else:
            out.append(run)
    return tuple(out)


def _canonical_token(local_index: int, layout: ParallelLayout) -> int:
    """The canonical position of one of this rank's local token indices."""
    chunk, position = divmod(local_index, layout.cp_kv_cache_interleave_size)
    return (chunk * layout.cp_size + layout.total_cp_rank) * layout.cp_kv_cache_interleave_size + position


def _interleave_cp_tokens(
    regions: list[ByteRegion], num_tokens: int, layout: ParallelLayout
) -> tuple[CopyRun, ...]:
    """Place each region's `num_tokens` rows at their canonical token positions, one run per
    chunk of interleaved tokens."""
    interleave = layout.cp_kv_cache_interleave_size
    runs: list[CopyRun] = []
    for region in regions:
        if layout.cp_size == 1:
            runs.append(
                CopyRun(
                    region.local_offset,
                    region.canonical_offset,
                    region.bytes_per_token,
                    num_tokens,
                    region.bytes_per_token,
                    region.canonical_token_stride,
                )
            )
            continue
        for chunk_start in range(0, num_tokens, interleave):
            token = _canonical_token(chunk_start, layout)
            runs.append(
                CopyRun(
                    region.local_offset + chunk_start * region.bytes_per_token,
                    region.canonical_offset + token * region.canonical_token_stride,
                    region.bytes_per_token,
                    interleave,
                    region.bytes_per_token,
                    region.canonical_token_stride,
                )
            )
    return coalesce_runs(runs)


def _packed_kv_regions(
    kv_cache: torch.Tensor, spec: AttentionLayerSpec, head_shard: int, num_head_shards: int, cp_size: int
) -> list[ByteRegion] | None:
    """K and V adjacent per (token, head), in NHD or HND stride order."""
    bs, heads = spec.block_size, spec.num_kv_heads
    elem = kv_cache.element_size()
    head_elems = 2 * spec.head_size
    if heads * bs * head_elems * elem != spec.real_page_size_bytes:
        return None
    _, head_stride, token_stride, inner_stride = kv_cache.stride()
    if inner_stride != 1:
        return None
    head_bytes = head_elems * elem
    token_row_bytes = heads * head_bytes
    if head_stride == head_elems and token_stride == heads * head_elems:  # NHD
        return [
            ByteRegion(0, head_shard * token_row_bytes, token_row_bytes, num_head_shards * token_row_bytes)
        ]
    if head_stride == bs * head_elems and token_stride == head_elems:  # HND
        canonical_span = bs * cp_size  # canonical tokens per offloaded block
        return [
            ByteRegion(
                head * bs * head_bytes,
                (head_shard * heads + head) * canonical_span * head_bytes,
                head_bytes,
                head_bytes,
            )
            for head in range(heads)
        ]
    return None


def _split_kv_regions(
    kv_cache: torch.Tensor, spec: AttentionLayerSpec, head_shard: int, num_head_shards: int, cp_size: int
) -> list[ByteRegion] | None:
    """K and V in separate halves of the page, in NHD or HND stride order."""
    bs, heads, head_size = spec.block_size, spec.num_kv_heads, spec.head_size
    elem = kv_cache.element_size()
    if 2 * bs * heads * head_size * elem != spec.real_page_size_bytes:
        return None
    _, half_stride, token_stride, head_stride, inner_stride = kv_cache.stride()
    if inner_stride != 1 or half_stride != bs * heads * head_size:
        return None
    head_bytes = head_size * elem
    token_row_bytes = heads * head_bytes
    canonical_span = bs * cp_size  # canonical tokens per offloaded block
    if token_stride == heads * head_size and head_stride == head_size:  # NHD
        canonical_half_bytes = canonical_span * num_head_shards * token_row_bytes
        return [
            ByteRegion(
                half * bs * token_row_bytes,
                half * canonical_half_bytes + head_shard * token_row_bytes,
                token_row_bytes,
                num_head_shards * token_row_bytes,
            )
            for half in range(2)  # K, then V
        ]
    if head_stride == bs * head_size and token_stride == head_size:  # HND
        local_half_bytes = bs * heads * head_bytes
        total_heads = num_head_shards * heads
        return [
            ByteRegion(
                half * local_half_bytes + head * bs * head_bytes,
                (half * total_heads + head_shard * heads + head) * canonical_span * head_bytes,
                head_bytes,
                head_bytes,
            )
            for half in range(2)
            for head in range(heads)
        ]
    return None


def _attention_byte_regions(
    kv_cache: torch.Tensor,
    spec: AttentionLayerSpec,
    num_blocks: int,
    head_shard: int,
    num_head_shards: int,
    cp_size: int,
) -> list[ByteRegion] | None:
    """An attention page's byte regions for this rank's head shard; None for a physical layout
    that is not recognized (fail closed)."""
    bs, heads, head_size = spec.block_size, spec.num_kv_heads, spec.head_size
    if tuple(kv_cache.shape) == (num_blocks, heads, bs, 2 * head_size):
        return _packed_kv_regions(kv_cache, spec, head_shard, num_head_shards, cp_size)
    if tuple(kv_cache.shape) == (num_blocks, 2, bs, heads, head_size):
        return _split_kv_regions(kv_cache, spec, head_shard, num_head_shards, cp_size)
    return None


def layer_mapping(
    spec: LayerSpec, kv_cache: torch.Tensor | None, num_blocks: int, layout: ParallelLayout
) -> CanonicalPageMapping | None:
    """The certified mapping of one layer at `layout.rank`, or None (fail closed)."""
    if not isinstance(spec, AttentionLayerSpec):
        return None
    bs, page = spec.block_size, spec.real_page_size_bytes
    interleave = layout.cp_kv_cache_interleave_size
    if layout.cp_size > 1 and (interleave > bs or bs % interleave):
        return None
    if spec.use_mla:
        # The latent is replicated across TP; context parallelism shards its tokens.
        if page % bs or layout.tp_size % layout.dcp_size or spec.per_token_head_quant:
            return None
        row = page // bs
        return CanonicalPageMapping(
            canonical_page_size_bytes=layout.cp_size * page,
            local_page_size_bytes=page,
            runs=_interleave_cp_tokens([ByteRegion(0, 0, row, row)], bs, layout),
            num_writers=layout.tp_size // layout.dcp_size,
            writer_index=layout.tp_rank // layout.dcp_size,
            parallelism_agnostic=layout.cp_size == 1,
        )
    if spec.per_token_head_quant or kv_cache is None:
        return None
    total, tp = layout.total_kv_heads, layout.tp_size
    if spec.num_kv_heads != max(1, total // tp):
        return None
    if total >= tp:
        if total % tp:
            return None
        num_head_shards, replication = tp, 1
    else:
        if tp % total:
            return None
        num_head_shards, replication = total, tp // total
    if replication % layout.dcp_size:  # DCP shards tokens across ranks holding replicated KV
        return None
    head_shard = layout.tp_rank // replication
    regions = _attention_byte_regions(kv_cache, spec, num_blocks, head_shard, num_head_shards, layout.cp_size)
    if regions is None:
        return None
    return CanonicalPageMapping(
        canonical_page_size_bytes=layout.cp_size * num_head_shards * page,
        local_page_size_bytes=page,
        runs=_interleave_cp_tokens(regions, bs, layout),
        num_writers=replication // layout.dcp_size,
        writer_index=(layout.tp_rank % replication) // layout.dcp_size,
        parallelism_agnostic=layout.cp_size == 1,
    )


def opaque_fallback_mapping(page_size_bytes: int, num_ranks: int, rank: int) -> CanonicalPageMapping:
    """The fallback: this worker's page whole, at an offset only this rank writes."""
    run = CopyRun(0, rank * page_size_bytes, page_size_bytes, 1, page_size_bytes, page_size_bytes)
    return CanonicalPageMapping(
        canonical_page_size_bytes=num_ranks * page_size_bytes,
        local_page_size_bytes=page_size_bytes,
        runs=(run,),
        num_writers=1,
        writer_index=0,
        parallelism_agnostic=False,
    )


def run_intervals(runs: tuple[CopyRun, ...], canonical: bool) -> list[tuple[int, int]]:
    """The sorted byte intervals the runs cover, on the canonical or the local side."""
    intervals: list[tuple[int, int]] = []
    for run in runs:
        offset = run.canonical_offset if canonical else run.local_offset
        stride = run.canonical_stride if canonical else run.local_stride
        for i in range(run.num_fragments):
            start = offset + i * stride
            intervals.append((start, start + run.fragment_size))
    return sorted(intervals)


def is_exact_partition(intervals: list[tuple[int, int]], size: int) -> bool:
    """Whether sorted intervals cover `[0, size)` exactly once."""
    return (
        bool(intervals)
        and intervals[0][0] == 0
        and intervals[-1][1] == size
        and all(a[1] == b[0] for a, b in zip(intervals, intervals[1:]))
    )


def verify_tiling(layer_name: str, per_rank: list[CanonicalPageMapping]) -> None:
    """Assert that each rank's runs cover its local page exactly, and that the writers any
    block elects tile the canonical page exactly once (an invariant of the derivation)."""
    size = per_rank[0].canonical_page_size_bytes
    num_writers = per_rank[0].num_writers
    for mapping in per_rank:
        assert mapping.canonical_page_size_bytes == size and mapping.num_writers == num_writers
        local = run_intervals(mapping.runs, canonical=False)
        assert is_exact_partition(local, mapping.local_page_size_bytes), (
            f"runs do not cover the local page of layer {layer_name}"
        )
    for block_id in range(num_writers):
        stored = sorted(
            interval
            for mapping in per_rank
            if mapping.is_writer(block_id)
            for interval in run_intervals(mapping.runs, canonical=True)
        )
        assert is_exact_partition(stored, size), (
            f"writers of block {block_id} do not tile the canonical page of layer {layer_name}"
        )


def derive_canonical_mappings(
    layout: ParallelLayout,
    layer_specs: Mapping[str, LayerSpec],
    kv_caches: Mapping[str, torch.Tensor],
    num_blocks: int,
) -> dict[str, CanonicalPageMapping]:
    """Per layer, this worker's canonical page mapping.

    Args:
        layout: this worker's place in the parallel layout.
        layer_specs: each layer's page.
        kv_caches: each layer's KV-cache tensor, as the attention backend shaped it (its
            strides tell the NHD and HND layouts apart).
        num_blocks: blocks in each KV-cache tensor.

    Returns:
        A mapping per layer; empty with pipeline parallelism (the ranks are not the TP x PCP
        grid).
    """
    if layout.pp_size != 1:
        return {}
    mappings: dict[str, CanonicalPageMapping] = {}
    for layer_name, spec in layer_specs.items():
        kv_cache = kv_caches.get(layer_name)
        per_rank: list[CanonicalPageMapping] = []
        for rank in range(layout.group_size):
            mapping = layer_mapping(spec, kv_cache, num_blocks, replace(layout, rank=rank))
            if mapping is None:
                break
            per_rank.append(mapping)
        if len(per_rank) != layout.group_size:
            per_rank = [
                opaque_fallback_mapping(spec.real_page_size_bytes, layout.group_size, rank)
                for rank in range(layout.group_size)
            ]
        verify_tiling(layer_name, per_rank)
        mappings[layer_name] = per_rank[layout.rank]
    return mappings
