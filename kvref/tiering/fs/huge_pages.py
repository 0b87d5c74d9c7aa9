"""Staging buffers on transparent huge pages, for O_DIRECT transfers of the fs tier.

Why: an O_DIRECT request goes to the device as a list of the physical pages of its user buffer.
On 4 KiB pages a 1 MiB request is 256 of them: the kernel pins each one, and a device that takes
fewer segments per request (virtio-blk: 254) gets the request split. On a 2 MiB huge page the
same request is one segment. On this project's virtio disk a plain reader (8 threads, 1 MiB
requests, O_DIRECT) read 2.0-2.3 GB/s into 4 KiB pages and 4.4 GB/s into huge pages. A primary
is rarely on huge pages (kvref's region in `/dev/shm` is not, unless that tmpfs is mounted with
`huge=`; CUDA's pinned host memory usually is not), so the
tier reads each block file into a per-thread buffer on huge pages, verifies it there, and copies
the payload into its row: one memory copy, a few GB/s of CPU work, for twice the device's speed
(`BENCHMARKS.md`). Where the kernel grants no transparent huge pages the copy would buy nothing,
so the tier moves rows to and from the device as they are.
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

__all__ = ["HUGE_PAGE_BYTES", "StagingBuffer", "transparent_huge_pages"]

_THP = Path("/sys/kernel/mm/transparent_hugepage")
# Python 3.11's mmap module does not export MADV_POPULATE_WRITE (Linux 5.14+, value 23).
_MADV_POPULATE_WRITE: int = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def _huge_page_bytes() -> int:
    try:
        return int((_THP / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 2 << 20


HUGE_PAGE_BYTES = _huge_page_bytes()
"""The size of a transparent huge page (2 MiB on x86-64)."""


def transparent_huge_pages() -> bool:
    """Whether this kernel gives a private anonymous mapping huge pages when asked
    (`MADV_HUGEPAGE`): transparent huge pages set to `always` or `madvise`."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        setting = (_THP / "enabled").read_text()
    except OSError:
        return False
    return "[always]" in setting or "[madvise]" in setting


class StagingBuffer:
    """A writable, page-aligned buffer of `size` bytes whose byte `lead` starts a huge page;
    the huge pages from there cover `payload` bytes and are faulted in now.

    Args:
        size: the buffer's bytes.
        lead: bytes before the payload (a block file's header), a multiple of 4 KiB.
        payload: bytes that should lie on huge pages, from `lead` on.

    Raises:
        ValueError: `lead + payload` exceeds `size`, or `lead` is not a multiple of 4 KiB.
    """

    def __init__(self, size: int, lead: int, payload: int) -> None:
        if lead % mmap.PAGESIZE or lead + payload > size:
            raise ValueError(f"lead {lead} and payload {payload} do not fit a buffer of {size} bytes")
        huge_span = -(-payload // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
        # One huge page of slack to align in, and room for the huge pages the payload touches.
        length = HUGE_PAGE_BYTES + lead + max(size - lead, huge_span)
        self._map = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        anchor = ctypes.c_char.from_buffer(self._map)
        address = ctypes.addressof(anchor)
        del anchor  # releases the export, so that close() can unmap
        start = -(address + lead) % HUGE_PAGE_BYTES  # the buffer's offset in the mapping
        if huge_span:
            self._map.madvise(mmap.MADV_HUGEPAGE, start + lead, huge_span)
        self.view = memoryview(self._map)[start : start + size]
        # Fault every page in now, not on the first transfer.
        try:
            self._map.madvise(_MADV_POPULATE_WRITE, start, size)
        except (OSError, ValueError):  # before Linux 5.14, or not Linux
            self.view[:] = bytes(size)

    def close(self) -> None:
        self.view.release()
        self._map.close()
