"""Inline suppression: `# kvref: ignore[KVR001]` or `# noqa: KVR001` on the finding's line.

A finding's line is its `def` line (where the method's name is). Codes are separated by commas
and/or spaces; `noqa` is matched case-insensitively, codes are not case-sensitive either. A
bare `# noqa` or `# kvref: ignore` suppresses nothing: kvref has no blanket suppression, so a
suppression always says what it accepts.

A bare `# type: ignore` is the type checkers' blanket suppression: pyright, mypy and ty report
nothing on its line, so a method whose `def` line carries one is a method they never report a
missing `@override` on. KVR001 follows them there (`type_ignore_lines`); with codes
(`# type: ignore[override]`) the comment names other checks, and KVR001 still reports.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kvref.audit.model import Finding

__all__ = [
    "candidate_lines",
    "suppressions_by_line",
    "codes_in_comment",
    "type_ignore_lines",
    "SuppressionFilter",
]

_CODE = r"[A-Za-z]+[0-9]+"
_CODES = rf"{_CODE}(?:[\s,]+{_CODE})*"
_NOQA = re.compile(rf"#\s*noqa\s*:\s*(?P<codes>{_CODES})", re.IGNORECASE)
_KVREF_IGNORE = re.compile(r"#\s*kvref\s*:\s*ignore\[(?P<codes>[^\]]*)\]", re.IGNORECASE)
_TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore(?!\s*\[)(?!\w)")


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


_SUPPRESSION_WORDS = ("noqa", "kvref")  # searched in lowered text


def candidate_lines(text: str) -> tuple[int, ...]:
    """The 1-based lines that mention `noqa` or `kvref` in any case: the only lines that can
    carry a suppression comment (`suppressions_by_line` still tokenizes to be sure).

    The summariser records these for every file, so checking a finding on any other line
    needs no file read at all.
    """
    lowered = text.lower()
    if "noqa" not in lowered and "kvref" not in lowered:  # most files: two scans, done
        return ()
    if "\r" in lowered:  # line numbers count every line break Python's tokenizer knows
        lowered = lowered.replace("\r\n", "\n").replace("\r", "\n")
    # `str.find` per word beats one alternation pattern; neither word can overlap itself or
    # the other, so the union of their occurrences is what the pattern would match.
    starts: list[int] = []
    find = lowered.find
    for word in _SUPPRESSION_WORDS:
        start = find(word)
        while start >= 0:
            starts.append(start)
            start = find(word, start + len(word))
    starts.sort()
    found: list[int] = []
    line, position = 1, 0
    for start in starts:
        line += lowered.count("\n", position, start)
        position = start
        if not found or found[-1] != line:
            found.append(line)
    return tuple(found)


def type_ignore_lines(text: str) -> tuple[int, ...]:
    """The 1-based lines with a bare `# type: ignore` comment (see the module docstring)."""
    if "ignore" not in text:
        return ()
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    found: list[int] = []
    line, position = 1, 0
    for match in _TYPE_IGNORE.finditer(text):
        line += text.count("\n", position, match.start())
        position = match.start()
        if not found or found[-1] != line:
            found.append(line)
    return tuple(found)


@dataclass(slots=True)
class _FileComments:
    """One file's candidate lines; its comments are tokenized only once a finding needs them."""

    source: bytes
    candidates: tuple[int, ...]
    by_line: dict[int, frozenset[str]] | None = None

    def codes(self, line: int) -> frozenset[str]:
        if line not in self.candidates:
            return frozenset()
        if self.by_line is None:
            self.by_line = suppressions_by_line(self.source)
        return self.by_line.get(line, frozenset())


@dataclass(slots=True)
class SuppressionFilter:
    """Drops suppressed findings, reading each file's comments once.

    Attributes:
        read_source: returns a project-relative file's bytes, or None when unreadable.
        candidate_lines: when known (`AnalysisResult.suppression_lines`), the lines of each
            file that mention a suppression word; a file not listed has none, and a finding
            on any other line is kept without reading its file.
        suppressed: how many findings were dropped so far.
    """

    read_source: Callable[[str], bytes | None]
    candidate_lines: Mapping[str, tuple[int, ...]] | None = None
    suppressed: int = 0
    _cache: dict[str, _FileComments] | None = None

    def is_suppressed(self, finding: Finding) -> bool:
        """Whether the finding's line suppresses its code."""
        if self.candidate_lines is not None and finding.line not in self.candidate_lines.get(
            finding.path, ()
        ):
            return False
        if self._cache is None:
            self._cache = {}
        comments = self._cache.get(finding.path)
        if comments is None:
            source = self.read_source(finding.path) or b""
            text = source.decode("utf-8", errors="replace")
            comments = self._cache[finding.path] = _FileComments(source, candidate_lines(text))
        return finding.code.upper() in comments.codes(finding.line)

    def keep(self, findings: Iterable[Finding]) -> list[Finding]:
        """The findings that are not suppressed (counting the others in `suppressed`)."""
        kept: list[Finding] = []
        for finding in findings:
            if self.is_suppressed(finding):
                self.suppressed += 1
            else:
                kept.append(finding)
        return kept
