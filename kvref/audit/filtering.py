"""Which of the engine's findings a run shows: the selected codes, in the reported files, not
ignored for their file (`per-file-ignores`) and not suppressed on their line (`# noqa: CODE`).

`kvref audit` (`kvref.audit.run`) and `kvref server` both filter through `shown_findings`, so an
editor sees what the command line prints for the same text.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from kvref.audit.catalogue import RuleInfo
from kvref.audit.discover.config import AuditConfig, codes_matching
from kvref.audit.discover.files import matches_glob
from kvref.audit.model import AnalysisResult, Finding
from kvref.audit.summarise.suppress import SuppressionFilter

__all__ = ["ShownFindings", "shown_findings"]


@dataclass(frozen=True, slots=True)
class ShownFindings:
    """The findings to show, sorted by (path, line, col, code), and how many were suppressed."""

    findings: list[Finding]
    suppressed: int


def shown_findings(
    result: AnalysisResult,
    *,
    config: AuditConfig,
    selected: Collection[str],
    rules: Sequence[RuleInfo],
    read: Callable[[str], bytes | None],
    reported: Collection[str] | None,
) -> ShownFindings:
    """Filter `result.findings` as the command line does.

    Args:
        result: the engine's result.
        config: the project's settings (its `per-file-ignores`).
        selected: the enabled codes.
        rules: every rule (to expand the selectors of `per-file-ignores`).
        read: a project-relative file's bytes (for its suppression comments), None when
            unreadable.
        reported: the project-relative paths reported on (None: all).
    """
    ignored_codes: dict[str, set[str]] = {}

    def per_file_ignored(path: str) -> set[str]:
        if path not in ignored_codes:
            codes: set[str] = set()
            for glob, selectors in config.per_file_ignores:
                if matches_glob(glob, path):
                    for selector in selectors:
                        codes |= codes_matching(selector, rules, enabling=False)
            ignored_codes[path] = codes
        return ignored_codes[path]

    candidates = [
        finding
        for finding in result.findings
        if finding.code in selected
        and (reported is None or finding.path in reported)
        and finding.code not in per_file_ignored(finding.path)
    ]
    suppression = SuppressionFilter(read, result.suppression_lines)
    findings = sorted(suppression.keep(candidates), key=lambda f: (f.path, f.line, f.col, f.code))
    return ShownFindings(findings, suppression.suppressed)
