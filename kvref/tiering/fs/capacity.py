"""Capacity of a root shared by many engines: what its files take, making room by evicting the
least recently used ones, and removing the temporary files of dead writers.

No engine owns the root, so none can keep its byte count in memory: every engine learns it from
the directories themselves. The root's `FANOUT` directories are split into `domains` eviction
domains of equal size, each with `capacity_bytes // domains` bytes. Before a block file is
renamed into place, the writing thread lists the directories of its domain (`os.scandir`: one `stat` only
for a file it has not seen before), adds the blocks this engine is still writing there, and, if
the new file would not fit, deletes the domain's files in order of modification time, oldest
first, re-reading each one's time first (another engine may have just used it: its time then
moved on, and it goes back in line). A load or a `touch` in any engine sets a file's time to now
(`BlockIO.mark_used`), so recency is shared through the files themselves; atime, `flock` and
daemons are not used, so a root on a shared volume works the same way (tested on JuiceFS over
two mounts, where another host's use is seen once the attribute cache expires).

Bounds: a writer lists after its temporary file is written whole and before it renames it into
place, so of two engines racing for a domain's last room the later one to list counts the
other's file and makes room for both: at rest the root is within `capacity_bytes`, and while engines write it exceeds it
by at most the writes in flight. Eviction is least-recently-used within each domain; across the
root the victim is the least recently used file of its domain, on average among the oldest 4-7%
of the root's files with 64 files a domain (closer to exact LRU as domains hold more files:
each domain's horizon drifts by about the square root of its files), and never newer than every
file of its domain. A capacity under 128 files is one domain: exact LRU.

Cost: a write lists its domain's `FANOUT / domains` directories, about `files / domains`
entries (each `os.scandir` entry costs well under a microsecond locally; on a FUSE or network
filesystem each directory is a round trip or more, a few milliseconds on JuiceFS: a capacity of
few files is one domain of 256 directories), plus one `stat` and `unlink` per eviction.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Container
from pathlib import Path

from kvref.tiering.fs.root import BLOCK_SUFFIX, FANOUT, TMP_SUFFIX, unlink_quietly

__all__ = ["RootCapacity", "domains_for"]

_MIN_FILES_PER_DOMAIN = 64


def domains_for(capacity_bytes: int | None, file_bytes: int) -> int:
    """The number of eviction domains for a capacity: a power of two up to `FANOUT`, so that each
    domain holds at least `_MIN_FILES_PER_DOMAIN` files of `file_bytes` (1 when unbounded)."""
    if capacity_bytes is None:
        return 1
    files = capacity_bytes // file_bytes
    domains = 1
    while domains * 2 <= FANOUT and files // (domains * 2) >= _MIN_FILES_PER_DOMAIN:
        domains *= 2
    return domains


class _FileInfo:
    __slots__ = ("inode", "size", "mtime_ns", "directory")

    def __init__(self, inode: int, size: int, mtime_ns: int, directory: str) -> None:
        self.inode = inode
        self.size = size
        self.mtime_ns = mtime_ns
        self.directory = directory


class RootCapacity:
    """The byte budget of a shared root and the stale temporary files in it (I/O threads).

    Args:
        root: the root directory.
        capacity_bytes: the budget of the whole root; None for no limit (then only temporary
            files are looked after).
        file_bytes: the size of one block file (sets the number of domains).
        token: this engine's part of temporary file names: its own are counted as the writes
            it reserved, not as found.
        stale_tmp_s: another writer's temporary file older than this belongs to a dead writer
            (a live one finishes a block in well under a second) and is deleted.
    """

    def __init__(
        self,
        root: Path,
        capacity_bytes: int | None,
        file_bytes: int,
        *,
        token: str,
        stale_tmp_s: float,
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.domains = domains_for(capacity_bytes, file_bytes)
        self.budget = None if capacity_bytes is None else capacity_bytes // self.domains
        self._root = str(root)
        self._dirs = [os.path.join(root, f"{index:02x}") for index in range(FANOUT)]
        self._token = token
        self._stale_tmp_s = stale_tmp_s
        per_domain = FANOUT // self.domains
        self._domain_dirs = [
            self._dirs[d * per_domain : (d + 1) * per_domain] for d in range(self.domains)
        ]
        self._locks = [threading.Lock() for _ in range(self.domains)]
        self._files: list[dict[str, _FileInfo]] = [{} for _ in range(self.domains)]
        self._found = [0] * self.domains  # bytes found by the domain's last listing
        self._reserved = [0] * self.domains  # bytes of this engine's writes in flight
        self._last_tmp_sweep = [0.0] * FANOUT  # unbounded roots only: nothing lists them
        self.evicted: deque[str] = deque()
        """Names of the block files this engine evicted, for the scheduler thread to report."""
        self.vanished: deque[str] = deque()
        """Names of block files gone since the last listing: evicted by other engines, or
        deleted by hand."""
        self.stale_removed = 0

    @property
    def files_found(self) -> int:
        """Block files found by the domains' last listings."""
        return sum(len(files) for files in self._files)

    def domain(self, directory_index: int) -> int:
        """The eviction domain of fan-out directory `directory_index`."""
        return directory_index * self.domains // FANOUT

    @property
    def used_bytes(self) -> int:
        """The root's bytes as last seen: files found by each domain's last listing, plus this
        engine's writes in flight."""
        return sum(self._found) + sum(self._reserved)

    def reserve(
        self,
        directory_index: int,
        size: int,
        protected: Container[str],
        in_use: Callable[[str], bool],
    ) -> bool:
        """Make room for a `size`-byte file in a directory and count it as in flight.

        Args:
            directory_index: the fan-out directory the file goes to.
            size: its bytes.
            protected: names never evicted for it (the storing job's own blocks).
            in_use: whether this engine is reading a file (never evicted under its reader).

        Returns:
            False when the domain cannot make room (every file there protected or in use, or
            the file larger than the domain's share); nothing is reserved then.
        """
        domain = self.domain(directory_index)
        if self.budget is None:
            self._sweep_tmp_if_due(directory_index)
            self._reserved[domain] += size  # under the GIL; read only for `used_bytes`
            return True
        with self._locks[domain]:
            used = self._list(domain) + self._reserved[domain]
            if used + size > self.budget:
                used = self._evict(domain, used, used + size - self.budget, protected, in_use)
            if used + size > self.budget:
                return False
            self._reserved[domain] += size
            return True

    def release(self, directory_index: int, size: int, written: str | None) -> None:
        """The write `reserve` counted has landed (`written` names the file now there) or
        failed (None)."""
        domain = self.domain(directory_index)
        if self.budget is None:
            self._reserved[domain] -= size
            return
        directory = self._dirs[directory_index]
        try:
            # Known from now on: if another engine evicts it before the next listing, that
            # listing reports it vanished.
            stat = os.stat(os.path.join(directory, written)) if written else None
        except OSError:
            stat = None
        with self._locks[domain]:
            self._reserved[domain] -= size
            if written and stat is not None:
                self._found[domain] += stat.st_size
                self._files[domain][written] = _FileInfo(
                    stat.st_ino, stat.st_size, stat.st_mtime_ns, directory
                )

    def sweep(self, closed: Callable[[], bool]) -> None:
        """List every domain once: the root's usage, and stale temporary files deleted.

        Args:
            closed: polled between directories; the sweep stops early once it answers True.
        """
        self._sweep_tmp_in(self._root)  # a config or O_DIRECT probe file of a dead opener
        if self.budget is None:
            for index in range(FANOUT):
                if closed():
                    return
                self._sweep_tmp(index)
            return
        for domain in range(self.domains):
            if closed():
                return
            with self._locks[domain]:
                self._list(domain)

    def _list(self, domain: int) -> int:
        """List a domain's directories; return the bytes of the files found (not counting this
        engine's temporary files) and delete stale temporary files of other writers."""
        files = self._files[domain]
        seen: set[str] = set()
        total = 0
        now = time.time()
        for directory in self._domain_dirs[domain]:
            try:
                entries = os.scandir(directory)
            except OSError:
                continue  # not made yet (or deleted by hand)
            with entries:
                for entry in entries:
                    name = entry.name
                    try:
                        if name.endswith(BLOCK_SUFFIX):
                            inode = entry.inode()
                            info = files.get(name)
                            if info is None or info.inode != inode:
                                stat = entry.stat()
                                info = _FileInfo(inode, stat.st_size, stat.st_mtime_ns, directory)
                                files[name] = info
                            seen.add(name)
                            total += info.size
                        elif name.endswith(TMP_SUFFIX) and self._token not in name:
                            stat = entry.stat()
                            if now - stat.st_mtime > self._stale_tmp_s:
                                self._remove_stale(entry.path)
                            else:
                                total += stat.st_size  # another engine's write in flight
                    except FileNotFoundError:
                        continue  # evicted or renamed while listed
        if len(seen) != len(files):
            for name in [name for name in files if name not in seen]:
                del files[name]
                self.vanished.append(name)
        self._found[domain] = total
        return total

    def _evict(
        self,
        domain: int,
        used: int,
        needed: int,
        protected: Container[str],
        in_use: Callable[[str], bool],
    ) -> int:
        """Delete files of `domain`, least recently modified first, until `needed` bytes are
        freed or none is left to delete; return the domain's bytes after."""
        files = self._files[domain]
        queue = [
            (info.mtime_ns, name)
            for name, info in files.items()
            if name not in protected and not in_use(name)
        ]
        heapq.heapify(queue)
        freed = 0
        while queue and freed < needed:
            mtime_ns, name = heapq.heappop(queue)
            info = files.get(name)
            if info is None:
                continue
            path = os.path.join(info.directory, name)
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                stat = None  # another engine evicted it already
            if stat is not None and stat.st_mtime_ns > mtime_ns and stat.st_ino == info.inode:
                # Used since it was listed (a load or touch in some engine): back in line.
                info.mtime_ns = stat.st_mtime_ns
                heapq.heappush(queue, (stat.st_mtime_ns, name))
                continue
            if stat is not None and unlink_quietly(path):
                self.evicted.append(name)
            freed += info.size
            del files[name]
        self._found[domain] -= freed
        return used - freed

    def _sweep_tmp_if_due(self, directory_index: int) -> None:
        """Without a budget nothing lists the directories: look for stale temporary files in the
        one about to be written to, at most twice per `stale_tmp_s`."""
        if time.time() - self._last_tmp_sweep[directory_index] >= self._stale_tmp_s / 2:
            self._sweep_tmp(directory_index)

    def _sweep_tmp(self, directory_index: int) -> None:
        self._last_tmp_sweep[directory_index] = time.time()
        self._sweep_tmp_in(self._dirs[directory_index])

    def _sweep_tmp_in(self, directory: str) -> None:
        now = time.time()
        try:
            entries = os.scandir(directory)
        except OSError:
            return
        with entries:
            for entry in entries:
                if entry.name.endswith(TMP_SUFFIX) and self._token not in entry.name:
                    try:
                        if now - entry.stat().st_mtime > self._stale_tmp_s:
                            self._remove_stale(entry.path)
                    except FileNotFoundError:
                        continue

    def _remove_stale(self, path: str) -> None:
        if unlink_quietly(path):
            self.stale_removed += 1
