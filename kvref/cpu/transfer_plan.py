"""Turn a transfer's block ids into byte-range copies, one pure function per step (vLLM 0.33: the
planning half of `vllm/v1/kv_offload/cpu/gpu_worker.py`).

Sizes. A CPU chunk holds `blocks_per_chunk` GPU blocks; a *sub-block* is one GPU block's worth
of a chunk's row. A GPU block is the unit of every transfer: a store copies GPU block `i` of a
group into sub-block `(skip + i) % blocks_per_chunk` of CPU chunk `(skip + i) //
blocks_per_chunk` of that group, where `skip = block_index % blocks_per_chunk` says how far into
its first chunk the group starts. A load is the mirror image. The GPU side is the same with
`blocks_per_chunk = 1`.

Pages. Each layer (a `CanonicalKVCacheRef`) copies its page of every sub-block through a
`CopyPlan`: byte fragments relative to the sub-block's start on each side. The direct layout (a
worker's private CPU rows) copies the layer's page whole; the canonical layout scatters it into
the canonical page its `CanonicalPageMapping` describes, and a store keeps only the pages this
rank is elected to write (ranks holding identical bytes take turns, `is_writer`).

The steps, each a function of data alone:

1. `split_groups` - which block ids of a spec each KV-cache group takes, on both sides.
2. `sub_block_offsets` - the byte offset of each sub-block in a tensor's rows, from
   `canonical_page_ids` (which also keys the writer rotation, `writer_mask`).
3. `expand_fragments` - one copy per (sub-block, fragment).
4. `merge_adjacent` - consecutive copies that touch on both sides become one.

`plan_transfer` conducts them and validates its input (`ValueError`: lengths, block ids out of
range, ids not consumed exactly). Offsets are relative to each tensor's first row on each side,
so the worker can index a byte view of the rows with them. Arrays are int64 CPU tensors (torch
plays numpy's part in vLLM): one vectorized step per group and layer, not one per block.
"""

from __future__ import annotations

import warnings
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

with warnings.catch_warnings():
    # CPU wheels of torch warn on import when numpy is absent; kvref does not need numpy.
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

from kvref.base import CanonicalKVCacheRef, CanonicalPageMapping

__all__ = [
    "ByteCopies",
    "CopyPlan",
    "GroupSlice",
    "LayerCopy",
    "SideRows",
    "TransferPlan",
    "as_block_ids",
    "build_copy_plan",
    "canonical_block_sizes",
    "canonical_page_ids",
    "expand_fragments",
    "int_list",
    "layer_copies",
    "merge_adjacent",
    "plan_transfer",
    "split_groups",
    "sub_block_offsets",
    "whole_page_plan",
    "writer_mask",
]

_INT64 = torch.int64


class CopyPlan(NamedTuple):
    """One layer's page as byte fragments, relative to a sub-block's start on each side.

    Attributes:
        frag_offsets_src: per fragment, its offset in the source sub-block.
        frag_offsets_dst: per fragment, its offset in the destination sub-block.
        frag_sizes: per fragment, its length.
        total_bytes: the bytes of one page, summed over the fragments.
    """

    frag_offsets_src: torch.Tensor
    frag_offsets_dst: torch.Tensor
    frag_sizes: torch.Tensor
    total_bytes: int

    @property
    def num_frags(self) -> int:
        """How many fragments one page is copied in."""
        return len(self.frag_sizes)


class ByteCopies(NamedTuple):
    """Contiguous copies within one tensor: copy `i` moves `sizes[i]` bytes from
    `src_offsets[i]` to `dst_offsets[i]` (int64 tensors of one length)."""

    src_offsets: torch.Tensor
    dst_offsets: torch.Tensor
    sizes: torch.Tensor


@dataclass(frozen=True, slots=True)
class SideRows:
    """The rows of one tensor on one side of a transfer.

    Attributes:
        row_stride: bytes from one row (a GPU block, or a CPU chunk) to the next.
        sub_block_bytes: bytes of one GPU block's worth inside a row (the row's page divided by
            its blocks per chunk).
        num_rows: rows in the tensor; block ids must be below it.
    """

    row_stride: int
    sub_block_bytes: int
    num_rows: int


@dataclass(frozen=True, slots=True)
class LayerCopy:
    """How one layer's pages are copied.

    Attributes:
        tensor_idx: the tensor holding the layer, on both sides.
        plan: its fragments.
        writers: on a canonical store, the layer's mapping, whose writer rotation elects the
            pages this rank writes; None when every page is written.
    """

    tensor_idx: int
    plan: CopyPlan
    writers: CanonicalPageMapping | None


