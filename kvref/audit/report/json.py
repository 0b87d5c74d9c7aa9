"""`--output-format json`: one JSON document on stdout.

Shape (format version 1; lines and columns are 1-based, `end_col` is the column just after the
last character, edit positions likewise):

    {"version": 1, "tool": {"name": "kvref", "version": "0.1.0"},
     "positions": "1-based lines and columns; end columns are exclusive",
     "findings": [{"code", "name", "message", "symbol", "path", "line", "col", "end_line",
                   "end_col", "fixable", "fix": null | {"applicability": "safe" | "unsafe",
                   "description", "edits": [{"line", "col", "end_line", "end_col", "content"}]}}],
     "errors": [{"path", "line", "col", "message"}],
     "summary": {"findings", "fixable", "errors", "files_analyzed", "files_reported", "fixed",
                 "baselined", "suppressed", "stale_baseline": [...], "unresolved_bases": {...},
                 "missing_modules": {...}}}

`fixable` says whether `--fix` would fix the finding with the flags given (unsafe fixes count
only with `--unsafe-fixes`); `fix` is present whenever the rule offers one.
"""

from __future__ import annotations

import json
import re
from json.encoder import encode_basestring

from kvref.audit.model import Finding
from kvref.audit.report import Report, is_fixable

__all__ = ["JSON_FORMAT_VERSION", "render_json", "render_statistics_json", "finding_to_json"]

JSON_FORMAT_VERSION = 1

JSONValue = None | bool | int | str | list["JSONValue"] | dict[str, "JSONValue"]


def finding_to_json(finding: Finding, *, name: str, unsafe_fixes: bool) -> dict[str, JSONValue]:
    """One finding as a JSON object."""
    fix: JSONValue = None
    if finding.fix is not None:
        fix = {
            "applicability": finding.fix.applicability.value,
            "description": finding.fix.description,
            "edits": [
                {
                    "line": edit.start_line,
                    "col": edit.start_col + 1,
                    "end_line": edit.end_line,
                    "end_col": edit.end_col + 1,
                    "content": edit.text,
                }
                for edit in finding.fix.edits
            ],
        }
    return {
        "code": finding.code,
        "name": name,
        "message": finding.message,
        "symbol": finding.symbol,
        "path": finding.path,
        "line": finding.line,
        "col": finding.col,
        "end_line": finding.end_line,
        "end_col": finding.end_col,
        "fixable": is_fixable(finding, unsafe_fixes=unsafe_fixes),
        "fix": fix,
    }


def render_json(report: Report) -> str:
    """The whole report as one JSON document (ends with a newline)."""
    names = {rule.code: rule.name for rule in report.rules}
    summary = report.summary
    document: dict[str, JSONValue] = {
        "version": JSON_FORMAT_VERSION,
        "tool": {"name": "kvref", "version": report.tool_version},
        "positions": "1-based lines and columns; end columns are exclusive",
        "findings": [],  # written by _finding_text below, one per line
        "errors": [
            {"path": error.path, "line": error.line, "col": error.col, "message": error.message}
            for error in report.errors
        ],
        "summary": {
            "findings": len(report.findings),
            "fixable": sum(
                is_fixable(finding, unsafe_fixes=summary.unsafe_fixes) for finding in report.findings
            ),
            "errors": len(report.errors),
            "files_analyzed": summary.files_analyzed,
            "files_reported": summary.files_reported,
            "fixed": summary.fixed,
            "baselined": summary.baselined,
            "suppressed": summary.suppressed,
            "stale_baseline": [
                {"path": path, "code": code, "symbol": symbol, "count": count}
                for (path, code, symbol), count in summary.stale_baseline
            ],
            "unresolved_bases": dict(sorted(summary.unresolved_bases.items())),
            "missing_modules": dict(summary.missing_modules),
        },
    }
    findings = [
        _finding_text(finding, names.get(finding.code, ""), summary.unsafe_fixes)
        for finding in report.findings
    ]
    return _dumps_one_item_per_line(document, {"findings": findings})


_ENCODER = json.JSONEncoder(ensure_ascii=False)


def _finding_text(finding: Finding, name: str, unsafe_fixes: bool) -> str:
    """`finding_to_json(...)` as `_ENCODER.encode` writes it, without building the dicts.

    A large report has ten thousand findings; formatting them directly (strings still go
    through the encoder) takes half the time, and a property test holds the two to the same
    text.
    """
    text = encode_basestring  # what `_ENCODER.encode` does with a str, minus the call to it
    fix = finding.fix
    if fix is None:
        fix_text = "null"
    else:
        edits = ", ".join(
            f'{{"line": {edit.start_line}, "col": {edit.start_col + 1}, '
            f'"end_line": {edit.end_line}, "end_col": {edit.end_col + 1}, '
            f'"content": {text(edit.text)}}}'
            for edit in fix.edits
        )
        fix_text = (
            f'{{"applicability": {text(fix.applicability.value)}, '
            f'"description": {text(fix.description)}, "edits": [{edits}]}}'
        )
    fixable = "true" if is_fixable(finding, unsafe_fixes=unsafe_fixes) else "false"
    return (
        f'{{"code": {text(finding.code)}, "name": {text(name)}, '
        f'"message": {text(finding.message)}, "symbol": {text(finding.symbol)}, '
        f'"path": {text(finding.path)}, "line": {finding.line}, "col": {finding.col}, '
        f'"end_line": {finding.end_line}, "end_col": {finding.end_col}, '
        f'"fixable": {fixable}, "fix": {fix_text}}}'
    )


def _dumps_one_item_per_line(
    document: dict[str, JSONValue], encoded: dict[str, list[str]] | None = None
) -> str:
    """`document` as JSON with one top-level key, and one list item, per line.

    `json.dumps(indent=...)` falls back to the pure-Python encoder, which took a quarter of a
    warm audit of vLLM (10,000 findings); dumping each item compactly keeps the C encoder and
    still gives one finding per line to read and diff. `encoded` gives the items of some
    lists already encoded.
    """
    encode = _ENCODER.encode  # one encoder: `json.dumps` with options builds one per call
    lines: list[str] = []
    for key, value in document.items():
        head = f"  {encode(key)}: "
        items = (encoded or {}).get(key)
        if items is None and isinstance(value, list):
            items = list(map(encode, value))
        if items:
            joined = ",\n    ".join(items)
            lines.append(f"{head}[\n    {joined}\n  ]")
        else:
            lines.append(head + encode(value))
    return escape_surrogates("{\n" + ",\n".join(lines) + "\n}\n")


_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_surrogates(text: str) -> str:
    """JSON text with each lone surrogate written as a `\\udcXX` escape.

    A file name that is not valid UTF-8 reaches kvref with its bytes as lone surrogates
    (`os.fsdecode`); UTF-8 cannot encode them, but JSON's escape can, and `json.loads` gives
    back the same string. Outside strings JSON text is ASCII, so every match is inside one.
    """
    if text.isascii():
        return text
    return _SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def render_statistics_json(report: Report) -> str:
    """`--statistics --output-format json`: one object per code found, most first."""
    from kvref.audit.report.text import count_by_code

    rows: list[JSONValue] = [
        {"code": code, "name": name, "count": count, "fixable": fixable}
        for code, name, count, fixable in count_by_code(report)
    ]
    return json.dumps(rows, indent=2) + "\n"
