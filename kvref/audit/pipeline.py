"""The analysis: summarize every project file, index them, run every rule on the reported ones.

`analyze` indexes the whole project but returns findings only for `report_files` (the files
pre-commit passed, say), with project-relative `/` paths, sorted by (path, line, col, code).
Files that cannot be read, decoded or parsed become `FileError`s and the rest is still
audited. Selection and suppression of codes happen later, in the command line.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

from kvref.audit.runner.cache import dumps, loads
from kvref.audit.rules.context import ClassContext, ModuleContext
from kvref.audit.runner.forked import run_shares
from kvref.audit.model import AnalysisOptions, AnalysisResult, FileError, Finding
from kvref.audit.discover.paths import absolute_path, relative_path
from kvref.audit.resolve.hierarchy import ProjectIndex
from kvref.audit.resolve.modules import module_names_for
from kvref.audit.resolve.targets import ClassInfo, ClassKey, Unresolved
from kvref.audit.rules import ALL_RULES
from kvref.audit.summarise.summary import ModuleSummary, SummaryError, summarize

__all__ = [
    "LazySummary",
    "SharedSummaries",
    "SummarizeMany",
    "analyze",
    "relative_path",
    "summarize_file",
]


class LazySummary(Protocol):
    """A summary not built yet (still pickled, say): `load()` builds it, where it is needed."""

    @property
    def weight(self) -> int:
        """A relative measure of the work its module stands for (to balance shares)."""
        ...

    def load(self) -> ModuleSummary:
        """Build the summary; raises if it cannot (the file is then summarised again)."""
        ...


@runtime_checkable
class SharedSummaries(Protocol):
    """What a `summarize_many` may offer so that summaries computed in forked checkers (of
    modules their lookups reached) come back to the parent, to be cached with the rest."""

    def mark(self) -> int:
        """A position in what has been summarised so far."""
        ...

    def export_since(self, mark: int) -> bytes:
        """What was summarised after `mark`, as bytes for `import_exported`."""
        ...

    def import_exported(self, data: bytes) -> None:
        """Keep what another process's `export_since` returned."""
        ...


SummarizeMany = Callable[[Sequence[Path]], Mapping[Path, ModuleSummary | FileError | LazySummary]]
_DEFAULT_OPTIONS = AnalysisOptions()
_REFUSED = ("(inconsistent MRO)", "(circular bases)")
MIN_SHARE: Final = 200
"""Fewer reported modules than this per process are checked in one process: forking and
sending the answer back would cost more than the checks."""
_UNKNOWN_WEIGHT: Final = 4096  # about the pickled size of an average module's summary


@dataclass(frozen=True, slots=True)
class _ShareResult:
    """What checking one share of the reported modules found (sent back by a forked child)."""

    findings: list[Finding]
    errors: list[FileError]
    unresolved: dict[str, int]
    suppression_lines: dict[str, tuple[int, ...]]
    learned: bytes


def summarize_file(path: Path, root: Path) -> ModuleSummary | FileError:
    """Read and summarize one file; unreadable or unparsable files become a `FileError`.

    Args:
        path: the file.
        root: the project root, for the relative path recorded in the summary or error.

    Returns:
        The summary, or the error with a 1-based line and column (1, 1 when not positional).
    """
    relative = relative_path(path, root)
    try:
        source = path.read_bytes()
    except OSError as error:
        return FileError(relative, 1, 1, f"cannot read: {error.strerror or error}")
    try:
        return summarize(relative, source)
    except SummaryError as error:
        return FileError(relative, error.line, error.col, error.message)


