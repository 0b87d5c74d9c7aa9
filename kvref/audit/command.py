"""One `kvref audit` run: `run_audit(AuditRequest) -> int` (the typer command in `kvref.cli` parses).

Exit codes: 0 clean (or everything fixed, or only baselined findings left), 1 findings remain
(with `--diff`: a diff would be applied), 2 a usage, configuration, file or internal error.
The runner catches every exception and turns it into exit 2 with one line on stderr, because
an uncaught exception would exit 1 and read as "findings".
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import sys
from collections.abc import Callable, Collection, Generator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, Protocol, TextIO

from kvref.audit.fixes.plan import ApplyFixesFn, FixPlan, plan_fixes, unified_diff, write_fixes
from kvref.audit.report.baseline import (
    BaselineKey,
    BaselineOutcome,
    apply_baseline,
    load_baseline,
    write_baseline,
)
from kvref.audit.catalogue import RuleInfo, find_rule, load_rule_catalogue
from kvref.audit.discover.config import (
    AuditConfig,
    ConfigError,
    SelectionLayer,
    codes_matching,
    find_project_root,
    load_config,
    resolve_selection,
    validate_selector,
)
from kvref.audit.discover.files import Discovery, discover, matches_glob
from kvref.audit.discover.project import with_project_facts
from kvref.audit.model import AnalysisOptions, AnalysisResult, FileError, Finding
from kvref.audit.report import OutputFormat, Report, Summary, render
from kvref.audit.runner.progress import progress_enabled
from kvref.audit.report.text import render_summary, use_color
from kvref.audit.discover.environment import find_interpreter, start_discovery
from kvref.audit.runner.scale import ScaleSettings, wait_for_saves
from kvref.audit.summarise.suppress import SuppressionFilter
from kvref.errors import KVRefError

__all__ = [
    "EXIT_CLEAN",
    "EXIT_FINDINGS",
    "EXIT_ERROR",
    "AnalyzeFn",
    "Backend",
    "AuditRequest",
    "UsageError",
    "real_backend",
    "run_audit",
    "list_rules",
    "explain_rule",
    "split_selectors",
]

EXIT_CLEAN: Final = 0
EXIT_FINDINGS: Final = 1
EXIT_ERROR: Final = 2

# Fixing can expose a finding that only exists once another is fixed; a few rounds settle it.
_MAX_FIX_ROUNDS = 4


class UsageError(KVRefError):
    """The command line combines options that cannot go together."""


class AnalyzeFn(Protocol):
    """The engine's signature (`kvref.audit.pipeline.analyze`)."""

    def __call__(
        self,
        project_files: Sequence[Path],
        *,
        root: Path,
        report_files: Collection[Path] | None = None,
        options: AnalysisOptions = ...,
    ) -> AnalysisResult: ...


class ScaledAnalyzeFn(Protocol):
    """`kvref.audit.runner.scale.analyze_at_scale`."""

    def __call__(
        self,
        project_files: Sequence[Path],
        *,
        root: Path,
        report_files: Collection[Path] | None = None,
        options: AnalysisOptions = ...,
        settings: ScaleSettings = ...,
        progress: TextIO | None = None,
    ) -> AnalysisResult: ...


@dataclass(frozen=True, slots=True)
class Backend:
    """The engine pieces the runner uses (tests substitute small fakes).

    Attributes:
        analyze: indexes the project and returns findings for the report files.
        apply_fixes: applies fixes to one file's bytes.
        fix_error: the exception `apply_fixes` raises when the result would not parse.
        rules: every rule, in code order.
    """

    analyze: AnalyzeFn
    apply_fixes: ApplyFixesFn
    fix_error: type[Exception]
    rules: tuple[RuleInfo, ...]
    # The cached, parallel driver of `analyze` (kvref.audit.runner.scale); fakes leave it None.
    analyze_at_scale: ScaledAnalyzeFn | None = None


def real_backend() -> Backend:
    """The real engine, imported only when an audit runs."""
    from kvref.audit.pipeline import analyze
    from kvref.audit.fixes.edits import FixError, apply_fixes
    from kvref.audit.runner.scale import analyze_at_scale

    return Backend(analyze, apply_fixes, FixError, load_rule_catalogue(), analyze_at_scale)


