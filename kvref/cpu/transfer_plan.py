"""Turn a transfer's block ids into byte-range copies, per KV-cache tensor (pure Python, no torch).

A CPU (offloaded) block holds `k` GPU blocks (the block-size factor). A GPU block is the unit
of every copy: GPU->CPU copies GPU block `i` of a group into sub-block `(skip + i) % k` of CPU
block `(skip + i) // k` of that group, where `skip = block_index % k` says how far into its
first CPU block the group starts (a request's GPU blocks need not start on a CPU block
boundary). CPU->GPU is the mirror image.

Byte offsets are relative to a tensor's first block: sub-block `s` of block `b` starts at
`b * row_bytes + s * page_bytes`. Consecutive units whose bytes are adjacent on *both* sides
are merged into one copy, so a transfer of consecutive blocks becomes one copy per tensor and
the per-copy submission cost is paid once per run instead of once per block.

`plan_transfer` is the only entry point; it validates that the specs fit the layout (every
block id of both sides consumed exactly, ids in range) and raises `ValueError` otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ByteCopy", "TensorGeometry", "TransferPlan", "plan_transfer"]

ByteCopy = tuple[int, int, int]
"""One contiguous copy: (source byte offset, destination byte offset, number of bytes)."""


@dataclass(frozen=True, slots=True)
class TensorGeometry:
    """The byte layout of one KV-cache tensor on both sides of a transfer.

    Attributes:
        page_bytes: bytes of one GPU block of this tensor (the unit of every copy).
        src_row_bytes: bytes from one source block to the next (the row stride); at least
            `src_block_size_factor * page_bytes`, larger when rows hold other data too.
        dst_row_bytes: the same for the destination.
    """

    page_bytes: int
    src_row_bytes: int
    dst_row_bytes: int


@dataclass(frozen=True, slots=True)
class TransferPlan:
    """The copies that carry out one transfer.

    Attributes:
        copies: per tensor (indexed like the `tensors` given to `plan_transfer`), its merged
            byte-range copies in transfer order.
        num_bytes: total bytes copied, over all tensors.
    """

    copies: tuple[tuple[ByteCopy, ...], ...]
    num_bytes: int

    @property
    def num_copies(self) -> int:
        """How many contiguous copies the transfer needs, over all tensors."""
        return sum(len(tensor_copies) for tensor_copies in self.copies)


@dataclass(frozen=True, slots=True)
class _SideUnits:
    """One side of one group, expanded to one entry per GPU-block-sized unit."""

    # Unit i lives in sub-block positions[i] % factor of block positions[i] // factor.
    positions: list[int]
    factor: int
    # Units that start a new block on this side (index > 0), i.e. (skip + i) % factor == 0.
    block_starts: range


def plan_transfer(
    src_block_ids: Sequence[int],
    dst_block_ids: Sequence[int],
    *,
    group_sizes: Sequence[int],
    block_indices: Sequence[int],
    src_block_size_factor: int,
    dst_block_size_factor: int,
    group_tensors: Sequence[Sequence[int]],
    tensors: Sequence[TensorGeometry],
    src_num_blocks: int,
    dst_num_blocks: int,
) -> TransferPlan:
    """Plan the byte-range copies of one transfer.

    Args:
        src_block_ids: source block ids, group 0's first (at the source's granularity).
        dst_block_ids: destination block ids, likewise.
        group_sizes: per KV-cache group, how many GPU blocks (units) it transfers.
        block_indices: per group, the request-relative index (in GPU blocks) of its first unit.
        src_block_size_factor: GPU blocks per source block (1 when the source is the GPU).
        dst_block_size_factor: GPU blocks per destination block (1 when it is the GPU).
        group_tensors: per group, the indices (into `tensors`) of the tensors holding it.
        tensors: the byte geometry of every tensor.
        src_num_blocks: blocks in each source tensor (ids must be below it).
        dst_num_blocks: blocks in each destination tensor.

    Returns:
        The merged copies per tensor and the total byte count.

    Raises:
        ValueError: the arguments disagree with one another: lengths per group, geometry,
            block ids out of range, or block ids not consumed exactly by the groups.
    """
    _validate_layout(
        group_sizes,
        block_indices,
        src_block_size_factor,
        dst_block_size_factor,
        group_tensors,
        tensors,
    )
    _validate_ids("src_block_ids", src_block_ids, src_num_blocks)
    _validate_ids("dst_block_ids", dst_block_ids, dst_num_blocks)

    copies: list[list[ByteCopy]] = [[] for _ in tensors]
    num_bytes = 0
    src_offset = dst_offset = 0
    for group, (size, block_index) in enumerate(zip(group_sizes, block_indices, strict=True)):
        if size == 0:
            continue
        src, src_offset = _expand(
            "src_block_ids", src_block_ids, src_offset, src_block_size_factor, block_index, size, group
        )
        dst, dst_offset = _expand(
            "dst_block_ids", dst_block_ids, dst_offset, dst_block_size_factor, block_index, size, group
        )
        # Whether bytes of consecutive blocks touch depends on each tensor's row stride, so
        # runs are found once per (source dense, destination dense) variant and then scaled.
        runs_by_density: dict[tuple[bool, bool], list[tuple[int, int]]] = {}
        for tensor_idx in group_tensors[group]:
            geometry = tensors[tensor_idx]
            page = geometry.page_bytes
            src_dense = geometry.src_row_bytes == src_block_size_factor * page
            dst_dense = geometry.dst_row_bytes == dst_block_size_factor * page
            runs = runs_by_density.get((src_dense, dst_dense))
            if runs is None:
                runs = _find_runs(src, dst, src_dense, dst_dense)
                runs_by_density[(src_dense, dst_dense)] = runs
            copies[tensor_idx].extend(
                _scale_runs(runs, src, dst, page, geometry.src_row_bytes, geometry.dst_row_bytes)
            )
            num_bytes += size * page

    for name, ids, consumed in (
        ("src_block_ids", src_block_ids, src_offset),
        ("dst_block_ids", dst_block_ids, dst_offset),
    ):
        if consumed != len(ids):
            raise ValueError(
                f"{name} has {len(ids)} block ids but the groups (group_sizes="
                f"{list(group_sizes)}, block_indices={list(block_indices)}) consume {consumed}"
            )
    return TransferPlan(tuple(tuple(c) for c in copies), num_bytes)


def _validate_layout(
    group_sizes: Sequence[int],
    block_indices: Sequence[int],
    src_block_size_factor: int,
    dst_block_size_factor: int,
    group_tensors: Sequence[Sequence[int]],
    tensors: Sequence[TensorGeometry],
) -> None:
    if len(group_sizes) != len(group_tensors) or len(block_indices) != len(group_tensors):
        raise ValueError(
            f"group_sizes ({len(group_sizes)} entries) and block_indices ({len(block_indices)}) "
            f"need one entry per KV-cache group ({len(group_tensors)} groups)"
        )
    if any(size < 0 for size in group_sizes) or any(index < 0 for index in block_indices):
        raise ValueError(
            f"group_sizes {list(group_sizes)} and block_indices {list(block_indices)} "
            "must be non-negative"
        )
    for name, factor in (
        ("src_block_size_factor", src_block_size_factor),
        ("dst_block_size_factor", dst_block_size_factor),
    ):
        if factor < 1:
            raise ValueError(f"{name} must be a positive integer, got {factor}")
    for group, tensor_indices in enumerate(group_tensors):
        for tensor_idx in tensor_indices:
            if not 0 <= tensor_idx < len(tensors):
                raise ValueError(
                    f"group_tensors[{group}] names tensor {tensor_idx}, but there are "
                    f"{len(tensors)} tensors"
                )
    for tensor_idx, geometry in enumerate(tensors):
        if geometry.page_bytes < 1:
            raise ValueError(f"tensors[{tensor_idx}].page_bytes must be positive: {geometry}")
        if geometry.src_row_bytes < src_block_size_factor * geometry.page_bytes:
            raise ValueError(
                f"tensors[{tensor_idx}].src_row_bytes must hold src_block_size_factor="
                f"{src_block_size_factor} pages of {geometry.page_bytes} bytes: {geometry}"
            )
        if geometry.dst_row_bytes < dst_block_size_factor * geometry.page_bytes:
            raise ValueError(
                f"tensors[{tensor_idx}].dst_row_bytes must hold dst_block_size_factor="
                f"{dst_block_size_factor} pages of {geometry.page_bytes} bytes: {geometry}"
            )


def _validate_ids(name: str, block_ids: Sequence[int], num_blocks: int) -> None:
    if not block_ids:
        return
    lowest, highest = min(block_ids), max(block_ids)
    if lowest < 0 or highest >= num_blocks:
        bad = lowest if lowest < 0 else highest
        raise ValueError(f"{name} contains block id {bad}, outside [0, {num_blocks})")


def _expand(
    name: str,
    block_ids: Sequence[int],
    offset: int,
    factor: int,
    block_index: int,
    size: int,
    group: int,
) -> tuple[_SideUnits, int]:
    """Expand one group's blocks on one side into units; return them and the new offset."""
    skip = block_index % factor
    count = -(-(size + skip) // factor)
    if offset + count > len(block_ids):
        raise ValueError(
            f"{name} is too short: group {group} ({size} GPU blocks from block index "
            f"{block_index}) needs {count} blocks at offset {offset}, only "
            f"{len(block_ids) - offset} remain"
        )
    ids = list(block_ids[offset : offset + count])
    if factor == 1:
        positions = ids
    else:
        positions = [ids[j // factor] * factor + j % factor for j in range(skip, skip + size)]
    first_block_start = (factor - skip) % factor or factor
    return _SideUnits(positions, factor, range(first_block_start, size, factor)), offset + count


def _find_runs(
    src: _SideUnits, dst: _SideUnits, src_dense: bool, dst_dense: bool
) -> list[tuple[int, int]]:
    """Split the units into maximal runs that are contiguous on both sides: (start, length)."""
    src_pos, dst_pos = src.positions, dst.positions
    size = len(src_pos)
    breaks = {
        i
        for i in range(1, size)
        if src_pos[i] - src_pos[i - 1] != 1 or dst_pos[i] - dst_pos[i - 1] != 1
    }
    # With padded rows (row stride > factor * page) bytes of adjacent blocks never touch.
    if not src_dense:
        breaks.update(src.block_starts)
    if not dst_dense:
        breaks.update(dst.block_starts)
    starts = [0, *sorted(breaks)]
    return [(start, end - start) for start, end in zip(starts, [*starts[1:], size])]


def _scale_runs(
    runs: list[tuple[int, int]],
    src: _SideUnits,
    dst: _SideUnits,
    page: int,
    src_row_bytes: int,
    dst_row_bytes: int,
) -> list[ByteCopy]:
    """Turn unit runs into byte copies for one tensor's geometry."""
    src_pos, dst_pos, src_factor, dst_factor = src.positions, dst.positions, src.factor, dst.factor
    result: list[ByteCopy] = []
    for start, length in runs:
        src_block, src_sub = divmod(src_pos[start], src_factor)
        dst_block, dst_sub = divmod(dst_pos[start], dst_factor)
        result.append(
            (
                src_block * src_row_bytes + src_sub * page,
                dst_block * dst_row_bytes + dst_sub * page,
                length * page,
            )
        )
    return result
