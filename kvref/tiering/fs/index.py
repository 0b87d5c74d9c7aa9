"""The in-memory index of `FileSystemSecondaryTier`: segments, where each block's record is,
and rebuilding both from the segment files under a root at start-up."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from kvref.base import OffloadKey
from kvref.tiering.fs.format import scan_segment

__all__ = [
    "SEGMENT_SUFFIX",
    "TMP_SUFFIX",
    "Run",
    "Segment",
    "Entry",
    "RootIndex",
    "index_root",
    "unlink_quietly",
]

logger = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".kvs"
TMP_SUFFIX = ".tmp"

Run = tuple[int, list[tuple[OffloadKey, int]]]
"""Adjacent records of one segment: (offset of the first, [(key, primary block id)])."""


class Segment:
    """One segment file and the blocks of it the index still holds."""

    __slots__ = ("path", "size", "keys", "writing", "readers")

    def __init__(self, path: str, size: int, writing: bool) -> None:
        self.path = path
        self.size = size
        self.keys: set[OffloadKey] = set()
        self.writing = writing
        self.readers = 0

    @property
    def idle(self) -> bool:
        return not self.writing and self.readers == 0


class Entry:
    """Where one block's record is."""

    __slots__ = ("segment", "offset")

    def __init__(self, segment: Segment, offset: int) -> None:
        self.segment = segment
        self.offset = offset


class RootIndex:
    """What `index_root` found under a root."""

    __slots__ = ("index", "segments", "last_generation", "stale_tmp", "skipped")

    def __init__(self) -> None:
        self.index: dict[OffloadKey, Entry] = {}
        # Segments holding blocks, least recently modified first.
        self.segments: list[Segment] = []
        self.last_generation = 0
        self.stale_tmp = 0
        self.skipped = 0


def index_root(root: Path, block_bytes: int) -> RootIndex:
    """Re-index the segments under `root`: delete stale temporary files left by a crash and
    segments without a sound record, skip damaged records.

    Args:
        root: the root directory (locked by the caller).
        block_bytes: the tier's block size; records of another size are skipped.

    Returns:
        The index of the blocks found.
    """
    result = RootIndex()
    found: list[tuple[int, float, str, int]] = []  # generation, mtime, path, size
    for dirpath, _dirnames, filenames in os.walk(root):
        for filename in filenames:
            path = os.path.join(dirpath, filename)
            if filename.endswith(TMP_SUFFIX):
                # Left by a crash: the caller holds the root's lock, so no live writer owns it.
                result.stale_tmp += 1
                unlink_quietly(path)
            elif filename.endswith(SEGMENT_SUFFIX):
                try:
                    generation = int(filename[: -len(SEGMENT_SUFFIX)], 16)
                    stat = os.stat(path)
                except (ValueError, OSError):
                    continue
                found.append((generation, stat.st_mtime, path, stat.st_size))
    index = result.index
    # Oldest generation first: a key stored again later (after an eviction that a crash
    # interrupted) keeps its newest record.
    segments: list[tuple[float, Segment]] = []
    for generation, mtime, path, size in sorted(found):
        result.last_generation = max(result.last_generation, generation)
        records, bad = _scan_segment(path, size, block_bytes)
        result.skipped += bad
        segment = Segment(path, size, writing=False)
        for key, offset in records:
            previous = index.get(key)
            if previous is not None:
                previous.segment.keys.discard(key)
            segment.keys.add(key)
            index[key] = Entry(segment, offset)
        segments.append((mtime, segment))
    for _mtime, segment in sorted(segments, key=lambda item: item[0]):
        if segment.keys:
            result.segments.append(segment)
        else:
            unlink_quietly(segment.path)
    return result


def _scan_segment(
    path: str, size: int, block_bytes: int
) -> tuple[list[tuple[OffloadKey, int]], int]:
    """(key, offset) of each sound record of a segment, and how many were skipped."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return [], 1
    try:
        return scan_segment(fd, size, block_bytes)
    except OSError:
        return [], 1
    finally:
        os.close(fd)


def unlink_quietly(path: str) -> None:
    """Delete `path`; a missing file is fine, other failures are logged (debug) and ignored."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            logger.debug("could not delete %s: %s", path, exc)
