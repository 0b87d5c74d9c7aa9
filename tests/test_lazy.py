"""The packages' lazy re-exports: every public name resolves, and importing costs nothing."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import kvref
import kvref.audit


@pytest.mark.parametrize("package", [kvref, kvref.audit], ids=lambda p: p.__name__)
def test_every_public_name_is_exported_from_its_module(package: ModuleType) -> None:
    exports: dict[str, str] = getattr(package, "_EXPORTS")
    assert len(set(package.__all__)) == len(package.__all__)
    assert set(exports) == set(package.__all__) - {"__version__"}
    for name, module in exports.items():
        assert getattr(package, name) is getattr(importlib.import_module(module), name)
    assert set(package.__all__) <= set(dir(package))


def test_unknown_names_still_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        getattr(kvref, "Nope")
    with pytest.raises(ImportError):
        exec("from kvref.audit import Nope", {})


def test_the_audit_command_line_does_not_import_the_offloading_library() -> None:
    code = (
        "import sys, kvref.cli, kvref.audit.command\n"
        "loaded = [m for m in ('kvref.tiering', 'kvref.cpu.manager', 'kvref.audit.resolve.hierarchy')"
        " if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == ""


def test_an_audit_from_the_console_script_never_imports_pydantic(tmp_path: Path) -> None:
    # typer converts values through pydantic; the console script's audit parse does not.
    (tmp_path / "mod.py").write_text("class A:\n    pass\n")
    code = (
        "import sys, kvref.console\n"
        f"sys.argv = ['kvref', 'audit', {str(tmp_path / 'mod.py')!r}, '--no-cache']\n"
        "try:\n"
        "    kvref.console.main()\n"
        "except SystemExit as exited:\n"
        "    print(exited.code, 'pydantic' in sys.modules)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert completed.stdout.split() == ["0", "False"]
