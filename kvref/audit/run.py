"""Carrying out one `AuditRequest`: configuration, discovery, analysis, filtering, fixing,
baseline, and the report on stdout/stderr (`AuditRun(...).run() -> exit code`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, TextIO

from kvref.audit.discover.config import AuditConfig, SelectionLayer, configure
from kvref.audit.discover.environment import find_interpreter, start_discovery
from kvref.audit.discover.files import Discovery, discover
from kvref.audit.filtering import shown_findings
from kvref.audit.fixes.plan import FixPlan, plan_fixes, unified_diff, write_fixes
from kvref.audit.model import AnalysisResult, FileError, Finding
from kvref.audit.report import OutputFormat, Report, Summary, render
from kvref.audit.report.baseline import apply_scoped_baseline, record_baseline
from kvref.audit.report.text import (
    render_fix_listing,
    render_statistics,
    render_summary,
    use_color,
)
from kvref.audit.request import (
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_FINDINGS,
    AuditRequest,
    Backend,
    UsageError,
)
from kvref.audit.runner.progress import progress_enabled

__all__ = ["AuditRun"]

# Fixing can expose a finding that only exists once another is fixed; a few rounds settle it.
_MAX_FIX_ROUNDS = 4

@dataclass(slots=True)
class _Analysis:
    """Findings after selection, per-file ignores and inline suppression."""

    findings: list[Finding]
    errors: list[FileError]
    result: AnalysisResult
    suppressed: int = 0
    unresolved: dict[str, int] = field(default_factory=lambda: {})


@dataclass(slots=True)
class _FixOutcome:
    """What `--fix`/`--diff` did: the analysis that remains, counts, the diff, fix errors."""

    analysis: _Analysis
    fixed: int = 0
    files: set[str] = field(default_factory=lambda: set[str]())
    diff: str = ""
    errors: list[FileError] = field(default_factory=lambda: [])
    fixed_findings: list[Finding] = field(default_factory=lambda: [])


class AuditRun:
    """One audit run: configuration, discovery, analysis, filtering, fixing, reporting."""

    def __init__(
        self,
        request: AuditRequest,
        backend: Backend,
        cwd: Path,
        streams: tuple[TextIO, TextIO, BinaryIO | None],
    ) -> None:
        self.request = request
        self.backend = backend
        self.cwd = cwd
        self.stdout, self.stderr, self.stdin = streams
        self.scale = request.scale  # with the interpreter `run` chose
        # `-`: the text read from stdin, audited (and fixed) as this project-relative path.
        self.source: tuple[str, bytes] | None = None

    def _check_usage(self) -> bool:
        """Refuse option combinations; whether the run reads stdin."""
        request = self.request
        if request.write_baseline is not None and (request.fix or request.diff):
            raise UsageError("--write-baseline cannot be combined with --fix or --diff")
        if request.statistics and request.output_format not in (OutputFormat.TEXT, OutputFormat.JSON):
            raise UsageError("--statistics prints text or json, not " + request.output_format.value)
        reads_stdin = Path("-") in request.paths
        if not reads_stdin:
            if request.stdin_filename is not None:
                raise UsageError("--stdin-filename needs `-` as the path to audit")
            return False
        if len(request.paths) > 1 or request.stdin_filename is None:
            raise UsageError("`-` (stdin) needs --stdin-filename PATH and no other path")
        if request.write_baseline is not None:
            raise UsageError("--write-baseline cannot be combined with stdin (`-`)")
        return True

    def _analyze(
        self, config: AuditConfig, discovery: Discovery, selected: frozenset[str]
    ) -> _Analysis:
        root = config.root
        # Only the selected rules run (their findings are all that is reported).
        options = replace(config.options, rules=selected)
        paths = self.request.paths
        if self.source is None and paths and not any((self.cwd / p).is_dir() for p in paths):
            # Files named one by one (pre-commit passes the changed ones): a subclass in
            # another file whose base they changed is reported too.
            options = replace(options, report_dependents=True)
        if self.source is not None:
            if self.backend.analyze_source is None:
                raise UsageError("this engine cannot audit stdin")
            result = self.backend.analyze_source(
                list(discovery.project_files),
                root=root,
                target=root / self.source[0],
                source=self.source[1],
                options=options,
                python=self.scale.python,
            )
        elif self.backend.analyze_at_scale is not None:
            show_progress = progress_enabled(
                self.stderr, output_format=self.request.output_format.value
            )
            result = self.backend.analyze_at_scale(
                list(discovery.project_files),
                root=root,
                report_files=discovery.report_files,
                options=options,
                # The caches are written by a forked child while this process reports;
                # `run_audit` waits for it before returning.
                settings=replace(self.scale, background_save=True),
                progress=self.stderr if show_progress else None,
            )
        else:
            result = self.backend.analyze(
                list(discovery.project_files),
                root=root,
                report_files=discovery.report_files,
                options=options,
            )
        reported = self._reported(config, discovery)

        def read(path: str) -> bytes | None:
            if self.source is not None and path == self.source[0]:
                return self.source[1]
            try:
                return (root / path).read_bytes()
            except OSError:
                return None

        if reported is not None:
            reported.update(result.dependent_paths)
        shown = shown_findings(
            result, config=config, selected=selected, rules=self.backend.rules, read=read, reported=reported
        )
        errors = [e for e in result.errors if reported is None or e.path in reported]
        return _Analysis(
            findings=shown.findings,
            errors=errors,
            result=result,
            suppressed=shown.suppressed,
            unresolved=dict(result.unresolved_bases),
        )

    @staticmethod
    def _reported(config: AuditConfig, discovery: Discovery) -> set[str] | None:
        if discovery.report_files is None:
            return None
        prefix = os.path.join(str(config.root), "")
        return {
            str(path)[len(prefix) :].replace(os.sep, "/")
            if str(path).startswith(prefix)
            else path.relative_to(config.root).as_posix()
            for path in discovery.report_files
        }

    def _plan(self, config: AuditConfig, findings: Sequence[Finding]) -> FixPlan:
        return plan_fixes(
            findings,
            root=config.root,
            unsafe_fixes=self.request.unsafe_fixes,
            apply_fixes=self.backend.apply_fixes,
            fix_error=self.backend.fix_error,
            sources=dict([self.source]) if self.source is not None else None,
        )

    def _discover(self, config: AuditConfig) -> Discovery:
        paths = self.request.paths
        cwd = Path(os.path.abspath(self.cwd))
        unsaved = None
        if self.source is not None:
            # Discovered as if the text were saved there: whether it is audited (a Python
            # file; not force-excluded) follows the rules for a path named on the command line.
            paths, unsaved = (config.root / self.source[0],), self.source[1]
        elif not paths and cwd != config.root and config.root in cwd.parents:
            # Like ruff: no paths means the current directory; the project is still indexed.
            paths = (cwd,)
        return discover(
            config.root,
            paths,
            cwd=self.cwd,
            excludes=config.excludes,
            respect_gitignore=config.respect_gitignore,
            force_exclude=config.force_exclude,
            unsaved=unsaved,
        )

    def _fix(
        self, config: AuditConfig, discovery: Discovery, selected: frozenset[str], analysis: _Analysis
    ) -> _FixOutcome:
        """Apply (`--fix`) or show (`--diff`, `--show-fixes`) fixes; `analysis` is what remains
        afterwards. Text from stdin is fixed in memory, never written."""
        outcome = _FixOutcome(analysis)
        if self.request.diff or not self.request.fix:
            plan = self._plan(config, analysis.findings)
            outcome.fixed_findings = [finding for file in plan.files for finding in file.findings]
            if not self.request.diff:
                return outcome  # --show-fixes alone: what --fix would fix (no exit-code change)
            outcome.errors.extend(plan.errors)
            outcome.diff = "".join(unified_diff(file) for file in plan.files)
            outcome.fixed = plan.fixed_findings
            outcome.files.update(file.path for file in plan.files)
            resolved = {id(finding) for finding in outcome.fixed_findings}
            analysis.findings = [f for f in analysis.findings if id(f) not in resolved]
            return outcome
        for _ in range(_MAX_FIX_ROUNDS):
            plan = self._plan(config, outcome.analysis.findings)
            if self.source is not None:
                written, write_errors = plan.files, []
                for file in written:
                    self.source = (file.path, file.fixed)
            else:
                written, write_errors = write_fixes(config.root, plan.files)
            outcome.errors.extend(plan.errors + write_errors)
            if not written:
                break
            outcome.fixed += sum(len(file.findings) for file in written)
            outcome.fixed_findings.extend(finding for file in written for finding in file.findings)
            outcome.files.update(file.path for file in written)
            # Analyse again so the exit code reflects what really remains.
            outcome.analysis = self._analyze(config, discovery, selected)
            if plan.errors or write_errors:
                break
        return outcome

    def _configure(self) -> tuple[AuditConfig, frozenset[str]]:
        request = self.request
        paths = request.paths
        if self.source is not None:
            assert request.stdin_filename is not None
            paths = (request.stdin_filename,)
        layer = SelectionLayer(
            select=request.select, extend_select=request.extend_select, ignore=request.ignore
        )
        config, selected = configure(self.cwd, paths, request.config, self.backend.rules, layer)
        if self.source is not None:
            assert request.stdin_filename is not None
            target = Path(os.path.abspath(self.cwd / request.stdin_filename))
            if target.is_dir():
                raise UsageError(f"--stdin-filename {request.stdin_filename}: is a directory")
            if config.root not in target.parents:
                raise UsageError(f"--stdin-filename {request.stdin_filename}: outside the project {config.root}")
            self.source = (target.relative_to(config.root).as_posix(), self.source[1])
        return config, selected

    def run(self) -> int:
        request = self.request
        if self._check_usage():
            stdin = self.stdin if self.stdin is not None else sys.stdin.buffer
            self.source = ("-", stdin.read())
        # The target interpreter takes a few hundredths of a second to start: it answers
        # while the configuration is read and the files are discovered.
        python = find_interpreter(request.scale.python, cwd=self.cwd, project_root=None)
        start_discovery(python)
        config, selected = self._configure()
        if python is None:  # no --python, no VIRTUAL_ENV: the project's own .venv, if any
            python = find_interpreter(None, cwd=self.cwd, project_root=config.root)
            start_discovery(python)
        self.scale = replace(request.scale, python=python)
        discovery = self._discover(config)
        if discovery.report_files is not None and not discovery.report_files:
            # Nothing to report on (pre-commit passed only excluded files): skip indexing.
            analysis = _Analysis([], [], AnalysisResult())
        else:
            analysis = self._analyze(config, discovery, selected)
        fixing = (
            self._fix(config, discovery, selected, analysis)
            if request.fix or request.diff or request.show_fixes
            else _FixOutcome(analysis)
        )
        analysis = fixing.analysis
        errors = sorted(
            {(e.path, e.line, e.col, e.message): e for e in [*analysis.errors, *fixing.errors]}.values(),
            key=lambda e: (e.path, e.line, e.col),
        )
        reported = self._reported(config, discovery)
        if request.write_baseline is not None:
            target = Path(os.path.abspath(self.cwd / request.write_baseline))
            findings = analysis.findings
            entries = record_baseline(target, findings, selected=selected, reported=reported)
            self.stderr.write(
                f"Wrote {entries} baseline entr{'y' if entries == 1 else 'ies'} "
                f"({len(findings)} findings) to {request.write_baseline}.\n"
            )
            for error in errors:
                self.stderr.write(f"{error.path}:{error.line}:{error.col}: error: {error.message}\n")
            return EXIT_ERROR if errors else EXIT_CLEAN
        baseline_path = (
            Path(os.path.abspath(self.cwd / request.baseline))
            if request.baseline is not None
            else config.baseline
        )
        baseline = apply_scoped_baseline(
            analysis.findings, baseline_path, selected=selected, reported=reported
        )
        report = Report(
            findings=baseline.new,
            errors=errors,
            rules=self.backend.rules,
            selected=selected,
            summary=Summary(
                files_analyzed=analysis.result.files_analyzed or len(discovery.project_files),
                files_reported=sum(  # stubs are indexed, never reported
                    path.suffix != ".pyi"
                    for path in (
                        discovery.project_files if discovery.report_files is None else discovery.report_files
                    )
                ),
                fixed=fixing.fixed,
                files_fixed=len(fixing.files),
                baselined=baseline.baselined,
                suppressed=analysis.suppressed,
                stale_baseline=baseline.stale,
                unresolved_bases=analysis.unresolved,
                missing_modules=analysis.result.missing_modules,
                warnings=discovery.warnings,
                unsafe_fixes=request.unsafe_fixes,
            ),
            uri_prefix=_uri_prefix(config.root, discovery.vcs_root),
            tool_version=_version(),
        )
        self._write_report(report, fixing)
        if request.exit_zero:
            # `--exit-zero` is for reports that must be uploaded whatever they hold (SARIF in
            # CI): unparsable files are in the report, and the run still succeeds.
            return EXIT_CLEAN
        if errors:
            return EXIT_ERROR
        failing = bool(fixing.diff) if request.diff else bool(baseline.new)
        return EXIT_FINDINGS if failing else EXIT_CLEAN

    def _write_report(self, report: Report, fixing: _FixOutcome) -> None:
        """Findings (or statistics, a diff, fixed stdin text) on stdout; the rest on stderr."""
        request = self.request
        fixed_findings: Sequence[Finding] = fixing.fixed_findings
        repository_paths = report
        if self.source is not None and request.stdin_filename is not None:
            # Text on stdin is named as `--stdin-filename` gave it, for the editor that passed
            # it; GitHub annotations and SARIF stay repository-relative (`repository_paths`),
            # which is what their readers resolve.
            named = _as_given(request.stdin_filename, self.cwd)
            report = _renamed(report, self.source[0], named)
            fixed_findings = [_renamed_finding(f, self.source[0], named) for f in fixed_findings]
        # With `- --fix` stdout carries the fixed text, so the findings go to stderr.
        findings_out = self.stderr if self.source is not None and request.fix else self.stdout
        if request.diff:
            self.stdout.write(fixing.diff)
        elif request.statistics:
            if request.output_format is OutputFormat.JSON:
                from kvref.audit.report.json import render_statistics_json

                findings_out.write(render_statistics_json(report))
            else:
                findings_out.write(render_statistics(report))
        else:
            text = request.output_format is OutputFormat.TEXT
            color = text and use_color(findings_out, os.environ)
            human = request.output_format in (OutputFormat.TEXT, OutputFormat.JSON)
            shown = report if human else repository_paths
            findings_out.write(render(request.output_format, shown, color=color))
        if self.source is not None and request.fix and not request.diff:
            self.stdout.write(self.source[1].decode("utf-8", "surrogateescape"))
        self.stdout.flush()
        if request.show_fixes:
            applied = request.fix and not request.diff
            self.stderr.write(render_fix_listing(fixed_findings, report.rules, applied=applied))
        self.stderr.write(
            render_summary(
                report,
                color=use_color(self.stderr, os.environ),
                diff=request.diff,
                quiet=request.quiet,
            )
        )


def _as_given(stdin_filename: Path, cwd: Path) -> str:
    """`--stdin-filename` as the findings name it: as written when relative (it is relative to
    the current directory), relative to the current directory when absolute and inside it, as
    ruff does; with `/` separators, like every reported path."""
    if not stdin_filename.is_absolute():
        return Path(os.path.normpath(stdin_filename)).as_posix()
    try:
        return Path(os.path.abspath(stdin_filename)).relative_to(os.path.abspath(cwd)).as_posix()
    except ValueError:
        return stdin_filename.as_posix()


def _renamed_finding(finding: Finding, path: str, named: str) -> Finding:
    return replace(finding, path=named) if finding.path == path else finding


def _renamed(report: Report, path: str, named: str) -> Report:
    """`report` with the file at project-relative `path` named `named`."""
    return replace(
        report,
        findings=[_renamed_finding(finding, path, named) for finding in report.findings],
        errors=[replace(error, path=named) if error.path == path else error for error in report.errors],
    )


def _uri_prefix(root: Path, vcs_root: Path | None) -> str:
    if vcs_root is None:
        return ""
    try:
        relative = Path(os.path.realpath(root)).relative_to(os.path.realpath(vcs_root)).as_posix()
    except ValueError:
        return ""
    return "" if relative == "." else relative + "/"


def _version() -> str:
    from kvref import __version__

    return __version__
