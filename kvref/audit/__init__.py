"""`kvref audit`: a cross-file @override and Collection-conformance checker.

The engine API: `analyze` a project (or `summarize_file`/`summarize` one file), then
`apply_fixes` to a file's bytes. Rules are listed in `ALL_RULES` and found by `get_rule`.
The command line: `kvref.audit.main.main(argv)` (or `run_audit` with an `AuditRequest`)
runs a whole audit.
"""

from kvref.audit.engine import SummarizeMany, analyze, summarize_file
from kvref.audit.fixer import FixError, apply_fixes
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
from kvref.audit.resolve import ProjectIndex
from kvref.audit.rules import ALL_RULES, Rule, get_rule
from kvref.audit.summary import ModuleSummary, SummaryError, summarize

# The command line (`kvref.audit.main.main(argv) -> int` is the argparse entry point).
from kvref.audit.config import AuditConfig, ConfigError
from kvref.audit.main import AuditRequest, run_audit
from kvref.audit.report import OutputFormat

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
