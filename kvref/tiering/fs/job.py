"""One job of the filesystem tier as its scheduler-thread side keeps it: what it writes or reads,
what it waits for, how it ends (`kvref.tiering.fs.tier` fills it in and settles it)."""

from __future__ import annotations

from kvref.base import OffloadKey
from kvref.tiering.base import JobResult, TransferJob

__all__ = ["BlockWrite", "FsJob"]


class BlockWrite:
    """One block being written by this engine; jobs storing the same block meanwhile wait on it
    instead of writing it twice."""

    __slots__ = ("key", "done", "ok")

    def __init__(self, key: OffloadKey) -> None:
        self.key = key
        self.done = False
        self.ok = False


class FsJob:
    """A submitted job's I/O (only the scheduler thread touches it; see `_task_done`)."""

    __slots__ = ("meta", "writes", "awaited", "reads", "remaining", "failed", "failed_keys", "io_span", "moved")

    def __init__(self, meta: TransferJob) -> None:
        self.meta = meta
        self.writes: list[BlockWrite] = []
        # Stores: blocks of the job that another job of this engine is writing; the job is
        # stored once those are (and fails if one is not).
        self.awaited: list[BlockWrite] = []
        self.reads: list[tuple[OffloadKey, str]] = []  # loads: (key, file name)
        self.remaining = 0
        self.failed = False
        self.failed_keys: list[OffloadKey] = []  # blocks whose write or load failed
        # (first task's start, last task's end) on the monotonic clock; None: no I/O ran.
        self.io_span: tuple[float, float] | None = None
        self.moved = 0  # blocks written or loaded completely

    def add_span(self, start: float, end: float) -> None:
        span = self.io_span
        self.io_span = (start, end) if span is None else (min(span[0], start), max(span[1], end))

    def result(self, block_bytes: int) -> JobResult:
        loaded = self.failed and self.meta.is_promotion and self.moved
        failed = set(self.failed_keys)
        span = self.io_span
        return JobResult(
            self.meta.job_id,
            not self.failed,
            successful_keys=(
                tuple(key for key, _name in self.reads if key not in failed) if loaded else None
            ),
            transfer_time=None if span is None else span[1] - span[0],
            transfer_bytes=None if span is None else self.moved * block_bytes,
        )
