"""Byte views of the KV caches and of the CPU rows, as the CPU<->GPU handlers copy them.

Both sides of a transfer are int8 `(num_rows, page_size)` tensors whose rows may be strided
(`as_block_rows` views a KV-cache tensor so; `private_rows` allocates a worker's own CPU rows);
`check_tensors` checks that the two sides line up; a copy's offsets index a 1-D byte view
spanning a tensor's rows (`byte_span`), described for the planner by `side_rows`.
"""

from __future__ import annotations

import mmap
import warnings
from collections.abc import Sequence

with warnings.catch_warnings():
    # CPU wheels of torch warn on import when numpy is absent; kvref does not need numpy.
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

from kvref.base import CanonicalKVCacheRef
from kvref.cpu.transfer_plan import SideRows

__all__ = ["as_block_rows", "byte_span", "check_tensors", "private_rows", "side_rows"]


def as_block_rows(tensor: torch.Tensor, page_size_bytes: int, index: int) -> torch.Tensor:
    """View a KV-cache tensor as int8 `(num_blocks, page_size_bytes)` rows, without copying.

    Raises:
        ValueError: a block's bytes are not contiguous, or the page size does not divide them.
    """
    try:
        return tensor.view(torch.int8).view((-1, page_size_bytes))
    except RuntimeError as exc:
        raise ValueError(
            f"kv_caches.tensors[{index}] (shape {tuple(tensor.shape)}, strides {tensor.stride()}) "
            f"cannot be viewed as rows of {page_size_bytes} bytes: each block's page must be "
            f"contiguous ({exc})"
        ) from exc


def private_rows(num_rows: int, row_bytes: int) -> torch.Tensor:
    """Zeroed int8 CPU rows `(num_rows, row_bytes)` of a worker's own.

    An anonymous mapping: exact-size and page-aligned, so it pins in whole pages (torch's pinned
    allocator rounds every allocation up to a power of two).
    """
    buffer = mmap.mmap(-1, num_rows * row_bytes)
    return torch.frombuffer(buffer, dtype=torch.int8).view(num_rows, row_bytes)


def check_tensors(
    gpu_tensors: Sequence[torch.Tensor],
    cpu_tensors: Sequence[torch.Tensor],
    blocks_per_chunk: int,
    canonical_sizes: Sequence[int] | None,
    layer_refs_per_group: Sequence[Sequence[CanonicalKVCacheRef]],
) -> None:
    """Check that the GPU and CPU rows line up with each other and with the references.

    Raises:
        ValueError: dtype, shape, device, row size or a reference is not as it must be.
    """
    device = gpu_tensors[0].device
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"gpu_tensors must be on a CUDA device (or the CPU), not {device}")
    for t, (gpu, cpu) in enumerate(zip(gpu_tensors, cpu_tensors, strict=True)):
        for name, tensor in (("gpu_tensors", gpu), ("cpu_tensors", cpu)):
            if (
                tensor.dtype != torch.int8
                or tensor.dim() != 2
                or tensor.shape[0] < 1
                or tensor.stride(1) != 1
            ):
                raise ValueError(
                    f"{name}[{t}] must be int8 rows (num_rows >= 1, page_size) with contiguous pages, "
                    f"got {tensor.dtype} of shape {tuple(tensor.shape)}, strides {tensor.stride()}"
                )
        if gpu.device != device or cpu.device.type != "cpu":
            raise ValueError(
                f"tensor {t}: the GPU rows are on {gpu.device} (tensor 0's: {device}), the CPU "
                f"rows on {cpu.device}"
            )
        page = canonical_sizes[t] if canonical_sizes is not None else gpu.shape[1]
        if cpu.shape[1] != page * blocks_per_chunk:
            raise ValueError(
                f"cpu_tensors[{t}] rows are {cpu.shape[1]} bytes; with blocks_per_chunk="
                f"{blocks_per_chunk} they must be {page * blocks_per_chunk}"
            )
    for group, refs in enumerate(layer_refs_per_group):
        for ref in refs:
            if not 0 <= ref.tensor_idx < len(gpu_tensors):
                raise ValueError(
                    f"layer_refs_per_group[{group}] names tensor {ref.tensor_idx} of {len(gpu_tensors)}"
                )
            if not 0 < ref.page_size_bytes <= gpu_tensors[ref.tensor_idx].shape[1]:
                raise ValueError(
                    f"layer_refs_per_group[{group}]: a {ref.page_size_bytes}-byte page does not fit "
                    f"tensor {ref.tensor_idx}'s {gpu_tensors[ref.tensor_idx].shape[1]}-byte rows"
                )


def side_rows(rows: torch.Tensor, blocks_per_chunk: int) -> SideRows:
    """Describe int8 rows for the planner; a row holds `blocks_per_chunk` sub-blocks."""
    return SideRows(rows.stride(0), rows.shape[1] // blocks_per_chunk, rows.shape[0])


def byte_span(rows: torch.Tensor) -> torch.Tensor:
    """A 1-D int8 view from the first byte of row 0 to the last byte of the last row."""
    num_rows, width = rows.shape
    return rows.as_strided(((num_rows - 1) * rows.stride(0) + width,), (1,))
