"""The pure transfer planner: unit mapping, skip handling, run merging, exact consumption.

No torch here: the planner is checked against a naive one-copy-per-GPU-block model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvref.cpu.transfer_plan import ByteCopy, TensorGeometry, TransferPlan, plan_transfer

PAGE = 16


def dense(page: int = PAGE, src_factor: int = 1, dst_factor: int = 1) -> TensorGeometry:
    return TensorGeometry(page, src_factor * page, dst_factor * page)


def plan(
    src: Sequence[int],
    dst: Sequence[int],
    *,
    sizes: Sequence[int],
    indices: Sequence[int] | None = None,
    src_factor: int = 1,
    dst_factor: int = 1,
    tensors: Sequence[TensorGeometry] | None = None,
    group_tensors: Sequence[Sequence[int]] | None = None,
    src_num_blocks: int = 100,
    dst_num_blocks: int = 100,
) -> TransferPlan:
    tensors = tensors if tensors is not None else [dense(PAGE, src_factor, dst_factor)]
    return plan_transfer(
        src,
        dst,
        group_sizes=sizes,
        block_indices=indices if indices is not None else [0] * len(sizes),
        src_block_size_factor=src_factor,
        dst_block_size_factor=dst_factor,
        group_tensors=group_tensors if group_tensors is not None else [[0]] * len(sizes),
        tensors=tensors,
        src_num_blocks=src_num_blocks,
        dst_num_blocks=dst_num_blocks,
    )


# ---- scenarios ----


def test_consecutive_blocks_merge_into_one_copy() -> None:
    result = plan([4, 5, 6], [10, 11, 12], sizes=[3])
    assert result.copies == (((4 * PAGE, 10 * PAGE, 3 * PAGE),),)
    assert result.num_bytes == 3 * PAGE


def test_runs_break_where_either_side_jumps() -> None:
    # src 1,2 | 3 jumps on dst | 7 jumps on src
    result = plan([1, 2, 3, 7], [5, 6, 9, 10], sizes=[4])
    assert result.copies[0] == (
        (1 * PAGE, 5 * PAGE, 2 * PAGE),
        (3 * PAGE, 9 * PAGE, PAGE),
        (7 * PAGE, 10 * PAGE, PAGE),
    )


def test_gpu_to_cpu_with_factor_3_and_a_mid_block_start() -> None:
    # The group starts at GPU block index 4: 4 % 3 = 1 sub-block into its first CPU block.
    # Units: CPU block 2 subs 1, 2; CPU block 8 subs 0, 1.
    result = plan([0, 1, 2, 3], [2, 8], sizes=[4], indices=[4], dst_factor=3)
    row = 3 * PAGE
    assert result.copies[0] == (
        (0, 2 * row + PAGE, 2 * PAGE),
        (2 * PAGE, 8 * row, 2 * PAGE),
    )


def test_cpu_to_gpu_with_factor_3_mirrors_the_store() -> None:
    result = plan([2, 8], [0, 1, 2, 3], sizes=[4], indices=[4], src_factor=3)
    row = 3 * PAGE
    assert result.copies[0] == (
        (2 * row + PAGE, 0, 2 * PAGE),
        (8 * row, 2 * PAGE, 2 * PAGE),
    )


def test_factor_3_merges_across_consecutive_cpu_blocks_when_rows_are_dense() -> None:
    # CPU blocks 3, 4 are adjacent in memory: 6 GPU blocks become one copy.
    result = plan([10, 11, 12, 13, 14, 15], [3, 4], sizes=[6], dst_factor=3)
    assert result.copies[0] == ((10 * PAGE, 3 * 3 * PAGE, 6 * PAGE),)


def test_padded_rows_never_merge_across_blocks() -> None:
    # Rows of 100 bytes hold 3 pages of 16 plus padding (e.g. other tensors' pages).
    padded = TensorGeometry(PAGE, PAGE, 100)
    result = plan([10, 11, 12, 13, 14, 15], [3, 4], sizes=[6], dst_factor=3, tensors=[padded])
    assert result.copies[0] == (
        (10 * PAGE, 300, 3 * PAGE),
        (13 * PAGE, 400, 3 * PAGE),
    )


def test_empty_groups_consume_no_block_ids() -> None:
    result = plan(
        [7, 8],
        [1, 2],
        sizes=[0, 2, 0],
        indices=[5, 0, 9],
        tensors=[dense(), dense(8), dense(4)],
        group_tensors=[[0], [1], [2]],
    )
    assert result.copies == ((), ((7 * 8, 1 * 8, 16),), ())
    assert result.num_bytes == 16


def test_each_group_uses_its_own_tensors_and_offsets() -> None:
    # Group 0 (tensors 0, 1) takes src [1, 2] -> dst [0]; group 1 (tensor 2) src [5] -> dst [3].
    tensors = [dense(8, 1, 2), dense(4, 1, 2), dense(32, 1, 2)]
    result = plan(
        [1, 2, 5],
        [0, 3],
        sizes=[2, 1],
        indices=[0, 2],
        dst_factor=2,
        tensors=tensors,
        group_tensors=[[0, 1], [2]],
    )
    assert result.copies == (
        ((8, 0, 16),),
        ((4, 0, 8),),
        ((5 * 32, 3 * 64, 32),),
    )
    assert result.num_bytes == 2 * 8 + 2 * 4 + 32
    assert result.num_copies == 3


def test_last_cpu_block_may_be_partial() -> None:
    result = plan([0, 1, 2, 3], [6, 7], sizes=[4], dst_factor=3)
    row = 3 * PAGE
    assert result.copies[0] == ((0, 6 * row, 4 * PAGE),)


# ---- validation ----


@pytest.mark.parametrize(
    ("src", "dst", "match"),
    [
        ([1, 2], [4], "dst_block_ids is too short"),
        ([1, 2], [4, 5, 6], "dst_block_ids has 3 block ids but the groups .* consume 2"),
        ([1, 2, 3], [4, 5, 6], "src_block_ids has 3 block ids but the groups .* consume 2"),
    ],
)
def test_block_ids_must_be_consumed_exactly(src: list[int], dst: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan(src, dst, sizes=[2])


def test_factor_changes_how_many_blocks_a_group_consumes() -> None:
    # 4 GPU blocks starting 2 into a CPU block of 3 need ceil((4 + 2) / 3) = 2 CPU blocks.
    plan([0, 1, 2, 3], [1, 2], sizes=[4], indices=[2], dst_factor=3)
    with pytest.raises(ValueError, match="consume 2"):
        plan([0, 1, 2, 3], [1, 2, 3], sizes=[4], indices=[2], dst_factor=3)
    with pytest.raises(ValueError, match="too short"):
        plan([0, 1, 2, 3, 4], [1, 2], sizes=[5], indices=[2], dst_factor=3)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: plan([100], [0], sizes=[1]), "src_block_ids contains block id 100, outside"),
        (lambda: plan([0], [-1], sizes=[1]), "dst_block_ids contains block id -1"),
        (lambda: plan([0], [0], sizes=[1, 0], indices=[0]), "one entry per KV-cache group"),
        (lambda: plan([0], [0], sizes=[-1]), "must be non-negative"),
        (lambda: plan([0], [0], sizes=[1], indices=[-2]), "must be non-negative"),
        (
            lambda: plan([0], [0], sizes=[1], src_factor=0, tensors=[dense()]),
            "src_block_size_factor must be a positive integer",
        ),
        (
            lambda: plan([0], [0], sizes=[1], tensors=[TensorGeometry(PAGE, PAGE - 1, PAGE)]),
            "src_row_bytes must hold",
        ),
        (
            lambda: plan([0], [0], sizes=[1], tensors=[TensorGeometry(0, 0, 0)]),
            "page_bytes must be positive",
        ),
        (
            lambda: plan([0], [0], sizes=[1], group_tensors=[[1]]),
            r"group_tensors\[0\] names tensor 1",
        ),
    ],
)
def test_inconsistent_arguments_raise_value_error(call: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


# ---- model-based ----


@dataclass(frozen=True)
class Scenario:
    src: list[int]
    dst: list[int]
    sizes: list[int]
    indices: list[int]
    src_factor: int
    dst_factor: int
    tensors: list[TensorGeometry]
    group_tensors: list[list[int]]
    num_src: int
    num_dst: int


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    factor = draw(st.integers(1, 4))
    gpu_to_cpu = draw(st.booleans())
    src_factor, dst_factor = (1, factor) if gpu_to_cpu else (factor, 1)
    num_tensors = draw(st.integers(1, 3))
    tensors: list[TensorGeometry] = []
    for _ in range(num_tensors):
        page = draw(st.sampled_from([4, 8, 12]))
        src_pad = draw(st.sampled_from([0, 0, 4]))
        dst_pad = draw(st.sampled_from([0, 0, 4]))
        tensors.append(TensorGeometry(page, src_factor * page + src_pad, dst_factor * page + dst_pad))
    num_groups = draw(st.integers(1, 3))
    group_tensors = [
        draw(st.lists(st.integers(0, num_tensors - 1), min_size=0, max_size=2, unique=True))
        for _ in range(num_groups)
    ]
    sizes = [draw(st.integers(0, 8)) for _ in range(num_groups)]
    indices = [draw(st.integers(0, 10)) for _ in range(num_groups)]
    num_src = num_dst = 64
    src: list[int] = []
    dst: list[int] = []
    for size, index in zip(sizes, indices):
        if size == 0:
            continue
        for side, side_factor in ((src, src_factor), (dst, dst_factor)):
            count = -(-(size + index % side_factor) // side_factor)
            ids = st.lists(st.integers(0, 63), min_size=count, max_size=count)
            # Runs of consecutive ids are what merging is about: draw some on purpose.
            run_start = draw(st.integers(0, 63 - count))
            side.extend(draw(st.one_of(ids, st.just(list(range(run_start, run_start + count))))))
    return Scenario(
        src, dst, sizes, indices, src_factor, dst_factor, tensors, group_tensors, num_src, num_dst
    )


def naive_copies(s: Scenario) -> list[list[ByteCopy]]:
    """One page-sized copy per GPU block, computed the obvious way."""
    copies: list[list[ByteCopy]] = [[] for _ in s.tensors]
    src_offset = dst_offset = 0
    for group, (size, index) in enumerate(zip(s.sizes, s.indices)):
        if size == 0:
            continue
        src_skip, dst_skip = index % s.src_factor, index % s.dst_factor
        for unit in range(size):
            src_block = s.src[src_offset + (src_skip + unit) // s.src_factor]
            dst_block = s.dst[dst_offset + (dst_skip + unit) // s.dst_factor]
            src_sub = (src_skip + unit) % s.src_factor
            dst_sub = (dst_skip + unit) % s.dst_factor
            for t in s.group_tensors[group]:
                g = s.tensors[t]
                copies[t].append(
                    (
                        src_block * g.src_row_bytes + src_sub * g.page_bytes,
                        dst_block * g.dst_row_bytes + dst_sub * g.page_bytes,
                        g.page_bytes,
                    )
                )
        src_offset += -(-(size + src_skip) // s.src_factor)
        dst_offset += -(-(size + dst_skip) // s.dst_factor)
    return copies


def split_into_pages(copies: Sequence[ByteCopy], page: int) -> list[ByteCopy]:
    return [
        (src + k, dst + k, page) for src, dst, nbytes in copies for k in range(0, nbytes, page)
    ]


@given(scenarios())
def test_plan_equals_the_naive_per_block_copies_merged_maximally(s: Scenario) -> None:
    result = plan_transfer(
        s.src,
        s.dst,
        group_sizes=s.sizes,
        block_indices=s.indices,
        src_block_size_factor=s.src_factor,
        dst_block_size_factor=s.dst_factor,
        group_tensors=s.group_tensors,
        tensors=s.tensors,
        src_num_blocks=s.num_src,
        dst_num_blocks=s.num_dst,
    )
    expected = naive_copies(s)
    for t, geometry in enumerate(s.tensors):
        # Same bytes, same order, once split back into pages...
        assert split_into_pages(result.copies[t], geometry.page_bytes) == expected[t]
        # ...and no two neighbouring copies could have been one.
        for (s0, d0, n0), (s1, d1, _) in zip(result.copies[t], result.copies[t][1:]):
            assert not (s0 + n0 == s1 and d0 + n0 == d1)
    assert result.num_bytes == sum(n for tensor in expected for _, _, n in tensor)


@given(scenarios(), st.integers(0, 1), st.integers(1, 3))
def test_extra_or_missing_block_ids_are_rejected(s: Scenario, side: int, extra: int) -> None:
    src, dst = list(s.src), list(s.dst)
    (src if side == 0 else dst).extend([0] * extra)
    with pytest.raises(ValueError, match="block ids but the groups"):
        plan_transfer(
            src,
            dst,
            group_sizes=s.sizes,
            block_indices=s.indices,
            src_block_size_factor=s.src_factor,
            dst_block_size_factor=s.dst_factor,
            group_tensors=s.group_tensors,
            tensors=s.tensors,
            src_num_blocks=s.num_src,
            dst_num_blocks=s.num_dst,
        )


def test_thousands_of_blocks_plan_into_few_copies() -> None:
    n = 8192
    result = plan(list(range(n)), list(range(n, 2 * n)), sizes=[n], src_num_blocks=2 * n, dst_num_blocks=2 * n)
    assert result.copies == (((0, n * PAGE, n * PAGE),),)
