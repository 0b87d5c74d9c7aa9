"""The transfer planner, step by step and whole: group slicing, sub-block offsets, fragments,
writer rotation, merging, and exact consumption of the block ids.

`plan_transfer` is checked against a naive model: one copy per (group, layer, GPU block,
fragment), applied byte by byte.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.base import CanonicalKVCacheRef, CanonicalPageMapping, CopyRun
from kvref.cpu.transfer_plan import (
    ByteCopies,
    LayerCopy,
    SideRows,
    TransferPlan,
    as_block_ids,
    build_copy_plan,
    canonical_block_sizes,
    canonical_page_ids,
    int_list,
    layer_copies,
    merge_adjacent,
    plan_transfer,
    split_groups,
    whole_page_plan,
)

PAGE = 16
NO_BREAKS = torch.empty(0, dtype=torch.int64)


def rows(factor: int = 1, page: int = PAGE, padding: int = 0, num_rows: int = 100) -> SideRows:
    return SideRows(factor * page + padding, page, num_rows)


def whole(tensor_idx: int = 0, page: int = PAGE) -> LayerCopy:
    return LayerCopy(tensor_idx, whole_page_plan(page), None)


def plan(
    src: Sequence[int],
    dst: Sequence[int],
    *,
    sizes: Sequence[int],
    indices: Sequence[int] | None = None,
    src_factor: int = 1,
    dst_factor: int = 1,
    layers: Sequence[Sequence[LayerCopy]] | None = None,
    src_rows: Sequence[SideRows] | None = None,
    dst_rows: Sequence[SideRows] | None = None,
) -> TransferPlan:
    return plan_transfer(
        src,
        dst,
        group_sizes=sizes,
        block_indices=indices if indices is not None else [0] * len(sizes),
        src_blocks_per_chunk=src_factor,
        dst_blocks_per_chunk=dst_factor,
        layers=layers if layers is not None else [[whole()]] * len(sizes),
        src_rows=src_rows if src_rows is not None else [rows(src_factor)],
        dst_rows=dst_rows if dst_rows is not None else [rows(dst_factor)],
    )


def triples(copies: ByteCopies) -> list[tuple[int, int, int]]:
    return list(
        zip(int_list(copies.src_offsets), int_list(copies.dst_offsets), int_list(copies.sizes), strict=True)
    )


# ---- the steps ----


def test_block_ids_come_from_arrays_lists_and_tensors() -> None:
    for ids in (array("q", [3, 1]), [3, 1], (3, 1), torch.tensor([3, 1])):
        assert int_list(as_block_ids(ids)) == [3, 1]
    assert len(as_block_ids(array("q"))) == 0


def test_canonical_page_ids_enumerate_sub_blocks_from_the_skip() -> None:
    # vLLM's example: chunks 3, 7, 9 of 4 sub-blocks, 10 of them from sub-block 2.
    ids = canonical_page_ids([3, 7, 9], blocks_per_chunk=4, count=10, skip_count=2)
    assert int_list(ids) == [14, 15, 28, 29, 30, 31, 36, 37, 38, 39]
    assert int_list(canonical_page_ids([5, 2], 1, 2, 0)) == [5, 2]


def test_groups_take_their_ids_in_order_and_empty_groups_take_none() -> None:
    parts = split_groups(as_block_ids([0, 1, 2, 3, 4]), as_block_ids([8, 9, 7]), [2, 0, 3], [0, 0, 1], 1, 2)
    assert [(p.group, p.size, int_list(p.src_ids), int_list(p.dst_ids), p.dst_skip) for p in parts] == [
        (0, 2, [0, 1], [8], 0),
        (2, 3, [2, 3, 4], [9, 7], 1),
    ]


def test_copy_plan_unrolls_runs_and_a_load_swaps_the_sides() -> None:
    runs = (CopyRun(0, 256, 128, 4, 128, 512), CopyRun(512, 2304, 128, 4, 128, 512))
    ref = CanonicalKVCacheRef(0, 1024, CanonicalPageMapping(4096, 1024, runs, 1, 0, True))
    store, load = build_copy_plan(ref, gpu_to_cpu=True), build_copy_plan(ref, gpu_to_cpu=False)
    k_dst = [256, 768, 1280, 1792]
    assert int_list(store.frag_offsets_src) == [0, 128, 256, 384, 512, 640, 768, 896]
    assert int_list(store.frag_offsets_dst) == k_dst + [2048 + o for o in k_dst]
    assert (store.num_frags, store.total_bytes) == (8, 1024)
    assert int_list(load.frag_offsets_src) == int_list(store.frag_offsets_dst)
    with pytest.raises(ValueError, match="no canonical mapping"):
        build_copy_plan(CanonicalKVCacheRef(0, 1024), gpu_to_cpu=True)


def mapped(
    tensor_idx: int, canonical: int, local: int = 256, writers: tuple[int, int] = (1, 0)
) -> CanonicalKVCacheRef:
    mapping = CanonicalPageMapping(canonical, local, (CopyRun(0, 0, local, 1, local, local),), *writers, True)
    return CanonicalKVCacheRef(tensor_idx, local, mapping)


def test_canonical_block_sizes_take_the_largest_page_per_tensor() -> None:
    assert canonical_block_sizes([[mapped(0, 4096), mapped(0, 2048)], [mapped(1, 2048)]], 2) == [4096, 2048]
    with pytest.raises(ValueError, match="needs every reference mapped"):
        canonical_block_sizes([[CanonicalKVCacheRef(0, 256)]], 1)
    with pytest.raises(ValueError, match="every tensor needs a mapped reference"):
        canonical_block_sizes([[mapped(0, 512)]], 2)


def test_only_canonical_stores_filter_writers() -> None:
    refs = [[mapped(0, 256, writers=(2, 1))]]
    assert layer_copies(refs, gpu_to_cpu=True, canonical_layout=True)[0][0].writers is not None
    assert layer_copies(refs, gpu_to_cpu=False, canonical_layout=True)[0][0].writers is None
    direct = layer_copies(refs, gpu_to_cpu=True, canonical_layout=False)[0][0]
    assert direct.writers is None and direct.plan.num_frags == 1


def test_merging_joins_touching_copies_and_stops_at_breaks() -> None:
    copies = ByteCopies(
        torch.tensor([0, 16, 32, 64]), torch.tensor([100, 116, 132, 148]), torch.tensor([16, 16, 16, 16])
    )
    assert triples(merge_adjacent(copies, NO_BREAKS, NO_BREAKS)) == [(0, 100, 48), (64, 148, 16)]
    assert triples(merge_adjacent(copies, NO_BREAKS, torch.tensor([132]))) == [
        (0, 100, 32),
        (32, 132, 16),
        (64, 148, 16),
    ]


# ---- whole plans ----


def test_consecutive_blocks_merge_into_one_copy() -> None:
    result = plan([4, 5, 6], [10, 11, 12], sizes=[3])
    assert [triples(c) for c in result.copies] == [[(4 * PAGE, 10 * PAGE, 3 * PAGE)]]
    assert (result.num_bytes, result.num_copies) == (3 * PAGE, 1)


def test_runs_break_where_either_side_jumps() -> None:
    result = plan([1, 2, 3, 7], [5, 6, 9, 10], sizes=[4])
    assert triples(result.copies[0]) == [
        (1 * PAGE, 5 * PAGE, 2 * PAGE),
        (3 * PAGE, 9 * PAGE, PAGE),
        (7 * PAGE, 10 * PAGE, PAGE),
    ]


def test_a_store_mid_way_into_a_chunk_skips_its_first_sub_blocks() -> None:
    # The group starts at GPU block index 4: 4 % 3 = 1 sub-block into its first CPU chunk.
    result = plan([0, 1, 2, 3], [2, 8], sizes=[4], indices=[4], dst_factor=3)
    row = 3 * PAGE
    assert triples(result.copies[0]) == [(0, 2 * row + PAGE, 2 * PAGE), (2 * PAGE, 8 * row, 2 * PAGE)]


def test_padded_rows_never_merge_across_rows() -> None:
    result = plan([0, 1], [4, 5], sizes=[2], dst_rows=[rows(padding=8)])
    assert triples(result.copies[0]) == [(0, 4 * 24, PAGE), (PAGE, 5 * 24, PAGE)]


def test_each_layer_copies_its_own_page_of_its_own_tensor() -> None:
    layers = [[whole(0, 16), whole(1, 8)], [whole(1, 8)]]
    result = plan(
        [0, 1, 2],
        [5, 6, 7],
        sizes=[2, 1],
        layers=layers,
        src_rows=[rows(), rows()],
        dst_rows=[rows(), rows()],
    )
    assert triples(result.copies[0]) == [(0, 5 * PAGE, 2 * PAGE)]
    assert triples(result.copies[1]) == [(0, 5 * PAGE, 8), (PAGE, 6 * PAGE, 8), (2 * PAGE, 7 * PAGE, 8)]
    assert result.num_bytes == 2 * 16 + 3 * 8


def test_a_canonical_store_writes_only_the_pages_this_rank_is_elected_for() -> None:
    copy = layer_copies(
        [[mapped(0, PAGE, local=PAGE, writers=(2, 1))]], gpu_to_cpu=True, canonical_layout=True
    )
    # Chunks of 2 sub-blocks: pages 2*3+0, 2*3+1, 2*4+0, 2*4+1 -> rank 1 writes the odd ones.
    result = plan([0, 1, 2, 3], [3, 4], sizes=[4], dst_factor=2, layers=copy, dst_rows=[rows(2)])
    assert triples(result.copies[0]) == [(PAGE, 7 * PAGE, PAGE), (3 * PAGE, 9 * PAGE, PAGE)]
    assert result.num_bytes == 2 * PAGE


@pytest.mark.parametrize(
    ("src", "dst", "match"),
    [
        ([1, 2], [3], "dst spec is too short"),
        ([1, 2, 3], [4, 5], "src spec has 3 block ids but the groups"),
        ([1, 200], [3, 4], r"src spec has block ids \[1, 200\] outside \[0, 100\)"),
        ([1, -1], [3, 4], "outside"),
    ],
)
def test_block_ids_must_fit_and_be_consumed_exactly(src: list[int], dst: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan(src, dst, sizes=[2])


def test_group_arguments_must_agree() -> None:
    with pytest.raises(ValueError, match="need one entry per KV-cache group"):
        plan([1], [2], sizes=[1], indices=[0, 0])
    with pytest.raises(ValueError, match="must be non-negative"):
        plan([1], [2], sizes=[1], indices=[-1])


# ---- against the naive model ----


@dataclass(frozen=True)
class Scenario:
    src_factor: int
    dst_factor: int
    sizes: list[int]
    indices: list[int]
    src_ids: list[int]
    dst_ids: list[int]
    layers: list[list[LayerCopy]]
    pages: list[int]
    src_padding: int
    dst_padding: int
    num_rows: int


@st.composite
def fragment_plans(draw: st.DrawFn, page: int) -> LayerCopy:
    """A layer's page in 1-3 fragments, in any order, with an optional writer rotation."""
    cuts = sorted(draw(st.sets(st.integers(1, page - 1), max_size=2)))
    bounds = [0, *cuts, page]
    pieces = [(a, b - a) for a, b in zip(bounds, bounds[1:])]
    targets = draw(st.permutations(pieces))
    offsets_dst: list[int] = []
    position = 0
    for _, size in targets:
        offsets_dst.append(position)
        position += size
    order = {piece: offsets_dst[i] for i, piece in enumerate(targets)}
    runs = tuple(CopyRun(start, order[(start, size)], size, 1, size, size) for start, size in pieces)
    writers = draw(st.sampled_from([(1, 0), (2, 0), (2, 1), (3, 2)]))
    mapping = CanonicalPageMapping(page, page, runs, *writers, True)
    return layer_copies([[CanonicalKVCacheRef(0, page, mapping)]], gpu_to_cpu=True, canonical_layout=True)[0][
        0
    ]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    store = draw(st.booleans())
    factor = draw(st.integers(1, 3))
    src_factor, dst_factor = (1, factor) if store else (factor, 1)
    num_groups = draw(st.integers(1, 3))
    pages = draw(st.lists(st.sampled_from([4, 8]), min_size=1, max_size=2))
    num_rows = 12
    sizes: list[int] = []
    indices: list[int] = []
    src_ids: list[int] = []
    dst_ids: list[int] = []
    layers: list[list[LayerCopy]] = []
    for _ in range(num_groups):
        size = draw(st.integers(0, 4))
        index = draw(st.integers(0, 5))
        sizes.append(size)
        indices.append(index)
        if size:
            for ids, f in ((src_ids, src_factor), (dst_ids, dst_factor)):
                count = -(-(size + index % f) // f)
                ids += draw(
                    st.lists(st.integers(0, num_rows - 1), min_size=count, max_size=count, unique=True)
                )
        tensors = draw(st.sets(st.integers(0, len(pages) - 1), min_size=1))
        group: list[LayerCopy] = []
        for t in sorted(tensors):
            if store and draw(st.booleans()):
                fragments = draw(fragment_plans(pages[t]))
                group.append(LayerCopy(t, fragments.plan, fragments.writers))
            else:
                group.append(whole(t, pages[t]))
        layers.append(group)
    return Scenario(
        src_factor,
        dst_factor,
        sizes,
        indices,
        src_ids,
        dst_ids,
        layers,
        pages,
        draw(st.sampled_from([0, 4])),
        draw(st.sampled_from([0, 4])),
        num_rows,
    )


def naive_copies(s: Scenario) -> list[list[tuple[int, int, int]]]:
    """One copy per (group, layer, GPU block, fragment), written out plainly."""
    copies: list[list[tuple[int, int, int]]] = [[] for _ in s.pages]
    src_offset = dst_offset = 0
    for group, (size, index) in enumerate(zip(s.sizes, s.indices)):
        if size == 0:
            continue
        src_skip, dst_skip = index % s.src_factor, index % s.dst_factor
        src_count = -(-(size + src_skip) // s.src_factor)
        dst_count = -(-(size + dst_skip) // s.dst_factor)
        for layer in s.layers[group]:
            page = s.pages[layer.tensor_idx]
            for i in range(size):
                src_block, src_sub = divmod(src_skip + i, s.src_factor)
                dst_block, dst_sub = divmod(dst_skip + i, s.dst_factor)
                src_id, dst_id = s.src_ids[src_offset + src_block], s.dst_ids[dst_offset + dst_block]
                cpu_page = dst_id * s.dst_factor + dst_sub
                if layer.writers is not None and not layer.writers.is_writer(cpu_page):
                    continue
                src_base = src_id * (s.src_factor * page + s.src_padding) + src_sub * page
                dst_base = dst_id * (s.dst_factor * page + s.dst_padding) + dst_sub * page
                for a, b, n in zip(
                    int_list(layer.plan.frag_offsets_src),
                    int_list(layer.plan.frag_offsets_dst),
                    int_list(layer.plan.frag_sizes),
                ):
                    copies[layer.tensor_idx].append((src_base + a, dst_base + b, n))
        src_offset += src_count
        dst_offset += dst_count
    return copies


def apply(copies: list[tuple[int, int, int]], source: bytes, size: int) -> bytes:
    out = bytearray(size)
    for s, d, n in copies:
        out[d : d + n] = source[s : s + n]
    return bytes(out)


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_plan_moves_the_bytes_of_the_naive_model_in_maximally_merged_copies(s: Scenario) -> None:
    src_rows = [SideRows(s.src_factor * p + s.src_padding, p, s.num_rows) for p in s.pages]
    dst_rows = [SideRows(s.dst_factor * p + s.dst_padding, p, s.num_rows) for p in s.pages]
    result = plan(
        s.src_ids,
        s.dst_ids,
        sizes=s.sizes,
        indices=s.indices,
        src_factor=s.src_factor,
        dst_factor=s.dst_factor,
        layers=s.layers,
        src_rows=src_rows,
        dst_rows=dst_rows,
    )
    expected = naive_copies(s)
    assert result.num_bytes == sum(n for tensor in expected for _, _, n in tensor)
    for t, page in enumerate(s.pages):
        size = s.num_rows * (max(s.src_factor, s.dst_factor) * page + 4)
        source = bytes((i * 7 + t) % 251 for i in range(size))
        merged = triples(result.copies[t])
        assert apply(merged, source, size) == apply(expected[t], source, size)
        assert len(merged) <= len(expected[t])
        assert not any(a[0] + a[2] == b[0] and a[1] + a[2] == b[1] for a, b in zip(merged, merged[1:]))
