"""The analysis as stages over data: plan the project, summarise, index, check, collect.

`analyze` runs them in one process, in that order. Each stage is a function a runner may call
itself (`kvref.audit.runner.scale` does, with its cache, pool and forked checkers around them).

Findings are returned only for the reported files (the files pre-commit passed, say), with
project-relative `/` paths, sorted by (path, line, col, code). Files that cannot be read,
decoded or parsed become `FileError`s and the rest is still audited; selection and suppression
of codes happen later (`kvref.audit.filtering`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvref.audit.dependents import dependent_classes, owning_class
from kvref.audit.discover.paths import absolute_path, relative_path
from kvref.audit.layout import Layout, Load, SearchRoots, build_index, name_files
from kvref.audit.model import AnalysisOptions, AnalysisResult, FileError, Finding
from kvref.audit.resolve.hierarchy import ProjectIndex
from kvref.audit.resolve.reachability import Reachability
from kvref.audit.resolve.targets import ClassInfo, ClassKey, Unresolved
from kvref.audit.rules import rules_for
from kvref.audit.rules.context import ClassContext, ModuleContext
from kvref.audit.source import read_source, summary_or_error
from kvref.audit.summarise.records import ModuleSummary
from kvref.audit.summarise.summary import summarize

__all__ = [
    "Analysed",
    "Checked",
    "Indexed",
    "Layout",
    "Project",
    "SearchRoots",
    "SummarizeMany",
    "analyze",
    "analyze_project",
    "check",
    "collect",
    "index_project",
    "plan",
    "summarize_file",
]

SummarizeMany = Callable[[Sequence[Path]], Mapping[Path, ModuleSummary | FileError]]
_DEFAULT_OPTIONS = AnalysisOptions()
_NO_ROOTS = SearchRoots()
_REFUSED = ("(inconsistent MRO)", "(circular bases)")


@dataclass(frozen=True, slots=True)
class Project:
    """Which files make up the project, which are reported on, and which to summarise first.

    A partial run (pre-commit passes the changed files) also reports the classes of other
    files that derive from the reported files' classes: renaming a base method makes the
    unchanged subclass's @override stale, and the commit that did it must see that. Every
    project file is then summarised up front to find those subclasses; otherwise only the
    reported ones are, and any other file when a name is first looked up in it.
    """

    root: Path
    files: tuple[Path, ...]
    reported: frozenset[Path]
    partial: bool

    @property
    def eager(self) -> list[Path]:
        """The files to summarise before indexing (in no particular order: reported files are
        few in the editor, where this is asked on every edit of a big project)."""
        return list(self.files) if self.partial else sorted(self.reported)


@dataclass(frozen=True, slots=True)
class Indexed:
    """The project indexed: every module's name, the index, and what to check."""

    project: Project
    primary: dict[Path, str]
    index: ProjectIndex
    errors: list[FileError]
    dependents: dict[Path, frozenset[str]]
    checked: list[Path]
    """The modules to check (reported or dependent, summarised without error), sorted so a
    package stays together."""
    layout: Layout
    """The module names it was built with (to pass back to `index_project`)."""

    @property
    def unreadable_tops(self) -> frozenset[str]:
        """The top-level names of project files that could not be summarised (reported as
        file errors, so never as packages missing from the environment)."""
        return self.layout.unreadable_tops


@dataclass(frozen=True, slots=True)
class Checked:
    """What checking some modules found."""

    findings: list[Finding]
    errors: list[FileError]
    unresolved: dict[str, int]
    suppression_lines: dict[str, tuple[int, ...]]


def summarize_file(
    path: Path, root: Path, max_bytes: int | None = None
) -> ModuleSummary | FileError:
    """Read and summarize one file; unreadable or unparsable files become a `FileError`.

    Args:
        path: the file.
        root: the project root, for the relative path recorded in the summary or error.
        max_bytes: a larger file is a `FileError` instead of being parsed (None: no limit).

    Returns:
        The summary, or the error with a 1-based line and column (1, 1 when not positional).
    """
    relative = relative_path(path, root)
    source, _ = read_source(path, relative, max_bytes)
    if isinstance(source, FileError):
        return source
    return summary_or_error(relative, source, summarize)


