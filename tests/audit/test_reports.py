"""Output formats: text, json, github annotations and SARIF (checked against GitHub's rules)."""

from __future__ import annotations

import io
import json
import subprocess
from typing import cast

from hypothesis import given, settings
from hypothesis import strategies as st
from typing_extensions import override

from kvref.audit.model import Applicability, Edit, FileError, Finding, Fix
from kvref.audit.report import OutputFormat, Report, Summary, render
from kvref.audit.report import json as json_report
from kvref.audit.report.github import escape_data, escape_property
from kvref.audit.report.sarif import build_sarif
from kvref.audit.report.text import render_summary, use_color
from tests.audit.conftest import Project
from tests.audit.fakes import FAKE_RULES

SAFE = Fix(Applicability.SAFE, (Edit(3, 4, 3, 4, "@override\n    "),), "Add @override")
UNSAFE = Fix(Applicability.UNSAFE, (Edit(7, 20, 7, 28, "Collection"),), "Widen", "the body may index it")


def _report(summary: Summary | None = None) -> Report:
    findings = [
        Finding("pkg/a.py", 3, 9, 3, 13, "KVR001", "`work` has no @override", "Child.work", SAFE),
        Finding("pkg/a.py", 7, 9, 7, 15, "KVR101", "narrows, badly: 100%\nsecond line", "Child.narrow", UNSAFE),
        Finding("pkg/b.py", 2, 5, 2, 10, "KVR102", "twice", "twice"),
    ]
    errors = [FileError("pkg/broken.py", 4, 2, "syntax error: invalid syntax")]
    return Report(
        findings=findings,
        errors=errors,
        rules=FAKE_RULES,
        selected=frozenset({"KVR001", "KVR002", "KVR101", "KVR102"}),
        summary=summary or Summary(files_analyzed=5, files_reported=3),
        uri_prefix="sub/",
        tool_version="0.1.0",
    )


def test_text_is_path_line_col_code_message() -> None:
    assert render(OutputFormat.TEXT, _report()).splitlines()[:1] == [
        "pkg/a.py:3:9: KVR001 `work` has no @override"
    ]


def test_summary_counts_fixability_errors_and_bases() -> None:
    report = _report(
        Summary(
            files_analyzed=5,
            files_reported=3,
            unresolved_bases={"torch.nn.Module": 3, "x.Y": 1},
            baselined=2,
            suppressed=1,
        )
    )
    summary = render_summary(report)
    assert summary.splitlines() == [
        "pkg/broken.py:4:2: error: syntax error: invalid syntax",
        "Found 3 findings (1 fixable with --fix; 1 more with --unsafe-fixes).",
        "1 KVR101 fix needs --unsafe-fixes: the body may index it.",
        "2 findings hidden by the baseline.",
        "1 finding suppressed by inline comments.",
        "2 base classes could not be resolved, so 4 classes inheriting from them were only "
        "checked against their known bases: torch.nn.Module (3), x.Y (1)",
        "1 file error.",
        "Checked 3 files (5 indexed).",
    ]
    assert "2 fixable with --fix" in render_summary(_report(Summary(unsafe_fixes=True)))


def test_summary_says_why_fixes_are_withheld_one_line_per_reason() -> None:
    def unsafe(code: str, reason: str) -> Finding:
        fix = Fix(Applicability.UNSAFE, (Edit(1, 0, 1, 0, "x"),), "Fix", reason)
        return Finding("m.py", 1, 1, 1, 2, code, "message", "C.f", fix)

    undeclared = 'typing_extensions is undeclared; add it to the dependencies or set target-version = "py312"'
    findings = [
        *(unsafe("KVR001", undeclared) for _ in range(3)),
        unsafe("KVR001", "setup.py runs where only [build-system] requires is installed"),
        *(unsafe("KVR101", "the body may index it") for _ in range(2)),
        unsafe("KVR103", ""),
        Finding("m.py", 2, 1, 2, 2, "KVR001", "message", "C.g", SAFE),
    ]
    report = Report(findings, [], FAKE_RULES, frozenset({"KVR001", "KVR101", "KVR103"}), Summary(files_reported=1))
    assert render_summary(report).splitlines() == [
        "Found 8 findings (1 fixable with --fix; 7 more with --unsafe-fixes).",
        f"3 KVR001 fixes need --unsafe-fixes: {undeclared}.",
        "2 KVR101 fixes need --unsafe-fixes: the body may index it.",
        "1 KVR001 fix needs --unsafe-fixes: setup.py runs where only [build-system] requires is installed.",
        "1 KVR103 fix needs --unsafe-fixes.",
        "Checked 1 file (0 indexed).",
    ]
    assert f"3 KVR001 fixes need --unsafe-fixes: {undeclared}." in render_summary(report, diff=True)
    applied = Report(findings, [], FAKE_RULES, frozenset(), Summary(files_reported=1, unsafe_fixes=True))
    assert "needs --unsafe-fixes" not in render_summary(applied)
    assert "need --unsafe-fixes" not in render_summary(applied)
    assert render_summary(report, quiet=True) == ""


