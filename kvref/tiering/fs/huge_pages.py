"""Staging buffers on transparent huge pages, for O_DIRECT transfers of the fs tier.

Why: an O_DIRECT request goes to the device as a list of the physical pages of its user buffer.
On 4 KiB pages a 1 MiB request is 256 segments, each pinned by the kernel and mapped by the
device; on a 2 MiB huge page it is one. The cost is per page, not per request: on this
project's virtio disk a plain reader (8 threads, O_DIRECT) read 2.0-2.7 GB/s into 4 KiB pages
whether its requests were 1 MiB, 1016 KiB (within virtio-blk's 254 segments) or 512 KiB, and
4.4-4.9 GB/s into huge pages. A primary
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
import threading
from pathlib import Path

__all__ = ["HUGE_PAGE_BYTES", "StagingBuffer", "ThreadBuffers", "transparent_huge_pages"]

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


class ThreadBuffers:
    """One page-aligned buffer of `size` bytes per thread that asks, for O_DIRECT transfers.

    Staged on huge pages, each buffer's byte `lead` starts a huge page (`StagingBuffer`), or,
    for buffers of up to half a huge page, buffers are slots side by side on shared huge pages:
    a slot spans at most two huge pages, so a request from it is at most two segments, and 64
    threads staging 256 KiB blocks (276 KiB slots) take 18 MiB rather than a huge page each
    (128 MiB). Otherwise each buffer is an anonymous mapping of its own on 4 KiB pages. Buffers
    live as long as this object.

    Args:
        size: each buffer's bytes.
        huge_pages: stage on huge pages (else 4 KiB pages).
        lead: bytes before the payload in a buffer of its own, a multiple of 4 KiB.
        payload: bytes from `lead` on that should lie on huge pages.
    """

    def __init__(self, size: int, *, huge_pages: bool, lead: int, payload: int) -> None:
        self.size = size
        self.huge_pages = huge_pages
        self._lead = lead
        self._payload = payload
        self._local = threading.local()
        self._owners: list[StagingBuffer | mmap.mmap] = []  # what the buffers are views of
        self._spare: list[memoryview] = []  # made by `prepare`, not yet taken by a thread
        self._lock = threading.Lock()

    def prepare(self, threads: int) -> None:
        """Make the buffers of `threads` threads now (faulting in a huge page takes about 1-3 ms),
        rather than on each thread's first transfer."""
        if not self.huge_pages or threads <= 0:
            return
        slot = self.size
        if slot <= HUGE_PAGE_BYTES // 2:
            arena = StagingBuffer(threads * slot, 0, threads * slot)
            owners = [arena]
            made = [arena.view[i * slot : (i + 1) * slot] for i in range(threads)]
        else:
            owners = [StagingBuffer(self.size, self._lead, self._payload) for _ in range(threads)]
            made = [staging.view for staging in owners]
        with self._lock:
            self._owners.extend(owners)
            self._spare.extend(made)

    def get(self) -> memoryview:
        """This thread's buffer (made now for a thread beyond those prepared)."""
        buffer: memoryview | None = getattr(self._local, "buffer", None)
        if buffer is not None:
            return buffer
        with self._lock:
            buffer = self._spare.pop() if self._spare else None
        if buffer is None:
            owner: StagingBuffer | mmap.mmap
            if self.huge_pages:
                owner = StagingBuffer(self.size, self._lead, self._payload)
                buffer = owner.view
            else:
                owner = mmap.mmap(-1, self.size)  # page-aligned
                buffer = memoryview(owner)
            with self._lock:
                self._owners.append(owner)
        self._local.buffer = buffer
        return buffer