def analyze(
    project_files: Sequence[Path],
    *,
    root: Path,
    report_files: Collection[Path] | None = None,
    options: AnalysisOptions = _DEFAULT_OPTIONS,
    search_paths: Sequence[Path] = (),
    package_roots: Sequence[tuple[str, Path]] = (),
    import_roots: Sequence[Path] = (),
    summarize_many: SummarizeMany | None = None,
    jobs: int = 1,
) -> AnalysisResult:
    """Audit a project.

    Args:
        project_files: every Python file of the project (all are indexed: the reported ones
            are summarized first, any other when a name is first looked up in it).
        root: the project root: paths are reported relative to it and module names derive
            from it (a `src/` layout is understood).
        report_files: the files to report findings and errors for (default: all). Files
            not in `project_files` are added to the project.
        options: the policy choices of the override rules.
        search_paths: extra roots for installed packages (site-packages), searched after the
            project; the standard library comes from the running interpreter.
        package_roots: (package name, directory) of editable installs made through an
            import hook, searched after `search_paths`.
        import_roots: directories inside the project that the interpreter imports from
            (besides the root and `src/`): the project's modules are named from them too.
        summarize_many: summarizes a batch of files (parallel, cached...): the reported
            files at once, then each other file the lookups reach; by default each file goes
            through `summarize_file`. It returns a mapping keyed by the paths it was given,
            whose summaries may be `LazySummary`s; if it is also `SharedSummaries`, what
            forked checkers summarise comes back to it.
        jobs: processes to check in (forked, where the platform allows it), at least
            `MIN_SHARE` reported modules each; the findings do not depend on it.

    Returns:
        The findings of every rule, file errors, unresolved bases and the file count.
    """
    root = Path(os.path.abspath(root))
    files = list(dict.fromkeys(absolute_path(p) for p in project_files))
    reported = set(files) if report_files is None else {absolute_path(p) for p in report_files}
    files.extend(sorted(reported.difference(files)))
    # A partial run (pre-commit passes the changed files) also reports the classes of other
    # files that derive from the reported files' classes: renaming a base method makes the
    # unchanged subclass's @override stale, and the commit that did it must see that. Every
    # project file is summarized (from the cache, when warm) to find those subclasses.
    # Without other files, only the reported ones are summarized up front; any other is
    # summarized when a name is first looked up in it.
    partial = options.report_dependents and len(reported) < len(files)
    eager = list(files) if partial else [path for path in files if path in reported]
    if summarize_many is not None:
        summaries = dict(summarize_many(eager))
    else:
        summaries = {path: summarize_file(path, root) for path in eager}

    def load(path: Path) -> ModuleSummary | None:
        loaded = (
            summarize_many([path]).get(path) if summarize_many is not None else None
        ) or summarize_file(path, root)
        if isinstance(loaded, FileError):
            return None
        return loaded if isinstance(loaded, ModuleSummary) else _load_lazy(path, loaded, root)

    result = AnalysisResult()
    good: dict[Path, ModuleSummary] = {}
    lazy: dict[Path, LazySummary] = {}
    for path in eager:
        summary = summaries.get(path)
        if summary is None:
            summary = summarize_file(path, root)
        if isinstance(summary, FileError):
            if path in reported:
                result.errors.append(summary)
        elif isinstance(summary, ModuleSummary):
            good[path] = summary
        else:
            lazy[path] = summary
    deferred = [path for path in files if path not in reported]
    result.files_analyzed = len(good) + len(lazy) + len(deferred)

    primary, index = _build_index(
        good, lazy, deferred, load, root, search_paths, package_roots, import_roots
    )
    dependents = (
        _dependent_classes(reported, good, lazy, primary, index, root) if partial else {}
    )
    result.dependent_paths = tuple(sorted(relative_path(path, root) for path in dependents))
    shared = summarize_many if isinstance(summarize_many, SharedSummaries) else None
    parent = os.getpid()

    def check(paths: Sequence[Path]) -> _ShareResult:
        mark = shared.mark() if shared is not None else 0
        unresolved: Counter[str] = Counter()
        findings: list[Finding] = []
        errors: list[FileError] = []
        suppression_lines: dict[str, tuple[int, ...]] = {}
        for path in paths:
            summary = good.get(path) or index.module(primary[path])
            if summary is None:  # its lazy form would not load, nor would the file parse
                error = summarize_file(path, root)
                if isinstance(error, FileError):
                    errors.append(error)
                continue
            context = _module_context(summary, primary[path], index, options, unresolved)
            affected = dependents.get(path)
            for rule in ALL_RULES:
                if affected is None:
                    findings.extend(rule.check(context))
                else:  # an unchanged file: only what its derived classes' bases changed
                    findings.extend(
                        finding
                        for finding in rule.check(context)
                        if _owning_class(finding.symbol, summary) in affected
                    )
            if summary.suppression_lines:
                suppression_lines[summary.path] = summary.suppression_lines
        # A forked checker's summaries die with it unless they are sent back.
        learned = shared.export_since(mark) if shared is not None and os.getpid() != parent else b""
        return _ShareResult(findings, errors, dict(unresolved), suppression_lines, learned)

    checked = sorted(reported.union(dependents).intersection(good.keys() | lazy.keys()))
    weights = [lazy[path].weight if path in lazy else _UNKNOWN_WEIGHT for path in checked]
    shares = _split(checked, weights, min(jobs, len(checked) // MIN_SHARE))
    unresolved: Counter[str] = Counter()
    suppression_lines: dict[str, tuple[int, ...]] = {}
    for share in run_shares(shares, check, encode=dumps, decode=_decode_share):
        result.findings.extend(share.findings)
        result.errors.extend(share.errors)
        unresolved.update(share.unresolved)
        suppression_lines.update(share.suppression_lines)
        if share.learned and shared is not None:
            shared.import_exported(share.learned)
    result.findings.sort(key=lambda f: (f.path, f.line, f.col, f.code))
    result.errors.sort(key=lambda e: (e.path, e.line, e.col))
    result.unresolved_bases = dict(sorted(unresolved.items()))
    result.missing_modules = _missing_modules(unresolved, index)
    result.suppression_lines = dict(sorted(suppression_lines.items()))
    return result


def _owning_class(symbol: str, summary: ModuleSummary) -> str:
    """The innermost class of `summary` that a finding's symbol (`Class.method[.param]`) is in."""
    qualnames = {cls.qualname for cls in summary.classes}
    owner = symbol
    while owner:
        owner = owner.rpartition(".")[0]
        if owner in qualnames:
            return owner
    return ""


def _dependent_classes(
    reported: Collection[Path],
    good: Mapping[Path, ModuleSummary],
    lazy: Mapping[Path, LazySummary],
    primary: Mapping[Path, str],
    index: ProjectIndex,
    root: Path,
) -> dict[Path, frozenset[str]]:
    """The classes outside `reported` that derive from a class defined in a reported file.

    Returns:
        For each unreported file with such classes, their qualified names, and the names of
        the classes nested in them (a finding's symbol is `Class.method`).
    """
    changed_modules = {primary[path] for path in reported if path in primary}

    def summary_of(path: Path) -> ModuleSummary | None:
        found = good.get(path)
        return found if found is not None else _load_lazy(path, lazy[path], root)

    others = {
        path: summary
        for path in sorted(good.keys() | lazy.keys())
        if path not in reported and (summary := summary_of(path)) is not None
    }
    # Which classes can derive from a changed one is first decided by name (a base spelled
    # `Base` or `mod.Base`), growing the names with each subclass found, so that only the
    # few candidate classes have their MROs resolved.
    names: set[str] = set()
    for path in reported:
        summary = summary_of(path) if path in good or path in lazy else None
        if summary is not None:
            names.update(cls.name for cls in summary.classes)
    candidates: dict[Path, list[str]] = {}
    grew = True
    while grew:
        grew = False
        for path, summary in others.items():
            for cls in summary.classes:
                if cls.qualname in candidates.get(path, ()):
                    continue
                if any(base.dotted.rpartition(".")[2] in names for base in cls.bases):
                    candidates.setdefault(path, []).append(cls.qualname)
                    if cls.name not in names:
                        names.add(cls.name)
                        grew = True
    dependents: dict[Path, frozenset[str]] = {}
    for path, qualnames in candidates.items():
        affected = {
            qualname
            for qualname in qualnames
            if any(
                ancestor.module in changed_modules
                for ancestor in index.known_ancestors(ClassKey(primary[path], qualname))
            )
        }
        if affected:
            dependents[path] = frozenset(affected)
    return dependents


def _load_lazy(path: Path, lazy: LazySummary, root: Path) -> ModuleSummary | None:
    try:
        summary = lazy.load()
    except Exception:  # noqa: BLE001 - a summary that will not load is recomputed
        summary = None
    if not isinstance(summary, ModuleSummary):
        fresh = summarize_file(path, root)
        return fresh if isinstance(fresh, ModuleSummary) else None
    return summary


def _decode_share(data: bytes) -> _ShareResult:
    share = loads(data)
    if not isinstance(share, _ShareResult):
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


def _missing_modules(unresolved: Mapping[str, int], index: ProjectIndex) -> dict[str, int]:
    """The top-level modules that cannot be found at all, with how many classes' bases lead
    into them: the packages not installed where kvref looked (one lookup per distinct name,
    after the checks, so the hot path pays nothing)."""
    missing: Counter[str] = Counter()
    known: dict[str, bool] = {}
    for name, count in unresolved.items():
        top = name.partition(".")[0]
        if not top.isidentifier() or "(" in name:
            continue  # `<expression>`, a call (`Manager.from_queryset(QS)`): nothing to install
        if top not in known:
            known[top] = index.module_exists(top)
        if not known[top]:
            missing[top] += count
    return dict(sorted(missing.items(), key=lambda item: (-item[1], item[0])))


def _build_index(
    summaries: Mapping[Path, ModuleSummary],
    lazy: Mapping[Path, LazySummary],
    deferred: Sequence[Path],
    load: Callable[[Path], ModuleSummary | None],
    root: Path,
    search_paths: Sequence[Path],
    package_roots: Sequence[tuple[str, Path]] = (),
    import_roots: Sequence[Path] = (),
) -> tuple[dict[Path, str], ProjectIndex]:
    paths = [*summaries, *lazy, *deferred]
    package_dirs = {
        os.path.dirname(str(path)) for path in paths if path.name in ("__init__.py", "__init__.pyi")
    }
    known: dict[str, bool] = {}

    def is_package(directory: str) -> bool:
        if directory in package_dirs:
            return True
        if directory not in known:
            known[directory] = os.path.isfile(
                os.path.join(directory, "__init__.py")
            ) or os.path.isfile(os.path.join(directory, "__init__.pyi"))
        return known[directory]

    root_text = str(root)
    # The import roots, the deepest first: those the interpreter imports from, a src layout's
    # `src/`, then the root (`module_names_for` skips any that is a package itself).
    source = os.path.join(root_text, "src")
    extra = {str(path) for path in import_roots}
    if os.path.isdir(source):
        extra.add(source)
    extra.discard(root_text)
    roots = [*sorted(extra, key=lambda path: (-path.count(os.sep), path)), root_text]
    names = {path: module_names_for(str(path), roots, is_package) for path in paths}
    modules: dict[str, ModuleSummary] = {}
    loaders: dict[str, Callable[[], ModuleSummary | None]] = {}
    primary: dict[Path, str] = {}
    # Implementations before stubs, then path order: the first claim of a name wins.
    ordered = sorted(paths, key=lambda p: (p.suffix == ".pyi", str(p)))
    for path in ordered:
        name = names[path][0]
        if name in modules or name in loaders:
            name = f"{name}@{relative_path(path, root)}"  # a duplicate: indexed, not importable
        summary = summaries.get(path)
        if summary is not None:
            modules[name] = summary
        elif path in lazy:
            loaders[name] = functools.partial(_load_lazy, path, lazy[path], root)
        else:
            loaders[name] = functools.partial(load, path)
        primary[path] = name
    aliases: dict[str, str] = {}
    for path in ordered:
        for alias in names[path][1:]:
            if alias not in modules and alias not in aliases:
                aliases[alias] = primary[path]
    packages = {primary[path] for path in paths if path.name in ("__init__.py", "__init__.pyi")}
    scripts = {primary[path] for path in paths if not is_package(os.path.dirname(str(path)))}
    index = ProjectIndex(
        modules,
        deferred=loaders,
        aliases=aliases,
        packages=packages,
        scripts=scripts,
        search_paths=search_paths,
        package_roots=package_roots,
        summarize_external=load,
    )
    return primary, index


def _module_context(
    summary: ModuleSummary,
    module: str,
    index: ProjectIndex,
    options: AnalysisOptions,
    unresolved: Counter[str],
) -> ModuleContext:
    classes: list[ClassContext] = []
    partial: list[ClassInfo] = []
    for cls in summary.classes:
        key = ClassKey(module, cls.qualname)
        try:
            mro = index.mro(key)
        except RecursionError:  # hundreds of levels of inheritance: treat as unknown
            mro = Unresolved(frozenset({f"{key.dotted} (hierarchy too deep)"}))
        info = index.class_info(key)
        if isinstance(mro, Unresolved) or info is None:
            names = mro.names if isinstance(mro, Unresolved) else frozenset({key.dotted})
            unresolved.update(names)
            # Only a missing base leaves the rest trustworthy; a class Python itself refuses
            # (inconsistent MRO, circular bases) gets no finding.
            if info is not None and not any(name.endswith(_REFUSED) for name in names):
                partial.append(info)
            continue
        classes.append(ClassContext(info, mro))
    return ModuleContext(summary.path, module, summary, classes, index, options, partial)
