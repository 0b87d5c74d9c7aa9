"""Applying fixes to files: `--fix` writes them, `--diff` prints them.

The edits themselves are made by the engine's fixer (`kvref.audit.fixes.edits.apply_fixes`), which
keeps encoding, BOM, line endings and every untouched byte; this module chooses which fixes
run (safe ones, unsafe ones only with `--unsafe-fixes`), refuses a result the fixer says does
not parse, and writes atomically: a temporary file in the same directory, then `os.replace`,
keeping the file's permission bits, so an interrupted run never leaves half a file.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kvref.audit.atomic import write_atomically
from kvref.audit.model import Applicability, FileError, Finding, Fix
from kvref.audit.source import decode_lenient

__all__ = [
    "ApplyFixesFn",
    "FileFix",
    "FixPlan",
    "plan_fixes",
    "unified_diff",
    "write_fixes",
]


class ApplyFixesFn(Protocol):
    """The fixer's signature (`kvref.audit.fixes.edits.apply_fixes`)."""

    def __call__(self, source: bytes, fixes: Sequence[Fix]) -> bytes: ...


@dataclass(frozen=True, slots=True)
class FileFix:
    """One file's fixed content.

    Attributes:
        path: project-relative path.
        original: the bytes read.
        fixed: the bytes after the fixes.
        findings: the findings these fixes resolve.
    """

    path: str
    original: bytes
    fixed: bytes
    findings: tuple[Finding, ...]


@dataclass(frozen=True, slots=True)
class FixPlan:
    """The files that would change, and the files whose fixes were refused."""

    files: list[FileFix]
    errors: list[FileError]

    @property
    def fixed_findings(self) -> int:
        """How many findings the changed files resolve."""
        return sum(len(file.findings) for file in self.files)


def _allowed(fix: Fix | None, unsafe_fixes: bool) -> bool:
    return fix is not None and (unsafe_fixes or fix.applicability is Applicability.SAFE)


def plan_fixes(
    findings: Iterable[Finding],
    *,
    root: Path,
    unsafe_fixes: bool,
    apply_fixes: ApplyFixesFn,
    fix_error: type[Exception],
    sources: Mapping[str, bytes] | None = None,
) -> FixPlan:
    """Compute every file's fixed content without writing anything.

    A file whose fixed content the fixer rejects (`fix_error`) or that cannot be read is not
    changed and becomes a `FileError`. `sources` gives the content of files that are not
    read from disk (the file read from stdin), by project-relative path.
    """
    by_file: defaultdict[str, list[Finding]] = defaultdict(list)
    for finding in findings:
        if _allowed(finding.fix, unsafe_fixes):
            by_file[finding.path].append(finding)
    files: list[FileFix] = []
    errors: list[FileError] = []
    for path, file_findings in sorted(by_file.items()):
        file_findings.sort(key=lambda f: (f.line, f.col, f.code))
        first = file_findings[0]
        try:
            original = sources[path] if sources and path in sources else (root / path).read_bytes()
        except OSError as exc:
            errors.append(FileError(path, first.line, first.col, f"cannot read for fixing: {exc.strerror}"))
            continue
        fixes = [finding.fix for finding in file_findings if finding.fix is not None]
        try:
            fixed = apply_fixes(original, fixes)
        except fix_error as exc:
            errors.append(
                FileError(path, first.line, first.col, f"fixes not applied (the result would not parse): {exc}")
            )
            continue
        if fixed != original:
            files.append(FileFix(path, original, fixed, tuple(file_findings)))
    return FixPlan(files, errors)


def write_fixes(root: Path, files: Sequence[FileFix]) -> tuple[list[FileFix], list[FileError]]:
    """Write each fixed file atomically; returns the files written and the write failures.

    A file that changed on disk since it was read is left alone (another tool got there
    first), so a fix is never applied to content it was not computed from.
    """
    written: list[FileFix] = []
    errors: list[FileError] = []
    for file in files:
        target = root / file.path
        first = file.findings[0]
        try:
            if target.read_bytes() != file.original:
                errors.append(FileError(file.path, first.line, first.col, "changed while fixing; not written"))
                continue
            write_atomically(target, file.fixed)
        except OSError as exc:
            errors.append(FileError(file.path, first.line, first.col, f"cannot write fixes: {exc.strerror}"))
            continue
        written.append(file)
    return written, errors


def unified_diff(file: FileFix, *, decode: Callable[[bytes], str] = decode_lenient) -> str:
    """The change to one file as a unified diff (`a/path`, `b/path` headers)."""
    before = decode(file.original).splitlines(keepends=True)
    after = decode(file.fixed).splitlines(keepends=True)
    lines = difflib.unified_diff(before, after, fromfile=f"a/{file.path}", tofile=f"b/{file.path}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
