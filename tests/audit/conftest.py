"""Helpers for command-line tests: throwaway projects and runs through both front ends."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvref.audit.command
import kvref.audit.rules
import kvref.audit.summarise.newer_syntax
from kvref.cli import audit_main as main
from kvref.cli import app
from tests.audit.fakes import FAKE_RULES, FakeEngine, fake_backend

__all__ = ["Outcome", "Project", "write_project"]


@dataclass(frozen=True)
class Outcome:
    """What one run produced."""

    code: int
    stdout: str
    stderr: str


def write_project(root: Path, files: Mapping[str, str], pyproject: str | None = "") -> Path:
    """Create files (dedented) under root; `pyproject` None means no pyproject.toml."""
    root.mkdir(parents=True, exist_ok=True)
    if pyproject is not None:
        (root / "pyproject.toml").write_text(
            '[project]\nname = "demo"\n' + textwrap.dedent(pyproject), encoding="utf-8"
        )
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


@dataclass
class Project:
    """A throwaway project plus runners through `main(argv)` and typer's CliRunner."""

    root: Path
    engine: FakeEngine
    capsys: pytest.CaptureFixture[str]
    monkeypatch: pytest.MonkeyPatch

    def write(self, files: Mapping[str, str], pyproject: str | None = "") -> Project:
        write_project(self.root, files, pyproject)
        return self

    def main(self, *argv: str) -> Outcome:
        """Run `main(argv)` from the project root."""
        self.monkeypatch.chdir(self.root)
        self.capsys.readouterr()
        code = main(list(argv))
        captured = self.capsys.readouterr()
        return Outcome(code, captured.out, captured.err)

    def cli(self, *argv: str, env: Mapping[str, str] | None = None) -> Outcome:
        """Run `kvref <argv>` through typer's CliRunner from the project root."""
        self.monkeypatch.chdir(self.root)
        result = CliRunner().invoke(app, list(argv), env=dict(env or {}), color=False)
        return Outcome(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def project(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Project:
    """A project under tmp_path audited by the fake engine (both front ends)."""
    engine = FakeEngine()
    fake: Callable[[], kvref.audit.command.Backend] = lambda: fake_backend(engine)
    monkeypatch.setattr(kvref.audit.command, "real_backend", fake)
    monkeypatch.setattr(kvref.audit.rules, "rule_catalogue", lambda: FAKE_RULES)
    for name in ("NO_COLOR", "FORCE_COLOR", "GITHUB_ACTIONS"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "proj"
    root.mkdir()
    return Project(root, engine, capsys, monkeypatch)


@pytest.fixture(autouse=True)
def no_lingering_parse_helper() -> Iterator[None]:
    """A test that parsed newer syntax leaves no helper process behind (a later test counts
    this process's children)."""
    yield
    kvref.audit.summarise.newer_syntax.close()
