"""Files named one by one (pre-commit's changed files) also report the subclasses they break."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.cli import audit_main as main

BASE = (
    "class Base:\n    def work(self) -> None: ...\n    def other(self) -> None: ...\n"
    "    def third(self) -> None: ...\n"
)
CHILD = """\
from typing_extensions import override

from pkg.base import Base


class Child(Base):
    @override
    def work(self) -> None: ...

    @override
    def other(self) -> None: ...


class Unrelated:
    @override
    def nope(self) -> None: ...
"""
GRANDCHILD = """\
from typing_extensions import override

from pkg.child import Child


class Grand(Child):
    @override
    def third(self) -> None: ...

    class Nested:
        @override
        def stale(self) -> None: ...
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text(BASE)
    (package / "child.py").write_text(CHILD)
    (package / "deeper").mkdir()
    (package / "deeper" / "__init__.py").write_text("")
    (package / "deeper" / "grand.py").write_text(GRANDCHILD)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _findings(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main([*argv])
    out = capsys.readouterr().out
    return code, [":".join(line.split(":")[:2]) + " " + line.split()[1] for line in out.splitlines()]


@pytest.mark.parametrize("cache", [[], ["--no-cache"]], ids=["cached", "uncached"])
def test_renamed_base_method_reports_stale_overrides_in_every_derived_file(
    project: Path, capsys: pytest.CaptureFixture[str], cache: list[str]
) -> None:
    # The unrelated class's stale override and Grand.Nested's are not the change's doing.
    assert _findings(capsys, "pkg/base.py", *cache) == (0, [])
    renamed = BASE.replace("def work", "def run").replace("def third", "def fourth")
    (project / "pkg" / "base.py").write_text(renamed)
    for _ in range(2):  # the second run may come from the result cache
        assert _findings(capsys, "pkg/base.py", *cache) == (
            1,
            ["pkg/child.py:8 KVR002", "pkg/deeper/grand.py:8 KVR002"],
        )


def test_a_base_gaining_a_method_reports_the_subclass_missing_override(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "pkg" / "child.py").write_text(CHILD + "\n    def later(self) -> None: ...\n")
    (project / "pkg" / "base.py").write_text(BASE + "    def later(self) -> None: ...\n")
    assert _findings(capsys, "pkg/base.py") == (0, [])  # `later` is Unrelated's, not Child's
    (project / "pkg" / "child.py").write_text(
        CHILD.replace("class Unrelated:", "    def later(self) -> None: ...\n\n\nclass Unrelated:")
    )
    assert _findings(capsys, "pkg/base.py") == (1, ["pkg/child.py:14 KVR001"])


def test_naming_a_directory_reports_only_that_directory(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "pkg" / "base.py").write_text(BASE.replace("def third", "def fourth"))
    (project / "other").mkdir()
    (project / "other" / "m.py").write_text("x = 1\n")
    assert _findings(capsys, "other") == (0, [])
    # The whole project, of course, reports every finding.
    code, found = _findings(capsys)
    assert code == 1
    assert found == [
        "pkg/child.py:16 KVR002",
        "pkg/deeper/grand.py:8 KVR002",
        "pkg/deeper/grand.py:12 KVR002",
    ]


@pytest.mark.parametrize("cache", [[], ["--no-cache"]], ids=["cached", "uncached"])
def test_a_changed_stub_reports_the_subclasses_it_breaks(
    project: Path, capsys: pytest.CaptureFixture[str], cache: list[str]
) -> None:
    # pre-commit passes stubs too (`types: [python]`): a stub is never reported on itself, but
    # the classes deriving from its classes are, as for a changed `.py`.
    (project / "pkg" / "base.py").unlink()
    (project / "pkg" / "base.pyi").write_text(BASE)
    assert _findings(capsys, "pkg/base.pyi", *cache) == (0, [])
    (project / "pkg" / "base.pyi").write_text(BASE.replace("def work", "def run"))
    for _ in range(2):  # the second run may come from the result cache
        assert _findings(capsys, "pkg/base.pyi", *cache) == (1, ["pkg/child.py:8 KVR002"])
