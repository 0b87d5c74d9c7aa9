"""The documents an editor has open, and the diagnostics published for each.

A document's text is the editor's (`didOpen`, then `didChange`); its findings are those of its
latest text that the audit could read. While a text does not parse (in the middle of typing),
the last good findings stay, their ranges clamped into the current text, so that diagnostics
neither flicker away nor point past the end of the document.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lsprotocol import types

from kvref.audit.model import Finding
from kvref.audit.source import split_lines
from kvref.server.diagnostics import RuleLinks, diagnostic
from kvref.server.positions import Encoding
from kvref.server.project import DocumentFindings

__all__ = ["OpenDocument", "updated_diagnostics"]


@dataclass(slots=True)
class OpenDocument:
    """One open document.

    Attributes:
        uri, path: where it is.
        version: the editor's version of `text`.
        text: the editor's text.
        good: the findings of the last text the audit could read.
        published: the diagnostics last published (None: none yet).
    """

    uri: str
    path: Path
    version: int | None
    text: str
    good: tuple[Finding, ...] = ()
    published: list[types.Diagnostic] | None = field(default=None)


def updated_diagnostics(
    document: OpenDocument, text: str, outcome: DocumentFindings, encoding: Encoding, links: RuleLinks
) -> list[types.Diagnostic]:
    """The diagnostics for `text` (the document's text the outcome was computed from), keeping
    the last good findings while the text does not parse; updates `document.good`."""
    findings: Sequence[Finding]
    if not outcome.audited:
        findings = ()
    elif outcome.error is not None:
        findings = document.good  # mid-typing: keep what was found last
    else:
        findings = document.good = outcome.findings
    lines = split_lines(text)
    return [diagnostic(finding, lines, encoding, links) for finding in findings]
