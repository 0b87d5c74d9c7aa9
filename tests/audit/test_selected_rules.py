"""Only the selected rules run, and a run whose summaries are not kept summarises only what
they read: the findings of the selected codes are those of a run of every rule."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, cast

import pytest

import kvref.audit.runner.scale
from kvref.audit.model import AnalysisOptions
from kvref.audit.pipeline import analyze
from kvref.audit.rules import ALL_RULES, rules_for
from kvref.audit.summarise.records import ModuleSummary
from kvref.audit.summarise.summary import summarize, summarize_without_parameters
from kvref.cli import audit_main

FIXTURES = Path(__file__).parent / "fixtures"
Summarizer = Callable[[str, bytes], ModuleSummary]
OLD_NS = time.time_ns() - 3_600_000_000_000


def codes(root: Path, rules: frozenset[str] | None) -> set[tuple[str, int, str]]:
    files = sorted(root.rglob("*.py"))
    result = analyze(files, root=root, options=AnalysisOptions(rules=rules))
    return {(f.path, f.line, f.code) for f in result.findings}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    for name in ("KVR001.py", "KVR101.py", "KVR102.py"):
        shutil.copy(FIXTURES / name, tmp_path / name.lower())
    for path in tmp_path.rglob("*"):
        os.utime(path, ns=(OLD_NS, OLD_NS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KVREF_CACHE_DIR", raising=False)
    return tmp_path


def test_rules_for_keeps_code_order() -> None:
    assert rules_for(None) == ALL_RULES
    assert [rule.code for rule in rules_for(frozenset({"KVR101", "KVR001"}))] == ["KVR001", "KVR101"]
    readers = {rule.code for rule in ALL_RULES if rule.reads_parameters}
    assert readers == {"KVR101", "KVR102", "KVR103"}


def test_a_rule_that_is_not_selected_does_not_run(project: Path) -> None:
    every = codes(project, None)
    assert {code for _, _, code in every} >= {"KVR001", "KVR101", "KVR102"}
    for selection in ({"KVR001"}, {"KVR101"}, {"KVR001", "KVR102"}):
        assert codes(project, frozenset(selection)) == {f for f in every if f[2] in selection}


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.py")), ids=lambda path: path.name)
def test_a_summary_without_parameters_lacks_them_only(path: Path) -> None:
    source = path.read_bytes()
    full = summarize(path.name, source)
    lean = summarize_without_parameters(path.name, source)
    assert lean.functions == ()
    for cls in lean.classes:
        assert all(m.parameters == () and m.multi_pass == () for m in cls.methods)
    stripped = dataclasses.replace(
        full,
        functions=(),
        classes=tuple(
            dataclasses.replace(
                cls,
                methods=tuple(
                    dataclasses.replace(m, parameters=(), multi_pass=()) for m in cls.methods
                ),
            )
            for cls in full.classes
        ),
    )
    assert lean == stripped


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert audit_main(["--output-format", "json", "--exit-zero", "--jobs", "1", *argv]) == 0
    document = cast(dict[str, object], json.loads(capsys.readouterr().out))
    findings = cast(list[dict[str, object]], document["findings"])
    return [f"{item['path']}:{item['line']}:{item['code']}" for item in findings]


@pytest.mark.parametrize(
    ("argv", "lean"),
    [
        (("--select", "KVR001", "--no-cache"), True),
        (("--select", "KVR001,KVR002", "--no-cache"), True),
        (("--select", "KVR001,KVR101", "--no-cache"), False),
        (("--no-cache",), False),
        # Summaries kept in the cache serve every later selection: complete.
        (("--select", "KVR001"), False),
    ],
)
def test_summaries_hold_what_the_run_needs(
    project: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    lean: bool,
) -> None:
    every = run(capsys, "--select", "ALL", "--no-cache")
    used: list[str] = []

    def counting(name: str, summarizer: Summarizer) -> Summarizer:
        def summarise(path: str, source: bytes) -> ModuleSummary:
            used.append(name)
            return summarizer(path, source)

        return summarise

    scale = kvref.audit.runner.scale
    monkeypatch.setattr(scale, "summarize", counting("full", summarize))
    monkeypatch.setattr(
        scale, "summarize_without_parameters", counting("lean", summarize_without_parameters)
    )
    selection = argv[argv.index("--select") + 1].split(",") if "--select" in argv else None
    found = run(capsys, *argv)
    assert set(used) == {"lean" if lean else "full"}
    assert found == [f for f in every if selection is None or f.rsplit(":", 1)[1] in selection]


def test_a_cached_result_serves_another_selection(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    every = run(capsys, "--select", "ALL", "--no-cache")
    assert run(capsys, "--select", "KVR001") == [f for f in every if f.endswith(":KVR001")]

    def analysed(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("the stored result should have answered")

    monkeypatch.setattr(kvref.audit.runner.scale, "run_pipeline", analysed)
    # The warm run answers from the stored result of every rule.
    assert run(capsys, "--select", "KVR101") == [f for f in every if f.endswith(":KVR101")]
