"""Rendering an audit's outcome: text (default), json, github annotations, SARIF 2.1.0.

Every renderer takes the same `Report` and returns what goes to stdout; the human summary
(`render_summary` in `text`) goes to stderr so stdout stays machine-readable. Positions are
1-based lines and columns everywhere; an end column is the column just after the last
character (SARIF's convention).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvref.audit.report.baseline import BaselineKey
from kvref.audit.catalogue import RuleInfo
from kvref.audit.model import Applicability, FileError, Finding

__all__ = ["OutputFormat", "Summary", "Report", "render", "is_fixable"]


class OutputFormat(str, enum.Enum):
    """The `--output-format` choices."""

    TEXT = "text"
    JSON = "json"
    GITHUB = "github"
    SARIF = "sarif"


@dataclass(frozen=True, slots=True)
class Summary:
    """Counts and side notes of one run.

    Attributes:
        files_analyzed: files indexed (the whole project).
        files_reported: files whose findings are reported (the paths given, or all).
        fixed: findings removed by `--fix` (or that `--diff` would remove).
        files_fixed: files written by `--fix` (or shown by `--diff`).
        baselined: findings hidden by the baseline.
        suppressed: findings hidden by inline `noqa` / `kvref: ignore` comments.
        stale_baseline: baseline entries matching fewer findings than recorded.
        unresolved_bases: base classes that could not be resolved, with how many classes use
            them (those classes were checked for KVR001 against their known bases only).
        missing_modules: the top-level modules those bases come from that were not found
            at all (not installed for the interpreter kvref read), with how many bases
            lead there, most first.
        warnings: one line each (skipped paths, unreadable directories).
        unsafe_fixes: whether `--unsafe-fixes` was given (decides what counts as fixable).
    """

    files_analyzed: int = 0
    files_reported: int = 0
    fixed: int = 0
    files_fixed: int = 0
    baselined: int = 0
    suppressed: int = 0
    stale_baseline: Sequence[tuple[BaselineKey, int]] = ()
    unresolved_bases: Mapping[str, int] = field(default_factory=lambda: {})
    missing_modules: Mapping[str, int] = field(default_factory=lambda: {})
    warnings: Sequence[str] = ()
    unsafe_fixes: bool = False


@dataclass(frozen=True, slots=True)
class Report:
    """What a renderer needs.

    Attributes:
        findings: the findings that remain (selected, not suppressed, not baselined), sorted.
        errors: files that could not be audited or fixed.
        rules: every known rule (for names and SARIF's rule table).
        selected: the codes that were enabled.
        summary: counts for the summary.
        uri_prefix: the project root relative to the repository root ('' or 'sub/dir/'), so
            GitHub annotations and SARIF locations are repository-relative.
        tool_version: kvref's version.
    """

    findings: Sequence[Finding]
    errors: Sequence[FileError]
    rules: Sequence[RuleInfo]
    selected: frozenset[str]
    summary: Summary
    uri_prefix: str = ""
    tool_version: str = ""


def is_fixable(finding: Finding, *, unsafe_fixes: bool) -> bool:
    """Whether `--fix` (with `--unsafe-fixes` when given) would fix the finding."""
    if finding.fix is None:
        return False
    return unsafe_fixes or finding.fix.applicability is Applicability.SAFE


def render(output_format: OutputFormat, report: Report, *, color: bool = False) -> str:
    """The stdout text for `report` in `output_format` (colour applies to text only)."""
    # Only the format asked for is imported (SARIF's builder alone is a few hundredths of a
    # second to import).
    if output_format is OutputFormat.TEXT:
        from kvref.audit.report.text import render_text

        return render_text(report, color=color)
    if output_format is OutputFormat.JSON:
        from kvref.audit.report.json import render_json

        return render_json(report)
    if output_format is OutputFormat.GITHUB:
        from kvref.audit.report.github import render_github

        return render_github(report)
    from kvref.audit.report.sarif import render_sarif

    return render_sarif(report)
