"""The runner: the pipeline's stages (`kvref.audit.pipeline`) with the caches, the process
pool and the forked checkers around them, and the target environment's installed packages.

`analyze_at_scale` has the engine's inputs plus `ScaleSettings` (`--no-cache`, `--cache-dir`,
`--python`, `--jobs`) and returns the engine's `AnalysisResult`. In order:

1. the import roots of the target interpreter (`kvref.audit.discover.environment`);
2. the previous run's whole result, when no project file, option, import root or engine
   source changed since it was stored (`ResultCache`): a warm run with nothing to do;
3. otherwise `run_pipeline`: per-file summaries from the summary cache, the rest summarised
   across processes (`parallel.py`), then indexing, and checking split over forked copies of
   this process (`forked.py`) when there are enough modules;
4. both caches saved atomically (a read-only checkout just runs uncached), in a forked child
   while the caller reports when it asks for that (`background_save`, `wait_for_saves`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Final, TextIO, cast

from kvref.audit.discover.environment import InterpreterError, discover_environment
from kvref.audit.discover.paths import absolute_path
from kvref.audit.model import AnalysisOptions, AnalysisResult, FileError
from kvref.audit.resolve.reachability import Reachability
from kvref.audit.runner.cache import SummaryCache, default_cache_dir, dumps, loads, version_stamp
from kvref.audit.runner.forked import fork_available, run_shares
from kvref.audit.runner.parallel import Pickled, available_cpus, summarize_many
from kvref.audit.runner.progress import ProgressBar
from kvref.audit.runner.results import ResultCache
from kvref.audit.summarise.newer_syntax import cache_key as newer_syntax_key
from kvref.audit.summarise.newer_syntax import use_interpreter
from kvref.audit.summarise.records import ModuleSummary
from kvref.audit.summarise.summary import summarize, summarize_without_parameters

if TYPE_CHECKING:  # the pipeline is imported when it runs: a warm run never loads it
    from kvref.audit.pipeline import Checked, SearchRoots

__all__ = [
    "InterpreterError",
    "MIN_SHARE",
    "ScaleSettings",
    "analyze_at_scale",
    "run_pipeline",
    "summary_stamp",
    "wait_for_saves",
]

_AUDIT_DIR = Path(__file__).resolve().parent.parent
# The summaries' meaning depends on these modules only (KVR102's analysis, `passes.py`, is one
# of summarise/'s); the result on the whole engine.
_SUMMARY_SCHEMA = (
    *sorted((_AUDIT_DIR / "summarise").glob("*.py")),
    _AUDIT_DIR / "model.py",
    _AUDIT_DIR / "source.py",
)


@dataclass(frozen=True, slots=True)
class ScaleSettings:
    """How to run the analysis (none of it changes the findings).

    Attributes:
        cache: use the on-disk caches (`--no-cache` turns them off).
        cache_dir: where they live (default `$KVREF_CACHE_DIR` or `<root>/.kvref_cache`).
        python: the interpreter whose installed packages resolve bases (None: the running one).
        jobs: worker processes (None: every CPU this process may use).
        background_save: write the caches in a forked child while the caller goes on; the
            caller must call `wait_for_saves()` before it exits (the command line does).
    """

    cache: bool = True
    cache_dir: Path | None = None
    python: Path | None = None
    jobs: int | None = None
    background_save: bool = False


def _engine_sources() -> list[Path]:
    return sorted(path for path in _AUDIT_DIR.rglob("*.py") if "__pycache__" not in path.parts)


def summary_stamp(root: Path, max_file_bytes: int, newer: str | None = None) -> str:
    """The summary cache's version (`kvref server` shares the cache): its schema, the project root, the file-size limit (a file
    over it is cached as skipped) and the interpreters that parse syntax newer than this
    Python (a file's summary or error depends on all of them)."""
    if newer is None:
        newer = newer_syntax_key()
    return version_stamp(_SUMMARY_SCHEMA) + f"@{root}@{max_file_bytes}@{newer}"


def _stats(files: Sequence[Path]) -> list[tuple[str, int, int]] | None:
    rows: list[tuple[str, int, int]] = []
    for path in files:
        try:
            stat = os.stat(path)
        except OSError:
            return None  # an unreadable file is reported by the full run
        rows.append((str(path), stat.st_size, stat.st_mtime_ns))
    return rows


def _options_key(options: AnalysisOptions) -> tuple[object, ...]:
    # Derived from the dataclass's fields, so an option added later can never be left out
    # of the key (a stale result would then be served for the new setting).
    key: list[tuple[str, object]] = []
    for item in fields(options):
        value: object = getattr(options, item.name)
        if isinstance(value, frozenset):
            value = sorted(str(member) for member in cast("frozenset[object]", value))
        key.append((item.name, value))
    return tuple(key)


class _Summaries:
    """Where the runner's summaries come from: the cache, then the process pool.

    The eager files' summaries stay in the pickled form the cache or a worker handed out
    (`held`) until a checker needs one, so that rebuilding thousands of them happens in the
    forked checkers, spread over the cores. `load` is the pipeline's summariser of one file.
    """

    def __init__(
        self,
        root: Path,
        jobs: int,
        cache: SummaryCache[ModuleSummary | FileError] | None,
        on_progress: Callable[[int], None] | None,
        max_bytes: int,
        summarizer: Callable[[str, bytes], ModuleSummary] = summarize,
    ) -> None:
        self.summarizer = summarizer
        self.root = root
        self.max_bytes = max_bytes
        self.jobs = jobs
        self.cache = cache
        self.on_progress = on_progress
        self.owner = os.getpid()
        self.held: dict[Path, Pickled[ModuleSummary]] = {}

    def many(
        self, paths: Sequence[Path]
    ) -> Mapping[Path, ModuleSummary | FileError | Pickled[ModuleSummary]]:
        # Imported here: a warm run, answered from the result cache, never loads the index.
        from kvref.audit.resolve.stdlib import standard_library_files

        return summarize_many(
            paths,
            root=self.root,
            jobs=self.jobs,
            cache=self.cache,
            summarize=self.summarizer,
            # A forked checker must not draw on its parent's progress bar.
            on_progress=self.on_progress if os.getpid() == self.owner else None,
            lazy=True,
            max_bytes=self.max_bytes,
            # The standard-library modules the classes derive from are summarised by the
            # pool too, so that the checking processes find them in the cache.
            follow=standard_library_files,
        )

    def load(self, path: Path) -> ModuleSummary | None:
        found = self.held.get(path) or self.many([path]).get(path)
        if isinstance(found, Pickled):
            try:
                found = found.load()
            except Exception:  # noqa: BLE001 - a summary that will not load is recomputed
                found = None
        if found is None:
            # Not summarised, or its summary would not load: summarised here, under the same
            # size limit (a FileError from the pool is final: too large, unreadable, invalid).
            from kvref.audit.pipeline import summarize_file

            found = summarize_file(path, self.root, self.max_bytes)
        return found if isinstance(found, ModuleSummary) else None


MIN_SHARE: Final = 200
"""Fewer reported modules than this per process are checked in one process: forking and
sending the answer back would cost more than the checks."""
_UNKNOWN_WEIGHT: Final = 4096  # about the pickled size of an average module's summary


@dataclass(frozen=True, slots=True)
class _Share:
    """What a checker found, and the summaries it made (which a forked child's cache would
    lose), for the parent's cache."""

    checked: Checked
    learned: bytes


def run_pipeline(
    project_files: Sequence[Path],
    *,
    root: Path,
    report_files: Collection[Path] | None = None,
    options: AnalysisOptions = AnalysisOptions(),
    roots: SearchRoots | None = None,
    jobs: int = 1,
    cache: SummaryCache[ModuleSummary | FileError] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> AnalysisResult:
    """The pipeline's stages, with the summary cache and the process pool around summarising
    and the reported modules checked in shares over forked copies of this process (at least
    `MIN_SHARE` modules each); the result is `kvref.audit.pipeline.analyze`'s."""
    from kvref.audit import pipeline
    from kvref.audit.rules import rules_for

    roots = roots or pipeline.SearchRoots()
    project = pipeline.plan(project_files, root=root, report_files=report_files, options=options)
    # Summaries kept on disk are complete; those of one run hold only what its rules read
    # (`Rule.reads_parameters`).
    keeps = cache is None or cache.persistent
    reads_parameters = any(rule.reads_parameters for rule in rules_for(options.rules))
    summarizer = summarize if keeps or reads_parameters else summarize_without_parameters
    summaries = _Summaries(
        project.root, jobs, cache, on_progress, options.max_file_bytes, summarizer
    )
    held = summaries.held
    ready: dict[Path, ModuleSummary | FileError] = {}
    for path, summary in summaries.many(project.eager).items():
        if isinstance(summary, Pickled):
            held[path] = summary
        else:
            ready[path] = summary
    reach = Reachability.for_floor(options.python_floor)
    indexed = pipeline.index_project(
        project, ready, summaries.load, roots, held=held.keys(), reach=reach
    )
    weights = [held[p].weight if p in held else _UNKNOWN_WEIGHT for p in indexed.checked]
    shares = _split(indexed.checked, weights, min(jobs, len(indexed.checked) // MIN_SHARE))
    parent = os.getpid()

    def check(paths: Sequence[Path]) -> _Share:
        mark = cache.stored_count if cache is not None else 0
        checked = pipeline.check(indexed, paths, options)
        # A forked checker's summaries die with it unless they are sent back (to be saved).
        forked = cache is not None and cache.persistent and os.getpid() != parent
        return _Share(checked, cache.export_stored(mark) if cache is not None and forked else b"")

    parts: list[Checked] = []
    for share in run_shares(shares, check, encode=dumps, decode=_decode_share):
        parts.append(share.checked)
        if share.learned and cache is not None:
            cache.import_stored(share.learned)
    return pipeline.collect(indexed, parts)


def _decode_share(data: bytes) -> _Share:
    share = loads(data)
    if not isinstance(share, _Share):
        raise TypeError(f"expected a share result, got {type(share).__name__}")
    return share


def _split(paths: Sequence[Path], weights: Sequence[int], count: int) -> list[list[Path]]:
    """Cut `paths` (sorted, so a package stays together) into `count` runs of similar weight."""
    if count <= 1:
        return [list(paths)]
    total = sum(weights)
    shares: list[list[Path]] = [[]]
    done = 0
    for path, weight in zip(paths, weights, strict=True):
        if done >= total * len(shares) / count and len(shares) < count:
            shares.append([])
        shares[-1].append(path)
        done += weight
    return [share for share in shares if share]


def analyze_at_scale(
    project_files: Sequence[Path],
    *,
    root: Path,
    report_files: Collection[Path] | None = None,
    options: AnalysisOptions = AnalysisOptions(),
    settings: ScaleSettings = ScaleSettings(),
    progress: TextIO | None = None,
) -> AnalysisResult:
    """Run the engine with caching, parallel summarising and the target environment.

    Args:
        project_files, root, report_files, options: as for `kvref.audit.pipeline.analyze`.
        settings: cache, interpreter and parallelism choices.
        progress: a terminal to draw a progress bar on (after a second), or None.

    Returns:
        The engine's result.

    Raises:
        InterpreterError: `settings.python` is not a working interpreter.
        ValueError: `settings.jobs` is below 1.
    """
    if settings.jobs is not None and settings.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {settings.jobs}")
    if settings.cache:
        # What the cache keeps serves any later selection: every rule runs (the command line
        # reports the selected ones).
        options = replace(options, rules=None)
    root = Path(os.path.abspath(root))
    environment = discover_environment(settings.python, project_root=root)
    # Files in syntax newer than this Python are parsed by the project's interpreter first.
    use_interpreter(environment.python, environment.version)
    newer = newer_syntax_key()  # which files parse depends on the interpreters at hand
    files = [absolute_path(path) for path in project_files]
    reported = None if report_files is None else sorted(os.path.abspath(p) for p in report_files)

    cache_dir = (settings.cache_dir or default_cache_dir(root)) if settings.cache else None
    results: ResultCache | None = None
    key: bytes = b""
    if cache_dir is not None:
        stats = _stats(files)
        if stats is not None:
            results = ResultCache(cache_dir, version_stamp(_engine_sources()))
            roots = [
                (str(path), path.stat().st_mtime_ns if path.is_dir() else 0)
                for path in environment.search_paths
            ]
            packages = [(name, str(path)) for name, path in environment.package_roots]
            packages.extend(("", str(path)) for path in environment.import_roots)
            key, newest = results.key(
                stats,
                [
                    str(root),
                    reported,
                    _options_key(options),
                    roots,
                    str(environment.stdlib),
                    packages,
                    newer,
                ],
            )
            cached = results.load(key, newest)
            if cached is not None:
                return cached

    # Without the on-disk cache the run still keeps its summaries in memory, so that the pool
    # summarises the standard-library modules the classes derive from once, alongside the
    # project, instead of each forked checker parsing them again while it checks.
    summaries = SummaryCache[ModuleSummary | FileError](
        cache_dir, summary_stamp(root, options.max_file_bytes, newer)
    )
    summaries.load()
    # The bar counts the reported files (summarised up front); other project files are read
    # only when a lookup reaches them, so they are not part of the total (the bar clamps).
    total = len(files) if reported is None else len(reported)
    bar = ProgressBar(total, progress) if progress is not None else None

    from kvref.audit.pipeline import SearchRoots

    try:
        result = run_pipeline(
            files,
            root=root,
            report_files=report_files,
            options=options,
            roots=SearchRoots(
                environment.search_paths, environment.package_roots, environment.import_roots
            ),
            jobs=settings.jobs or available_cpus(),
            cache=summaries,
            on_progress=bar.advance if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.close()
    if summaries.persistent:
        summaries.forget_missing(files)

    def save() -> None:
        try:
            summaries.save()
            if results is not None:
                results.save(key, result)
        except OSError:
            pass  # a read-only checkout: the next run is simply uncached too

    if settings.background_save and (summaries.persistent or results is not None):
        _save_in_background(save)
    else:
        save()
    return result


_saving: list[int] = []


def _save_in_background(save: Callable[[], None]) -> None:
    """Run `save` in a forked child (while this process reports); `wait_for_saves` joins it.

    Pickling and writing the caches of a large project would otherwise come between the
    analysis and the report. Where fork is not available, or fails, it runs here.
    """
    if not fork_available():
        save()
        return
    try:
        pid = os.fork()
    except OSError:
        save()
        return
    if pid == 0:
        try:
            save()
        finally:
            os._exit(0)  # noqa: SLF001 - a forked child must not run the parent's exit code
    _saving.append(pid)


def wait_for_saves() -> None:
    """Wait until the caches being written in the background are on disk."""
    while _saving:
        pid = _saving.pop()
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