@dataclass(frozen=True, slots=True)
class GroupSlice:
    """The block ids one KV-cache group takes from a transfer's specs.

    Attributes:
        group: the group's index.
        size: GPU blocks the group transfers (sub-blocks on the CPU side).
        src_ids, dst_ids: the group's block ids at each side's granularity.
        src_skip, dst_skip: sub-blocks to skip in the group's first block on each side.
    """

    group: int
    size: int
    src_ids: torch.Tensor
    dst_ids: torch.Tensor
    src_skip: int
    dst_skip: int


@dataclass(frozen=True, slots=True)
class TransferPlan:
    """The copies that carry out one transfer.

    Attributes:
        copies: per tensor, its merged copies in transfer order.
        num_bytes: the bytes the transfer moves.
    """

    copies: tuple[ByteCopies, ...]
    num_bytes: int

    @property
    def num_copies(self) -> int:
        """How many contiguous copies the transfer takes, over all tensors."""
        return sum(len(c.sizes) for c in self.copies)


def int_list(values: torch.Tensor) -> list[int]:
    """A 1-D integer tensor's values as Python ints."""
    return cast(list[int], values.tolist())  # pyright: ignore[reportUnknownMemberType]  # torch types it loosely


def as_block_ids(block_ids: object) -> torch.Tensor:
    """Block ids as a 1-D int64 CPU tensor (from `array('q')`, a list, numpy or torch)."""
    if isinstance(block_ids, array):
        ids = cast("array[int]", block_ids)
        if ids.typecode == "q" and len(ids):
            return torch.frombuffer(ids, dtype=_INT64)  # zero-copy over the spec's ids
    return torch.as_tensor(block_ids, dtype=_INT64).reshape(-1)


def whole_page_plan(page_size_bytes: int) -> CopyPlan:
    """The direct layout's plan: the page copied whole, at the start of both sub-blocks."""
    return CopyPlan(
        frag_offsets_src=torch.zeros(1, dtype=_INT64),
        frag_offsets_dst=torch.zeros(1, dtype=_INT64),
        frag_sizes=torch.tensor([page_size_bytes], dtype=_INT64),
        total_bytes=page_size_bytes,
    )


def build_copy_plan(ref: CanonicalKVCacheRef, gpu_to_cpu: bool) -> CopyPlan:
    """Unroll a layer's mapped runs into fragments (local = GPU side, canonical = CPU side).

    Raises:
        ValueError: the reference has no mapping.
    """
    mapping = ref.mapping
    if mapping is None:
        raise ValueError(f"reference to tensor {ref.tensor_idx} has no canonical mapping")
    local: list[int] = []
    canonical: list[int] = []
    sizes: list[int] = []
    for run in mapping.runs:
        for i in range(run.num_fragments):
            local.append(run.local_offset + i * run.local_stride)
            canonical.append(run.canonical_offset + i * run.canonical_stride)
            sizes.append(run.fragment_size)
    src, dst = (local, canonical) if gpu_to_cpu else (canonical, local)
    return CopyPlan(
        frag_offsets_src=torch.tensor(src, dtype=_INT64),
        frag_offsets_dst=torch.tensor(dst, dtype=_INT64),
        frag_sizes=torch.tensor(sizes, dtype=_INT64),
        total_bytes=sum(sizes),
    )


def canonical_block_sizes(
    layer_refs_per_group: Sequence[Sequence[CanonicalKVCacheRef]], num_tensors: int
) -> list[int]:
    """Canonical CPU bytes per GPU block of each tensor: the largest canonical page among the
    layers it holds.

    Raises:
        ValueError: a reference has no mapping, names a tensor out of range, or a tensor is
            held by no layer.
    """
    sizes = [0] * num_tensors
    for group, refs in enumerate(layer_refs_per_group):
        for ref in refs:
            if ref.mapping is None or not 0 <= ref.tensor_idx < num_tensors:
                raise ValueError(
                    f"layer_refs_per_group[{group}]: the canonical layout needs every reference "
                    f"mapped and within the {num_tensors} tensors, got {ref}"
                )
            sizes[ref.tensor_idx] = max(sizes[ref.tensor_idx], ref.mapping.canonical_page_size_bytes)
    if not all(size > 0 for size in sizes):
        raise ValueError(f"every tensor needs a mapped reference; canonical page sizes {sizes}")
    return sizes


def layer_copies(
    layer_refs_per_group: Sequence[Sequence[CanonicalKVCacheRef]], gpu_to_cpu: bool, canonical_layout: bool
) -> list[list[LayerCopy]]:
    """Each group's layers as `LayerCopy`s: whole pages (direct), or mapped fragments."""
    groups: list[list[LayerCopy]] = []
    for refs in layer_refs_per_group:
        copies: list[LayerCopy] = []
        for ref in refs:
            if not canonical_layout:
                copies.append(LayerCopy(ref.tensor_idx, whole_page_plan(ref.page_size_bytes), None))
                continue
            mapping = ref.mapping
            writers = mapping if gpu_to_cpu and mapping is not None and mapping.num_writers > 1 else None
            copies.append(LayerCopy(ref.tensor_idx, build_copy_plan(ref, gpu_to_cpu), writers))
        groups.append(copies)
    return groups


