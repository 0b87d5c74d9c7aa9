"""One project as the server sees it: its settings, files and environment, found from a file
the way `kvref audit - --stdin-filename FILE` finds them, and its findings for the editor's
texts computed by the audit's own pipeline (`kvref.audit.pipeline.analyze_project`), filtered
as the command line filters them (`kvref.audit.filtering`, the baseline).

An edit costs what the edited texts need, not what the project's size does: the project's
files are planned and named once (`kvref.audit.layout.Layout`, kept until the file list
changes), each edit summarises only the texts that changed, and the files a lookup reaches are
summarised from memory (`DiskSummaries`).

Everything here blocks (files, the target interpreter, analysis): the language server calls it
from its one analysis thread, never from the thread that reads the protocol.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Collection, Generator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvref.audit.catalogue import RuleInfo
from kvref.audit.discover.config import AuditConfig, SelectionLayer, configure, find_project_root
from kvref.audit.discover.environment import Environment, discover_environment, find_interpreter
from kvref.audit.discover.files import discover
from kvref.audit.discover.paths import absolute_path, relative_path
from kvref.audit.layout import Layout, SearchRoots
from kvref.audit.filtering import shown_findings
from kvref.audit.fixes.edits import FixError, apply_fixes
from kvref.audit.fixes.plan import plan_fixes
from kvref.audit.model import AnalysisResult, FileError, Finding
from kvref.audit.pipeline import Project, analyze_project
from kvref.audit.report.baseline import apply_scoped_baseline
from kvref.audit.runner.cache import default_cache_dir
from kvref.audit.source import summary_or_error
from kvref.audit.summarise.newer_syntax import use_interpreter
from kvref.audit.summarise.records import ModuleSummary
from kvref.audit.summarise.summary import summarize
from kvref.errors import KVRefError
from kvref.server.disk_summaries import DiskSummaries
from kvref.server.settings import ServerSettings

__all__ = ["DocumentFindings", "ProjectSession", "project_root_of"]

# As `kvref audit --fix`: fixing can expose a finding that exists only once another is fixed.
_MAX_FIX_ROUNDS = 4
_INDEX_BATCH = 24
_LAYOUTS_KEPT = 2


@dataclass(frozen=True, slots=True)
class DocumentFindings:
    """What the audit says about one document's text: its findings, or why it has none (the
    text does not parse, say), and whether the project audits it at all."""

    findings: tuple[Finding, ...] = ()
    error: FileError | None = None
    audited: bool = True


def project_root_of(path: Path, cwd: Path) -> Path:
    """The root of the project `path` belongs to (the nearest `pyproject.toml` above it)."""
    return find_project_root([path], cwd)[0]


class ProjectSession:
    """A project's settings, files, environment and disk summaries, kept between edits.

    Args:
        path: a file of the project (the project is found from it as for `--stdin-filename`).
        settings: the server's settings.
        rules: every rule.
        cwd: the directory relative settings are taken from.

    Raises:
        KVRefError: the configuration is invalid, or `python` names no interpreter (the
            message says which, as `kvref audit` would).
    """

    def __init__(self, path: Path, settings: ServerSettings, rules: Sequence[RuleInfo], cwd: Path) -> None:
        layer = SelectionLayer(select=settings.select, extend_select=settings.extend_select, ignore=settings.ignore)
        config, selected = configure(cwd, (path,), settings.configuration, rules, layer)
        python = find_interpreter(settings.python, cwd=cwd, project_root=None)
        if python is None:
            python = find_interpreter(None, cwd=cwd, project_root=config.root)
        self.config: AuditConfig = config
        self.root = config.root
        self.selected = selected
        self.rules = tuple(rules)
        self.environment: Environment = discover_environment(python, project_root=config.root)
        self._use_interpreter()
        cache_dir = default_cache_dir(self.root) if settings.cache else None
        self.disk = DiskSummaries(self.root, config.options.max_file_bytes, cache_dir)
        self.files: tuple[Path, ...] = ()
        self._file_set: frozenset[Path] = frozenset()
        self._audited: dict[Path, tuple[bytes, bool]] = {}
        self._unindexed: list[Path] = []
        # The project's naming, most recent first: with every open buffer parsing, and with
        # one that does not (typing breaks and mends the text all the time).
        self._layouts: list[Layout] = []
        self._project_files: tuple[Path, ...] = ()
        self.refresh_files()
        self._texts: dict[Path, tuple[bytes, ModuleSummary | FileError]] = {}
        environment = self.environment
        self._roots = SearchRoots(environment.search_paths, environment.package_roots, environment.import_roots)

    def _use_interpreter(self) -> None:
        # Which interpreter parses syntax newer than kvref's is process-wide; sessions of
        # several projects take turns.
        use_interpreter(self.environment.python, self.environment.version)

    def refresh_files(self) -> None:
        """Discover the project's files again (one was created or deleted); new ones are
        queued for indexing."""
        config = self.config
        known = self._file_set
        self.files = discover(
            self.root,
            excludes=config.excludes,
            respect_gitignore=config.respect_gitignore,
            force_exclude=config.force_exclude,
        ).project_files
        self._file_set = frozenset(self.files)
        self._project_files = self.files
        self._layouts.clear()
        self._audited.clear()
        self._unindexed.extend(path for path in self.files if path not in known)

    def audits(self, path: Path, source: bytes) -> bool:
        """Whether `kvref audit - --stdin-filename path` would audit this text (a Python file,
        not force-excluded)."""
        if path in self._file_set and not self.config.force_exclude:
            return True  # a project file is a Python file by its name
        # Otherwise discovery decides, from the name and the first line (a shebang).
        first_line = source.split(b"\n", 1)[0]
        known = self._audited.get(path)
        if known is not None and known[0] == first_line:
            return known[1]
        config = self.config
        report = discover(
            self.root,
            (path,),
            excludes=config.excludes,
            respect_gitignore=config.respect_gitignore,
            force_exclude=config.force_exclude,
            unsaved=source,
        ).report_files
        audited = bool(report)
        self._audited[path] = (first_line, audited)
        return audited

    def _summarize_text(self, path: Path, source: bytes) -> ModuleSummary | FileError:
        digest = _digest(source)
        known = self._texts.get(path)
        if known is not None and known[0] == digest:
            return known[1]
        summary = summary_or_error(relative_path(path, self.root), source, summarize)
        self._texts[path] = (digest, summary)
        return summary

    def analyze(self, texts: Mapping[Path, bytes], report: Collection[Path]) -> dict[Path, DocumentFindings]:
        """The findings `kvref audit` shows for each file of `report`, every file of `texts`
        audited from its text (the editor's unsaved buffers) and the rest from disk."""
        with _collector_paused():
            return self._analyze(texts, report)

    def _analyze(self, texts: Mapping[Path, bytes], report: Collection[Path]) -> dict[Path, DocumentFindings]:
        self._use_interpreter()
        texts = {absolute_path(path): source for path, source in texts.items()}
        audited = [path for path in map(absolute_path, report) if self.audits(path, texts.get(path, b""))]
        outcome = {path: DocumentFindings(audited=False) for path in map(absolute_path, report)}
        if not audited:
            return outcome
        for stale in set(self._texts).difference(texts):
            del self._texts[stale]
        result = self._audit(texts, audited)
        relative = {relative_path(path, self.root): path for path in audited}
        by_relative = {relative_path(path, self.root): source for path, source in texts.items()}

        def read(name: str) -> bytes | None:
            if name in by_relative:
                return by_relative[name]
            try:
                return (self.root / name).read_bytes()
            except OSError:
                return None

        shown = shown_findings(
            result, config=self.config, selected=self.selected, rules=self.rules, read=read, reported=set(relative)
        ).findings
        try:
            shown = apply_scoped_baseline(
                shown, self.config.baseline, selected=self.selected, reported=set(relative)
            ).new
        except KVRefError:
            pass  # a missing or broken baseline: `kvref audit` says so; the editor shows all
        errors = {error.path: error for error in result.errors}
        for name, path in relative.items():
            findings = tuple(finding for finding in shown if finding.path == name)
            outcome[path] = DocumentFindings(findings, errors.get(name))
        return outcome

    def _audit(self, texts: Mapping[Path, bytes], audited: Sequence[Path]) -> AnalysisResult:
        """The pipeline's result for `audited`, the files of `texts` from those texts."""
        # Unsaved new files join the project; the same tuple while they stay the same, so the
        # layout made for it is reused.
        unlisted = tuple(path for path in dict.fromkeys([*texts, *audited]) if path not in self._file_set)
        if self._project_files[len(self.files) :] != unlisted:
            self._project_files = self.files + unlisted
        files = self._project_files
        options = self.config.options
        project = Project(self.root, files, frozenset(audited), options.report_dependents and len(audited) < len(files))

        def summarize_many(paths: Sequence[Path]) -> dict[Path, ModuleSummary | FileError]:
            return {
                path: self._summarize_text(path, texts[path]) if path in texts else self.disk.get(path)
                for path in paths
            }

        analysed = analyze_project(
            project, options=options, roots=self._roots, summarize_many=summarize_many, layouts=self._layouts
        )
        kept = [layout for layout in self._layouts if layout is not analysed.layout]
        self._layouts = [analysed.layout, *kept][:_LAYOUTS_KEPT]
        return analysed.result

    def fixed_text(
        self, path: Path, texts: Mapping[Path, bytes], findings: Sequence[Finding], *, unsafe: bool
    ) -> bytes | None:
        """The text after the fixes of `findings` (chosen as `--fix` chooses them), or None
        when none applies (the fixer refused the result, or nothing changes)."""
        source = texts[path]
        name = relative_path(path, self.root)
        plan = plan_fixes(
            findings, root=self.root, unsafe_fixes=unsafe, apply_fixes=apply_fixes,
            fix_error=FixError, sources={name: source},
        )  # fmt: skip
        fixed = [file.fixed for file in plan.files if file.path == name]
        return fixed[0] if fixed and fixed[0] != source else None

    def fix_all(self, path: Path, texts: Mapping[Path, bytes], *, unsafe: bool) -> bytes | None:
        """The text after every fix `kvref audit --fix` would apply to it (in rounds, as
        `--fix` does), or None when nothing changes."""
        path = absolute_path(path)
        current = dict(texts)
        original = current[path]
        for _ in range(_MAX_FIX_ROUNDS):
            found = self.analyze(current, [path])[path]
            if found.error is not None or not found.audited:
                break
            fixed = self.fixed_text(path, current, found.findings, unsafe=unsafe)
            if fixed is None:
                break
            current[path] = fixed
        return current[path] if current[path] != original else None

    def forget(self, paths: Collection[Path]) -> None:
        """Files changed on disk: drop what is known of them."""
        self.disk.forget(map(absolute_path, paths))

    @property
    def unindexed(self) -> int:
        """How many project files are still to be indexed."""
        return len(self._unindexed)

    def index_step(self) -> int:
        """Index the next few files into the summary cache; returns how many are left."""
        batch, self._unindexed = self._unindexed[:_INDEX_BATCH], self._unindexed[_INDEX_BATCH:]
        if batch:
            self._use_interpreter()
            self.disk.index(batch)
        if not self._unindexed:
            self.disk.save()
        return len(self._unindexed)

    def save(self) -> None:
        """Write the summary cache (what the checks learned since indexing)."""
        self.disk.save()


@contextmanager
def _collector_paused() -> Generator[None]:
    """Python's cyclic garbage collector off while a check runs. Parsing a big file makes
    ~100,000 objects, and every few hundred set off a collection, some of them over the whole
    heap of a server that holds a project's index: that doubled an edit's CPU on vLLM. What a
    check makes is garbage only once it ends, and mostly freed by reference counting then."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _digest(source: bytes) -> bytes:
    return hashlib.blake2b(source, digest_size=16).digest()
