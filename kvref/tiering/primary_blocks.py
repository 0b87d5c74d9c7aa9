"""`PrimaryBlocks`: the rows of the primary tier's memory, as a secondary tier copies them.

A secondary tier is given the primary's memory as a zero-copy, C-contiguous memoryview whose
first dimension is the chunk, of any format (bytes, or a float16/uint16 view exported by torch
or numpy); `PrimaryBlocks` hands out one row of `strides[0]` bytes per chunk id.
"""

from __future__ import annotations

import pickle
from typing import Any

from typing_extensions import override

__all__ = ["PrimaryBlocks"]


class PrimaryBlocks:
    """Rows of the primary tier's memory, as seen by a secondary tier.

    Args:
        primary_kv_view: a C-contiguous memoryview of at least two dimensions whose first one
            is the block (vLLM's `SharedOffloadRegion.create_kv_memoryview()` is
            `(num_blocks, row_bytes)` bytes; a float16 view of the same memory, or one shaped
            `(num_blocks, layers, items)`, serves as well). A row is `strides[0]` bytes.

    Raises:
        ValueError: the view has fewer than two dimensions or is not C-contiguous.
    """

    def __init__(self, primary_kv_view: memoryview[Any]) -> None:
        if primary_kv_view.ndim < 2 or not primary_kv_view.c_contiguous:
            raise ValueError(
                "primary_kv_view must be a C-contiguous memoryview (num_blocks, row_items, ...),"
                f" got ndim={primary_kv_view.ndim}, c_contiguous={primary_kv_view.c_contiguous}"
            )
        shape, strides = primary_kv_view.shape, primary_kv_view.strides
        assert shape is not None and strides is not None
        self.num_blocks: int = shape[0]
        self.block_bytes: int = strides[0]
        self._flat: memoryview = _flat_bytes(primary_kv_view)

    def row(self, block_id: int) -> memoryview:
        """Return the bytes of primary block `block_id` (zero-copy, writable when the view is).

        Raises:
            IndexError: `block_id` is out of range.
        """
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block id {block_id} not in [0, {self.num_blocks})")
        start = block_id * self.block_bytes
        return self._flat[start : start + self.block_bytes]

    def release(self) -> None:
        """Release this object's hold on the primary's memory (rows handed out stay valid)."""
        self._flat.release()

    @override
    def __repr__(self) -> str:
        return f"PrimaryBlocks(num_blocks={self.num_blocks}, block_bytes={self.block_bytes})"


def _flat_bytes(view: memoryview[Any]) -> memoryview:
    """A flat, zero-copy byte view of a C-contiguous view of any format."""
    try:
        # Shares the view's buffer without exporting it, so the owner can release it later.
        return view.cast("B")
    except (TypeError, ValueError):
        # cast refuses formats it does not know (numpy's float16 "e" on Python 3.11);
        # PickleBuffer.raw() takes any contiguous buffer, holding an export until released.
        return pickle.PickleBuffer(view).raw()
