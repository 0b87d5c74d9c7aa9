"""Finding the target interpreter's import roots without importing anything from them."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import typer

import kvref.audit.discover.environment as environment_module
from kvref.audit.discover.environment import (
    InterpreterError,
    discover_environment,
    interpreter_path,
    start_discovery,
)

SITE_PACKAGES = Path(typer.__file__).resolve().parent.parent
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def test_default_is_the_running_interpreter() -> None:
    environment = discover_environment()
    assert environment.python == Path(sys.executable)
    assert environment.version == tuple(sys.version_info[:3])
    assert environment.stdlib == STDLIB
    assert SITE_PACKAGES in environment.search_paths
    assert STDLIB not in environment.search_paths
    assert STDLIB / "lib-dynload" not in environment.search_paths


def test_explicit_interpreter_is_asked_in_a_subprocess() -> None:
    asked = discover_environment(Path(sys.executable))
    assert asked.python == Path(sys.executable)
    assert asked.stdlib == STDLIB
    assert SITE_PACKAGES in asked.search_paths
    # In-process sys.path is the subprocess's plus what pytest inserted.
    assert set(asked.search_paths) <= set(discover_environment().search_paths)


def test_a_virtual_environment_directory_is_accepted(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    environment = discover_environment(venv)
    assert environment.python == interpreter_path(venv)
    site = [path for path in environment.search_paths if path.name == "site-packages"]
    assert site and all(venv.resolve() in path.resolve().parents for path in site)
    # The parent environment's packages (typer) are not visible from a fresh venv.
    assert SITE_PACKAGES not in environment.search_paths


def test_pythonpath_entries_count_but_project_paths_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra, project = tmp_path / "extra", tmp_path / "project"
    (project / "src").mkdir(parents=True)
    extra.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(extra), str(project / "src")]))
    environment = discover_environment(Path(sys.executable), project_root=project)
    assert extra in environment.search_paths
    assert project / "src" not in environment.search_paths


def test_nothing_from_the_search_paths_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    package = tmp_path / "roots" / "tripwire"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "roots"))
    environment = discover_environment(Path(sys.executable))
    assert tmp_path / "roots" in environment.search_paths
    assert not marker.exists()


@pytest.mark.parametrize(
    ("python", "message"),
    [
        pytest.param("/no/such/python", "is not an executable Python interpreter", id="missing"),
        pytest.param("/bin/false", "failed to report its sys.path", id="fails"),
        pytest.param("/bin/echo", "is not a Python interpreter kvref understands", id="not python"),
    ],
)
def test_bad_interpreters_are_rejected_naming_the_option(python: str, message: str) -> None:
    with pytest.raises(ValueError, match="--python") as raised:
        discover_environment(Path(python))
    assert message in str(raised.value)


def test_a_directory_without_an_interpreter_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--python: .* is a directory without bin/python"):
        interpreter_path(tmp_path)


def test_a_started_discovery_gives_the_same_answer_and_is_collected_once() -> None:
    expected = discover_environment(Path(sys.executable))
    start_discovery(Path(sys.executable))
    assert discover_environment(Path(sys.executable)) == expected
    assert not environment_module._started  # pyright: ignore[reportPrivateUsage]


def test_starting_discovery_of_a_bad_interpreter_is_silent_and_reported_later(
    tmp_path: Path,
) -> None:
    start_discovery(tmp_path / "missing-python")
    start_discovery(None)
    with pytest.raises(InterpreterError, match="--python"):
        discover_environment(tmp_path / "missing-python")
