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
        self,
        state: FsJob,
        blocks: list[tuple[OffloadKey, int]],
        protected: frozenset[str],
    ) -> IOTask:
        """A task storing `blocks` ((key, primary block id)) of a store job; `protected` names
        the files of the job's blocks, which its room-making never evicts."""

        def run() -> None:
            start = time.monotonic()
            self._post(state, self._write_blocks(blocks, protected), start)

        def cancel() -> None:
            self._post(state, [(key, "cancelled") for key, _ in blocks])

        return IOTask(run, cancel)

    def _write_blocks(
        self, blocks: list[tuple[OffloadKey, int]], protected: frozenset[str]
    ) -> list[Outcome]:
        """Store a task's blocks, making room for each, and say how each went (never raises).

        A root without a capacity takes all of them in one `BlockIO.write_blocks` call. A
        bounded root takes them one at a time: room is made for a block once its file is
        written whole, and a writer holding several written files while it lists its domain
        would leave every other writer racing for that room as much less of it.
        """
        step = len(blocks) if self._capacity.budget is None else 1
        outcomes: list[Outcome] = []
        for first in range(0, len(blocks), step):
            outcomes.extend(self._write_group(blocks[first : first + step], protected))
        return outcomes

    def _write_group(
        self, blocks: list[tuple[OffloadKey, int]], protected: frozenset[str]
    ) -> list[Outcome]:
        names = [block_name(key) for key, _ in blocks]
        indexes = [fanout_dir(name) for name in names]
        paths = [os.path.join(self._dirs[index], name) for index, name in zip(indexes, names)]
        sizes = [file_bytes(len(key), self._io.block_bytes) for key, _ in blocks]
        reserved: list[int] = []  # blocks whose room is reserved

        def make_room(block: int) -> bool:
            if not self._capacity.reserve(indexes[block], sizes[block], protected, self._in_use):
                return False
            reserved.append(block)
            return True

        outcomes: list[WriteOutcome | OSError] = []
        try:
            outcomes = self._io.write_blocks(
                paths,
                [key for key, _ in blocks],
                [block_id for _, block_id in blocks],
                make_room,
            )
        except Exception as exc:  # a bug: failed stores, never an exception
            self.warn("write", paths[0], exc)
            outcomes = [OSError(str(exc) or type(exc).__name__)] * len(blocks)
        finally:
            for block in reserved:
                landed = block < len(outcomes) and outcomes[block] is WriteOutcome.WRITTEN
                self._capacity.release(
                    indexes[block], sizes[block], names[block] if landed else None
                )
        results: list[Outcome] = []
        for (key, _), path, outcome in zip(blocks, paths, outcomes):
            if isinstance(outcome, OSError):
                self.warn("write", path, outcome)
                results.append((key, str(outcome) or type(outcome).__name__))
            elif outcome is WriteOutcome.NO_ROOM:
                results.append((key, "no room: every block of its eviction domain is in use"))
            else:
                results.append((key, outcome))
        return results

    def read(self, state: FsJob, blocks: list[tuple[OffloadKey, str, int]]) -> IOTask:
        """A task loading `blocks` ((key, file name, primary block id)) of a load job."""

        def run() -> None:
            start = time.monotonic()
            paths = [os.path.join(self._dirs[fanout_dir(name)], name) for _, name, _ in blocks]
            try:
                problems = self._io.read_blocks(
                    paths,
                    [key for key, _, _ in blocks],
                    [block_id for _, _, block_id in blocks],
                )
            except Exception as exc:  # a bug: failed loads, never an exception
                self.warn("read", paths[0], exc)
                problems = [ReadProblem.UNREADABLE] * len(blocks)
            for (key, _, _), path, problem in zip(blocks, paths, problems):
                if problem is not None and problem is not ReadProblem.MISSING:
                    self.warn("read", path, OSError(f"block {key.hex()}: {problem.value}"))
            self._post(
                state,
                [(key, problem) for (key, _, _), problem in zip(blocks, problems)],
                start,
            )
            # A load is a use, in every engine's eyes: marked after the outcome is posted, a
            # metadata write off the load's latency.
            self._io.mark_used([path for path, problem in zip(paths, problems) if problem is None])

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
