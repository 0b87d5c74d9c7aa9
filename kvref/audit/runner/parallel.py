"""Summarise many files at once: on-disk cache first, then a process pool for what is left.

`summarize_many(paths, root=...)` is how the runner (`scale.py`) summarises. Parsing is the
expensive part of an audit and is independent per file, so it is spread over processes; only
summaries (small frozen dataclasses, no `ast` objects) travel back to the parent. Files are
dealt to workers in chunks, largest first, so one huge file does not leave the other cores
idle at the end.

Every file yields a summary or a `FileError`, never an exception: unreadable files, symlink
loops, undecodable or unparsable source, and files over the size limit (generated code) are
each reported once, and the rest is audited.
"""

from __future__ import annotations

import importlib
import marshal
import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Final, Generic, TypeVar, cast

from kvref.audit.runner.cache import SummaryCache, content_digest, dumps, loads
from kvref.audit.model import DEFAULT_MAX_FILE_BYTES, FileError
from kvref.audit.discover.paths import relative_path
from kvref.audit.source import FileStamp, read_source, summary_or_error

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "FileStamp",
    "Follow",
    "Pickled",
    "SERIAL_THRESHOLD",
    "Summarizer",
    "Unchanged",
    "available_cpus",
    "summarize_many",
    "summarize_path",
]

S = TypeVar("S")

Summarizer = Callable[[str, bytes], S]
"""Turns (project-relative path, file bytes) into a summary; raises to reject the file.

It must be a module-level function (it is sent to worker processes by reference). An exception
carrying `line`, `col` and `message` attributes (such as `kvref.audit.summarise.summary.SummaryError`)
becomes a `FileError` at that position.
"""


SERIAL_THRESHOLD: Final = 48
"""Below this many files to summarise, starting processes costs more than it saves."""

_CHUNKS_PER_JOB: Final = 6