def plan(
    project_files: Sequence[Path],
    *,
    root: Path,
    report_files: Collection[Path] | None,
    options: AnalysisOptions,
) -> Project:
    """Stage 1: the project's files, absolute and deduplicated (reported files not among
    `project_files` are added)."""
    files = list(dict.fromkeys(absolute_path(p) for p in project_files))
    reported = set(files) if report_files is None else {absolute_path(p) for p in report_files}
    files.extend(sorted(reported.difference(files)))
    partial = options.report_dependents and len(reported) < len(files)
    return Project(Path(os.path.abspath(root)), tuple(files), frozenset(reported), partial)


def index_project(
    project: Project,
    summaries: Mapping[Path, ModuleSummary | FileError],
    load: Load,
    roots: SearchRoots = _NO_ROOTS,
    *,
    held: Collection[Path] = (),
    reach: Reachability | None = None,
    layouts: Iterable[Layout] = (),
) -> Indexed:
    """Stage 3: index the project and decide what to check.

    Args:
        project: from `plan`.
        summaries: the `project.eager` files summarised (a file missing from it is
            summarised by `load`, as every other project file is, when a lookup reaches it).
        load: summarises one file (project, standard library or installed), None when it
            cannot be read or parsed.
        roots: where names outside the project are looked up.
        held: eager files summarised without error whose summaries `load` still holds (so
            they are not in `summaries`).
        reach: decides version and platform checks (default: the running interpreter's).
        layouts: the `Indexed.layout`s of earlier calls: the one that fits these files (and
            the same ones failing) is reused.
    """
    errors: list[FileError] = []
    failed: set[Path] = set()
    loaded: dict[Path, ModuleSummary] = {}
    for path in project.eager:
        summary = summaries.get(path)
        if summary is None and path not in held:
            summary = summarize_file(path, project.root)
        if isinstance(summary, FileError):
            failed.add(path)
            if path in project.reported:
                errors.append(summary)
        elif summary is not None:
            loaded[path] = summary
    layout = next((known for known in layouts if known.fits(project.files, failed, roots)), None)
    if layout is None:
        layout = name_files(project.root, project.files, frozenset(failed), roots)
    index = build_index(layout, loaded, load, reach)
    primary = layout.primary
    summarised = set(project.eager).difference(failed)
    dependents = dependent_classes(project.reported, summarised, primary, index) if project.partial else {}
    checked = sorted(p for p in project.reported.union(dependents).intersection(summarised) if p.suffix != ".pyi")
    return Indexed(project, primary, index, errors, dependents, checked, layout)


def check(indexed: Indexed, paths: Iterable[Path], options: AnalysisOptions) -> Checked:
    """Stage 4: run the rules of `options.rules` (every rule by default) on the modules at
    `paths` (some of `indexed.checked`)."""
    rules = rules_for(options.rules)
    unresolved: Counter[str] = Counter()
    findings: list[Finding] = []
    errors: list[FileError] = []
    suppression_lines: dict[str, tuple[int, ...]] = {}
    index, root = indexed.index, indexed.project.root
    for path in paths:
        summary = index.module(indexed.primary[path])
        if summary is None:  # its stored form would not load, nor would the file parse
            error = summarize_file(path, root)
            if isinstance(error, FileError):
                errors.append(error)
            continue
        context = _module_context(summary, indexed.primary[path], index, options, unresolved)
        affected = indexed.dependents.get(path)
        for rule in rules:
            if affected is None:
                findings.extend(rule.check(context))
            else:  # an unchanged file: only what its derived classes' bases changed
                findings.extend(
                    finding
                    for finding in rule.check(context)
                    if owning_class(finding.symbol, summary) in affected
                )
        if summary.suppression_lines:
            suppression_lines[summary.path] = summary.suppression_lines
    return Checked(findings, errors, dict(unresolved), suppression_lines)