def test_json_shape() -> None:
    document = json.loads(render(OutputFormat.JSON, _report()))
    assert document["version"] == 1
    assert document["positions"].startswith("1-based")
    first = document["findings"][0]
    assert first == {
        "code": "KVR001",
        "name": "missing-override",
        "message": "`work` has no @override",
        "symbol": "Child.work",
        "path": "pkg/a.py",
        "line": 3,
        "col": 9,
        "end_line": 3,
        "end_col": 13,
        "fixable": True,
        "fix": {
            "applicability": "safe",
            "description": "Add @override",
            "edits": [{"line": 3, "col": 5, "end_line": 3, "end_col": 5, "content": "@override\n    "}],
        },
    }
    assert document["findings"][1]["fixable"] is False
    assert document["findings"][1]["fix"]["applicability"] == "unsafe"
    assert document["findings"][2]["fix"] is None
    assert document["errors"] == [
        {"path": "pkg/broken.py", "line": 4, "col": 2, "message": "syntax error: invalid syntax"}
    ]
    assert document["summary"]["findings"] == 3
    assert document["summary"]["fixable"] == 1
    assert document["summary"]["errors"] == 1


def test_github_annotations_are_escaped() -> None:
    assert escape_data("100%\r\nx") == "100%25%0D%0Ax"
    assert escape_property("a:b,c%") == "a%3Ab%2Cc%25"
    lines = render(OutputFormat.GITHUB, _report()).splitlines()
    assert lines[0] == (
        "::error file=sub/pkg/a.py,line=3,col=9,endLine=3,endColumn=13,title=KVR001::"
        "`work` has no @override"
    )
    assert lines[1].endswith("::narrows, badly: 100%25%0Asecond line")
    assert lines[3] == "::error file=sub/pkg/broken.py,line=4,col=2,title=kvref error::syntax error: invalid syntax"


def _require_text(value: object, where: str) -> None:
    assert isinstance(value, str) and value, f"{where} must be a non-empty string"


