"""Fixture files: expected codes are trailing comments; `.fixed.py` twins are the fix output.

Each `fixtures/KVRnnn*.py` is audited on its own; the (line, code) pairs found must equal the
`# KVRnnn` markers. When a `.fixed.py` twin exists, applying every fix (safe and unsafe) must
produce it byte for byte, the result must parse, and fixing the result again changes nothing.
An `# OPTIONS: name=value, ...` line sets `AnalysisOptions` fields for that fixture. A fixture
may subclass the bases in `fixtures/support/` (on the search path), so that its fixes must
import names of another module; the fixed twins of the annotation rules must then also run.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import runpy
import sys
import typing
from pathlib import Path

import pytest

from kvref.audit import AnalysisOptions, Finding, analyze, apply_fixes

FIXTURES = Path(__file__).parent / "fixtures"
SUPPORT = FIXTURES / "support"
_MARKER = re.compile(r"#\s*((?:KVR\d{3}\s*)+)$")
_OPTIONS = re.compile(r"^# OPTIONS: (.*)$", re.MULTILINE)


def fixture_files() -> list[Path]:
    return sorted(p for p in FIXTURES.glob("KVR*.py") if not p.name.endswith(".fixed.py"))


def expected_counts(source: str) -> list[tuple[int, str]]:
    pairs: list[tuple[int, str]] = []
    for number, line in enumerate(source.splitlines(), start=1):
        match = _MARKER.search(line)
        if match:
            pairs.extend((number, code) for code in match.group(1).split())
    return sorted(pairs)


def fixture_options(source: str) -> AnalysisOptions:
    values: dict[str, object] = {}
    for line in _OPTIONS.findall(source):
        for item in line.split(","):
            name, _, raw = item.strip().partition("=")
            if name == "exempt_names":
                values[name] = frozenset(raw.split("|"))
            elif name == "python_floor":
                major, minor = raw.split(".")
                values[name] = (int(major), int(minor))
            elif raw in ("true", "false"):
                values[name] = raw == "true"
            else:
                values[name] = raw
    return dataclasses.replace(AnalysisOptions(), **values)


def audit(path: Path, options: AnalysisOptions) -> list[Finding]:
    result = analyze([path], root=path.parent, options=options, search_paths=[SUPPORT])
    assert result.errors == []
    return result.findings


def fix_all(source: bytes, findings: list[Finding], options: AnalysisOptions) -> bytes:
    fixes = [f.fix for f in findings if f.fix is not None]
    return apply_fixes(source, fixes)


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.stem)
def test_fixture_findings_match_markers(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    findings = audit(path, fixture_options(source))
    found = sorted((f.line, f.code) for f in findings)
    assert found == expected_counts(source)
    assert all(f.path == path.name for f in findings)


@pytest.mark.parametrize(
    "path",
    [p for p in fixture_files() if p.with_name(p.stem + ".fixed.py").exists()],
    ids=lambda p: p.stem,
)
def test_fixture_fixes_match_twin(path: Path, tmp_path: Path) -> None:
    source = path.read_bytes()
    options = fixture_options(source.decode())
    fixed = fix_all(source, audit(path, options), options)
    assert fixed.decode() == path.with_name(path.stem + ".fixed.py").read_text(encoding="utf-8")
    ast.parse(fixed)
    # Fixing the fixed file again is a no-op (idempotence through a fresh analysis).
    again = tmp_path / path.name
    again.write_bytes(fixed)
    assert fix_all(fixed, audit(again, options), options) == fixed


@pytest.mark.parametrize("name", ["KVR101", "KVR103"])
def test_annotation_fixes_leave_a_module_that_runs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The twins have no `from __future__ import annotations`: every annotation is evaluated
    # when the module runs, so a name the fix wrote without importing it is a NameError.
    monkeypatch.setattr(sys, "path", [str(SUPPORT), *sys.path])
    namespace = runpy.run_path(str(FIXTURES / f"{name}.fixed.py"), run_name=f"{name}_fixed")
    remote = namespace["Remote"]
    assert isinstance(remote, type)
    for method in vars(remote).values():
        if callable(method):
            typing.get_type_hints(method, globalns=namespace)
