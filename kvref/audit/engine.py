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
from pathlib import Path

from kvref.audit.context import ClassContext, ModuleContext
from kvref.audit.model import AnalysisOptions, AnalysisResult, FileError
from kvref.audit.paths import absolute_path, relative_path
from kvref.audit.resolve import ClassInfo, ClassKey, ProjectIndex, Unresolved, module_names_for
from kvref.audit.rules import ALL_RULES
from kvref.audit.summary import ModuleSummary, SummaryError, summarize

__all__ = ["SummarizeMany", "analyze", "relative_path", "summarize_file"]

SummarizeMany = Callable[[Sequence[Path]], Mapping[Path, ModuleSummary | FileError]]
_DEFAULT_OPTIONS = AnalysisOptions()
_REFUSED = ("(inconsistent MRO)", "(circular bases)")


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
    summarize_many: SummarizeMany | None = None,
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
        summarize_many: summarizes a batch of files (parallel, cached...): the reported
            files at once, then each other file the lookups reach; by default each file goes
            through `summarize_file`. It returns a mapping keyed by the paths it was given.

    Returns:
        The findings of every rule, file errors, unresolved bases and the file count.
    """
    root = Path(os.path.abspath(root))
    files = list(dict.fromkeys(absolute_path(p) for p in project_files))
    reported = set(files) if report_files is None else {absolute_path(p) for p in report_files}
    files.extend(sorted(reported.difference(files)))
    # Only the reported files are summarized up front; any other project file is summarized
    # when a name is first looked up in it (a base class, a re-export), so auditing one file
    # of a big project reads that file and the modules its classes' bases lead to.
    eager = [path for path in files if path in reported]
    if summarize_many is not None:
        summaries = dict(summarize_many(eager))
    else:
        summaries = {path: summarize_file(path, root) for path in eager}

    def load(path: Path) -> ModuleSummary | None:
        loaded = (
            summarize_many([path]).get(path) if summarize_many is not None else None
        ) or summarize_file(path, root)
        return loaded if isinstance(loaded, ModuleSummary) else None

    result = AnalysisResult()
    good: dict[Path, ModuleSummary] = {}
    for path in eager:
        summary = summaries.get(path)
        if summary is None:
            summary = summarize_file(path, root)
        if isinstance(summary, FileError):
            result.errors.append(summary)
        else:
            good[path] = summary
    deferred = [path for path in files if path not in reported]
    result.files_analyzed = len(good) + len(deferred)

    primary, index = _build_index(good, deferred, load, root, search_paths)
    unresolved: Counter[str] = Counter()
    for path in sorted(reported.intersection(good)):
        context = _module_context(good[path], primary[path], index, options, unresolved)
        for rule in ALL_RULES:
            result.findings.extend(rule.check(context))
    result.findings.sort(key=lambda f: (f.path, f.line, f.col, f.code))
    result.errors.sort(key=lambda e: (e.path, e.line, e.col))
    result.unresolved_bases = dict(sorted(unresolved.items()))
    result.suppression_lines = {
        summary.path: summary.suppression_lines
        for summary in good.values()
        if summary.suppression_lines
    }
    return result


def _build_index(
    summaries: Mapping[Path, ModuleSummary],
    deferred: Sequence[Path],
    load: Callable[[Path], ModuleSummary | None],
    root: Path,
    search_paths: Sequence[Path],
) -> tuple[dict[Path, str], ProjectIndex]:
    paths = [*summaries, *deferred]
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
    names = {path: module_names_for(str(path), root_text, is_package) for path in paths}
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
