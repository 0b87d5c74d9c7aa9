"""A small stand-in for the analysis engine, so the command line is tested on its own.

The fake reports by method name, which keeps test projects readable:
`def bad_*` -> KVR001 (safe fix: insert `@override`), `def stale_*` -> KVR002 (safe fix: drop
the line above), `def narrow_*` -> KVR101 (unsafe fix: `Sequence` -> `Collection` on the def
line), `def twice_*` -> KVR102 (no fix), `def drift_*` -> KVR103 (off by default). A class
whose base is `Missing` counts as an unresolved base. A file that does not parse is a
FileError. The fake fixer applies edits literally and raises `FakeFixError` when the result
would not parse (a fix whose text is "BROKEN(" exercises that).
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvref.audit.catalogue import FixSafety, RuleInfo
from kvref.audit.command import Backend
from kvref.audit.model import (
    AnalysisOptions,
    AnalysisResult,
    Applicability,
    Edit,
    FileError,
    Finding,
    Fix,
)
from kvref.errors import KVRefError

__all__ = ["FAKE_RULES", "FakeFixError", "FakeEngine", "fake_backend"]


def _doc(what: str, safety: str = "Safe: only adds a decorator.") -> str:
    return (
        f"## What it does\n{what} Second sentence.\n\n## Why is this bad?\nBecause.\n\n"
        "## Example\n```python\nx\n```\n\nUse instead:\n```python\ny\n```\n\n"
        f"## Fix safety\n{safety}"
    )


FAKE_RULES: tuple[RuleInfo, ...] = (
    RuleInfo("KVR001", "missing-override", True, FixSafety.SAFE, "Checks for overrides without it.", _doc("Checks for overrides without it.")),
    RuleInfo("KVR002", "stale-override", True, FixSafety.SAFE, "Checks for stale @override.", _doc("Checks for stale @override.")),
    RuleInfo("KVR101", "narrowed-collection-parameter", True, FixSafety.UNSAFE, "Checks narrowing.", _doc("Checks narrowing.", "Unsafe: the body may index.")),
    RuleInfo("KVR102", "multi-pass-iterable", True, FixSafety.NONE, "Checks double iteration.", _doc("Checks double iteration.")),
    RuleInfo("KVR103", "override-annotation-drift", False, FixSafety.UNSAFE, "Checks drift.", _doc("Checks drift.", "Unsafe: narrows.")),
)


class FakeFixError(KVRefError):
    """The fake fixer's result would not parse."""


def _findings_for(path: str, source: str, tree: ast.Module) -> tuple[list[Finding], list[str]]:
    findings: list[Finding] = []
    unresolved: list[str] = []
    lines = source.splitlines()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                if any(isinstance(base, ast.Name) and base.id == "Missing" for base in child.bases):
                    unresolved.append("pkg.Missing")
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef):
                findings.extend(_finding(path, child, prefix + child.name, lines))
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return findings, unresolved


def _finding(path: str, node: ast.FunctionDef, symbol: str, lines: list[str]) -> list[Finding]:
    line = node.lineno
    col = lines[line - 1].index(node.name)
    name = node.name

    def make(code: str, message: str, fix: Fix | None = None) -> list[Finding]:
        return [Finding(path, line, col + 1, line, col + 1 + len(name), code, message, symbol, fix)]

    decorated = any(isinstance(d, ast.Name) and d.id == "override" for d in node.decorator_list)
    if name.startswith("bad_") and not decorated:
        text = "BROKEN(\n" if "broken" in name else " " * node.col_offset + "@override\n"
        edits = [Edit(line, 0, line, 0, text)]
        if _OVERRIDE_IMPORT not in lines:  # every fix carries its import, as the real ones do
            # After the decorator: applied bottom-up, an insertion listed later lands first.
            edits.append(Edit(1, 0, 1, 0, _OVERRIDE_IMPORT + "\n"))
        fix = Fix(Applicability.SAFE, tuple(edits), description="Add @override")
        return make("KVR001", f"`{name}` overrides a base method but has no @override", fix)
    if name.startswith("stale_"):
        fix = Fix(Applicability.SAFE, (Edit(line - 1, 0, line, 0, ""),), description="Remove @override")
        return make("KVR002", f"`{name}` is marked @override but overrides nothing", fix)
    if name.startswith("narrow_") and "Sequence" in lines[line - 1]:
        start = lines[line - 1].index("Sequence")
        edit = Edit(line, start, line, start + len("Sequence"), "Collection")
        fix = Fix(Applicability.UNSAFE, (edit,), "Widen to Collection", "the body may index it")
        return make("KVR101", f"`{name}` narrows a Collection parameter to Sequence", fix)
    if name.startswith("twice_"):
        return make("KVR102", f"`{name}` iterates an Iterable twice")
    if name.startswith("drift_"):
        return make("KVR103", f"`{name}` drifts from the base annotation")
    return []


@dataclass
class FakeEngine:
    """Counts calls so tests can check what was indexed and reported."""

    calls: list[tuple[list[str], list[str] | None]] = field(default_factory=lambda: [])
    options: list[AnalysisOptions] = field(default_factory=lambda: [])

    def analyze(
        self,
        project_files: Sequence[Path],
        *,
        root: Path,
        report_files: Collection[Path] | None = None,
        options: AnalysisOptions = AnalysisOptions(),
    ) -> AnalysisResult:
        def rel(path: Path) -> str:
            return path.relative_to(root).as_posix()

        reported = None if report_files is None else sorted(rel(p) for p in report_files)
        self.calls.append((sorted(rel(p) for p in project_files), reported))
        self.options.append(options)
        wanted = set(project_files if report_files is None else report_files)
        result = AnalysisResult(files_analyzed=len(project_files))
        unresolved: dict[str, int] = {}
        for path in sorted(project_files):
            if path not in wanted:
                continue
            data = path.read_bytes()
            try:
                source = data.decode("utf-8")
                tree = ast.parse(source)
            except UnicodeDecodeError as exc:
                result.errors.append(FileError(rel(path), 1, 1, f"cannot decode: {exc.reason}"))
                continue
            except SyntaxError as exc:
                error = FileError(rel(path), exc.lineno or 1, exc.offset or 1, f"syntax error: {exc.msg}")
                result.errors.append(error)
                continue
            findings, bases = _findings_for(rel(path), source, tree)
            result.findings.extend(findings)
            for base in bases:
                unresolved[base] = unresolved.get(base, 0) + 1
        result.unresolved_bases = unresolved
        return result


_OVERRIDE_IMPORT = "from typing_extensions import override"


def fake_apply_fixes(source: bytes, fixes: Sequence[Fix]) -> bytes:
    """Apply edits bottom-up (an edit that several fixes carry once)."""
    text = source.decode("utf-8")
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(line: int, col: int) -> int:
        return starts[line - 1] + col if line - 1 < len(starts) else len(text)

    edits = list(dict.fromkeys(edit for fix in fixes for edit in fix.edits))
    for edit in sorted(edits, key=lambda e: (e.start_line, e.start_col), reverse=True):
        start, end = offset(edit.start_line, edit.start_col), offset(edit.end_line, edit.end_col)
        text = text[:start] + edit.text + text[end:]
    try:
        ast.parse(text)
    except SyntaxError as exc:
        raise FakeFixError(f"line {exc.lineno}: {exc.msg}") from exc
    return text.encode("utf-8")


def fake_backend(engine: FakeEngine | None = None) -> Backend:
    """A Backend over the fake engine and fixer."""
    engine = engine or FakeEngine()
    return Backend(engine.analyze, fake_apply_fixes, FakeFixError, FAKE_RULES)
