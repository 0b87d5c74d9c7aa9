"""Inline suppression: `# kvref: ignore[KVR001]` or `# noqa: KVR001` on the finding's line.

A finding's line is its `def` line (where the method's name is). Codes are separated by commas
and/or spaces; `noqa` is matched case-insensitively, codes are not case-sensitive either. A
bare `# noqa` or `# kvref: ignore` suppresses nothing: kvref has no blanket suppression, so a
suppression always says what it accepts.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvref.audit.model import Finding

__all__ = ["suppressions_by_line", "codes_in_comment", "SuppressionFilter"]

_CODE = r"[A-Za-z]+[0-9]+"
_CODES = rf"{_CODE}(?:[\s,]+{_CODE})*"
_NOQA = re.compile(rf"#\s*noqa\s*:\s*(?P<codes>{_CODES})", re.IGNORECASE)
_KVREF_IGNORE = re.compile(r"#\s*kvref\s*:\s*ignore\[(?P<codes>[^\]]*)\]", re.IGNORECASE)


def codes_in_comment(comment: str) -> frozenset[str]:
    """The codes a comment suppresses (upper-case), empty when it names none."""
    codes: set[str] = set()
    for pattern in (_NOQA, _KVREF_IGNORE):
        for match in pattern.finditer(comment):
            codes.update(code.upper() for code in re.split(r"[\s,]+", match.group("codes")) if code)
    return frozenset(codes)


def suppressions_by_line(source: bytes) -> dict[int, frozenset[str]]:
    """Suppressed codes for each 1-based line that carries a suppression comment.

    Comments are found with `tokenize`, so a `# noqa` inside a string does not count; a file
    that does not tokenize falls back to a line-by-line scan.
    """
    found: dict[int, frozenset[str]] = {}
    # Every suppression names `noqa` or `kvref`; most files have neither, and tokenizing
    # them is most of a warm run's time.
    lowered = source.lower()
    if b"noqa" not in lowered and b"kvref" not in lowered:
        return found
    try:
        for token in tokenize.tokenize(io.BytesIO(source).readline):
            if token.type == tokenize.COMMENT:
                codes = codes_in_comment(token.string)
                if codes:
                    found[token.start[0]] = found.get(token.start[0], frozenset()) | codes
        return found
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
        found.clear()
    text = source.decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if "#" in line:
            codes = codes_in_comment(line[line.index("#") :])
            if codes:
                found[number] = codes
    return found


@dataclass(frozen=True, slots=True)
class _Pending:
    """A line that mentions a suppression word; tokenizing decides whether it is a comment."""

    source: bytes


_SUPPRESSION_WORD = re.compile(rb"noqa|kvref", re.IGNORECASE)


def _candidate_lines(source: bytes) -> dict[int, frozenset[str] | _Pending]:
    """Lines that may carry a suppression, found without tokenizing (most files have none)."""
    pending = _Pending(source)
    found: dict[int, frozenset[str] | _Pending] = {}
    if _SUPPRESSION_WORD.search(source) is None:
        return found
    for number, line in enumerate(source.splitlines(), start=1):
        if _SUPPRESSION_WORD.search(line) is not None:
            found[number] = pending
    return found


@dataclass(slots=True)
class SuppressionFilter:
    """Drops suppressed findings, reading each file's comments once.

    Attributes:
        read_source: returns a project-relative file's bytes, or None when unreadable.
        suppressed: how many findings were dropped so far.
    """

    read_source: Callable[[str], bytes | None]
    suppressed: int = 0
    _cache: dict[str, dict[int, frozenset[str] | _Pending]] | None = None

    def is_suppressed(self, finding: Finding) -> bool:
        """Whether the finding's line suppresses its code."""
        if self._cache is None:
            self._cache = {}
        by_line = self._cache.get(finding.path)
        if by_line is None:
            source = self.read_source(finding.path)
            by_line = _candidate_lines(source) if source is not None else {}
            self._cache[finding.path] = by_line
        codes = by_line.get(finding.line)
        if isinstance(codes, _Pending):
            # Only now is the whole file tokenized: a comment, not a string, must carry it.
            by_line.clear()
            by_line.update(suppressions_by_line(codes.source))
            codes = by_line.get(finding.line)
        return isinstance(codes, frozenset) and finding.code.upper() in codes

    def keep(self, findings: Iterable[Finding]) -> list[Finding]:
        """The findings that are not suppressed (counting the others in `suppressed`)."""
        kept: list[Finding] = []
        for finding in findings:
            if self.is_suppressed(finding):
                self.suppressed += 1
            else:
                kept.append(finding)
        return kept
