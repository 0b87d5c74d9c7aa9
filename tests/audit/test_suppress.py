"""Inline suppression comments: which comments suppress which codes, and on which line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from kvref.audit.model import Finding
from kvref.audit.summarise.summary import summarize
from kvref.audit.summarise.suppress import (
    SuppressionFilter,
    candidate_lines,
    codes_in_comment,
    suppressions_by_line,
)
import kvref.audit.pipeline
from kvref.cli import audit_main as main
from tests.audit.conftest import Project, write_project


@pytest.mark.parametrize(
    ("comment", "codes"),
    [
        ("# noqa: KVR001", {"KVR001"}),
        ("#NOQA:KVR001,KVR002", {"KVR001", "KVR002"}),
        ("# noqa: KVR001 KVR101, KVR102", {"KVR001", "KVR101", "KVR102"}),
        ("# kvref: ignore[KVR001]", {"KVR001"}),
        ("# kvref: ignore[kvr001, KVR002]", {"KVR001", "KVR002"}),
        ("# type: ignore[override]  # noqa: KVR001", {"KVR001"}),
        ("# noqa: KVR001 because the base is generated", {"KVR001"}),
        ("# noqa", set[str]()),  # no blanket suppression
        ("# kvref: ignore", set[str]()),
        ("# kvref: ignore[]", set[str]()),
        ("# noqa:", set[str]()),
    ],
)
def test_codes_in_comment(comment: str, codes: set[str]) -> None:
    assert codes_in_comment(comment) == codes


def test_only_real_comments_count() -> None:
    source = b'def f(x="# noqa: KVR001"):  # kvref: ignore[KVR002]\n    pass\n'
    assert suppressions_by_line(source) == {1: frozenset({"KVR002"})}


def test_untokenizable_source_falls_back_to_a_line_scan() -> None:
    source = b'def f(:  # noqa: KVR001\n    """unterminated\n'
    assert suppressions_by_line(source) == {1: frozenset({"KVR001"})}


CHILD = """\
class Child(Base):
    def bad_one(self):  # noqa: KVR001
        pass

    def bad_two(self):  # kvref: ignore[KVR002]
        pass

    def bad_three(self):  # noqa
        pass

    # noqa: KVR001 (on the line above the def: does not count)
    def bad_four(self):
        pass
"""


def test_suppressed_findings_are_hidden_and_counted(project: Project) -> None:
    project.write({"child.py": CHILD})
    outcome = project.main()
    assert [line.split(":")[1] for line in outcome.stdout.splitlines()] == ["5", "8", "12"]
    assert "1 finding suppressed by inline comments." in outcome.stderr
    # A suppressed finding is not fixed either.
    assert project.main("--fix").code == 0
    fixed = (project.root / "child.py").read_text()
    assert "    def bad_one(self):  # noqa: KVR001" in fixed
    assert "    @override\n    def bad_one" not in fixed


def _finding(path: str, line: int) -> Finding:
    return Finding(path, line, 9, line, 16, "KVR001", "m", "Child.f")


def test_known_candidate_lines_spare_reading_files_without_suppressions() -> None:
    sources = {"a.py": b"class A(B):\n    def f(self): ...  # NOQA: kvr001\n    def g(self): ...\n"}
    read: list[str] = []

    def read_source(path: str) -> bytes | None:
        read.append(path)
        return sources.get(path)

    # What the engine records: a.py line 2 mentions noqa; b.py mentions nothing.
    suppression = SuppressionFilter(read_source, {"a.py": (2,)})
    kept = suppression.keep([_finding("a.py", 2), _finding("a.py", 3), _finding("b.py", 7)])
    assert [(f.path, f.line) for f in kept] == [("a.py", 3), ("b.py", 7)]
    assert suppression.suppressed == 1
    assert read == ["a.py"]  # b.py, and a.py's other lines, were never looked at


def test_summaries_record_the_lines_that_can_carry_a_suppression() -> None:
    source = b'x = "kvref"\nclass A(B):\n    def f(self): ...  # NoQa: KVR001\n    def g(self): ...\n'
    assert summarize("a.py", source).suppression_lines == (1, 3)
    assert summarize("b.py", b"class A(B):\n    def f(self): ...\n").suppression_lines == ()


def _must_not_run(*args: object, **kwargs: object) -> object:
    raise AssertionError("the warm run analysed again")


def test_suppressions_hold_when_the_real_result_comes_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = "class Base:\n    def f(self): ...\n    def g(self): ...\n"
    child = (
        "from base import Base\n\n"
        "class Child(Base):\n"
        "    def f(self): ...  # noqa: KVR001\n"
        "    def g(self): ...\n"
    )
    write_project(tmp_path, {"base.py": base, "child.py": child})
    old = time.time_ns() - 3_600_000_000_000  # older than the racy window: results are reused
    for name in ("base.py", "child.py"):
        os.utime(tmp_path / name, ns=(old, old))
    monkeypatch.chdir(tmp_path)
    outcomes: list[tuple[int, str, str]] = []
    for run in range(2):
        if run == 1:  # the second run must be served from the result cache
            monkeypatch.setattr(kvref.audit.pipeline, "plan", _must_not_run)
        code = main(["--output-format", "json"])
        captured = capsys.readouterr()
        outcomes.append((code, captured.out, captured.err))
        assert (tmp_path / ".kvref_cache" / "result.bin").exists()
    assert outcomes[0] == outcomes[1]
    assert [f["line"] for f in json.loads(outcomes[1][1])["findings"]] == [5]
    assert "1 finding suppressed by inline comments." in outcomes[1][2]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_candidate_lines_count_every_line_ending(newline: str) -> None:
    text = newline.join(["x = 1", "y = 'KVREF'", "", "def f(): ...  # NOQA: KVR001  # noqa", "z"])
    assert candidate_lines(text) == (2, 4)
    assert candidate_lines("x = 1\n") == ()
