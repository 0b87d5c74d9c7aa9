"""What one `kvref audit` asks for (`AuditRequest`) and the engine it runs on (`Backend`).

The typer command in `kvref.cli` builds the request; `kvref.audit.run` carries it out.
Exit codes: 0 clean (or everything fixed, or only baselined findings left), 1 findings remain
(with `--diff`: a diff would be applied), 2 a usage, configuration, file or internal error.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol, TextIO

from kvref.audit.catalogue import RuleInfo
from kvref.audit.fixes.plan import ApplyFixesFn
from kvref.audit.model import AnalysisOptions, AnalysisResult
from kvref.audit.report import OutputFormat
from kvref.audit.runner.scale import ScaleSettings
from kvref.errors import KVRefError

__all__ = [
    "EXIT_CLEAN",
    "EXIT_FINDINGS",
    "EXIT_ERROR",
    "AnalyzeFn",
    "AnalyzeSourceFn",
    "AuditRequest",
    "Backend",
    "ScaledAnalyzeFn",
    "UsageError",
    "split_selectors",
]

EXIT_CLEAN: Final = 0
EXIT_FINDINGS: Final = 1
EXIT_ERROR: Final = 2


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


class AnalyzeSourceFn(Protocol):
    """`kvref.audit.stdin.analyze_source`: the findings for text audited as one project file."""

    def __call__(
        self,
        project_files: Sequence[Path],
        *,
        root: Path,
        target: Path,
        source: bytes,
        options: AnalysisOptions,
        python: Path | None,
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
    # Text from stdin audited as a project file (kvref.audit.stdin); fakes leave it None.
    analyze_source: AnalyzeSourceFn | None = None


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
