"""The pre-commit hooks, run by pre-commit itself against a throwaway git repository.

Two ways: `repo: local` hooks built from this checkout's `.pre-commit-hooks.yaml` with
`language: system` (fast, runs `kvref` from this virtual environment), and `pre-commit
try-repo` pointing at this checkout with the shipped `language: python` (slow: pre-commit
builds a virtual environment and pip-installs kvref from the configured, local, package index).
Both pass only the changed file, so they also prove the cross-file index: the base class lives
in a file pre-commit does not pass.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PRE_COMMIT = BIN / "pre-commit"

pytestmark = pytest.mark.skipif(
    not PRE_COMMIT.exists(), reason="pre-commit is not installed in this venv"
)
needs_engine = pytest.mark.skipif(
    importlib.util.find_spec("kvref.audit.pipeline") is None,
    reason="the analysis engine (kvref.audit.pipeline) is not merged yet",
)

BASE = "class Base:\n    def work(self) -> None:\n        pass\n"
CHILD = "from base import Base\n\n\nclass Child(Base):\n    def work(self) -> None:\n        pass\n"


def _hooks() -> list[dict[str, Any]]:
    yaml = importlib.import_module("yaml")
    return cast(list[dict[str, Any]], yaml.safe_load((CHECKOUT / ".pre-commit-hooks.yaml").read_text()))


def test_hook_definitions() -> None:
    hooks = {hook["id"]: hook for hook in _hooks()}
    assert sorted(hooks) == ["kvref-audit", "kvref-audit-fix"]
    assert hooks["kvref-audit"]["entry"] == "kvref audit"
    assert hooks["kvref-audit-fix"]["entry"] == "kvref audit --fix"
    for hook in hooks.values():
        assert hook["language"] == "python"
        assert hook["types"] == ["python"]
        assert hook["require_serial"] is True
        assert hook.get("pass_filenames", True) is True


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"),
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
        NO_COLOR="1",
    )
    env.pop("VIRTUAL_ENV", None)
    return env


def _repo(tmp_path: Path, config: str | None) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    # It declares typing_extensions, so the KVR001 fix that imports it is safe.
    (repo / "pyproject.toml").write_text('[project]\nname = "demo"\ndependencies = ["typing_extensions"]\n')
    (repo / "base.py").write_text(BASE)
    (repo / "child.py").write_text(CHILD)
    if config is not None:
        (repo / ".pre-commit-config.yaml").write_text(config)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    return repo


def _pre_commit(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PRE_COMMIT), *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600
    )


def _scenario(repo: Path, env: dict[str, str], run: list[str]) -> None:
    """kvref-audit fails on child.py, kvref-audit-fix fixes it, then kvref-audit passes."""
    check = _pre_commit(repo, env, *run, "kvref-audit", "--files", "child.py")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "child.py:5:9: KVR001" in check.stdout
    assert "base.py:" not in check.stdout.replace("from base import", "")

    fix = _pre_commit(repo, env, *run, "kvref-audit-fix", "--files", "child.py")
    assert fix.returncode == 1, fix.stdout + fix.stderr  # pre-commit fails when files change
    assert "files were modified by this hook" in fix.stdout
    fixed = (repo / "child.py").read_text()
    assert "    @override\n    def work(self) -> None:" in fixed
    assert "from typing_extensions import override" in fixed
    assert (repo / "base.py").read_text() == BASE

    again = _pre_commit(repo, env, *run, "kvref-audit", "--files", "child.py")
    assert again.returncode == 0, again.stdout + again.stderr


@needs_engine
def test_local_hooks_from_the_manifest(tmp_path: Path) -> None:
    hooks = [{**hook, "language": "system"} for hook in _hooks()]
    config = json.dumps({"repos": [{"repo": "local", "hooks": hooks}]})  # JSON is YAML
    repo = _repo(tmp_path, config)
    _scenario(repo, _env(tmp_path), ["run"])


@needs_engine
@pytest.mark.slow
def test_try_repo_installs_and_runs_the_shipped_hooks(tmp_path: Path) -> None:
    # One try-repo call runs both shipped hooks in order (each call builds a fresh environment,
    # about 40 s): the check fails on child.py, then the fixing hook rewrites it.
    repo = _repo(tmp_path, None)
    env = _env(tmp_path)
    both = _pre_commit(repo, env, "try-repo", str(CHECKOUT), "--files", "child.py")
    assert both.returncode == 1, both.stdout + both.stderr
    assert "child.py:5:9: KVR001" in both.stdout
    assert "files were modified by this hook" in both.stdout
    fixed = (repo / "child.py").read_text()
    assert "    @override\n    def work(self) -> None:" in fixed
    assert (repo / "base.py").read_text() == BASE
    after = subprocess.run(
        [str(BIN / "kvref"), "audit", "child.py"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert after.returncode == 0, after.stdout + after.stderr


@needs_engine
def test_renaming_a_base_method_fails_the_commit_on_the_unchanged_subclass(tmp_path: Path) -> None:
    # pre-commit passes only the staged base.py; the stale @override is in child.py, which the
    # commit does not touch. `git commit` through the installed hook must still refuse it.
    hooks = [{**hook, "language": "system"} for hook in _hooks() if hook["id"] == "kvref-audit"]
    config = json.dumps({"repos": [{"repo": "local", "hooks": hooks}]})
    repo = _repo(tmp_path, config)
    env = _env(tmp_path)
    (repo / "child.py").write_text(
        "from typing_extensions import override\n\nfrom base import Base\n\n\n"
        "class Child(Base):\n    @override\n    def work(self) -> None:\n        pass\n"
    )
    git = ["git", "-C", str(repo)]
    subprocess.run([*git, "add", "."], check=True, env=env)
    subprocess.run([*git, "commit", "-qm", "start"], check=True, env=env)
    installed = _pre_commit(repo, env, "install")
    assert installed.returncode == 0, installed.stdout + installed.stderr

    (repo / "base.py").write_text(BASE.replace("def work", "def run"))
    subprocess.run([*git, "add", "base.py"], check=True, env=env)
    staged = _pre_commit(repo, env, "run")
    assert staged.returncode == 1, staged.stdout + staged.stderr
    assert "child.py:8:9: KVR002" in staged.stdout
    commit = subprocess.run(
        [*git, "commit", "-qm", "rename work"], env=env, capture_output=True, text=True
    )
    assert commit.returncode != 0
    assert "child.py:8:9: KVR002" in commit.stdout + commit.stderr
    log = subprocess.run([*git, "log", "--oneline"], env=env, capture_output=True, text=True)
    assert len(log.stdout.splitlines()) == 1  # the breaking commit was refused

    # Renaming the override as well makes the commit pass.
    (repo / "child.py").write_text((repo / "child.py").read_text().replace("def work", "def run"))
    subprocess.run([*git, "add", "child.py"], check=True, env=env)
    fixed = subprocess.run([*git, "commit", "-qm", "rename both"], env=env, capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
