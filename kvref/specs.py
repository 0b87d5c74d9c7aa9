"""Load/store specs: what a worker needs to find blocks on one medium (part of `kvref.base`).

A manager's `prepare_load` and `prepare_store` answer with the spec of its medium; the worker
pairs it with the GPU side's `GPULoadStoreSpec` in `submit_store` / `submit_load`. Block ids are
kept packed as int64 (`array('q')`): compact, and zero-copy into torch or numpy.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from typing_extensions import override

__all__ = ["BlockIDsLoadStoreSpec", "GPULoadStoreSpec", "LoadStoreSpec"]


class LoadStoreSpec:
    """Metadata that lets a worker load, and optionally also store, blocks of KV data."""


class BlockIDsLoadStoreSpec(LoadStoreSpec):
    """Blocks addressed by integer ids on their medium, co-indexed with the keys they serve.

    What an id means is the subclass's: a GPU block for `GPULoadStoreSpec`, a CPU chunk (a
    slot of the CPU tier) for `kvref.cpu.common.CPULoadStoreSpec`.

    Args:
        block_ids: the ids, in the order of the keys they serve.
    """

    def __init__(self, block_ids: Iterable[int]) -> None:
        self.block_ids: array[int] = array("q", block_ids)

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.block_ids.tolist()})"

    @override
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockIDsLoadStoreSpec):
            return NotImplemented
        return type(self) is type(other) and self.block_ids == other.block_ids


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """GPU blocks of one request, ordered by KV-cache group.

    An offloaded chunk may span several GPU blocks, so the first GPU block of a group can sit
    mid-way into a chunk; `block_indices[g]` says where group `g` starts, so the worker can skip
    the part of the first chunk that precedes it.

    Args:
        block_ids: GPU block ids, group 0's first, then group 1's, ...
        group_sizes: how many of `block_ids` belong to each group.
        block_indices: per group, the request-relative index (in GPU blocks) of its first block.

    Raises:
        ValueError: the sizes do not add up to the ids, or the two sequences differ in length
            (vLLM asserts both).
    """

    def __init__(
        self, block_ids: Iterable[int], group_sizes: Sequence[int], block_indices: Sequence[int]
    ) -> None:
        super().__init__(block_ids)
        if len(block_indices) != len(group_sizes):
            raise ValueError(
                f"block_indices has {len(block_indices)} entries but group_sizes has "
                f"{len(group_sizes)}: both need one entry per KV-cache group"
            )
        if any(size < 0 for size in group_sizes) or sum(group_sizes) != len(self.block_ids):
            raise ValueError(
                f"group_sizes {list(group_sizes)} must be non-negative and sum to the "
                f"{len(self.block_ids)} block ids"
            )
        self.group_sizes: Sequence[int] = tuple(group_sizes)
        self.block_indices: Sequence[int] = tuple(block_indices)

    @override
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GPULoadStoreSpec):
            return NotImplemented
        return (
            self.block_ids == other.block_ids
            and self.group_sizes == other.group_sizes
            and self.block_indices == other.block_indices
        )

    @override
    def __repr__(self) -> str:
        return (
            f"GPULoadStoreSpec({self.block_ids.tolist()}, group_sizes={list(self.group_sizes)}, "
            f"block_indices={list(self.block_indices)})"
        )
