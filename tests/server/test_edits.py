"""An edit costs what the edited texts need: the project's files are named once, not on every
check (`kvref.audit.layout.Layout`), and the findings are still those of the text as it is now,
across files, for unsaved new files and for text that does not parse."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvref.audit.pipeline
from kvref.audit.layout import Layout, SearchRoots
from kvref.audit.rules import rule_catalogue
from kvref.server.project import ProjectSession
from kvref.server.settings import ServerSettings
from tests.server.projects import BASE, SUB, write_project

FIXED = SUB.replace("    def load", "    @override\n    def load")
OTHERS = 30  # unrelated modules: naming the project costs this many more than the edit does


@pytest.fixture
def named(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many files each naming of the project (a new `Layout`) named, in order."""
    calls: list[int] = []
    original = kvref.audit.pipeline.name_files

    def counting(root: Path, files: tuple[Path, ...], failed: frozenset[Path], roots: SearchRoots) -> Layout:
        calls.append(len(files) - len(failed))
        return original(root, files, failed, roots)

    monkeypatch.setattr(kvref.audit.pipeline, "name_files", counting)
    return calls


def _session(tmp_path: Path) -> tuple[ProjectSession, Path, Path]:
    files = {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/sub.py": SUB}
    files.update({f"pkg/other{i}.py": f"class Other{i}:\n    pass\n" for i in range(OTHERS)})
    root = write_project(tmp_path / "proj", files)
    sub = root / "pkg" / "sub.py"
    session = ProjectSession(sub, ServerSettings(cache=False), rule_catalogue(), root)
    return session, root / "pkg" / "base.py", sub


def _codes(session: ProjectSession, texts: dict[Path, str], path: Path) -> list[str]:
    found = session.analyze({p: text.encode() for p, text in texts.items()}, list(texts))[path]
    return [finding.code for finding in found.findings]


def test_edits_name_no_file_and_see_the_new_text(tmp_path: Path, named: list[int]) -> None:
    session, _, sub = _session(tmp_path)
    assert _codes(session, {sub: SUB}, sub) == ["KVR001"]
    assert named == [OTHERS + 3]  # the first check names the project's files
    named.clear()
    for _ in range(3):
        assert _codes(session, {sub: FIXED}, sub) == []
        assert _codes(session, {sub: SUB}, sub) == ["KVR001"]
    assert named == []


def test_an_edited_base_buffer_is_seen_by_its_open_subclass(tmp_path: Path, named: list[int]) -> None:
    session, base, sub = _session(tmp_path)
    clean = {base: BASE, sub: FIXED}
    assert _codes(session, clean, sub) == []
    named.clear()
    renamed = {base: BASE.replace("def load", "def fetch"), sub: FIXED}
    assert _codes(session, renamed, sub) == ["KVR002"]
    assert _codes(session, clean, sub) == []
    assert named == []


def test_an_unsaved_new_file_joins_the_project_once(tmp_path: Path, named: list[int]) -> None:
    session, _, sub = _session(tmp_path)
    new = sub.with_name("new.py")  # not on disk
    assert _codes(session, {sub: FIXED, new: SUB.replace("Cached", "New")}, new) == ["KVR001"]
    assert _codes(session, {sub: FIXED, new: FIXED.replace("Cached", "New")}, new) == []
    assert named == [OTHERS + 4]  # the same files twice: named once
    assert _codes(session, {sub: SUB}, sub) == ["KVR001"]  # closed again: the project as on disk
    assert named == [OTHERS + 4, OTHERS + 3]


def test_text_that_does_not_parse_then_parses_again(tmp_path: Path, named: list[int]) -> None:
    session, _, sub = _session(tmp_path)
    assert _codes(session, {sub: SUB}, sub) == ["KVR001"]
    for _ in range(2):
        broken = session.analyze({sub: b"class (\n"}, [sub])[sub]
        assert broken.error is not None and broken.findings == ()
        assert _codes(session, {sub: SUB}, sub) == ["KVR001"]
    # Without the file that does not parse, the project is named once more (its module is
    # absent, as in `kvref audit`); typing breaks and mends the text again and again.
    assert named == [OTHERS + 3, OTHERS + 2]


def test_a_file_created_on_disk_is_named_after_refresh(tmp_path: Path, named: list[int]) -> None:
    session, base, sub = _session(tmp_path)
    assert _codes(session, {sub: FIXED}, sub) == []
    deeper = sub.with_name("deeper.py")
    deeper.write_text("from pkg.sub import Cached\n\n\nclass Deeper(Cached):\n    def load(self, key: str) -> bytes:\n        return b''\n")
    session.refresh_files()
    assert _codes(session, {sub: FIXED, deeper: deeper.read_text()}, deeper) == ["KVR001"]
    assert named == [OTHERS + 3, OTHERS + 4]
    assert base.is_file()
