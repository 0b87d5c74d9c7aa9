"""The summaries of a project's files as they are on disk, kept between edits.

Backed by the summary cache `kvref audit` reads and writes (`kvref.audit.runner.cache`), so a
project the command line has audited starts warm, and indexing a workspace leaves the cache
warm for the command line. Each file is summarised the way the audit does it
(`kvref.audit.runner.parallel.summarize_many`); what the checks look up is kept in memory and
trusted while the file's size and mtime stay the same, or until the editor reports the file
changed (`forget`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from kvref.audit.model import FileError
from kvref.audit.runner.cache import SummaryCache
from kvref.audit.runner.parallel import Pickled, summarize_many
from kvref.audit.runner.scale import summary_stamp
from kvref.audit.summarise.records import ModuleSummary
from kvref.audit.summarise.summary import summarize

__all__ = ["DiskSummaries"]

_Summary = ModuleSummary | FileError


class DiskSummaries:
    """Summaries of files on disk: in memory, then the on-disk cache, then parsed.

    Args:
        root: the project root (summaries name files relative to it).
        max_bytes: larger files become a `FileError`, as in the audit.
        cache_dir: the cache directory, or None for a cache held in memory only.
    """

    def __init__(self, root: Path, max_bytes: int, cache_dir: Path | None) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.persistent = cache_dir is not None
        # An in-memory cache never saved still validates by stat and digest.
        self.cache: SummaryCache[_Summary] = SummaryCache(
            cache_dir or root / ".kvref_cache", summary_stamp(root, max_bytes)
        )
        if cache_dir is not None:
            self.cache.load()
        self._known: dict[Path, tuple[int, int, _Summary]] = {}

    def get(self, path: Path) -> _Summary:
        """The summary of `path` as it is on disk now (or why there is none)."""
        try:
            stat = os.stat(path)
        except OSError:
            stat = None
        known = self._known.get(path)
        if stat is not None and known is not None and known[:2] == (stat.st_size, stat.st_mtime_ns):
            return known[2]
        found = summarize_many([path], root=self.root, jobs=1, cache=self.cache, max_bytes=self.max_bytes)[path]
        summary = found.load() if isinstance(found, Pickled) else found
        if stat is not None:
            self._known[path] = (stat.st_size, stat.st_mtime_ns, summary)
        return summary

    def forget(self, paths: Iterable[Path]) -> None:
        """Drop what is known of `paths` (changed or deleted on disk)."""
        for path in paths:
            self._known.pop(path, None)

    def index(self, paths: Sequence[Path]) -> None:
        """Bring the cache up to date for `paths` (summaries stay pickled until looked up)."""
        summarize_many(
            paths, root=self.root, jobs=1, cache=self.cache, summarize=summarize,
            max_bytes=self.max_bytes, lazy=True,
        )  # fmt: skip

    def save(self) -> None:
        """Write the cache, when it is the on-disk one (a read-only checkout stays uncached)."""
        if not self.persistent:
            return
        try:
            self.cache.save()
        except OSError:
            pass
