"""The work of `FileSystemSecondaryTier`'s I/O threads on segment files, and the plan of a load.

`SegmentIO` writes a segment, reads runs of adjacent records straight into their primary rows and
verifies them, and marks a record dead; it touches no index state, so it is safe on any I/O
thread. `plan_read_tasks` groups a load's records into read tasks (pure, scheduler thread).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence

from kvref.base import OffloadKey
from kvref.tiering.base import PrimaryBlocks
from kvref.tiering.fs.format import (
    DEAD_MAGIC,
    RECORD_HEADER_BYTES,
    RecordCheck,
    expected_fields,
    pack_header,
    read_into,
    write_all,
)
from kvref.tiering.fs.index import TMP_SUFFIX, Entry, Run, Segment, unlink_quietly

__all__ = ["READ_PIECE_BYTES", "READ_TASK_BYTES", "SegmentIO", "plan_read_tasks"]

logger = logging.getLogger(__name__)

READ_PIECE_BYTES = 1 << 20
"""A run is read with one `preadv` per piece of at most this many bytes (cut anywhere in a
payload, never in a header), and each piece is hashed right after it is read, while it is still
in the CPU's L2 cache (usually 1-2 MiB per core). Smaller pieces pay more in system calls and
GIL hand-offs per byte; much larger ones are hashed back from memory."""
READ_TASK_BYTES = 8 << 20
"""One read task (one open of a segment) covers runs of up to this many bytes (at least one
record), so a large load still spreads over several I/O threads."""
_WARN_INTERVAL_S = 10.0

# One buffer of a run as read: (index of its record in the run, the buffer, is it the header).
_Part = tuple[int, memoryview, bool]


def plan_read_tasks(
    reads: Sequence[tuple[OffloadKey, Entry]], block_ids: Sequence[int], block_bytes: int
) -> list[tuple[str, list[Run]]]:
    """Group a load's records into runs of adjacent records, and runs into read tasks.

    Args:
        reads: (key, where its record is) per block of the load.
        block_ids: the primary block each record is read into, in the order of `reads`.
        block_bytes: the payload size of a record.

    Returns:
        (segment path, its runs) per task; a run is (offset of its first record,
        [(key, primary block id)]).
    """
    by_segment: dict[Segment, list[tuple[int, OffloadKey, int]]] = {}
    for (key, entry), block_id in zip(reads, block_ids):
        by_segment.setdefault(entry.segment, []).append((entry.offset, key, block_id))
    tasks: list[tuple[str, list[Run]]] = []
    for segment, records in by_segment.items():
        records.sort(key=lambda record: record[0])
        runs: list[Run] = []
        run: list[tuple[OffloadKey, int]] = []
        run_start = run_end = task_bytes = 0
        for offset, key, block_id in records:
            record_bytes = RECORD_HEADER_BYTES + len(key) + block_bytes
            task_full = task_bytes + record_bytes > READ_TASK_BYTES
            if run and (offset != run_end or task_full):
                runs.append((run_start, run))
                run = []
                if task_full:
                    tasks.append((segment.path, runs))
                    runs, task_bytes = [], 0
            if not run:
                run_start = offset
            run.append((key, block_id))
            run_end = offset + record_bytes
            task_bytes += record_bytes
        runs.append((run_start, run))
        tasks.append((segment.path, runs))
    return tasks


class SegmentIO:
    """Reads and writes the segment files of one tier (any thread; no index state).

    Args:
        primary: the primary's rows, the source of stores and the destination of loads.
        fsync: `fsync` each segment before renaming it into place.
        medium: the tier's name, in warnings.
    """

    def __init__(self, primary: PrimaryBlocks, *, fsync: bool, medium: str) -> None:
        self._primary = primary
        self._fsync = fsync
        self._medium = medium
        self._made_dirs: set[str] = set()
        # Key length -> the header fields of a record of this tier (threads racing to fill an
        # entry store the same bytes).
        self._fields: dict[int, bytes] = {}
        self._last_warning = 0.0

    def write_segment(self, path: str, records: list[tuple[OffloadKey, int]]) -> bool:
        """Write `records` ((key, primary block id)) as the segment `path`, through a temporary
        file renamed into place; return whether it worked (no temporary file is left if not)."""
        tmp_path = path + TMP_SUFFIX
        try:
            directory = os.path.dirname(path)
            if directory not in self._made_dirs:
                os.makedirs(directory, exist_ok=True)
                self._made_dirs.add(directory)
            fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                # One record per system call, checksummed just before it is written: the
                # payload is still in cache for the copy, and no call grows past one block.
                for key, block_id in records:
                    payload = self._primary.row(block_id)
                    write_all(fd, [pack_header(key, payload), payload])
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp_path, path)
            return True
        except Exception as exc:
            self._warn("write", path, exc)
            unlink_quietly(tmp_path)
            return False

    def read_runs(self, path: str, runs: list[Run]) -> list[OffloadKey]:
        """Read runs of adjacent records of one segment straight into their primary rows,
        verifying each record as its pieces arrive.

        A record that fails verification has still been read into its row: the caller must fail
        the load, so those bytes are never reported as loaded.

        Returns:
            The keys whose record could not be read or failed verification.
        """
        failed: list[OffloadKey] = []
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            self._warn("read", path, exc)
            return [key for _, run in runs for key, _ in run]
        try:
            for offset, run in runs:
                failed.extend(self._read_run(fd, path, offset, run))
        finally:
            os.close(fd)
        return failed

    def _read_run(
        self, fd: int, path: str, offset: int, records: list[tuple[OffloadKey, int]]
    ) -> list[OffloadKey]:
        checks: list[RecordCheck] = []
        parts: list[_Part] = []
        try:
            for index, (key, block_id) in enumerate(records):
                header = bytearray(RECORD_HEADER_BYTES + len(key))
                checks.append(RecordCheck(header, self._expected_fields(len(key)), key))
                parts.append((index, memoryview(header), True))
                parts.append((index, self._primary.row(block_id), False))
            truncated = len(records)
            for piece in _pieces(parts, READ_PIECE_BYTES):
                available = read_into(fd, [view for _, view, _ in piece], offset)
                offset += available
                for index, view, is_header in piece:
                    if available < len(view):
                        truncated = index  # the file ends inside this record
                        break
                    available -= len(view)
                    if is_header:
                        checks[index].check_header()
                    else:
                        checks[index].update(view)
                if truncated < len(records):
                    break
        except Exception as exc:
            self._warn("read", path, exc)
            return [key for key, _ in records]
        failed: list[OffloadKey] = []
        for index, (check, (key, _block_id)) in enumerate(zip(checks, records)):
            problem = "truncated record" if index >= truncated else check.finish()
            if problem is not None:
                self._warn("read", path, _CorruptBlock(f"{problem} (key {key.hex()})"))
                failed.append(key)
        return failed

    def _expected_fields(self, key_len: int) -> bytes:
        fields = self._fields.get(key_len)
        if fields is None:
            fields = self._fields[key_len] = expected_fields(key_len, self._primary.block_bytes)
        return fields

    def mark_dead(self, path: str, offset: int) -> None:
        """Overwrite the magic of the record at `offset` so no restart indexes it (best effort)."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.pwrite(fd, DEAD_MAGIC, offset)
            finally:
                os.close(fd)
        except OSError as exc:
            logger.debug("could not mark the record at %s:%d dead: %s", path, offset, exc)

    def _warn(self, operation: str, path: str, exc: Exception) -> None:
        # Disk-full or permission errors hit every block: warn at most every few seconds.
        now = time.monotonic()
        level = logging.DEBUG
        if now - self._last_warning >= _WARN_INTERVAL_S:
            self._last_warning = now
            level = logging.WARNING
        logger.log(level, "fs tier %s: %s of %s failed: %s", self._medium, operation, path, exc)


def _pieces(parts: list[_Part], limit: int) -> Iterator[list[_Part]]:
    """Cut a run's buffers, in file order, into consecutive pieces of at most `limit` bytes
    (a payload may be cut anywhere; a header is never cut, a longer one is a piece of its own)."""
    piece: list[_Part] = []
    room = limit
    for index, view, is_header in parts:
        while not is_header and len(view) > room:
            if room > 0:
                piece.append((index, view[:room], False))
                view = view[room:]
            yield piece
            piece, room = [], limit
        if is_header and piece and len(view) > room:
            yield piece
            piece, room = [], limit
        piece.append((index, view, is_header))
        room -= len(view)
    if piece:
        yield piece


class _CorruptBlock(Exception):
    """A record does not hold what the index promises."""
