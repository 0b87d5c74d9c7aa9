"""Page-locking host memory that already exists, for asynchronous GPU copies (vLLM 0.33:
`vllm/v1/kv_offload/cpu/host_register.py`).

The CPU rows the worker copies to and from are allocated outside torch's pinned allocator (a
shared mmap region, or an exact-size anonymous mapping: torch's pinned allocator rounds every
allocation up to a power of two), so they are registered after the fact with
`cudaHostRegister`, through `torch.cuda.cudart()`. Pinning is a bandwidth optimization only:
without CUDA, or when the driver refuses, every transfer still runs, as a pageable (slower,
synchronous) copy.
"""

from __future__ import annotations

import logging
import math
import warnings
import mmap
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, cast

with warnings.catch_warnings():
    # CPU wheels of torch warn on import when numpy is absent; kvref does not need numpy.
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

__all__ = [
    "MAX_HOST_REGISTER_CHUNK_BYTES",
    "MIN_HOST_REGISTER_SAVED_BYTES",
    "PinnableRegion",
    "host_register",
    "host_unregister",
    "pin_mmap_region",
    "pin_rows",
    "register_ranges",
    "row_aligned_chunks",
]

logger = logging.getLogger(__name__)

MAX_HOST_REGISTER_CHUNK_BYTES = 64 * 1024**3
"""The largest range one registration covers (the driver fails on very large ones)."""

MIN_HOST_REGISTER_SAVED_BYTES = 3 * 1024**2
"""Pin only a rank's slots when that skips at least this much per row (each call costs time)."""


class _CudaRuntime(Protocol):
    """The two calls kvref makes through `torch.cuda.cudart()` (each returns a cudaError)."""

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int: ...

    def cudaHostUnregister(self, ptr: int) -> int: ...


def _cudart() -> _CudaRuntime | None:
    if not torch.cuda.is_available():
        return None
    return cast(_CudaRuntime, torch.cuda.cudart())


def host_register(ptr: int, num_bytes: int) -> bool:
    """Page-lock `[ptr, ptr + num_bytes)` for device DMA.

    Returns:
        True if the range was registered (and later needs `host_unregister`); False without
        CUDA, for an empty range, or when the driver refuses (logged).
    """
    cudart = _cudart()
    if cudart is None or not ptr or num_bytes <= 0:
        return False
    code = int(cudart.cudaHostRegister(ptr, num_bytes, 0))
    if code != 0:
        logger.warning(
            "cudaHostRegister(%#x, %d) failed with cudaError %d: transfers still work, unpinned and slower",
            ptr,
            num_bytes,
            code,
        )
        return False
    return True


def host_unregister(ptr: int) -> None:
    """Release a range `host_register` registered (failures are logged, not raised)."""
    cudart = _cudart()
    if cudart is None or not ptr:
        return
    code = int(cudart.cudaHostUnregister(ptr))
    if code != 0:
        logger.warning("cudaHostUnregister(%#x) failed with cudaError %d", ptr, code)


def register_ranges(ranges: Iterable[tuple[int, int]]) -> list[int] | None:
    """Register every `(address, length)` range, or none of them.

    Returns:
        The registered addresses (for `host_unregister`), or None once one range failed and
        the ranges before it were unregistered again.
    """
    addresses: list[int] = []
    for address, length in ranges:
        if not host_register(address, length):
            for registered in reversed(addresses):
                host_unregister(registered)
            return None
        addresses.append(address)
    return addresses


def row_aligned_chunks(
    total_bytes: int, row_stride: int, page_size: int, max_chunk_bytes: int = MAX_HOST_REGISTER_CHUNK_BYTES
) -> Iterator[tuple[int, int]]:
    """Split `total_bytes` of rows into `(offset, length)` chunks of at most `max_chunk_bytes`
    (at least one row group) that end on row boundaries at page-aligned offsets.

    On row boundaries, no single block's copy straddles two registrations; page-aligned, no
    page belongs to two of them (the driver pins whole pages, once).
    """
    rows_per_page_group = page_size // math.gcd(row_stride, page_size)  # rows whose bytes fill whole pages
    group_bytes = rows_per_page_group * row_stride
    chunk = max(max_chunk_bytes // group_bytes, 1) * group_bytes
    for offset in range(0, total_bytes, chunk):
        yield offset, min(chunk, total_bytes - offset)


class PinnableRegion(Protocol):
    """What `pin_mmap_region` reads and records of a shared region: the members kvref's
    `SharedOffloadRegion` shares with vLLM's, so vLLM's own tests can pass theirs."""

    is_pinned: bool
    pinned_addresses: list[int]

    @property
    def rank(self) -> int | None: ...

    @property
    def num_chunks(self) -> int: ...

    @property
    def cpu_page_size(self) -> int: ...

    @property
    def total_size_bytes(self) -> int: ...

    @property
    def page_size(self) -> int: ...

    @property
    def base_tensor(self) -> torch.Tensor: ...

    def iter_worker_slot_ranges(self) -> Iterator[tuple[int, int]]: ...


def pin_mmap_region(region: PinnableRegion, worker_slot_only: bool = False) -> None:
    """Page-lock the region in row-aligned chunks, or only this rank's slots; all or nothing.

    On success the region records the registrations (`pinned_addresses`, `is_pinned`) and its
    `cleanup` releases them. On failure (logged) nothing stays registered and the region stays
    pageable: transfers still work, slower.

    Args:
        region: the shared region.
        worker_slot_only: pin only this rank's slot of each row (the worker layout), when that
            saves at least a page and `MIN_HOST_REGISTER_SAVED_BYTES` per row.
    """
    base = region.base_tensor.data_ptr()
    row_stride = region.total_size_bytes // region.num_chunks
    slot_savings = row_stride - region.cpu_page_size
    if (
        worker_slot_only
        and region.rank is not None
        and slot_savings >= max(region.page_size, MIN_HOST_REGISTER_SAVED_BYTES)
    ):
        ranges = ((base + offset, length) for offset, length in region.iter_worker_slot_ranges())
    else:
        chunks = row_aligned_chunks(region.total_size_bytes, row_stride, region.page_size)
        ranges = ((base + offset, length) for offset, length in chunks)
    addresses = register_ranges(ranges)
    if addresses is None:
        logger.warning("could not pin the shared offload region (rank %s); it stays pageable", region.rank)
        return
    region.pinned_addresses.extend(addresses)
    region.is_pinned = True


def pin_rows(rows: Sequence[torch.Tensor]) -> list[int] | None:
    """Page-lock CPU rows (int8 `(num_rows, row_bytes)`, each from a page-aligned allocation) in
    row-aligned chunks; all or nothing.

    Returns:
        The registered addresses, or None when pinning failed (logged; nothing stays pinned).
    """
    ranges = [
        (t.data_ptr() + offset, length)
        for t in rows
        for offset, length in row_aligned_chunks(t.numel(), t.stride(0), mmap.PAGESIZE)
    ]
    addresses = register_ranges(ranges)
    if addresses is None:
        logger.warning("could not pin the worker's CPU rows; transfers stay synchronous and slower")
    return addresses