class Pickled(Generic[S]):
    """A summary still in the pickled form a worker sent or the cache holds; `load()` builds it.

    Handed out by `summarize_many(..., lazy=True)`, so that rebuilding thousands of summaries
    happens where they are used (in forked checkers, spread over the cores) and not in one
    process while the workers still compete for the CPU.
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    @property
    def weight(self) -> int:
        """How much work the summary stands for (its pickled size), to balance shares."""
        return len(self.data)

    def load(self) -> S:
        """Unpickle the summary.

        Raises:
            pickle.UnpicklingError: the data is corrupt or names a class from elsewhere.
        """
        return cast(S, loads(self.data))


@dataclass(frozen=True, slots=True)
class Unchanged:
    """A worker's answer when the file's digest matches the cached one (nothing to send)."""

    digest: bytes


@dataclass(frozen=True, slots=True)
class _Outcome(Generic[S]):
    """What summarising one file produced, with the stamp and digest it was computed from.

    A worker's summary arrives `Pickled` (that pickle becomes the cache entry as it is).
    """

    path: str
    result: S | FileError | Unchanged | Pickled[S]
    stamp: FileStamp | None
    digest: bytes


def summarize_path(
    path: Path,
    root: Path,
    summarize: Summarizer[S],
    *,
    expected_digest: bytes | None = None,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> tuple[S | FileError | Unchanged, FileStamp | None, bytes]:
    """Read and summarise one file as the pipeline's `summarize_file` does (through
    `kvref.audit.source`), with the stamp and digest the cache keeps.

    Args:
        path: the file (absolute).
        root: the project root, for the relative path in summaries and errors.
        summarize: the summariser (see `Summarizer`).
        expected_digest: the cached digest of the file; when the bytes still hash to it,
            `Unchanged` is returned instead of summarising again.
        max_bytes: files larger than this are reported instead of parsed.

    Returns:
        (result, the size/mtime of the bytes read or None when unreadable, their digest or
        b"" when they were not read).
    """
    relative = relative_path(path, root)
    source, stamp = read_source(path, relative, max_bytes)
    if isinstance(source, FileError):
        return source, stamp, b""
    digest = content_digest(source)
    if expected_digest is not None and digest == expected_digest:
        return Unchanged(digest), stamp, digest
    return summary_or_error(relative, source, summarize), stamp, digest


def _summarize_chunk(
    chunk: Sequence[tuple[Path, bytes | None]],
    root: Path,
    summarize: Summarizer[S],
    max_bytes: int,
) -> list[_Outcome[S]]:
    outcomes: list[_Outcome[S]] = []
    for path, expected in chunk:
        result, stamp, digest = summarize_path(
            path, root, summarize, expected_digest=expected, max_bytes=max_bytes
        )
        outcomes.append(_Outcome(str(path), result, stamp, digest))
    return outcomes


_SUMMARY, _ERROR, _UNCHANGED = 0, 1, 2
_Row = tuple[str, int, object, int, int, bytes, tuple[str, ...]]

Follow = Callable[[S], Iterable[str]]
"""Turns a summary into files worth summarising too (paths; they go to the cache only)."""


def _summarize_chunk_packed(
    chunk: Sequence[tuple[Path, bytes | None]],
    root: Path,
    summarize: Summarizer[S],
    max_bytes: int,
    follow: Follow[S] | None = None,
) -> bytes:
    """A worker's answer: `marshal` of one plain row per file, each summary pickled alone.

    One pickle per file lets the parent keep it as the summary cache's entry without pickling
    it again; the rows themselves are plain values, the cheapest thing to send.
    """
    rows: list[_Row] = []
    for path, expected in chunk:
        # Each summary is pickled and dropped before the next file is parsed instead of
        # being held to the chunk's end: long-lived objects among the parser's short-lived
        # ones make the garbage collector's later passes over them slow every later parse.
        result, stamp, digest = summarize_path(
            path, root, summarize, expected_digest=expected, max_bytes=max_bytes
        )
        size, mtime_ns = (stamp.st_size, stamp.st_mtime_ns) if stamp else (-1, 0)
        if isinstance(result, Unchanged):
            rows.append((str(path), _UNCHANGED, result.digest, size, mtime_ns, digest, ()))
        elif isinstance(result, FileError):
            fields = (result.path, result.line, result.col, result.message)
            rows.append((str(path), _ERROR, fields, size, mtime_ns, digest, ()))
        else:
            leads = tuple(follow(result)) if follow is not None else ()
            rows.append((str(path), _SUMMARY, dumps(result), size, mtime_ns, digest, leads))
        del result
    return marshal.dumps(rows)


def _unpack_rows(data: bytes) -> tuple[list[_Outcome[object]], list[str]]:
    """The outcomes a worker sent (summaries still `Pickled`), and the files its summaries
    lead to (see `Follow`)."""
    outcomes: list[_Outcome[object]] = []
    leads: list[str] = []
    for path, kind, payload, size, mtime_ns, digest, led in cast(
        list[_Row], marshal.loads(data)
    ):
        leads.extend(led)
        stamp = FileStamp(size, mtime_ns) if size >= 0 else None
        result: object
        if kind == _UNCHANGED:
            result = Unchanged(cast(bytes, payload))
        elif kind == _ERROR:
            result = FileError(*cast(tuple[str, int, int, str], payload))
        else:
            result = Pickled[object](cast(bytes, payload))
        outcomes.append(_Outcome(path, result, stamp, digest))
    return outcomes, leads


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform says), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _chunks(
    work: Sequence[tuple[Path, bytes | None]], sizes: Mapping[Path, int], count: int
) -> list[list[tuple[Path, bytes | None]]]:
    """Deal files into `count` chunks of similar total size, largest files first."""
    ordered = sorted(work, key=lambda item: sizes.get(item[0], 0), reverse=True)
    chunks: list[list[tuple[Path, bytes | None]]] = [[] for _ in range(max(1, count))]
    loads = [0] * len(chunks)
    for item in ordered:
        lightest = min(range(len(chunks)), key=loads.__getitem__)
        chunks[lightest].append(item)
        loads[lightest] += sizes.get(item[0], 0) + 512
    # The heaviest chunks are submitted first, which shortens the tail.
    order = sorted(range(len(chunks)), key=loads.__getitem__, reverse=True)
    return [chunks[index] for index in order if chunks[index]]


def _pool_context() -> BaseContext:
    # fork starts workers at once and shares the imported modules; the parent holds no
    # threads at this point. Elsewhere (macOS, Windows) the platform default is the safe one.
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def _default_summarizer() -> Summarizer[object]:
    # Imported on first use: the summariser pulls in `ast` walking code the cache hit path
    # never needs.
    module = importlib.import_module("kvref.audit.summarise.summary")
    return cast(Summarizer[object], module.summarize)


def summarize_many(
    paths: Iterable[Path],
    *,
    root: Path,
    jobs: int | None = None,
    cache: SummaryCache[S | FileError] | None = None,
    summarize: Summarizer[S] | None = None,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    on_progress: Callable[[int], None] | None = None,
    lazy: bool = False,
    follow: Follow[S] | None = None,
) -> dict[Path, S | FileError | Pickled[S]]:
    """Summarise every file, reusing the cache and spreading the rest over processes.

    Args:
        paths: absolute paths of the files.
        root: the project root (summaries and errors name files relative to it).
        jobs: worker processes (default: the CPUs this process may use); 1 runs in-process.
        cache: a loaded `SummaryCache`, updated in place (the caller saves it), or None.
        summarize: the summariser (default: `kvref.audit.summarise.summary.summarize`).
        max_bytes: files larger than this become a `FileError` instead of being parsed.
        on_progress: called with the number of files just finished (for a progress bar).
        lazy: hand out summaries that arrive pickled (from a worker, or from the cache while
            not yet unpickled) as `Pickled`, for the caller to load where it needs them.
        follow: run in the workers on each summary; the files it names that the cache does
            not hold are summarised by the same pool, after the others, into the cache only
            (not returned). Used with a cache and more than one process, ignored otherwise.

    Returns:
        A summary (or its `Pickled` form) or a `FileError` for every given path, keyed by
        the path as given.

    Raises:
        ValueError: `jobs` is below 1.
    """
    if jobs is None:
        jobs = available_cpus()
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    summarizer = cast(Summarizer[S], summarize or _default_summarizer())
    results: dict[Path, S | FileError | Pickled[S]] = {}
    work: list[tuple[Path, bytes | None]] = []
    sizes: dict[Path, int] = {}
    for path in dict.fromkeys(paths):
        if cache is not None:
            try:
                file_stat = os.stat(path)
            except OSError as error:
                results[path] = FileError(
                    relative_path(path, root), 1, 1, f"cannot read: {error.strerror or error}"
                )
                continue
            cached = cache.lookup_pickled(path, file_stat) if lazy else None
            if cached is not None:
                results[path] = Pickled[S](cached)
                continue
            cached = cache.lookup(path, file_stat)
            if cached is not None:
                results[path] = cached
                continue
            sizes[path] = file_stat.st_size
            work.append((path, cache.expected_digest(path)))
        else:
            work.append((path, None))
    if on_progress is not None and results:
        on_progress(len(results))
    by_name = {str(path): path for path, _ in work}

    followed: dict[str, Path] = {}  # files summarised for the cache only (see `follow`)

    def absorb(outcomes: Iterable[_Outcome[S]]) -> None:
        finished = 0
        for outcome in outcomes:
            result = outcome.result
            followed_path = followed.get(outcome.path)
            if followed_path is not None:
                # Kept as the worker pickled it; a file that failed is left to the lookup.
                if cache is not None and isinstance(result, Pickled) and outcome.stamp is not None:
                    cache.store_pickled(followed_path, outcome.stamp, outcome.digest, result.data)
                continue
            finished += 1
            path = by_name[outcome.path]
            if isinstance(result, Unchanged):
                assert cache is not None and outcome.stamp is not None
                reused = cache.lookup_digest(path, result.digest, outcome.stamp)
                if reused is None:  # the cache changed under us: cannot happen in one process
                    raise AssertionError(f"digest of {path} vanished from the cache")
                results[path] = reused
                continue
            # Errors from reading (no stat) depend on the filesystem, not the bytes: not cached.
            cacheable = cache is not None and outcome.stamp is not None and outcome.digest
            if isinstance(result, Pickled):  # from a worker: the pickle is the cache entry
                if cacheable:
                    assert cache is not None and outcome.stamp is not None
                    cache.store_pickled(path, outcome.stamp, outcome.digest, result.data)
                results[path] = result if lazy else cast(Pickled[S], result).load()
                continue
            results[path] = result
            if cacheable:
                assert cache is not None and outcome.stamp is not None
                cache.store(path, outcome.stamp, outcome.digest, result)
        if on_progress is not None and finished:
            on_progress(finished)

    if jobs == 1 or len(work) < SERIAL_THRESHOLD:
        for item in work:
            absorb(_summarize_chunk([item], root, summarizer, max_bytes))
        return results
    if not sizes:
        sizes = {path: _size(path) for path, _ in work}
    chunks = deque(_chunks(work, sizes, jobs * _CHUNKS_PER_JOB))
    leading = follow if cache is not None else None
    workers = min(jobs, len(chunks))
    with ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context()) as pool:

        def submit(chunk: Sequence[tuple[Path, bytes | None]]) -> Future[bytes]:
            return pool.submit(_summarize_chunk_packed, chunk, root, summarizer, max_bytes, leading)

        # Chunks are dealt a few at a time (two per worker in flight, so none waits for its
        # next one), so that the files a finished chunk leads to go in ahead of the remaining
        # chunks instead of after all of them, where their chain would run on one core.
        pending: set[Future[bytes]] = set()
        while chunks and len(pending) < 2 * workers:
            pending.add(submit(chunks.popleft()))
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                outcomes, leads = _unpack_rows(future.result())
                absorb(cast(list[_Outcome[S]], outcomes))
                new = [
                    lead
                    for lead in dict.fromkeys(leads)
                    if lead not in by_name
                    and lead not in followed
                    and cache is not None
                    and cache.expected_digest(Path(lead)) is None
                ]
                if new:
                    followed.update((lead, Path(lead)) for lead in new)
                    pending.add(submit([(Path(lead), None) for lead in new]))
            while chunks and len(pending) < 2 * workers:
                pending.add(submit(chunks.popleft()))
    return results

