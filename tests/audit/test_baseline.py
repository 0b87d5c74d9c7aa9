"""Baselines: write, apply, survive line moves, report stale entries, reject bad files."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvref.audit.report.baseline import (
    Baseline,
    BaselineError,
    apply_baseline,
    baseline_key,
    load_baseline,
    write_baseline,
)
from kvref.audit.model import Finding
from tests.audit.conftest import Project

LEGACY = """\
class A(Base):
    def bad_one(self):
        pass

    def twice_two(self):
        pass
"""


def _finding(path: str, line: int, code: str = "KVR001", symbol: str = "A.f") -> Finding:
    return Finding(path, line, 5, line, 6, code, "m", symbol)


def test_round_trip_counts_by_path_code_and_symbol(tmp_path: Path) -> None:
    findings = [_finding("a.py", 3), _finding("a.py", 9), _finding("b.py", 1, "KVR102", "g")]
    assert write_baseline(tmp_path / "b.json", findings) == 2
    document = json.loads((tmp_path / "b.json").read_text())
    assert document == {
        "kvref_baseline": 1,
        "entries": [
            {"path": "a.py", "code": "KVR001", "symbol": "A.f", "count": 2},
            {"path": "b.py", "code": "KVR102", "symbol": "g", "count": 1},
        ],
    }
    assert load_baseline(tmp_path / "b.json") == Baseline(
        {("a.py", "KVR001", "A.f"): 2, ("b.py", "KVR102", "g"): 1}
    )


def test_apply_hides_up_to_count_and_reports_stale() -> None:
    baseline = Baseline({("a.py", "KVR001", "A.f"): 1, ("gone.py", "KVR002", "X.y"): 2})
    outcome = apply_baseline([_finding("a.py", 40), _finding("a.py", 7)], baseline)
    assert outcome.baselined == 1
    assert [f.line for f in outcome.new] == [40]  # the first by position is the baselined one
    assert outcome.stale == [(("gone.py", "KVR002", "X.y"), 2)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "must be a JSON object"),
        ("{", "not valid JSON"),
        ('{"entries": []}', "not a kvref baseline"),
        ('{"kvref_baseline": 1, "entries": {}}', '"entries" must be a list'),
        ('{"kvref_baseline": 1, "entries": [{"path": "a"}]}', "entry 0 needs string path"),
        ('{"kvref_baseline": 1, "entries": [{"path": "a", "code": "K", "symbol": "s", "count": 0}]}', "positive count"),
    ],
)
def test_malformed_baselines_are_errors(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "b.json").write_text(text)
    with pytest.raises(BaselineError, match=message):
        load_baseline(tmp_path / "b.json")


def test_cli_round_trip(project: Project) -> None:
    project.write({"legacy.py": LEGACY})
    written = project.main("--write-baseline", ".kvref-baseline.json")
    assert written.code == 0
    assert written.stderr == "Wrote 2 baseline entries (2 findings) to .kvref-baseline.json.\n"

    accepted = project.cli("audit", "--baseline", ".kvref-baseline.json")
    assert accepted.code == 0
    assert accepted.stdout == ""
    assert "2 findings hidden by the baseline." in accepted.stderr

    # Code moves down and a new finding appears: only the new one is reported.
    (project.root / "legacy.py").write_text("\n\n\n" + LEGACY + "\n    def bad_new(self):\n        pass\n")
    moved = project.main("--baseline", ".kvref-baseline.json")
    assert moved.code == 1
    assert moved.stdout.splitlines() == [
        "legacy.py:11:9: KVR001 `bad_new` overrides a base method but has no @override"
    ]

    # The legacy finding is fixed: its entry is stale, and the run is clean.
    (project.root / "legacy.py").write_text("class A(Base):\n    def twice_two(self):\n        pass\n")
    stale = project.main("--baseline", ".kvref-baseline.json")
    assert stale.code == 0
    assert (
        "1 baseline entry no longer matches (regenerate with --write-baseline): "
        "legacy.py KVR001 A.bad_one (x1)"
    ) in stale.stderr


def test_configured_baseline_and_scoping_of_stale_entries(project: Project) -> None:
    project.write({"legacy.py": LEGACY, "other.py": LEGACY}, pyproject='[tool.kvref]\nbaseline = "kvref-baseline.json"\n')
    assert project.main("--write-baseline", "kvref-baseline.json").code == 0
    assert project.main().code == 0
    # Reporting on one file (pre-commit) does not call the other file's entries stale.
    only_one = project.main("legacy.py")
    assert only_one.code == 0
    assert "no longer match" not in only_one.stderr
    # Neither do entries of rules that were not selected.
    assert "no longer match" not in project.main("--select", "KVR001").stderr


def test_missing_baseline_exits_2_with_a_hint(project: Project) -> None:
    project.write({"legacy.py": LEGACY})
    outcome = project.main("--baseline", "nope.json")
    assert outcome.code == 2
    assert outcome.stderr.startswith("kvref: error: ")
    assert "create it with --write-baseline" in outcome.stderr
    assert len(outcome.stderr.splitlines()) == 1


FINDINGS = st.lists(
    st.builds(
        _finding,
        path=st.sampled_from(["a.py", "pkg/b.py"]),
        line=st.integers(1, 50),
        code=st.sampled_from(["KVR001", "KVR101"]),
        symbol=st.sampled_from(["A.f", "A.g", "B.f"]),
    ),
    max_size=12,
)


@given(findings=FINDINGS, data=st.data())
def test_baseline_accounts_for_every_finding(findings: list[Finding], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "b.json"
        write_baseline(path, findings)
        baseline = load_baseline(path)
    full = apply_baseline(findings, baseline)
    assert (full.new, full.baselined, full.stale) == ([], len(findings), [])
    # Some findings are fixed and others appear: exactly the fixed ones become stale counts,
    # and a new finding is reported unless its key still has unmatched entries.
    kept = data.draw(st.lists(st.sampled_from(findings), unique_by=id) if findings else st.just([]))
    added = data.draw(FINDINGS)
    outcome = apply_baseline([*kept, *added], baseline)
    assert outcome.baselined + len(outcome.new) == len(kept) + len(added)
    assert outcome.baselined + sum(count for _, count in outcome.stale) == len(findings)
    for finding in outcome.new:
        assert all(key != baseline_key(finding) for key, _ in outcome.stale)


def test_a_partial_write_keeps_the_entries_it_did_not_look_at(project: Project) -> None:
    project.write({"legacy.py": LEGACY, "other.py": LEGACY})
    assert project.main("--write-baseline", "b.json").code == 0
    before = json.loads((project.root / "b.json").read_text())["entries"]
    assert len(before) == 4
    # Rewriting from one file, with one rule selected, keeps everything else.
    (project.root / "legacy.py").write_text("class A(Base):\n    def twice_two(self):\n        pass\n")
    assert project.main("--write-baseline", "b.json", "--select", "KVR001", "legacy.py").code == 0
    after = json.loads((project.root / "b.json").read_text())["entries"]
    assert [(e["path"], e["code"]) for e in after] == [
        ("legacy.py", "KVR102"),
        ("other.py", "KVR001"),
        ("other.py", "KVR102"),
    ]
    assert project.main("--baseline", "b.json").code == 0