@dataclass(frozen=True, slots=True)
class AuditRequest:
    """Everything the command line asked for (both front ends build one of these).

    Attributes:
        paths: files/directories to report on; empty means the current directory (the
            whole project when run at its root).
        select: `--select` selectors (None: keep the configured selection).
        extend_select: `--extend-select` selectors, added to the selection.
        ignore: `--ignore` and `--extend-ignore` selectors.
        output_format: how findings are printed on stdout.
        statistics: print a count per code instead of the findings.
        quiet: print the findings (and file errors) only, no summary.
        exit_zero: exit 0 even when findings remain or files cannot be read or parsed (they are
            still reported); a usage or configuration error still exits 2.
        baseline: `--baseline FILE` (overrides the configured baseline).
        write_baseline: `--write-baseline FILE`: record the current findings and exit.
        fix: write safe fixes (and unsafe ones with `unsafe_fixes`).
        unsafe_fixes: also apply (and count as fixable) unsafe fixes.
        diff: print the fixes as unified diffs instead of writing them.
        show_fixes: list, per file, the findings the fixes fixed (or would fix).
        stdin_filename: audit stdin as this file of the project (the path `-`); nothing is
            written, and `fix` prints the fixed source on stdout.
        config: `--config FILE` instead of the nearest pyproject.toml.
        scale: `--no-cache`, `--cache-dir`, `--python`, `--jobs`.
    """

    paths: tuple[Path, ...] = ()
    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    output_format: OutputFormat = OutputFormat.TEXT
    statistics: bool = False
    quiet: bool = False
    exit_zero: bool = False
    baseline: Path | None = None
    write_baseline: Path | None = None
    fix: bool = False
    unsafe_fixes: bool = False
    diff: bool = False
    show_fixes: bool = False
    stdin_filename: Path | None = None
    config: Path | None = None
    scale: ScaleSettings = ScaleSettings()


def split_selectors(values: Sequence[str] | None) -> tuple[str, ...] | None:
    """Flatten repeated and comma-separated selector options (`--select KVR0,KVR101`)."""
    if values is None:
        return None
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


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


