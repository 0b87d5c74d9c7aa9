"""`--output-format sarif`: SARIF 2.1.0 for GitHub code scanning.

Carries every property GitHub requires (`$schema`, `version`, `runs[].tool.driver.name` and
`rules[]` with `id`, `shortDescription`, `fullDescription`, `help`; results with `ruleId`,
`message.text`, a physical location with a repository-relative `artifactLocation.uri` and a
`region`, and `partialFingerprints.primaryLocationLineHash`). The fingerprint hashes
(path, code, symbol) plus an occurrence number, so an alert survives code moving within its
file. File errors become `invocations[].toolExecutionNotifications`. A finding with a fix
carries it as `fixes[0]`: every edit of the fix (the imports it adds included) as a
replacement of a region (an insertion is an empty region), 1-based columns, end exclusive,
like the JSON output; an unsafe fix says so in its description. Typed with hand-written
TypedDicts for the subset used (no SARIF dependency).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Literal, NotRequired, TypedDict
from urllib.parse import quote

from kvref.audit.catalogue import FixSafety, RuleInfo, doc_section
from kvref.audit.model import Applicability, Fix
from kvref.audit.report import Report

__all__ = ["SARIF_SCHEMA", "SarifLog", "build_sarif", "render_sarif", "fingerprint"]

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"

Level = Literal["none", "note", "warning", "error"]


class Message(TypedDict):
    text: str


class MultiformatMessage(TypedDict):
    text: str
    markdown: NotRequired[str]


class ReportingConfiguration(TypedDict):
    level: Level
    enabled: bool


class ReportingDescriptor(TypedDict):
    id: str
    name: str
    shortDescription: MultiformatMessage
    fullDescription: MultiformatMessage
    help: MultiformatMessage
    defaultConfiguration: ReportingConfiguration


class ToolComponent(TypedDict):
    name: str
    version: str
    semanticVersion: str
    rules: list[ReportingDescriptor]


class Tool(TypedDict):
    driver: ToolComponent


class ArtifactLocation(TypedDict):
    uri: str
    uriBaseId: NotRequired[str]


class Region(TypedDict):
    startLine: int
    startColumn: int
    endLine: NotRequired[int]
    endColumn: NotRequired[int]


class PhysicalLocation(TypedDict):
    artifactLocation: ArtifactLocation
    region: Region


class Location(TypedDict):
    physicalLocation: PhysicalLocation


class Replacement(TypedDict):
    deletedRegion: Region
    insertedContent: Message


class ArtifactChange(TypedDict):
    artifactLocation: ArtifactLocation
    replacements: list[Replacement]


class SarifFix(TypedDict):
    description: Message
    artifactChanges: list[ArtifactChange]


class Result(TypedDict):
    ruleId: str
    ruleIndex: int
    level: Level
    message: Message
    locations: list[Location]
    partialFingerprints: dict[str, str]
    fixes: NotRequired[list[SarifFix]]


class Notification(TypedDict):
    level: Level
    message: Message
    locations: list[Location]


class Invocation(TypedDict):
    executionSuccessful: bool
    toolExecutionNotifications: list[Notification]


class Run(TypedDict):
    tool: Tool
    columnKind: Literal["unicodeCodePoints"]
    results: list[Result]
    invocations: list[Invocation]


SarifLog = TypedDict("SarifLog", {"$schema": str, "version": Literal["2.1.0"], "runs": list[Run]})


def fingerprint(path: str, code: str, symbol: str, occurrence: int) -> str:
    """A stable `primaryLocationLineHash`: independent of line numbers."""
    digest = hashlib.sha256(f"{path}\0{code}\0{symbol}".encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"{digest}:{occurrence}"


def _descriptor(rule: RuleInfo, selected: frozenset[str]) -> ReportingDescriptor:
    summary = rule.summary or rule.name
    full = " ".join((doc_section(rule.doc, "What it does") or summary).split())
    help_text = rule.doc or summary
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": summary},
        "fullDescription": {"text": full},
        "help": {"text": help_text, "markdown": help_text},
        "defaultConfiguration": {"level": "error", "enabled": rule.code in selected},
    }


def _quoted(path: str) -> str:
    """A relative path as a URI reference; a name that is not UTF-8 keeps its own bytes."""
    return quote(path.encode("utf-8", "surrogateescape"), safe="/")


def _location(uri: str, line: int, col: int, end_line: int | None, end_col: int | None) -> Location:
    region: Region = {"startLine": max(line, 1), "startColumn": max(col, 1)}
    if end_line is not None and end_col is not None and end_line >= 1 and end_col >= 1:
        region["endLine"] = end_line
        region["endColumn"] = end_col
    return {
        "physicalLocation": {
            "artifactLocation": {"uri": _quoted(uri), "uriBaseId": "%SRCROOT%"},
            "region": region,
        }
    }


def _fix(uri: str, fix: Fix) -> SarifFix:
    description = fix.description or "Fix"
    if fix.applicability is Applicability.UNSAFE and "unsafe" not in description:
        description += " (unsafe: applied with --unsafe-fixes)"
    replacements: list[Replacement] = [
        {
            "deletedRegion": {
                "startLine": edit.start_line,
                "startColumn": edit.start_col + 1,
                "endLine": edit.end_line,
                "endColumn": edit.end_col + 1,
            },
            "insertedContent": {"text": edit.text},
        }
        for edit in fix.edits
    ]
    return {
        "description": {"text": description},
        "artifactChanges": [
            {
                "artifactLocation": {"uri": _quoted(uri), "uriBaseId": "%SRCROOT%"},
                "replacements": replacements,
            }
        ],
    }


def build_sarif(report: Report) -> SarifLog:
    """The SARIF log for `report`."""
    rules = list(report.rules)
    known = {rule.code for rule in rules}
    # A finding whose rule the catalogue does not list still needs a descriptor.
    for code in sorted({finding.code for finding in report.findings} - known):
        rules.append(RuleInfo(code, code.lower(), True, FixSafety.NONE, "", code))
    index = {rule.code: position for position, rule in enumerate(rules)}
    occurrences: Counter[tuple[str, str, str]] = Counter()
    results: list[Result] = []
    for finding in report.findings:
        key = (finding.path, finding.code, finding.symbol)
        occurrences[key] += 1
        result: Result = {
            "ruleId": finding.code,
            "ruleIndex": index[finding.code],
            "level": "error",
            "message": {"text": finding.message or finding.code},
            "locations": [
                _location(
                    report.uri_prefix + finding.path,
                    finding.line,
                    finding.col,
                    finding.end_line,
                    finding.end_col,
                )
            ],
            "partialFingerprints": {
                "primaryLocationLineHash": fingerprint(*key, occurrences[key])
            },
        }
        if finding.fix is not None and finding.fix.edits:
            result["fixes"] = [_fix(report.uri_prefix + finding.path, finding.fix)]
        results.append(result)
    notifications: list[Notification] = [
        {
            "level": "error",
            "message": {"text": f"{error.path}: {error.message}"},
            "locations": [
                _location(report.uri_prefix + error.path, error.line, error.col, None, None)
            ],
        }
        for error in report.errors
    ]
    version = report.tool_version or "0"
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "kvref",
                        "version": version,
                        "semanticVersion": version,
                        "rules": [_descriptor(rule, report.selected) for rule in rules],
                    }
                },
                "columnKind": "unicodeCodePoints",
                "results": results,
                "invocations": [
                    {
                        "executionSuccessful": not report.errors,
                        "toolExecutionNotifications": notifications,
                    }
                ],
            }
        ],
    }


def render_sarif(report: Report) -> str:
    """The SARIF log as indented JSON (ends with a newline)."""
    return json.dumps(build_sarif(report), indent=2, ensure_ascii=False) + "\n"
