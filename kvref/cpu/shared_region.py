"""`SharedOffloadRegion`: the CPU tier's memory, one mmap'd file shared by every process.

The scheduler process and every worker rank map the same file, so a block written by the
workers (GPU -> CPU) can be read by the scheduler-side secondary tiers (CPU -> disk, ...) without
a copy, and vice versa.

Layout: one row per CPU chunk (vLLM's name for a CPU block), `row_stride` bytes each. Two ways to
carve the rows into per-tensor views (vLLM 0.33's two layouts):

* The worker layout (`create_next_worker_view`): a row holds `world_size` slots of
  `rank_slot_bytes` (vLLM: `cpu_page_size`), one per worker rank; a rank's slot holds the pages
  of all its KV tensors back to back. Rank r's page of tensor t in chunk c lives at
  `c * row_stride + r * rank_slot_bytes + (offset of tensor t within the slot)`.
* The canonical layout (`create_next_canonical_view`): every rank gets the same views, carved
  from the start of each row, one canonical page per tensor; each rank writes only its own bytes
  of them (its `CanonicalPageMapping` says which), so a chunk stored under one parallel layout
  can be loaded under another.

Create or join: the first process to open the file creates it (`O_CREAT | O_EXCL`), checks that
the directory has room, and sizes it; the others wait (bounded by `join_timeout_s`) until the file
reaches the expected size, and fail with a clear error on a timeout or on a file of another
size. Pages are pre-faulted at start-up (`MADV_POPULATE_WRITE`, or touching one byte per page on
kernels without it) so the first transfers do not pay for page faults.

A file left behind by a crashed run with the same name and size is joined, not recreated: give
each engine instance its own `instance_id`.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from typing_extensions import Self, override

from kvref.errors import KVRefError

if TYPE_CHECKING:
    import torch

__all__ = ["SharedOffloadRegion", "SharedRegionError", "DEFAULT_REGION_DIR"]

logger = logging.getLogger(__name__)

DEFAULT_REGION_DIR = "/dev/shm"

# Python 3.11's mmap module does not export MADV_POPULATE_WRITE (Linux 5.14+, value 23).
_MADV_POPULATE_WRITE: int | None = getattr(
    mmap, "MADV_POPULATE_WRITE", 23 if sys.platform.startswith("linux") else None
)
_INSTANCE_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")
_JOIN_POLL_S = 0.005


class SharedRegionError(KVRefError):
    """The shared region could not be created or joined (no room, wrong size, timeout)."""


class SharedOffloadRegion:
    """One mmap'd file holding every CPU chunk, shared by the scheduler and the worker ranks.

    vLLM 0.33's region names the same sizes `num_chunks` (`num_blocks`), `cpu_page_size`
    (`rank_slot_bytes`), `kv_bytes_per_chunk` (`row_stride`) and `total_size_bytes`; they are
    readable here under those names too, and `pin_mmap_region` (`kvref.cpu.gpu_worker`) pins
    either region through them.

    Args:
        instance_id: names the file `kvref_offload_<instance_id>.mmap`; letters, digits, `_`,
            `.` and `-` only. Every process of one engine instance passes the same id.
        num_blocks: number of CPU blocks (rows).
        rank_slot_bytes: bytes per block per rank (all of one rank's KV pages of one block).
        world_size: number of worker ranks sharing each row.
        rank: this process's worker rank, or None for the scheduler side (which sees whole rows).
        directory: where the file lives; `/dev/shm` keeps it in memory.
        join_timeout_s: how long a joiner waits for the creator to size the file.
        prefault: pre-fault the pages this process uses (the whole file for rank None).

    Raises:
        ValueError: an argument is out of range.
        SharedRegionError: the directory lacks space, the existing file has another size, or it
            did not reach its size within `join_timeout_s`.
    """

    def __init__(
        self,
        instance_id: str,
        num_blocks: int,
        rank_slot_bytes: int,
        *,
        world_size: int = 1,
        rank: int | None = None,
        directory: str | os.PathLike[str] = DEFAULT_REGION_DIR,
        join_timeout_s: float = 30.0,
        prefault: bool = True,
    ) -> None:
        if not _INSTANCE_ID_PATTERN.fullmatch(instance_id):
            raise ValueError(
                f"instance_id must be non-empty and use only letters, digits, '_', '.' and '-', "
                f"got {instance_id!r}"
            )
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if rank_slot_bytes < 1:
            raise ValueError(f"rank_slot_bytes must be >= 1, got {rank_slot_bytes}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if rank is not None and not 0 <= rank < world_size:
            raise ValueError(f"rank must be None or in [0, {world_size}), got {rank}")
        if join_timeout_s < 0:
            raise ValueError(f"join_timeout_s must be >= 0, got {join_timeout_s}")

        self.num_blocks = num_blocks
        self.rank_slot_bytes = rank_slot_bytes
        self.world_size = world_size
        self.rank = rank
        self.row_stride = world_size * rank_slot_bytes
        self.total_bytes = num_blocks * self.row_stride
        self.path = Path(directory) / f"kvref_offload_{instance_id}.mmap"

        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._created = False
        self._kv_view: memoryview | None = None
        self._base: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        self._worker_cursor = 0
        self._canonical_cursor = 0
        self._closed = False
        self.is_pinned = False
        """Whether `pin_mmap_region` page-locked (some of) the region; `cleanup` unpins it."""
        self.pinned_addresses: list[int] = []
        """The start of each registered range, for `cleanup` to unregister."""

        try:
            self._open(join_timeout_s)
            assert self._fd is not None
            self._map = mmap.mmap(self._fd, self.total_bytes, flags=mmap.MAP_SHARED)
            if prefault:
                self._prefault()
        except BaseException:
            self.cleanup()
            raise

    # --- construction ---

    def _open(self, join_timeout_s: float) -> None:
        directory = self.path.parent
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            self._join(join_timeout_s)
            return
        except OSError as exc:
            raise SharedRegionError(
                f"cannot create the shared region {str(self.path)!r} in directory "
                f"{str(directory)!r}: {exc.strerror or exc}"
            ) from exc
        self._created = True
        stats = os.statvfs(directory)
        available = stats.f_bavail * stats.f_frsize
        if available < self.total_bytes:
            raise SharedRegionError(
                f"directory {str(directory)!r} has {available} bytes free but the shared region "
                f"needs {self.total_bytes} bytes ({self.num_blocks} blocks x {self.row_stride} "
                f"bytes); free some space, pick another directory, or use fewer CPU blocks"
            )
        try:
            os.ftruncate(self._fd, self.total_bytes)
        except OSError as exc:
            raise SharedRegionError(
                f"cannot size the shared region {str(self.path)!r} to {self.total_bytes} bytes: "
                f"{exc.strerror or exc}"
            ) from exc

    def _join(self, join_timeout_s: float) -> None:
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise SharedRegionError(
                f"cannot join the shared region {str(self.path)!r}: {exc.strerror or exc}"
            ) from exc
        deadline = time.monotonic() + join_timeout_s
        while True:
            size = os.fstat(self._fd).st_size
            if size == self.total_bytes:
                return
            # The creator sizes the file in one ftruncate: any size but 0 is another layout.
            if size != 0:
                raise SharedRegionError(
                    f"shared region {str(self.path)!r} is {size} bytes but this process expects "
                    f"{self.total_bytes} ({self.num_blocks} blocks x {self.row_stride} bytes): "
                    f"another engine uses this instance_id with another configuration, or a "
                    f"stale file was left behind; remove it or use another instance_id"
                )
            if time.monotonic() >= deadline:
                raise SharedRegionError(
                    f"shared region {str(self.path)!r} did not reach its size of "
                    f"{self.total_bytes} bytes within {join_timeout_s} s; its creator may have "
                    f"died (remove the file) or is still starting (raise join_timeout_s)"
                )
            time.sleep(_JOIN_POLL_S)

    def _prefault(self) -> None:
        assert self._map is not None
        if self.rank is None:
            ranges = [(0, self.total_bytes)]
        else:
            start = self.rank * self.rank_slot_bytes
            ranges = [
                (block * self.row_stride + start, self.rank_slot_bytes)
                for block in range(self.num_blocks)
            ]
            ranges = _merge_page_ranges(ranges)
        if _MADV_POPULATE_WRITE is not None:
            try:
                for start, length in ranges:
                    self._map.madvise(_MADV_POPULATE_WRITE, start, length)
                return
            except OSError as exc:
                # EINVAL: kernel older than 5.14. Anything else: fall back too, it is only a hint.
                if exc.errno != errno.EINVAL:
                    logger.debug("MADV_POPULATE_WRITE failed (%s); touching pages instead", exc)
        self._touch_pages(ranges)

    def _touch_pages(self, ranges: list[tuple[int, int]]) -> None:
        # Read-modify-write of one byte per page: faults the page in for writing without
        # changing what another process may already have written there.
        assert self._map is not None
        page = mmap.PAGESIZE
        view = self._map
        for start, length in ranges:
            first = start - start % page
            for offset in range(first, start + length, page):
                view[offset] = view[offset]

    # --- vLLM's names ---

    BLOCK_SIZE_ALIGNMENT: int = mmap.PAGESIZE
    """What vLLM rounds a row up to, so rows start on pages (kvref does not require it)."""

    @property
    def num_chunks(self) -> int:
        """The rows (vLLM's name for `num_blocks`)."""
        return self.num_blocks

    @property
    def cpu_page_size(self) -> int:
        """One rank's slot of a row (vLLM's name for `rank_slot_bytes`)."""
        return self.rank_slot_bytes

    @property
    def total_size_bytes(self) -> int:
        """The file's size (vLLM's name for `total_bytes`)."""
        return self.total_bytes

    @property
    def page_size(self) -> int:
        """The OS page size the region is mapped and pinned in."""
        return mmap.PAGESIZE

    def iter_worker_slot_ranges(self) -> Iterator[tuple[int, int]]:
        """Yield this rank's slot of each row as a page-aligned `(offset, length)` range.

        Raises:
            ValueError: this is the scheduler side (rank None).
        """
        if self.rank is None:
            raise ValueError("iter_worker_slot_ranges needs a worker rank; this region has rank=None")
        page = mmap.PAGESIZE
        for row in range(self.num_blocks):
            start = row * self.row_stride + self.rank * self.rank_slot_bytes
            aligned = start - start % page
            end = -(-(start + self.rank_slot_bytes) // page) * page  # round up to a page
            yield aligned, end - aligned

    # --- views ---

    @property
    def created(self) -> bool:
        """True if this process created the file (and will unlink it in `cleanup`)."""
        return self._created

    @property
    def closed(self) -> bool:
        """True once `cleanup` ran."""
        return self._closed

    def create_kv_memoryview(self) -> memoryview:
        """Return the zero-copy 2-D view `(num_blocks, row_stride)` of unsigned bytes.

        Secondary tiers address block b as row b (`view.cast("B")[b * row_stride:...]`). The same
        view is returned on every call; `cleanup` releases it.

        Raises:
            SharedRegionError: the region was cleaned up.
        """
        mapping = self._require_open()
        if self._kv_view is None:
            self._kv_view = memoryview(mapping).cast("B", (self.num_blocks, self.row_stride))
        return self._kv_view

    @property
    def base_tensor(self) -> torch.Tensor:
        """The whole file as one flat int8 tensor (torch is imported here only).

        The tensor holds a buffer export on the mapping, so the map cannot be closed under it.

        Raises:
            SharedRegionError: the region was cleaned up.
        """
        import torch

        mapping = self._require_open()
        if self._base is None:
            self._base = torch.frombuffer(memoryview(mapping), dtype=torch.int8)
        return self._base

    def create_next_worker_view(self, tensor_page_size: int) -> torch.Tensor:
        """Hand out the next `tensor_page_size` bytes of this rank's slot as an int8 view.

        The view has shape `(num_blocks, tensor_page_size)` and stride `(row_stride, 1)`: row c is
        this rank's page of one KV tensor in chunk c. Call it once per tensor, in order.

        Raises:
            ValueError: this is the scheduler side (rank None), or the slot is full.
            SharedRegionError: the region was cleaned up.
        """
        if self.rank is None:
            raise ValueError("create_next_worker_view needs a worker rank; this region has rank=None")
        left = self.rank_slot_bytes - self._worker_cursor
        if not 0 < tensor_page_size <= left:
            raise ValueError(
                f"tensor_page_size={tensor_page_size} does not fit in rank {self.rank}'s slot: "
                f"{left} of {self.rank_slot_bytes} bytes left"
            )
        offset = self.rank * self.rank_slot_bytes + self._worker_cursor
        self._worker_cursor += tensor_page_size
        return self._row_view(offset, tensor_page_size)

    def create_next_canonical_view(self, tensor_page_size: int) -> torch.Tensor:
        """Hand out the next `tensor_page_size` bytes of every row, the same on every rank.

        For the canonical layout: the views are carved consecutively from the start of each
        row, and every rank writes only its disjoint bytes of them. Call it once per tensor,
        in order, instead of `create_next_worker_view`.

        Raises:
            ValueError: the row is full.
            SharedRegionError: the region was cleaned up.
        """
        left = self.row_stride - self._canonical_cursor
        if not 0 < tensor_page_size <= left:
            raise ValueError(
                f"tensor_page_size={tensor_page_size} does not fit in the row: {left} of "
                f"{self.row_stride} bytes left"
            )
        offset = self._canonical_cursor
        self._canonical_cursor += tensor_page_size
        return self._row_view(offset, tensor_page_size)

    def _row_view(self, offset: int, width: int) -> torch.Tensor:
        view = self.base_tensor.as_strided((self.num_blocks, width), (self.row_stride, 1), offset)
        self._views.append(view)
        return view

    def _require_open(self) -> mmap.mmap:
        if self._closed or self._map is None:
            raise SharedRegionError(f"shared region {str(self.path)!r} was cleaned up")
        return self._map

    # --- lifecycle ---

    def cleanup(self) -> None:
        """Unpin, release views, unmap, close the file, and unlink it if this process created it.

        Safe to call twice. If some view handed out earlier is still referenced elsewhere, the
        mapping stays valid until that view is garbage collected (it is never unmapped under a
        live view); the file is closed and unlinked regardless.
        """
        if self._closed:
            return
        self._closed = True
        if self.is_pinned:
            # Only when pinned, which only a torch worker does: the scheduler never imports torch.
            from kvref.cpu.host_register import host_unregister

            for address in reversed(self.pinned_addresses):
                host_unregister(address)
            self.pinned_addresses.clear()
            self.is_pinned = False
        self._views.clear()
        self._base = None
        if self._kv_view is not None:
            self._kv_view.release()
            self._kv_view = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                logger.warning(
                    "shared region %s: views are still referenced; it is unmapped when they are "
                    "garbage collected",
                    self.path,
                )
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._created:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.cleanup()

    @override
    def __repr__(self) -> str:
        return (
            f"SharedOffloadRegion({str(self.path)!r}, num_blocks={self.num_blocks}, "
            f"row_stride={self.row_stride}, rank={self.rank}, created={self._created})"
        )


def _merge_page_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Page-align (start, length) ranges and merge the ones that touch (madvise needs alignment)."""
    page = mmap.PAGESIZE
    merged: list[tuple[int, int]] = []
    for start, length in ranges:
        aligned_start = start - start % page
        end = start + length
        if merged and aligned_start <= merged[-1][0] + merged[-1][1]:
            last_start, last_length = merged[-1]
            merged[-1] = (last_start, max(last_start + last_length, end) - last_start)
        else:
            merged.append((aligned_start, end - aligned_start))
    return merged