class _Runner:
    """One audit run: configuration, discovery, analysis, filtering, fixing, reporting."""

    def __init__(
        self, request: AuditRequest, backend: Backend, cwd: Path, stdout: TextIO, stderr: TextIO
    ) -> None:
        self.request = request
        self.backend = backend
        self.cwd = cwd
        self.stdout = stdout
        self.stderr = stderr
        self.scale = request.scale  # with the interpreter `run` chose

    def _configure(self) -> tuple[AuditConfig, frozenset[str]]:
        request = self.request
        if request.write_baseline is not None and (request.fix or request.diff):
            raise UsageError("--write-baseline cannot be combined with --fix or --diff")
        root, pyproject = find_project_root([self.cwd / path for path in request.paths], self.cwd)
        if request.config is not None:
            # Like ruff: the named file's settings apply to the tree being audited, wherever
            # the file lives (the project root is still found from the paths); only the
            # paths written inside it (`baseline`) are relative to its own directory.
            config_file = Path(os.path.abspath(self.cwd / request.config))
            if not config_file.is_file():
                raise ConfigError(f"--config {request.config}: no such file")
            config = load_config(config_file, root, relative_to=config_file.parent)
        else:
            config = load_config(pyproject, root)
        config = with_project_facts(config)
        where = f"{config.source} [tool.kvref]" if config.source else "[tool.kvref]"
        rules = self.backend.rules
        for glob, selectors in config.per_file_ignores:
            for selector in selectors:
                validate_selector(selector, rules, where=f"{where} per-file-ignores {glob!r}")
        selected = resolve_selection(
            rules,
            [
                (config.selection, where),
                (
                    SelectionLayer(
                        select=request.select,
                        extend_select=request.extend_select,
                        ignore=request.ignore,
                    ),
                    "--select/--ignore/--extend-select/--extend-ignore",
                ),
            ],
        )
        return config, selected

    def _analyze(
        self, config: AuditConfig, discovery: Discovery, selected: frozenset[str]
    ) -> _Analysis:
        root = config.root
        options = config.options
        paths = self.request.paths
        if paths and not any((self.cwd / path).is_dir() for path in paths):
            # Files named one by one (pre-commit passes the changed ones): a subclass in
            # another file whose base they changed is reported too.
            options = replace(options, report_dependents=True)
        if self.backend.analyze_at_scale is not None:
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
        ignored_codes: dict[str, set[str]] = {}

        def per_file_ignored(path: str) -> set[str]:
            if path not in ignored_codes:
                codes: set[str] = set()
                for glob, selectors in config.per_file_ignores:
                    if matches_glob(glob, path):
                        for selector in selectors:
                            codes |= codes_matching(selector, self.backend.rules, enabling=False)
                ignored_codes[path] = codes
            return ignored_codes[path]

        def read(path: str) -> bytes | None:
            try:
                return (root / path).read_bytes()
            except OSError:
                return None

        if reported is not None:
            reported.update(result.dependent_paths)
        candidates = [
            finding
            for finding in result.findings
            if finding.code in selected
            and (reported is None or finding.path in reported)
            and finding.code not in per_file_ignored(finding.path)
        ]
        suppression = SuppressionFilter(read, result.suppression_lines)
        findings = sorted(suppression.keep(candidates), key=lambda f: (f.path, f.line, f.col, f.code))
        errors = [e for e in result.errors if reported is None or e.path in reported]
        return _Analysis(
            findings=findings,
            errors=errors,
            result=result,
            suppressed=suppression.suppressed,
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
        )

    def _discover(self, config: AuditConfig) -> Discovery:
        paths = self.request.paths
        cwd = Path(os.path.abspath(self.cwd))
        if not paths and cwd != config.root and config.root in cwd.parents:
            # Like ruff: no paths means the current directory; the project is still indexed.
            paths = (cwd,)
        return discover(
            config.root,
            paths,
            cwd=self.cwd,
            excludes=config.excludes,
            respect_gitignore=config.respect_gitignore,
            force_exclude=config.force_exclude,
        )

    def _fix(
        self, config: AuditConfig, discovery: Discovery, selected: frozenset[str], analysis: _Analysis
    ) -> _FixOutcome:
        """Apply (`--fix`) or show (`--diff`) fixes; `analysis` is what remains afterwards."""
        outcome = _FixOutcome(analysis)
        if self.request.diff:
            plan = self._plan(config, analysis.findings)
            outcome.errors.extend(plan.errors)
            outcome.diff = "".join(unified_diff(file) for file in plan.files)
            outcome.fixed = plan.fixed_findings
            outcome.files.update(file.path for file in plan.files)
            resolved = {id(finding) for file in plan.files for finding in file.findings}
            analysis.findings = [f for f in analysis.findings if id(f) not in resolved]
            return outcome
        for _ in range(_MAX_FIX_ROUNDS):
            plan = self._plan(config, outcome.analysis.findings)
            written, write_errors = write_fixes(config.root, plan.files)
            outcome.errors.extend(plan.errors + write_errors)
            if not written:
                break
            outcome.fixed += sum(len(file.findings) for file in written)
            outcome.files.update(file.path for file in written)
            # Analyse again so the exit code reflects what really remains.
            outcome.analysis = self._analyze(config, discovery, selected)
            if plan.errors or write_errors:
                break
        return outcome

    def _write_baseline(
        self,
        config: AuditConfig,
        discovery: Discovery,
        selected: frozenset[str],
        findings: Sequence[Finding],
        errors: Sequence[FileError],
    ) -> int:
        target_name = self.request.write_baseline
        assert target_name is not None
        target = Path(os.path.abspath(self.cwd / target_name))
        keep: dict[BaselineKey, int] = {}
        if target.exists():
            # A partial run (named paths, a narrower --select) must not drop the entries of
            # the files and rules it did not look at.
            reported = self._reported(config, discovery)
            keep = {
                key: count
                for key, count in load_baseline(target).counts.items()
                if key[1] not in selected or (reported is not None and key[0] not in reported)
            }
        entries = write_baseline(target, findings, keep)
        self.stderr.write(
            f"Wrote {entries} baseline entr{'y' if entries == 1 else 'ies'} "
            f"({len(findings)} findings) to {target_name}.\n"
        )
        for error in errors:
            self.stderr.write(f"{error.path}:{error.line}:{error.col}: error: {error.message}\n")
        return EXIT_ERROR if errors else EXIT_CLEAN

    def _apply_baseline(
        self,
        config: AuditConfig,
        discovery: Discovery,
        selected: frozenset[str],
        findings: list[Finding],
    ) -> BaselineOutcome:
        path = (
            Path(os.path.abspath(self.cwd / self.request.baseline))
            if self.request.baseline is not None
            else config.baseline
        )
        if path is None:
            return BaselineOutcome(new=findings, baselined=0, stale=[])
        outcome = apply_baseline(findings, load_baseline(path))
        reported = self._reported(config, discovery)
        # Entries for files or rules outside this run are not stale, just not looked at.
        outcome.stale[:] = [
            (key, count)
            for key, count in outcome.stale
            if key[1] in selected and (reported is None or key[0] in reported)
        ]
        return outcome

    def run(self) -> int:
        request = self.request
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
            if request.fix or request.diff
            else _FixOutcome(analysis)
        )
        analysis = fixing.analysis
        errors = sorted(
            {(e.path, e.line, e.col, e.message): e for e in [*analysis.errors, *fixing.errors]}.values(),
            key=lambda e: (e.path, e.line, e.col),
        )
        if request.write_baseline is not None:
            return self._write_baseline(config, discovery, selected, analysis.findings, errors)
        baseline = self._apply_baseline(config, discovery, selected, analysis.findings)

        report = Report(
            findings=baseline.new,
            errors=errors,
            rules=self.backend.rules,
            selected=selected,
            summary=Summary(
                files_analyzed=analysis.result.files_analyzed or len(discovery.project_files),
                files_reported=len(
                    discovery.project_files
                    if discovery.report_files is None
                    else discovery.report_files
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
        if request.diff:
            self.stdout.write(fixing.diff)
        else:
            color = request.output_format is OutputFormat.TEXT and use_color(self.stdout, os.environ)
            self.stdout.write(render(request.output_format, report, color=color))
        self.stdout.flush()
        self.stderr.write(
            render_summary(report, color=use_color(self.stderr, os.environ), diff=request.diff)
        )
        if request.exit_zero:
            # `--exit-zero` is for reports that must be uploaded whatever they hold (SARIF in
            # CI): unparsable files are in the report, and the run still succeeds.
            return EXIT_CLEAN
        if errors:
            return EXIT_ERROR
        failing = bool(fixing.diff) if request.diff else bool(baseline.new)
        return EXIT_FINDINGS if failing else EXIT_CLEAN


_FREEZE_AFTER_ALLOCATIONS: Final = 200_000


@contextlib.contextmanager
def _cyclic_gc_paused() -> Generator[None, None, None]:
    """Turn the cyclic garbage collector off for one audit (worker processes inherit it).

    An audit allocates about a million small objects (summaries, index entries) that form no
    cycles; every gen-2 pass re-scans all of them. On vLLM's 1.16 M lines, unpickling the
    summaries took 2.7x longer with the collector on. Reference counting still frees
    everything that is dropped, and the collector is back on for the caller afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            # After a big run the first allocation once `enable` is back would scan every
            # object the run left alive as one huge youngest generation (0.7 s on vLLM), so
            # they are frozen first: reference counting still frees them, the cyclic collector
            # just never scans them (a process-wide effect, kept to runs that need it).
            if gc.get_count()[0] > _FREEZE_AFTER_ALLOCATIONS:
                gc.freeze()
            gc.enable()


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


def run_audit(
    request: AuditRequest,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    backend: Backend | Callable[[], Backend] | None = None,
    cwd: Path | None = None,
) -> int:
    """Run one audit and return its exit code; never raises (errors are exit 2, one line).

    `backend` defaults to the real engine (`real_backend`, looked up when called).
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    for stream in (out, err):
        _pass_undecodable_names_through(stream)
    try:
        if backend is None:
            resolved = real_backend()
        else:
            resolved = backend if isinstance(backend, Backend) else backend()
        runner = _Runner(request, resolved, cwd if cwd is not None else Path.cwd(), out, err)
        try:
            with _cyclic_gc_paused():
                return runner.run()
        finally:
            wait_for_saves()
    except KVRefError as exc:
        err.write(f"kvref: error: {exc}\n")
    except BrokenPipeError:
        # The reader went away (`kvref audit | head`): stop quietly, and keep Python from
        # complaining again when it flushes stdout at exit.
        _silence(out)
        return EXIT_FINDINGS
    except KeyboardInterrupt:
        err.write("kvref: interrupted\n")
    except Exception as exc:  # noqa: BLE001 - the one place every failure becomes exit 2
        err.write(f"kvref: internal error: {type(exc).__name__}: {exc}\n")
    return EXIT_ERROR


def _pass_undecodable_names_through(stream: TextIO) -> None:
    """Let a console stream write file names that are not valid UTF-8 as their own bytes.

    Such a name is held as lone surrogates (`os.fsdecode`); a strict stream would raise on
    it, ending the run with nothing reported. Written back as the original bytes, the name
    is the one `ls` shows and a shell can open.
    """
    if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
        stream.reconfigure(errors="surrogateescape")


def _silence(stream: TextIO) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def list_rules(rules: Sequence[RuleInfo], out: TextIO) -> int:
    """Print a table of the rules: code, name, default, fixable, summary."""
    name_width = max((len(rule.name) for rule in rules), default=4)
    out.write(f"{'code':<7} {'name':<{name_width}} {'default':<7} {'fix':<6} summary\n")
    for rule in rules:
        out.write(
            f"{rule.code:<7} {rule.name:<{name_width}} "
            f"{'on' if rule.default_enabled else 'off':<7} "
            f"{rule.fix_safety:<6} {rule.summary}\n"
        )
    return EXIT_CLEAN


def explain_rule(rules: Sequence[RuleInfo], code: str, out: TextIO, err: TextIO) -> int:
    """Print one rule's documentation; exit 2 for an unknown code."""
    rule = find_rule(rules, code)
    if rule is None:
        known = ", ".join(r.code for r in rules)
        err.write(f"kvref: error: unknown rule {code!r} (known: {known})\n")
        return EXIT_ERROR
    default = "on by default" if rule.default_enabled else "off by default: select it by code"
    fixable = {"safe": "safe fix", "unsafe": "unsafe fix (--unsafe-fixes)"}.get(rule.fix_safety, "no fix")
    out.write(f"{rule.code} {rule.name} ({default}; {fixable})\n\n{rule.doc.rstrip()}\n")
    return EXIT_CLEAN
