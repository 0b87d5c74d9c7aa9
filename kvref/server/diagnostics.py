"""Findings as LSP diagnostics: code, message, range, severity, and a link to the rule's
documentation (`codeDescription`).

The link is the `ruleDocs` setting's URL with the code filled in, or else a Markdown page the
server writes once per kvref version from the rule's own documentation (what
`kvref explain CODE` prints), so the link works offline and always matches the rules running.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from lsprotocol import types

from kvref.audit.catalogue import RuleInfo
from kvref.audit.model import Finding
from kvref.server.positions import Encoding, client_column

__all__ = ["DIAGNOSTIC_SOURCE", "RuleLinks", "diagnostic", "finding_range"]

DIAGNOSTIC_SOURCE = "kvref"


class RuleLinks:
    """Each rule's documentation URL.

    Args:
        rules: every rule.
        template: a URL with `{code}` (the `ruleDocs` setting), or None for local pages.
        directory: where local pages are written (default: kvref's folder in the user's
            cache, by version).
    """

    def __init__(self, rules: Sequence[RuleInfo], template: str | None, directory: Path | None = None) -> None:
        self._links: dict[str, str] = {}
        if template is not None:
            self._links = {rule.code: template.replace("{code}", rule.code) for rule in rules}
            return
        from kvref import __version__

        if directory is None:
            cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            directory = Path(cache_home) / "kvref" / "rule-docs" / __version__
        for rule in rules:
            page = directory / f"{rule.code}.md"
            try:
                text = f"# {rule.code} {rule.name}\n\n{rule.summary}\n\n{rule.doc.strip()}\n"
                if not page.is_file() or page.read_text(encoding="utf-8") != text:
                    directory.mkdir(parents=True, exist_ok=True)
                    page.write_text(text, encoding="utf-8")
            except OSError:
                continue  # no writable cache: that diagnostic simply carries no link
            self._links[rule.code] = page.as_uri()

    def link(self, code: str) -> str | None:
        """The documentation URL of `code`, if there is one."""
        return self._links.get(code)

    @property
    def links(self) -> Mapping[str, str]:
        """Every code's URL."""
        return self._links


def finding_range(finding: Finding, lines: Sequence[str], encoding: Encoding) -> types.Range:
    """The finding's range (1-based, end column exclusive) in the client's units, clamped
    into the document."""
    start = client_column(lines, finding.line - 1, finding.col - 1, encoding)
    end = client_column(lines, finding.end_line - 1, finding.end_col - 1, encoding)
    if end < start:
        end = start
    return types.Range(
        start=types.Position(line=start.line, character=start.character),
        end=types.Position(line=end.line, character=end.character),
    )


def diagnostic(finding: Finding, lines: Sequence[str], encoding: Encoding, links: RuleLinks) -> types.Diagnostic:
    """The diagnostic of one finding in the document whose lines are `lines`."""
    href = links.link(finding.code)
    return types.Diagnostic(
        range=finding_range(finding, lines, encoding),
        message=finding.message,
        severity=types.DiagnosticSeverity.Warning,
        code=finding.code,
        code_description=types.CodeDescription(href=href) if href is not None else None,
        source=DIAGNOSTIC_SOURCE,
        data={"symbol": finding.symbol, "fixable": finding.fix is not None},
    )
