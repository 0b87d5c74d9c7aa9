"""What `FileSystemSecondaryTier`'s I/O threads run for a job: writing its blocks (making room
first) or reading them, and posting each task's outcome for the scheduler thread, which settles
it (`kvref.tiering.fs.tier`). Nothing here touches the scheduler thread's state but through the
completion queue and the read-only view of the files being read."""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Container

from kvref.base import OffloadKey
from kvref.tiering.fs.block_io import BlockIO, ReadProblem, WriteOutcome
from kvref.tiering.fs.capacity import RootCapacity
from kvref.tiering.fs.format import file_bytes
from kvref.tiering.fs.job import FsJob
from kvref.tiering.fs.pool import IOTask
from kvref.tiering.fs.root import block_name, fanout_dir

__all__ = ["Outcome", "Completion", "JobTasks"]

logger = logging.getLogger(__name__)

_WARN_INTERVAL_S = 10.0

Outcome = tuple[OffloadKey, WriteOutcome | ReadProblem | str | None]
"""How one block of a task ended: (key, None for a load's success, else the outcome)."""
Completion = tuple[FsJob, list[Outcome], float, float]
"""One task's outcomes, with when its I/O started and ended (monotonic clock)."""


class JobTasks:
    """Builds the I/O tasks of jobs (scheduler thread) and runs them (I/O threads).

    Args:
        io: the block file work.
        capacity: the root's byte budget.
        dirs: the root's fan-out directories, by index.
        in_use: whether this engine is reading a file (the scheduler thread's read counts;
            never evicted under its reader).
        medium: the tier's name, in warnings.
    """

    def __init__(
        self,
        io: BlockIO,
        capacity: RootCapacity,
        dirs: list[str],
        in_use: Container[str],
        medium: str,
    ) -> None:
        self._io = io
        self._capacity = capacity
        self._dirs = dirs
        self._in_use: Callable[[str], bool] = in_use.__contains__
        self._medium = medium
        self.completions: deque[Completion] = deque()
        """Posted by the I/O threads, taken by the scheduler thread (deque appends and pops are
        atomic: neither side waits on a lock the other holds)."""
        self._last_warning = 0.0

    def write(
        self, state: FsJob, blocks: list[tuple[OffloadKey, int]], protected: frozenset[str]
    ) -> IOTask:
        """A task storing `blocks` ((key, primary block id)) of a store job; `protected` names
        the files of the job's blocks, which its room-making never evicts."""

        def run() -> None:
            start = time.monotonic()
            outcomes: list[Outcome] = []
            for key, block_id in blocks:
                outcomes.append((key, self._write_block(key, block_id, protected)))
            self._post(state, outcomes, start)

        def cancel() -> None:
            self._post(state, [(key, "cancelled") for key, _ in blocks])

        return IOTask(run, cancel)

    def _write_block(
        self, key: OffloadKey, block_id: int, protected: frozenset[str]
    ) -> WriteOutcome | str:
        """Store one block: make room, write, and return how it went (never raises)."""
        name = block_name(key)
        index = fanout_dir(name)
        path = os.path.join(self._dirs[index], name)
        size = file_bytes(len(key), self._io.block_bytes)
        reserved = False
        outcome: WriteOutcome | None = None

        def make_room() -> bool:
            nonlocal reserved
            reserved = self._capacity.reserve(index, size, protected, self._in_use)
            return reserved

        try:
            outcome = self._io.write_block(path, key, block_id, make_room)
            if outcome is WriteOutcome.NO_ROOM:
                return "no room: every block of its eviction domain is in use"
            return outcome
        except Exception as exc:  # OSError, or a bug: a failed store, never an exception
            self.warn("write", path, exc)
            return str(exc) or type(exc).__name__
        finally:
            if reserved:
                written = name if outcome is WriteOutcome.WRITTEN else None
                self._capacity.release(index, size, written)

    def read(self, state: FsJob, blocks: list[tuple[OffloadKey, str, int]]) -> IOTask:
        """A task loading `blocks` ((key, file name, primary block id)) of a load job."""

        def run() -> None:
            start = time.monotonic()
            outcomes: list[Outcome] = []
            used: list[str] = []
            for key, name, block_id in blocks:
                path = os.path.join(self._dirs[fanout_dir(name)], name)
                try:
                    problem = self._io.read_block(path, key, block_id, used)
                except Exception as exc:  # a bug: a failed load, never an exception
                    self.warn("read", path, exc)
                    problem = ReadProblem.UNREADABLE
                if problem is not None and problem is not ReadProblem.MISSING:
                    self.warn("read", path, OSError(f"block {key.hex()}: {problem.value}"))
                outcomes.append((key, problem))
            self._post(state, outcomes, start)
            self._io.mark_used(used)  # after the outcome: a metadata write off the load's latency

        def cancel() -> None:
            self._post(state, [(key, ReadProblem.UNREADABLE) for key, _, _ in blocks])

        return IOTask(run, cancel)

    def _post(self, state: FsJob, outcomes: list[Outcome], start: float | None = None) -> None:
        """Post one task's outcomes; `start` is None when it was cancelled before any I/O."""
        end = time.monotonic()
        self.completions.append((state, outcomes, end if start is None else start, end))

    def warn(self, operation: str, path: str, exc: BaseException) -> None:
        """Log a failed operation; disk-full or permission errors hit every block, so a warning
        at most every few seconds, the rest at debug level."""
        now = time.monotonic()
        level = logging.DEBUG
        if now - self._last_warning >= _WARN_INTERVAL_S:
            self._last_warning = now
            level = logging.WARNING
        logger.log(level, "fs tier %s: %s of %s failed: %s", self._medium, operation, path, exc)