def validate_github_sarif(log: dict[str, object]) -> None:
    """The properties GitHub code scanning requires of an uploaded SARIF file."""
    assert log["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json"
    assert log["version"] == "2.1.0"
    runs = cast(list[dict[str, object]], log["runs"])
    assert runs
    for run in runs:
        driver = cast(dict[str, object], cast(dict[str, object], run["tool"])["driver"])
        _require_text(driver["name"], "tool.driver.name")
        rules = cast(list[dict[str, object]], driver["rules"])
        ids = [rule["id"] for rule in rules]
        assert len(ids) == len(set(ids))
        for rule in rules:
            _require_text(rule["id"], "rule.id")
            for key in ("shortDescription", "fullDescription", "help"):
                _require_text(cast(dict[str, object], rule[key])["text"], f"rule.{key}.text")
            level = cast(dict[str, object], rule["defaultConfiguration"])["level"]
            assert level in ("note", "warning", "error")
        for result in cast(list[dict[str, object]], run["results"]):
            assert result["ruleId"] in ids
            assert rules[cast(int, result["ruleIndex"])]["id"] == result["ruleId"]
            _require_text(cast(dict[str, object], result["message"])["text"], "result.message.text")
            locations = cast(list[dict[str, object]], result["locations"])
            assert 1 <= len(locations) <= 10
            physical = cast(dict[str, object], locations[0]["physicalLocation"])
            uri = cast(dict[str, object], physical["artifactLocation"])["uri"]
            _require_text(uri, "artifactLocation.uri")
            assert not cast(str, uri).startswith("/")
            region = cast(dict[str, int], physical["region"])
            assert region["startLine"] >= 1 and region["startColumn"] >= 1
            assert region["endLine"] >= region["startLine"]
            fingerprints = cast(dict[str, str], result["partialFingerprints"])
            _require_text(fingerprints["primaryLocationLineHash"], "primaryLocationLineHash")


def test_sarif_has_every_field_github_requires() -> None:
    log = json.loads(render(OutputFormat.SARIF, _report()))
    validate_github_sarif(log)
    run = log["runs"][0]
    assert [rule["id"] for rule in run["tool"]["driver"]["rules"]] == [r.code for r in FAKE_RULES]
    rule = run["tool"]["driver"]["rules"][0]
    assert rule["shortDescription"]["text"] == "Checks for overrides without it."
    assert "## Why is this bad?" in rule["help"]["text"]
    assert run["tool"]["driver"]["rules"][4]["defaultConfiguration"]["enabled"] is False
    # kvref has no public home page ([project.urls] is empty), so no URL is guessed.
    assert "informationUri" not in run["tool"]["driver"]
    result = run["results"][0]
    assert result["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "sub/pkg/a.py", "uriBaseId": "%SRCROOT%"},
        "region": {"startLine": 3, "startColumn": 9, "endLine": 3, "endColumn": 13},
    }
    notification = run["invocations"][0]["toolExecutionNotifications"][0]
    assert notification["message"]["text"] == "pkg/broken.py: syntax error: invalid syntax"
    assert run["invocations"][0]["executionSuccessful"] is False


def test_sarif_fingerprints_survive_line_moves_and_tell_duplicates_apart() -> None:
    def prints(lines: list[int]) -> list[str]:
        findings = [Finding("a.py", n, 1, n, 2, "KVR001", "m", "C.f") for n in lines]
        report = Report(findings, [], FAKE_RULES, frozenset(), Summary())
        return [r["partialFingerprints"]["primaryLocationLineHash"] for r in build_sarif(report)["runs"][0]["results"]]

    assert prints([3, 9]) == prints([30, 90])
    assert len(set(prints([3, 9]))) == 2


def test_colour_decision() -> None:
    class Tty(io.StringIO):
        @override
        def isatty(self) -> bool:
            return True

    tty = Tty()
    assert use_color(tty, {}) is True
    assert use_color(io.StringIO(), {}) is False
    assert use_color(io.StringIO(), {"FORCE_COLOR": "1"}) is True
    assert use_color(tty, {"NO_COLOR": "1"}) is False
    assert use_color(tty, {"NO_COLOR": ""}) is True
    assert use_color(tty, {"TERM": "dumb"}) is False
    assert use_color(tty, {"FORCE_COLOR": "1", "NO_COLOR": "x"}) is False


def test_reports_use_repository_relative_paths(project: Project) -> None:
    subprocess.run(["git", "init", "-q", str(project.root.parent)], check=True)
    project.write({"pkg/child.py": "class C(Base):\n    def bad_x(self): pass\n"})
    outcome = project.main("--output-format", "sarif")
    log = json.loads(outcome.stdout)
    validate_github_sarif(log)
    uri = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "proj/pkg/child.py"
    github = project.main("--output-format", "github")
    assert github.stdout.startswith("::error file=proj/pkg/child.py,line=2,col=9,")
    text = project.main()
    assert text.stdout.startswith("pkg/child.py:2:9: KVR001")


_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
_POSITIVE = st.integers(min_value=0, max_value=10**6)
_EDITS = st.builds(Edit, _POSITIVE, _POSITIVE, _POSITIVE, _POSITIVE, _TEXT)
_FIXES = st.none() | st.builds(
    Fix,
    st.sampled_from(list(Applicability)),
    st.lists(_EDITS, max_size=3).map(tuple),
    _TEXT,
)
_FINDINGS = st.builds(
    Finding, _TEXT, _POSITIVE, _POSITIVE, _POSITIVE, _POSITIVE, _TEXT, _TEXT, _TEXT, _FIXES
)


@settings(max_examples=300, deadline=None)
@given(finding=_FINDINGS, name=_TEXT, unsafe_fixes=st.booleans())
def test_the_direct_finding_writer_gives_exactly_the_encoded_json_object(
    finding: Finding, name: str, unsafe_fixes: bool
) -> None:
    expected = json_report._ENCODER.encode(  # pyright: ignore[reportPrivateUsage]
        json_report.finding_to_json(finding, name=name, unsafe_fixes=unsafe_fixes)
    )
    written = json_report._finding_text(finding, name, unsafe_fixes)  # pyright: ignore[reportPrivateUsage]
    assert written == expected
