"""Page-locked host memory for the GPU<->CPU handlers (`kvref.cpu.gpu_worker`).

torch's `pin_memory=True` allocations go through its caching host allocator, which rounds each
request up to a power of two (a 20 GiB pool costs 32 GiB). kvref instead page-locks memory that
is already allocated, at its exact size, with `cudaHostRegister` (through
`torch.cuda.cudart()`), in bounded, page-aligned chunks (`HostMemoryPin`). A DMA must stay
within one registration, so the handlers split their copies at the chunk boundaries
(`split_at_cuts`).
"""

from __future__ import annotations

import bisect
import mmap
import warnings
from collections.abc import Sequence
from typing import Protocol, cast

with warnings.catch_warnings():
    # CPU wheels of torch warn on import when numpy is absent; kvref never uses numpy.
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

from kvref.cpu.transfer_plan import ByteCopy

__all__ = ["DEFAULT_PIN_CHUNK_BYTES", "HostMemoryPin", "split_at_cuts"]

DEFAULT_PIN_CHUNK_BYTES = 1 << 30
"""Largest single `cudaHostRegister` call (one call fails at >= 512 GiB, vLLM #51080)."""

_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712
_PAGE_BYTES = mmap.PAGESIZE


class _CudaRuntime(Protocol):
    """The two calls kvref makes through `torch.cuda.cudart()` (they return a cudaError)."""

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int: ...

    def cudaHostUnregister(self, ptr: int) -> int: ...


class HostMemoryPin:
    """Page-locks existing host memory with `cudaHostRegister`, in bounded page-aligned chunks.

    Chunk boundaries sit on absolute multiples of the chunk size (itself a whole number of
    pages), so two registrations never share a page (the driver pins whole pages and refuses
    a second registration of one). A row may straddle a boundary: the handlers split copies
    there, so every DMA stays inside one registration.

    Registration creates a CUDA context on the current device, so call it with the KV caches'
    device current. `close()` unregisters what this object registered (only that: memory that
    someone else had already registered is left alone).

    Args:
        ptr: start address of the host range.
        nbytes: its length.
        chunk_bytes: the largest range registered by one call (rounded down to whole pages,
            at least one page).
    """

    def __init__(self, ptr: int, nbytes: int, chunk_bytes: int = DEFAULT_PIN_CHUNK_BYTES) -> None:
        if nbytes < 0 or chunk_bytes < 1:
            raise ValueError(f"nbytes ({nbytes}) must be >= 0 and chunk_bytes ({chunk_bytes}) >= 1")
        self.ptr = ptr
        self.nbytes = nbytes
        self._registered: list[int] = []
        self.pinned = False
        """True if the whole range is page-locked (by this object or already by its owner)."""
        self.error: str | None = None
        """Why pinning failed, when it did."""
        step = max(_PAGE_BYTES, chunk_bytes - chunk_bytes % _PAGE_BYTES)
        first = ptr - ptr % step + step
        self.boundaries: list[int] = list(range(first, ptr + nbytes, step))
        """Addresses where one registration ends and the next begins (no copy may cross)."""
        self._pin()

    def _pin(self) -> None:
        if self.nbytes == 0:
            self.pinned = True
            return
        cudart = cast(_CudaRuntime, torch.cuda.cudart())
        edges = [self.ptr, *self.boundaries, self.ptr + self.nbytes]
        for start, end in zip(edges, edges[1:]):
            size = end - start
            code = int(cudart.cudaHostRegister(start, size, 0))
            if code == 0:
                self._registered.append(start)
                continue
            if code == _CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED and start == self.ptr:
                # The owner (e.g. a shared offload region) pinned it already: nothing to undo.
                self.pinned = True
                self.boundaries = []
                return
            self.close()
            self.error = f"cudaHostRegister({start:#x}, {size}) failed with cudaError {code}"
            return
        self.pinned = True

    def close(self) -> None:
        """Unregister every chunk this object registered (idempotent)."""
        if self._registered:
            cudart = cast(_CudaRuntime, torch.cuda.cudart())
            for start in self._registered:
                cudart.cudaHostUnregister(start)
        self._registered.clear()
        self.pinned = False


def split_at_cuts(copies: Sequence[ByteCopy], cuts: list[int], cpu_is_src: bool) -> list[ByteCopy]:
    """Split copies whose host range crosses a pinned-registration boundary (offset in `cuts`)."""
    result: list[ByteCopy] = []
    for src_offset, dst_offset, nbytes in copies:
        host = src_offset if cpu_is_src else dst_offset
        i = bisect.bisect_right(cuts, host)
        while i < len(cuts) and cuts[i] < host + nbytes:
            head = cuts[i] - host
            result.append((src_offset, dst_offset, head))
            src_offset, dst_offset, host, nbytes = (
                src_offset + head,
                dst_offset + head,
                host + head,
                nbytes - head,
            )
            i += 1
        result.append((src_offset, dst_offset, nbytes))
    return result