def collect(indexed: Indexed, parts: Iterable[Checked]) -> AnalysisResult:
    """Stage 5: one sorted result from the checks of all the shares."""
    result = AnalysisResult(errors=list(indexed.errors))
    result.files_analyzed = len(indexed.primary)
    result.dependent_paths = tuple(
        sorted(relative_path(path, indexed.project.root) for path in indexed.dependents)
    )
    unresolved: Counter[str] = Counter()
    suppression_lines: dict[str, tuple[int, ...]] = {}
    for part in parts:
        result.findings.extend(part.findings)
        result.errors.extend(part.errors)
        unresolved.update(part.unresolved)
        suppression_lines.update(part.suppression_lines)
    result.findings.sort(key=lambda f: (f.path, f.line, f.col, f.code))
    result.errors.sort(key=lambda e: (e.path, e.line, e.col))
    result.unresolved_bases = dict(sorted(unresolved.items()))
    result.missing_modules = _missing_modules(unresolved, indexed.index, indexed.unreadable_tops)
    result.suppression_lines = dict(sorted(suppression_lines.items()))
    return result


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
) -> AnalysisResult:
    """Audit a project, in this process.

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
        summarize_many: summarizes a batch of files, returning a mapping keyed by the paths
            it was given: the files summarised up front at once, then each other file the
            lookups reach; by default each file goes through `summarize_file`.

    Returns:
        The findings of every rule, file errors, unresolved bases and the file count.
    """
    project = plan(project_files, root=root, report_files=report_files, options=options)
    roots = SearchRoots(search_paths, package_roots, import_roots)
    return analyze_project(project, options=options, roots=roots, summarize_many=summarize_many).result


@dataclass(frozen=True, slots=True)
class Analysed:
    """What `analyze_project` found, and the layout it used (to pass to its next calls)."""

    result: AnalysisResult
    layout: Layout


def analyze_project(
    project: Project,
    *,
    options: AnalysisOptions = _DEFAULT_OPTIONS,
    roots: SearchRoots = _NO_ROOTS,
    summarize_many: SummarizeMany | None = None,
    layouts: Iterable[Layout] = (),
) -> Analysed:
    """`analyze` for a planned project, reusing the one of `layouts` that fits (see `Layout`):
    a caller that audits the same files again (`kvref server`) plans once and names the files
    once."""

    def each(paths: Sequence[Path]) -> Mapping[Path, ModuleSummary | FileError]:
        return {path: summarize_file(path, project.root) for path in paths}

    many = summarize_many or each

    def load(path: Path) -> ModuleSummary | None:
        summary = many([path]).get(path) or summarize_file(path, project.root)
        return summary if isinstance(summary, ModuleSummary) else None

    reach = Reachability.for_floor(options.python_floor)  # the project's, for version checks
    indexed = index_project(project, many(project.eager), load, roots, reach=reach, layouts=layouts)
    result = collect(indexed, [check(indexed, indexed.checked, options)])
    return Analysed(result, indexed.layout)


def _missing_modules(
    unresolved: Mapping[str, int], index: ProjectIndex, unreadable_tops: Collection[str]
) -> dict[str, int]:
    """The top-level modules that cannot be found at all, with how many classes' bases lead
    into them: the packages not installed where kvref looked (one lookup per distinct name,
    after the checks, so the hot path pays nothing). A project file that could not be read
    is not one: its file error says why."""
    missing: Counter[str] = Counter()
    known: dict[str, bool] = {}
    for name, count in unresolved.items():
        top = name.partition(".")[0]
        if not top.isidentifier() or "(" in name:
            continue  # `<expression>`, a call (`Manager.from_queryset(QS)`): nothing to install
        if top not in known:
            known[top] = top in unreadable_tops or index.module_exists(top)
        if not known[top]:
            missing[top] += count
    return dict(sorted(missing.items(), key=lambda item: (-item[1], item[0])))


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
        if cls.guard and not index.reach.reaches(cls.guard):
            continue  # code the type checkers never analyse (`if not TYPE_CHECKING:`)
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
