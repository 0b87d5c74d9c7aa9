"""Human output: `path:line:col: CODE message` lines on stdout, a summary on stderr.

Colour is decided by the caller (`use_color`): only for this format, only on a terminal,
`NO_COLOR` (non-empty) wins over `FORCE_COLOR`, and `TERM=dumb` turns it off.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TextIO

from kvref.audit.catalogue import RuleInfo
from kvref.audit.model import Finding
from kvref.audit.report import Report, is_fixable

__all__ = [
    "render_text",
    "render_summary",
    "render_statistics",
    "render_fix_listing",
    "count_by_code",
    "use_color",
]

_BOLD = "\x1b[1m"
_RED = "\x1b[31m"
_YELLOW = "\x1b[33m"
_CYAN = "\x1b[36m"
_RESET = "\x1b[0m"


def use_color(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Whether to colour text written to `stream` (NO_COLOR > FORCE_COLOR > TERM=dumb > TTY)."""
    if environ.get("NO_COLOR", ""):
        return False
    if environ.get("FORCE_COLOR", "") not in ("", "0"):
        return True
    if environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if callable(isatty) else False


def _paint(text: str, style: str, color: bool) -> str:
    return f"{style}{text}{_RESET}" if color else text


def render_text(report: Report, *, color: bool = False) -> str:
    """One line per finding: `path:line:col: CODE message` (1-based, project-relative)."""
    lines: list[str] = []
    for finding in report.findings:
        location = _paint(f"{finding.path}:{finding.line}:{finding.col}:", _BOLD, color)
        code = _paint(finding.code, _RED + _BOLD, color)
        lines.append(f"{location} {code} {finding.message}")
    return "".join(line + "\n" for line in lines)


def count_by_code(report: Report) -> list[tuple[str, str, int, int]]:
    """(code, name, findings, fixable with the run's fix flags) per code found, most first."""
    names = {rule.code: rule.name for rule in report.rules}
    counts = Counter(finding.code for finding in report.findings)
    fixable = Counter(
        finding.code
        for finding in report.findings
        if is_fixable(finding, unsafe_fixes=report.summary.unsafe_fixes)
    )
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [(code, names.get(code, ""), count, fixable[code]) for code, count in ranked]


def render_statistics(report: Report) -> str:
    """`--statistics`: one line per code, `count code [*] name` (`[*]`: --fix fixes some)."""
    return "".join(
        f"{count:>5}\t{code}\t{'[*] ' if fixable else ''}{name}\n"
        for code, name, count, fixable in count_by_code(report)
    )


def render_fix_listing(fixed: Sequence[Finding], rules: Sequence[RuleInfo], *, applied: bool) -> str:
    """`--show-fixes`: the findings fixed (or that `--fix` would fix), counted per file and code."""
    if not fixed:
        return "No fixes applied.\n" if applied else "No fixes available.\n"
    names = {rule.code: rule.name for rule in rules}
    lines = [f"{'Fixed' if applied else 'Would fix'} {_plural(len(fixed), 'finding')}:"]
    by_file: dict[str, Counter[str]] = {}
    for finding in fixed:
        by_file.setdefault(finding.path, Counter())[finding.code] += 1
    for path in sorted(by_file):
        lines.append(f"- {path}:")
        lines.extend(
            f"    {count} x {code} ({names.get(code, '?')})" for code, count in sorted(by_file[path].items())
        )
    return "".join(line + "\n" for line in lines)


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {plural or word + 's'}"


def _withheld_fixes(findings: Sequence[Finding]) -> list[str]:
    """One line per (code, reason) of the fixes that need `--unsafe-fixes`, most first."""
    reasons = Counter(
        (finding.code, finding.fix.unsafe_reason)
        for finding in findings
        if finding.fix is not None and not is_fixable(finding, unsafe_fixes=False)
    )
    ranked = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
    return [
        f"{_plural(count, code + ' fix', code + ' fixes')} "
        f"{'needs' if count == 1 else 'need'} --unsafe-fixes{': ' + reason if reason else ''}."
        for (code, reason), count in ranked
    ]


