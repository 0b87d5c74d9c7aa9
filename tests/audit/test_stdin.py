"""`kvref audit - --stdin-filename PATH` on the real engine: the text on stdin is audited as
that project file (names resolve across the project), fixed text goes to stdout, and nothing
is ever written."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvref.audit.command import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS
from kvref.cli import app, audit_main

BASE = """\
class Base:
    def work(self) -> None: ...
    def more(self) -> None: ...
"""

ON_DISK = """\
from pkg.base import Base


class Child(Base):
    pass
"""

EDITED = """\
from pkg.base import Base


class Child(Base):
    def work(self) -> None: ...
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "proj"\ndependencies = ["typing_extensions"]\n'
    )
    (root / "pkg/__init__.py").write_text("")
    (root / "pkg/base.py").write_text(BASE)
    (root / "pkg/child.py").write_text(ON_DISK)
    monkeypatch.chdir(root)
    for name in ("NO_COLOR", "FORCE_COLOR", "GITHUB_ACTIONS"):
        monkeypatch.delenv(name, raising=False)
    return root


def _run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], text: str, *argv: str
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    capsys.readouterr()
    code = audit_main(["-", *argv, "--no-cache"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_stdin_is_audited_as_the_named_file_with_names_from_the_project(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(monkeypatch, capsys, EDITED, "--stdin-filename", "pkg/child.py")
    assert code == EXIT_FINDINGS, err
    # pkg.base.Base resolves from the project; the file on disk (no override) is not read.
    assert out.splitlines() == [
        'pkg/child.py:5:9: KVR001 Method "Child.work" overrides "pkg.base.Base.work" '
        "but is not decorated with @override"
    ]
    assert "Checked 1 file (3 indexed)." in err


def test_stdin_names_a_file_that_does_not_exist_yet(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(monkeypatch, capsys, EDITED, "--stdin-filename", "pkg/new.py")
    assert code == EXIT_FINDINGS
    assert out.startswith("pkg/new.py:5:9: KVR001 ")
    assert not (project / "pkg/new.py").exists()


def test_stdin_with_fix_prints_the_fixed_text_and_writes_nothing(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        monkeypatch, capsys, EDITED, "--stdin-filename", "pkg/child.py", "--fix", "--show-fixes"
    )
    assert code == EXIT_CLEAN, err
    assert out == (
        "from typing_extensions import override\n\nfrom pkg.base import Base\n\n\n"
        "class Child(Base):\n    @override\n    def work(self) -> None: ...\n"
    )
    assert "Fixed 1 finding:\n- pkg/child.py:\n    1 x KVR001 (missing-override)\n" in err
    assert (project / "pkg/child.py").read_text() == ON_DISK


def test_stdin_with_fix_and_nothing_to_fix_echoes_the_text(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(monkeypatch, capsys, ON_DISK, "--stdin-filename", "pkg/child.py", "--fix")
    assert (code, out) == (EXIT_CLEAN, ON_DISK)


def test_stdin_with_diff_shows_the_fix(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(monkeypatch, capsys, EDITED, "--stdin-filename", "pkg/child.py", "--diff")
    assert code == EXIT_FINDINGS
    assert "+    @override\n" in out
    assert (project / "pkg/child.py").read_text() == ON_DISK


def test_stdin_that_does_not_parse_is_a_file_error(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(monkeypatch, capsys, "def (:\n", "--stdin-filename", "pkg/child.py")
    assert code == EXIT_ERROR
    assert out == ""
    assert err.startswith("pkg/child.py:1:")


def test_stdin_through_typer(project: Path) -> None:
    result = CliRunner().invoke(
        app, ["audit", "-", "--stdin-filename", "pkg/child.py", "--no-cache", "-q"], input=EDITED
    )
    assert result.exit_code == EXIT_FINDINGS
    assert result.stdout.startswith("pkg/child.py:5:9: KVR001 ")
    assert result.stderr == ""


def test_stdin_through_the_console_script(project: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "kvref", "audit", "-", "--stdin-filename", "pkg/child.py", "--no-cache", "--fix"],
        input=textwrap.dedent(EDITED),
        capture_output=True,
        text=True,
        cwd=project,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"},
    )
    assert completed.returncode == EXIT_CLEAN, completed.stderr
    assert "    @override\n    def work" in completed.stdout
    assert (project / "pkg/child.py").read_text() == ON_DISK


# --- findings name the file as --stdin-filename gave it, relative to the current directory
# --- (as ruff does), wherever the project root is.


def test_stdin_findings_are_named_as_given_outside_any_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No pyproject.toml: pkg/ is the project root, and the path is still pkg/mod.py.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    text = "class A:\n    def f(self) -> None: ...\n\n\nclass B(A):\n    def f(self) -> None: ...\n"
    code, out, _ = _run(monkeypatch, capsys, text, "--stdin-filename", "pkg/mod.py")
    assert code == EXIT_FINDINGS
    assert out.startswith("pkg/mod.py:6:9: KVR001 ")
    code, out, _ = _run(monkeypatch, capsys, text, "--stdin-filename", "./pkg/mod.py", "--output-format", "json")
    assert json.loads(out)["findings"][0]["path"] == "pkg/mod.py"


def test_stdin_findings_are_named_relative_to_the_current_directory(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(project / "pkg")  # below the project root
    code, out, _ = _run(monkeypatch, capsys, EDITED, "--stdin-filename", "child.py")
    assert code == EXIT_FINDINGS
    assert out.startswith("child.py:5:9: KVR001 ")
    code, out, _ = _run(monkeypatch, capsys, EDITED, "--stdin-filename", str(project / "pkg/child.py"))
    assert out.startswith("child.py:5:9: KVR001 ")  # an absolute PATH inside it, relative
    code, out, err = _run(monkeypatch, capsys, "def (:\n", "--stdin-filename", "child.py")
    assert (code, out) == (EXIT_ERROR, "")
    assert err.startswith("child.py:1:")
    code, out, err = _run(monkeypatch, capsys, EDITED, "--stdin-filename", "child.py", "--fix", "--show-fixes")
    assert "- child.py:\n    1 x KVR001 (missing-override)" in err
    # GitHub annotations stay repository-relative: GitHub resolves them from the checkout.
    code, out, _ = _run(monkeypatch, capsys, EDITED, "--stdin-filename", "child.py", "--output-format", "github")
    assert out.startswith("::error file=pkg/child.py,line=5,")


# --- PATH in another project than the current directory (an editor's working directory is
# --- rarely the project of the buffer it lints).


@pytest.fixture
def elsewhere(tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A second project, the current directory, whose own `pkg.base.Base` has no `work` and
    whose configuration ignores KVR001: neither may leak into an audit of `project`'s file."""
    cwd = tmp_path / "elsewhere"
    (cwd / "pkg").mkdir(parents=True)
    (cwd / "pyproject.toml").write_text('[project]\nname = "elsewhere"\n\n[tool.kvref]\nignore = ["KVR001"]\n')
    (cwd / "pkg/__init__.py").write_text("")
    (cwd / "pkg/base.py").write_text("class Base:\n    pass\n")
    monkeypatch.chdir(cwd)
    return cwd


@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "absolute"])
def test_stdin_filename_in_another_project_is_audited_in_that_project(
    project: Path,
    elsewhere: Path,
    absolute: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = str(project / "pkg/child.py") if absolute else "../proj/pkg/child.py"
    code, out, err = _run(monkeypatch, capsys, EDITED, "--stdin-filename", name)
    # Base comes from the sibling module pkg/base.py of PATH, the configuration from PATH's
    # pyproject.toml; the finding names the file as PATH was given (outside the current
    # directory, absolute stays absolute).
    assert code == EXIT_FINDINGS, err
    assert out.splitlines() == [
        f'{name}:5:9: KVR001 Method "Child.work" overrides "pkg.base.Base.work" '
        "but is not decorated with @override"
    ]
    assert "Checked 1 file (3 indexed)." in err


def test_stdin_filename_in_another_project_with_fix_writes_nothing(
    project: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(monkeypatch, capsys, EDITED, "--stdin-filename", "../proj/pkg/child.py", "--fix")
    assert code == EXIT_CLEAN, err
    assert "    @override\n    def work" in out
    assert (project / "pkg/child.py").read_text() == ON_DISK
    assert sorted(p.name for p in elsewhere.rglob("*")) == ["__init__.py", "base.py", "pkg", "pyproject.toml"]


def test_stdin_filename_in_a_directory_that_does_not_exist_is_a_project_of_one_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(
        monkeypatch, capsys, "class A:\n    def f(self) -> None: ...\n", "--stdin-filename", "new/dir/a.py"
    )
    assert (code, out) == (EXIT_CLEAN, "")
    assert "warning" not in err and "Checked 1 file." in err


# --- a PATH that is not audited: as when it is named on the command line. Like ruff, the run
# --- succeeds with nothing to report, and `--fix` prints the text back unchanged.


@pytest.mark.parametrize("fix", [False, True], ids=["check", "fix"])
def test_stdin_filename_that_is_not_a_python_file_is_skipped_with_a_warning(
    project: Path, fix: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("--stdin-filename", "pkg/notes.txt", *(("--fix",) if fix else ()))
    code, out, err = _run(monkeypatch, capsys, EDITED, *argv)
    assert (code, out) == (EXIT_CLEAN, EDITED if fix else "")
    assert "warning: pkg/notes.txt: not a Python file, skipped" in err


def test_stdin_filename_of_a_python_script_is_audited(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(monkeypatch, capsys, "#!/usr/bin/env python3\n" + EDITED, "--stdin-filename", "pkg/tool")
    assert code == EXIT_FINDINGS
    assert out.startswith("pkg/tool:6:9: KVR001 ")


@pytest.mark.parametrize("force", [False, True], ids=["named-wins", "force-exclude"])
def test_stdin_filename_excluded_by_the_configuration(
    project: Path, force: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with (project / "pyproject.toml").open("a") as config:
        config.write(f'\n[tool.kvref]\nexclude = ["pkg/child.py"]\nforce-exclude = {str(force).lower()}\n')
    code, out, err = _run(monkeypatch, capsys, EDITED, "--stdin-filename", "pkg/child.py")
    if force:  # skipped silently, as a named file is
        assert (code, out) == (EXIT_CLEAN, "")
        assert "Checked 0 files" in err
        code, out, _ = _run(monkeypatch, capsys, EDITED, "--stdin-filename", "pkg/child.py", "--fix")
        assert (code, out) == (EXIT_CLEAN, EDITED)
    else:  # a named file is audited even when excluded
        assert code == EXIT_FINDINGS
        assert out.startswith("pkg/child.py:5:9: KVR001 ")


# --- errors: one line on stderr, exit 2, no traceback.


@pytest.mark.parametrize("name", ["pkg", ".", ""], ids=["directory", "dot", "empty"])
def test_stdin_filename_that_is_a_directory_is_an_error(
    project: Path, name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(monkeypatch, capsys, EDITED, "--stdin-filename", name)
    assert (code, out) == (EXIT_ERROR, "")
    assert err == f"kvref: error: --stdin-filename {name or '.'}: is a directory\n"


def test_stdin_filename_in_a_project_with_a_broken_configuration_is_an_error(
    project: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "pyproject.toml").write_text('[tool.kvref]\nselct = ["KVR001"]\n')
    code, out, err = _run(monkeypatch, capsys, EDITED, "--stdin-filename", "../proj/pkg/child.py")
    assert (code, out) == (EXIT_ERROR, "")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"kvref: error: {project / 'pyproject.toml'} [tool.kvref]: unknown key 'selct'")


def test_stdin_filename_outside_any_project_is_audited_on_its_own(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No pyproject.toml above the named file: its directory is the project (ruff's defaults);
    # a base it cannot find is reported as unresolved, never guessed.
    loose = tmp_path / "loose"
    loose.mkdir()
    code, out, err = _run(monkeypatch, capsys, EDITED, "--stdin-filename", str(loose / "mod.py"))
    assert code == EXIT_CLEAN, err
    assert out == ""
    assert "could not be resolved" in err and "pkg.base.Base" in err
    assert not (loose / "mod.py").exists()