def split_groups(
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    group_sizes: Sequence[int],
    block_indices: Sequence[int],
    src_blocks_per_chunk: int,
    dst_blocks_per_chunk: int,
) -> list[GroupSlice]:
    """Hand each non-empty group its block ids, in group order, on both sides.

    Raises:
        ValueError: a side's ids run out, or are left over, after the last group.
    """
    slices: list[GroupSlice] = []
    src_offset = dst_offset = 0
    for group, (size, block_index) in enumerate(zip(group_sizes, block_indices, strict=True)):
        if size == 0:
            continue
        src_skip = block_index % src_blocks_per_chunk
        dst_skip = block_index % dst_blocks_per_chunk
        src_count = -(-(size + src_skip) // src_blocks_per_chunk)  # ceiling division
        dst_count = -(-(size + dst_skip) // dst_blocks_per_chunk)
        for name, ids, offset, count in (
            ("src", src_ids, src_offset, src_count),
            ("dst", dst_ids, dst_offset, dst_count),
        ):
            if offset + count > len(ids):
                raise ValueError(
                    f"{name} spec is too short: group {group} ({size} GPU blocks from block "
                    f"index {block_index}) needs {count} block ids at offset {offset}, only "
                    f"{len(ids) - offset} remain"
                )
        slices.append(
            GroupSlice(
                group,
                size,
                src_ids[src_offset : src_offset + src_count],
                dst_ids[dst_offset : dst_offset + dst_count],
                src_skip,
                dst_skip,
            )
        )
        src_offset += src_count
        dst_offset += dst_count
    for name, ids, consumed in (("src", src_ids, src_offset), ("dst", dst_ids, dst_offset)):
        if consumed != len(ids):
            raise ValueError(
                f"{name} spec has {len(ids)} block ids but the groups (group_sizes="
                f"{list(group_sizes)}, block_indices={list(block_indices)}) consume {consumed}"
            )
    return slices


def canonical_page_ids(block_ids: object, blocks_per_chunk: int, count: int, skip_count: int) -> torch.Tensor:
    """The global sub-block ids of `count` sub-blocks from `skip_count` into the first block.

    Sub-block `j` of block `b` is `b * blocks_per_chunk + j`. On the CPU side these name the
    canonical pages consistently across ranks, so they key the writer rotation.
    """
    ids = as_block_ids(block_ids)
    if blocks_per_chunk == 1:
        return ids[:count]
    flat = (ids[:, None] * blocks_per_chunk + torch.arange(blocks_per_chunk, dtype=_INT64)).reshape(-1)
    return flat[skip_count : skip_count + count]


def sub_block_offsets(
    block_ids: torch.Tensor, blocks_per_chunk: int, count: int, skip_count: int, rows: SideRows
) -> torch.Tensor:
    """The byte offset, in a tensor's rows, of each sub-block `canonical_page_ids` names."""
    pages = canonical_page_ids(block_ids, blocks_per_chunk, count, skip_count)
    return (pages // blocks_per_chunk) * rows.row_stride + (pages % blocks_per_chunk) * rows.sub_block_bytes


def writer_mask(cpu_page_ids: torch.Tensor, mapping: CanonicalPageMapping) -> torch.Tensor:
    """Which pages this rank writes (`CanonicalPageMapping.is_writer`, vectorized)."""
    return cpu_page_ids % mapping.num_writers == mapping.writer_index


def expand_fragments(src_bases: torch.Tensor, dst_bases: torch.Tensor, plan: CopyPlan) -> ByteCopies:
    """One copy per (sub-block, fragment), sub-block by sub-block."""
    return ByteCopies(
        (src_bases[:, None] + plan.frag_offsets_src[None, :]).reshape(-1),
        (dst_bases[:, None] + plan.frag_offsets_dst[None, :]).reshape(-1),
        plan.frag_sizes.repeat(len(src_bases)),
    )


def merge_adjacent(copies: ByteCopies, src_breaks: torch.Tensor, dst_breaks: torch.Tensor) -> ByteCopies:
    """Join consecutive copies whose bytes touch on both sides: each copy is one call (one
    `cudaMemcpyAsync` on a GPU), so consecutive blocks are worth one call, not one each.

    A copy starting at a `*_breaks` offset is never joined to the one before (pinned host
    memory is registered in chunks, and one DMA must not cross from one into the next).
    """
    src, dst, sizes = copies
    if len(sizes) < 2:
        return copies
    touching = (src[1:] == src[:-1] + sizes[:-1]) & (dst[1:] == dst[:-1] + sizes[:-1])
    touching &= ~torch.isin(src[1:], src_breaks) & ~torch.isin(dst[1:], dst_breaks)
    starts = torch.cat([torch.ones(1, dtype=torch.bool), ~touching])
    run_of_copy = torch.cumsum(starts.to(_INT64), 0) - 1
    merged_sizes = torch.zeros(int(run_of_copy[-1]) + 1, dtype=_INT64).index_add_(0, run_of_copy, sizes)
    return ByteCopies(src[starts], dst[starts], merged_sizes)


_NO_BREAKS = torch.empty(0, dtype=_INT64)


def plan_transfer(
    src_block_ids: object,
    dst_block_ids: object,
    *,
    group_sizes: Sequence[int],
    block_indices: Sequence[int],
    src_blocks_per_chunk: int,
    dst_blocks_per_chunk: int,
    layers: Sequence[Sequence[LayerCopy]],
    src_rows: Sequence[SideRows],
    dst_rows: Sequence[SideRows],
    src_breaks: Sequence[torch.Tensor] = (),
    dst_breaks: Sequence[torch.Tensor] = (),
) -> TransferPlan:
    """Plan the byte copies of one transfer.

    Args:
        src_block_ids, dst_block_ids: each side's block ids, group 0's first (at each side's
            granularity: GPU blocks, or CPU chunks).
        group_sizes: per KV-cache group, the GPU blocks it transfers.
        block_indices: per group, the request-relative index (in GPU blocks) of its first one.
        src_blocks_per_chunk, dst_blocks_per_chunk: GPU blocks per row on each side.
        layers: per group, its layers' copies (`layer_copies`).
        src_rows, dst_rows: per tensor, its rows on each side.
        src_breaks, dst_breaks: per tensor, offsets no merged copy may run across (default none).

    Returns:
        Per tensor its merged copies, and the bytes moved (a non-writer's skipped pages
        excluded).

    Raises:
        ValueError: the arguments disagree: lengths per group, block ids out of range, or block
            ids not consumed exactly by the groups.
    """
    if not len(group_sizes) == len(block_indices) == len(layers):
        raise ValueError(
            f"group_sizes ({len(group_sizes)} entries) and block_indices ({len(block_indices)}) "
            f"need one entry per KV-cache group ({len(layers)} groups)"
        )
    if any(size < 0 for size in group_sizes) or any(index < 0 for index in block_indices):
        raise ValueError(
            f"group_sizes {list(group_sizes)} and block_indices {list(block_indices)} must be non-negative"
        )
    src_ids, dst_ids = as_block_ids(src_block_ids), as_block_ids(dst_block_ids)
    for name, ids, rows in (("src", src_ids, src_rows), ("dst", dst_ids, dst_rows)):
        num_rows = min((r.num_rows for r in rows), default=0)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= num_rows):
            raise ValueError(f"{name} spec has block ids {int_list(ids)} outside [0, {num_rows})")
    per_tensor: list[list[ByteCopies]] = [[] for _ in src_rows]
    num_bytes = 0
    for part in split_groups(
        src_ids, dst_ids, group_sizes, block_indices, src_blocks_per_chunk, dst_blocks_per_chunk
    ):
        for layer in layers[part.group]:
            t = layer.tensor_idx
            src_bases = sub_block_offsets(
                part.src_ids, src_blocks_per_chunk, part.size, part.src_skip, src_rows[t]
            )
            dst_bases = sub_block_offsets(
                part.dst_ids, dst_blocks_per_chunk, part.size, part.dst_skip, dst_rows[t]
            )
            if layer.writers is not None:
                # A store writes the CPU side: its page ids are the same on every rank.
                pages = canonical_page_ids(part.dst_ids, dst_blocks_per_chunk, part.size, part.dst_skip)
                written = writer_mask(pages, layer.writers)
                src_bases, dst_bases = src_bases[written], dst_bases[written]
            per_tensor[t].append(expand_fragments(src_bases, dst_bases, layer.plan))
            num_bytes += len(src_bases) * layer.plan.total_bytes
    merged = tuple(
        merge_adjacent(
            _concatenate(copies),
            src_breaks[t] if src_breaks else _NO_BREAKS,
            dst_breaks[t] if dst_breaks else _NO_BREAKS,
        )
        for t, copies in enumerate(per_tensor)
    )
    return TransferPlan(merged, num_bytes)


def _concatenate(copies: list[ByteCopies]) -> ByteCopies:
    if not copies:
        return ByteCopies(_NO_BREAKS, _NO_BREAKS, _NO_BREAKS)
    return ByteCopies(*(torch.cat(column) for column in zip(*copies, strict=True)))
