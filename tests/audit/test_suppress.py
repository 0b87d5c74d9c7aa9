"""Inline suppression comments: which comments suppress which codes, and on which line."""

from __future__ import annotations

import pytest

from kvref.audit.suppress import codes_in_comment, suppressions_by_line
from tests.audit.conftest import Project


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
