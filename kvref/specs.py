"""Load/store specs: what a worker needs to find blocks on one medium (part of `kvref.base`).

A manager's `prepare_load` and `prepare_store` answer with a spec of their medium; the worker
pairs it with the GPU side's `GPULoadStoreSpec` and routes the pair to the handler registered for
those two mediums (`kvref.worker`). `kvref.base` exports every name here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from array import array
from collections.abc import Iterable, Sequence

from typing_extensions import override

__all__ = ["BlockIDsLoadStoreSpec", "GPULoadStoreSpec", "LoadStoreSpec"]


class LoadStoreSpec(ABC):
    """Opaque metadata that lets a worker locate blocks on one medium."""

    @staticmethod
    @abstractmethod
    def medium() -> str:
        """Return the medium these blocks live on ("GPU", "CPU", ...)."""


class BlockIDsLoadStoreSpec(LoadStoreSpec, ABC):
    """Blocks addressed by integer ids on their medium (co-indexed with the keys they serve).

    `block_ids` is an `array('q')`: packed int64, compact and zero-copy into torch/numpy.
    """

    def __init__(self, block_ids: Iterable[int]) -> None:
        # array fills a sized array from a list, but grows one item at a time from an iterator.
        self._ids: array[int] | list[int] = array(
            "q", block_ids if isinstance(block_ids, list) else list(block_ids)
        )

    @property
    def block_ids(self) -> array[int]:
        """The block ids, packed (on first read, for a spec built from a list it owns)."""
        ids = self._ids
        if isinstance(ids, list):
            ids = self._ids = array("q", ids)
        return ids

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

    An offloaded block may span several GPU blocks (the block-size factor), so the first GPU
    block of a group can sit mid-way into an offloaded block; `block_indices[g]` says where.

    Args:
        block_ids: GPU block ids, group 0's first, then group 1's, ...
        group_sizes: how many of `block_ids` belong to each group.
        block_indices: per group, the request-relative index (in GPU blocks) of its first block.
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
        if any(index < 0 for index in block_indices):
            raise ValueError(f"block_indices {list(block_indices)} must be non-negative")
        self.group_sizes: tuple[int, ...] = tuple(group_sizes)
        self.block_indices: tuple[int, ...] = tuple(block_indices)

    @staticmethod
    @override
    def medium() -> str:
        return "GPU"

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
