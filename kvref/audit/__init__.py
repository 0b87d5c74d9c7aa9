"""`kvref audit`: a cross-file @override and Collection-conformance checker.

The engine API: `analyze` a project (or `summarize_file`/`summarize` one file), then
`apply_fixes` to a file's bytes. Rules are listed in `ALL_RULES` and found by `get_rule`.
The command line: `kvref.cli.audit_main(argv)` (the typer command's options) or `run_audit`
with an `AuditRequest` runs a whole audit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvref._lazy import lazy_exports

if TYPE_CHECKING:
    from kvref.audit.pipeline import SummarizeMany, analyze, summarize_file
    from kvref.audit.fixes.edits import FixError, apply_fixes
    from kvref.audit.model import (
        DEFAULT_EXEMPT_NAMES,
        AnalysisOptions,
        AnalysisResult,
        Applicability,
        Edit,
        FileError,
        Finding,
        Fix,
        RequiredImport,
    )
    from kvref.audit.resolve.hierarchy import ProjectIndex
    from kvref.audit.rules import ALL_RULES, Rule, get_rule
    from kvref.audit.source import SummaryError
    from kvref.audit.summarise.records import ModuleSummary
    from kvref.audit.summarise.summary import summarize

    # The command line (`kvref.cli.audit_main(argv) -> int` parses with the typer command).
    from kvref.audit.discover.config import AuditConfig, ConfigError
    from kvref.audit.command import AuditRequest, run_audit
    from kvref.audit.report import OutputFormat

# Imported on first use (PEP 562): `kvref audit` and a pre-commit hook need none of this,
# and importing it all cost a noticeable share of a warm audit.
_EXPORTS: dict[str, str] = {
    # kvref.audit.pipeline
    "SummarizeMany": "kvref.audit.pipeline",
    "analyze": "kvref.audit.pipeline",
    "summarize_file": "kvref.audit.pipeline",
    # kvref.audit.fixes.edits
    "FixError": "kvref.audit.fixes.edits",
    "apply_fixes": "kvref.audit.fixes.edits",
    # kvref.audit.model
    "DEFAULT_EXEMPT_NAMES": "kvref.audit.model",
    "AnalysisOptions": "kvref.audit.model",
    "AnalysisResult": "kvref.audit.model",
    "Applicability": "kvref.audit.model",
    "Edit": "kvref.audit.model",
    "FileError": "kvref.audit.model",
    "Finding": "kvref.audit.model",
    "Fix": "kvref.audit.model",
    "RequiredImport": "kvref.audit.model",
    # kvref.audit.resolve.hierarchy
    "ProjectIndex": "kvref.audit.resolve.hierarchy",
    # kvref.audit.rules
    "ALL_RULES": "kvref.audit.rules",
    "Rule": "kvref.audit.rules",
    "get_rule": "kvref.audit.rules",
    # kvref.audit.summarise
    "ModuleSummary": "kvref.audit.summarise.records",
    "SummaryError": "kvref.audit.source",
    "summarize": "kvref.audit.summarise.summary",
    # kvref.audit.discover.config
    "AuditConfig": "kvref.audit.discover.config",
    "ConfigError": "kvref.audit.discover.config",
    # kvref.audit.command
    "AuditRequest": "kvref.audit.command",
    "run_audit": "kvref.audit.command",
    # kvref.audit.report
    "OutputFormat": "kvref.audit.report",
}
if not TYPE_CHECKING:  # checkers see the imports above, not a catch-all `__getattr__`
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ALL_RULES",
    "DEFAULT_EXEMPT_NAMES",
    "AnalysisOptions",
    "AnalysisResult",
    "Applicability",
    "Edit",
    "FileError",
    "Finding",
    "Fix",
    "FixError",
    "ModuleSummary",
    "ProjectIndex",
    "RequiredImport",
    "Rule",
    "SummarizeMany",
    "SummaryError",
    "analyze",
    "apply_fixes",
    "get_rule",
    "summarize",
    "summarize_file",
    # command line
    "AuditConfig",
    "AuditRequest",
    "ConfigError",
    "OutputFormat",
    "run_audit",
]
