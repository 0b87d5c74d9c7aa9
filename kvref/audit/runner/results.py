"""The last whole run's result, reused when nothing it depends on has changed."""

from __future__ import annotations

import hashlib
import marshal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import cast

from kvref.audit.atomic import write_atomically
from kvref.audit.model import AnalysisResult, Applicability, Edit, FileError, Finding, Fix
from kvref.audit.runner.cache import RACY_WINDOW_NS, ensure_directory

__all__ = ["ResultCache"]


def _encode_result(result: AnalysisResult) -> tuple[object, ...]:
    findings = tuple(
        (
            f.path, f.line, f.col, f.end_line, f.end_col, f.code, f.message, f.symbol,
            None
            if f.fix is None
            else (
                f.fix.applicability.value,
                tuple(
                    (e.start_line, e.start_col, e.end_line, e.end_col, e.text)
                    for e in f.fix.edits
                ),
                f.fix.description,
                f.fix.unsafe_reason,
            ),
        )
        for f in result.findings
    )
    errors = tuple((e.path, e.line, e.col, e.message) for e in result.errors)
    suppression = (
        None if result.suppression_lines is None else tuple(result.suppression_lines.items())
    )
    return (
        findings,
        errors,
        tuple(result.unresolved_bases.items()),
        result.files_analyzed,
        suppression,
        result.dependent_paths,
        tuple(result.missing_modules.items()),
    )


def _decode_result(data: object) -> AnalysisResult:
    findings_data, errors_data, unresolved, files_analyzed, suppression, dependents, missing = cast(
        tuple[
            tuple[tuple[object, ...], ...],
            tuple[tuple[str, int, int, str], ...],
            tuple[tuple[str, int], ...],
            int,
            tuple[tuple[str, tuple[int, ...]], ...] | None,
            tuple[str, ...],
            tuple[tuple[str, int], ...],
        ],
        data,
    )
    findings: list[Finding] = []
    for row in findings_data:
        path, line, col, end_line, end_col, code, message, symbol, fix_data = cast(
            tuple[str, int, int, int, int, str, str, str, object], row
        )
        fix = None
        if fix_data is not None:
            applicability, edits, description, unsafe_reason = cast(
                tuple[str, tuple[tuple[int, int, int, int, str], ...], str, str], fix_data
            )
            fix = Fix(
                Applicability(applicability), tuple(Edit(*edit) for edit in edits), description, unsafe_reason
            )
        findings.append(Finding(path, line, col, end_line, end_col, code, message, symbol, fix))
    return AnalysisResult(
        findings=findings,
        errors=[FileError(*row) for row in errors_data],
        unresolved_bases=dict(unresolved),
        files_analyzed=files_analyzed,
        suppression_lines=None if suppression is None else dict(suppression),
        dependent_paths=tuple(dependents),
        missing_modules=dict(missing),
    )


class ResultCache:
    """The last run's whole result, reused when nothing it depends on has changed.

    The key covers the engine's code, the options, the report set, the import roots (and
    their mtimes, which change when packages are installed or removed) and the size and mtime
    of every project file; a result is never trusted when a project file was modified within
    `RACY_WINDOW_NS` of its write. The encoding is `marshal` of plain tuples: it cannot run
    code.

    Args:
        directory: the cache directory.
        stamp: the version stamp (see `version_stamp`, over the whole engine's sources).
    """

    def __init__(self, directory: Path, stamp: str) -> None:
        self.directory = directory
        self.stamp = stamp

    @property
    def path(self) -> Path:
        return self.directory / "result.bin"

    def key(
        self, stats: Iterable[tuple[str, int, int]], context: Iterable[object]
    ) -> tuple[bytes, int]:
        """(digest of everything the result depends on, the newest project file mtime)."""
        digest = hashlib.blake2b(self.stamp.encode(), digest_size=20)
        for item in context:
            digest.update(repr(item).encode())
            digest.update(b"\0")
        newest = 0
        for path, size, mtime_ns in stats:
            # A file name that is not UTF-8 keeps its bytes as lone surrogates (os.fsdecode).
            digest.update(f"{path}\0{size}\0{mtime_ns}\n".encode("utf-8", "surrogateescape"))
            newest = max(newest, mtime_ns)
        return digest.digest(), newest

    def load(self, key: bytes, newest_mtime_ns: int) -> AnalysisResult | None:
        """The stored result for `key`, or None (absent, another key, racy, corrupt)."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return None
        try:
            stored_key, written_at_ns, payload = cast(
                tuple[object, object, object], marshal.loads(data)
            )
            if stored_key != key or not isinstance(written_at_ns, int):
                return None
            if newest_mtime_ns >= written_at_ns - RACY_WINDOW_NS:
                return None
            return _decode_result(payload)
        except (ValueError, TypeError, EOFError, KeyError):
            return None

    def save(self, key: bytes, result: AnalysisResult) -> None:
        """Store `result` atomically under `key`.

        Raises:
            OSError: the directory cannot be written (callers may ignore it).
        """
        ensure_directory(self.directory)
        record: object = (key, time.time_ns(), _encode_result(result))
        payload = marshal.dumps(cast(tuple[bytes, int], record))
        write_atomically(self.path, payload, durable=False)