def render_summary(
    report: Report, *, color: bool = False, diff: bool = False, quiet: bool = False
) -> str:
    """The stderr summary: file errors, warnings, counts, fixability, baseline and bases
    (`quiet`: the file errors only)."""
    summary = report.summary
    lines: list[str] = []
    for error in report.errors:
        label = _paint("error:", _RED + _BOLD, color)
        lines.append(f"{error.path}:{error.line}:{error.col}: {label} {error.message}")
    if quiet:
        return "".join(line + "\n" for line in lines)
    for warning in summary.warnings:
        lines.append(f"{_paint('warning:', _YELLOW, color)} {warning}")

    if summary.fixed:
        verb = "Would fix" if diff else "Fixed"
        lines.append(
            f"{verb} {_plural(summary.fixed, 'finding')} in {_plural(summary.files_fixed, 'file')}."
        )
    remaining = len(report.findings)
    if remaining:
        safe = sum(is_fixable(f, unsafe_fixes=False) for f in report.findings)
        any_fix = sum(is_fixable(f, unsafe_fixes=True) for f in report.findings)
        fixable = any_fix if summary.unsafe_fixes else safe
        if diff:
            line = f"{_plural(remaining, 'finding')} would remain after the fixes"
        else:
            line = f"Found {_plural(remaining, 'finding')}"
        notes: list[str] = []
        if fixable and not diff:
            notes.append(f"{fixable} fixable with --fix")
        if not summary.unsafe_fixes and any_fix > safe:
            notes.append(f"{any_fix - safe} more with --unsafe-fixes")
        lines.append(line + (f" ({'; '.join(notes)})." if notes else "."))
        if not summary.unsafe_fixes:
            lines.extend(_withheld_fixes(report.findings))
    elif not report.errors and not (diff and summary.fixed):
        lines.append(_paint("All checks passed.", _CYAN, color))

    if summary.baselined:
        lines.append(f"{_plural(summary.baselined, 'finding')} hidden by the baseline.")
    if summary.stale_baseline:
        listed = ", ".join(
            f"{path} {code} {symbol} (x{count})"
            for (path, code, symbol), count in summary.stale_baseline[:5]
        )
        more = len(summary.stale_baseline) - 5
        lines.append(
            f"{_plural(len(summary.stale_baseline), 'baseline entry', 'baseline entries')} no longer "
            f"{'matches' if len(summary.stale_baseline) == 1 else 'match'} "
            f"(regenerate with --write-baseline): {listed}" + (f", and {more} more" if more > 0 else "")
        )
    if summary.suppressed:
        lines.append(f"{_plural(summary.suppressed, 'finding')} suppressed by inline comments.")
    if summary.unresolved_bases:
        ranked = sorted(summary.unresolved_bases.items(), key=lambda item: (-item[1], item[0]))
        listed = ", ".join(f"{name} ({count})" for name, count in ranked[:8])
        more = len(ranked) - 8
        classes = sum(summary.unresolved_bases.values())
        lines.append(
            f"{_plural(len(ranked), 'base class', 'base classes')} could not be resolved, so "
            f"{_plural(classes, 'class', 'classes')} inheriting from them "
            f"{'was' if classes == 1 else 'were'} only checked against their known bases: {listed}"
            + (f", and {more} more" if more > 0 else "")
        )
    if summary.missing_modules:
        ranked = sorted(summary.missing_modules.items(), key=lambda item: (-item[1], item[0]))
        listed = ", ".join(f"{name} ({count})" for name, count in ranked[:5])
        more = len(ranked) - 5
        lines.append(
            f"{_plural(len(ranked), 'module')} not installed where kvref looked: {listed}"
            + (f", and {more} more" if more > 0 else "")
            + "; pass --python with the project's interpreter or virtual environment, or "
            "install kvref where the project's dependencies are."
        )
    if report.errors:
        lines.append(f"{_plural(len(report.errors), 'file error')}.")
    checked = f"Checked {_plural(summary.files_reported, 'file')}"
    if summary.files_analyzed != summary.files_reported:
        checked += f" ({summary.files_analyzed} indexed)"
    lines.append(checked + ".")
    return "".join(line + "\n" for line in lines)

