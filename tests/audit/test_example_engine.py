"""`kvref audit --fix --unsafe-fixes` on examples/engine leaves a package that imports and is clean.

The example carries a narrowed `FifoPolicy.touch(keys: Sequence[OffloadKey])`; its unsafe fix
writes the base's `Collection[OffloadKey]`, so it must also import `Collection` there. The
example and kvref are copied into one project root (so kvref's bases resolve as project
modules), fixed through the command line, audited again, and imported.
"""

from __future__ import annotations

import collections.abc
import importlib
import shutil
import sys
import typing
from pathlib import Path

import pytest

from kvref.cli import audit_main as main

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "kvref_example_engine_fixed"


def test_fixed_example_engine_imports_and_audits_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "kvref", tmp_path / "kvref", ignore=ignore)
    shutil.copytree(REPO / "examples" / "engine", tmp_path / PACKAGE, ignore=ignore)
    # The project root (a pyproject.toml) holds both, so the whole of it is indexed.
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "fixed-engine"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVREF_CACHE_DIR", str(tmp_path / "cache"))

    assert main([PACKAGE, "--fix", "--unsafe-fixes"]) == 0
    policy = (tmp_path / PACKAGE / "policy.py").read_text(encoding="utf-8")
    # Merged in isort's order; `Sequence` was used only by the rewritten annotation.
    assert "from collections.abc import Collection\n" in policy
    assert "def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:" in policy
    capsys.readouterr()
    assert main([PACKAGE, "--select", "ALL"]) == 0, capsys.readouterr().out

    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    try:
        module = importlib.import_module(f"{PACKAGE}.policy")
        # The module defers annotations: evaluating them is what finds an unimported name.
        hints = typing.get_type_hints(module.FifoPolicy.touch)
        assert hints["keys"] == collections.abc.Collection[module.OffloadKey]
    finally:
        for name in [n for n in sys.modules if n.startswith(PACKAGE)]:
            del sys.modules[name]
