"""`--output-format github`: GitHub Actions workflow commands, one `::error` per line.

`::error file=F,line=L,col=C,endLine=EL,endColumn=EC,title=CODE::message`, escaped as
actions/toolkit does (`command.ts`): data `%`, CR, LF; property values also `:` and `,`.
Paths are repository-relative so annotations land on the right file. The annotations do not
fail the step; the exit code does.
"""

from __future__ import annotations

from kvref.audit.report import Report

__all__ = ["render_github", "escape_data", "escape_property"]


def escape_data(text: str) -> str:
    """Escape a workflow command's message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a workflow command's property value."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _command(properties: dict[str, str | int], message: str) -> str:
    rendered = ",".join(f"{key}={escape_property(str(value))}" for key, value in properties.items())
    return f"::error {rendered}::{escape_data(message)}"


def render_github(report: Report) -> str:
    """One annotation per finding and per file error."""
    lines: list[str] = []
    for finding in report.findings:
        lines.append(
            _command(
                {
                    "file": report.uri_prefix + finding.path,
                    "line": finding.line,
                    "col": finding.col,
                    "endLine": finding.end_line,
                    "endColumn": finding.end_col,
                    "title": finding.code,
                },
                finding.message,
            )
        )
    for error in report.errors:
        lines.append(
            _command(
                {
                    "file": report.uri_prefix + error.path,
                    "line": error.line,
                    "col": error.col,
                    "title": "kvref error",
                },
                error.message,
            )
        )
    return "".join(line + "\n" for line in lines)
