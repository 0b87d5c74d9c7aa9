"""Byte views of the KV caches and of the CPU rows, as the GPU<->CPU handlers copy them.

Every KV-cache tensor is seen as int8 `(num_blocks, page_bytes)` rows (`as_block_rows`); the CPU
side is one view per tensor, of rows the handlers allocate or that the caller provides
(`cpu_views`, `CPUViewSource`); `validate_tensors` checks that the two sides line up. A copy's
offsets index a 1-D byte view spanning each tensor's rows (`byte_span`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

with warnings.catch_warnings():
    # CPU wheels of torch warn on import when numpy is absent; kvref never uses numpy.
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

__all__ = ["CPUViewSource", "as_block_rows", "byte_span", "cpu_views", "span_end", "validate_tensors"]


@runtime_checkable
class CPUViewSource(Protocol):
    """Anything that hands out CPU rows for KV tensors, one view per tensor, in order.

    kvref's `SharedOffloadRegion` satisfies it: each call returns the next per-tensor int8
    view `(num_blocks, page_bytes)` of its rows (stride `(row_bytes, 1)`).
    """

    def create_worker_view(self, page_bytes: int) -> torch.Tensor:
        """Return the int8 CPU view `(num_blocks, page_bytes)` for the next tensor."""
        ...


def validate_tensors(
    gpu_tensors: Sequence[torch.Tensor], cpu_tensors: Sequence[torch.Tensor], block_size_factor: int
) -> None:
    if not gpu_tensors or len(gpu_tensors) != len(cpu_tensors):
        raise ValueError(
            f"gpu_tensors ({len(gpu_tensors)}) and cpu_tensors ({len(cpu_tensors)}) must be "
            "non-empty and co-indexed"
        )
    if block_size_factor < 1:
        raise ValueError(f"block_size_factor must be a positive integer, got {block_size_factor}")
    device = gpu_tensors[0].device
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"gpu_tensors must be on a CUDA device (or the CPU fallback), not {device}")
    num_gpu_blocks, num_cpu_blocks = gpu_tensors[0].shape[0], cpu_tensors[0].shape[0]
    for i, (gpu, cpu) in enumerate(zip(gpu_tensors, cpu_tensors, strict=True)):
        for name, tensor in (("gpu_tensors", gpu), ("cpu_tensors", cpu)):
            if tensor.dtype != torch.int8 or tensor.dim() != 2:
                raise ValueError(
                    f"{name}[{i}] must be a 2-D int8 tensor (num_blocks, page_bytes), got "
                    f"{tensor.dtype} of shape {tuple(tensor.shape)}"
                )
            if tensor.stride(1) != 1 or tensor.stride(0) < tensor.shape[1]:
                raise ValueError(
                    f"{name}[{i}] rows must be contiguous and not overlap: strides "
                    f"{tensor.stride()} for shape {tuple(tensor.shape)}"
                )
        if gpu.device != device:
            raise ValueError(f"gpu_tensors[{i}] is on {gpu.device}, gpu_tensors[0] on {device}")
        if cpu.device.type != "cpu":
            raise ValueError(f"cpu_tensors[{i}] must be on the CPU, not {cpu.device}")
        if gpu.shape[0] != num_gpu_blocks or cpu.shape[0] != num_cpu_blocks:
            raise ValueError(
                f"tensor {i} has {gpu.shape[0]} GPU and {cpu.shape[0]} CPU blocks; every tensor "
                f"must have {num_gpu_blocks} and {num_cpu_blocks} (those of tensor 0)"
            )
        if cpu.shape[1] != gpu.shape[1] * block_size_factor:
            raise ValueError(
                f"cpu_tensors[{i}] pages are {cpu.shape[1]} bytes; with block_size_factor="
                f"{block_size_factor} and {gpu.shape[1]}-byte GPU pages they must be "
                f"{gpu.shape[1] * block_size_factor}"
            )


def as_block_rows(tensor: torch.Tensor, index: int) -> torch.Tensor:
    """View a KV-cache tensor as int8 `(num_blocks, page_bytes)` without copying."""
    if tensor.dim() < 1 or tensor.shape[0] < 1:
        raise ValueError(f"kv_caches[{index}] needs a leading num_blocks dimension >= 1")
    try:
        flat = tensor.view(tensor.shape[0], -1) if tensor.dim() > 1 else tensor.view(-1, 1)
        return flat.view(torch.int8)
    except RuntimeError as exc:
        raise ValueError(
            f"kv_caches[{index}] (shape {tuple(tensor.shape)}, strides {tensor.stride()}) cannot "
            f"be viewed as (num_blocks, page_bytes) bytes: each block must be contiguous ({exc})"
        ) from exc


def cpu_views(
    cpu_rows: torch.Tensor | CPUViewSource | None,
    cpu_page_bytes: list[int],
    num_cpu_blocks: int | None,
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Per-tensor CPU views, and the buffer the handlers own (None when the caller owns it)."""
    if cpu_rows is None:
        if num_cpu_blocks is None or num_cpu_blocks < 1:
            raise ValueError(
                f"num_cpu_blocks must be a positive integer when cpu_rows is None, got "
                f"{num_cpu_blocks}"
            )
        # One exact-size allocation (no power-of-two rounding), each tensor's rows dense so
        # consecutive CPU blocks merge into single copies.
        buffer = torch.zeros(num_cpu_blocks * sum(cpu_page_bytes), dtype=torch.int8)
        views: list[torch.Tensor] = []
        offset = 0
        for page in cpu_page_bytes:
            size = num_cpu_blocks * page
            views.append(buffer[offset : offset + size].view(num_cpu_blocks, page))
            offset += size
        return views, buffer
    if isinstance(cpu_rows, torch.Tensor):
        if cpu_rows.dtype != torch.int8 or cpu_rows.dim() != 2 or cpu_rows.device.type != "cpu":
            raise ValueError(
                "cpu_rows must be a 2-D int8 CPU tensor (num_cpu_blocks, row_bytes), got "
                f"{cpu_rows.dtype} of shape {tuple(cpu_rows.shape)} on {cpu_rows.device}"
            )
        if cpu_rows.shape[1] < sum(cpu_page_bytes):
            raise ValueError(
                f"cpu_rows rows are {cpu_rows.shape[1]} bytes; the KV caches need "
                f"{sum(cpu_page_bytes)} per CPU block ({cpu_page_bytes})"
            )
        views = []
        offset = 0
        for page in cpu_page_bytes:
            views.append(cpu_rows[:, offset : offset + page])
            offset += page
        _check_num_blocks(views, num_cpu_blocks)
        return views, None
    views = [cpu_rows.create_worker_view(page) for page in cpu_page_bytes]
    _check_num_blocks(views, num_cpu_blocks)
    return views, None


def _check_num_blocks(views: list[torch.Tensor], num_cpu_blocks: int | None) -> None:
    if num_cpu_blocks is not None and views[0].shape[0] != num_cpu_blocks:
        raise ValueError(
            f"num_cpu_blocks={num_cpu_blocks} but cpu_rows has {views[0].shape[0]} blocks"
        )


def byte_span(rows: torch.Tensor) -> torch.Tensor:
    """A 1-D int8 view from the first byte of row 0 to the last byte of the last row."""
    return rows.as_strided((span_end(rows) - rows.data_ptr(),), (1,))


def span_end(rows: torch.Tensor) -> int:
    num_blocks, width = rows.shape
    return rows.data_ptr() + (num_blocks - 1) * rows.stride(0) + width
