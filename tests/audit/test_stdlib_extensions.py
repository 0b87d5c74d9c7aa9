"""Bases defined in standard-library C extensions (`_pickle.Unpickler`, `_ctypes.Structure`)."""

from __future__ import annotations

from pathlib import Path

from kvref.audit.pipeline import analyze
from kvref.audit.resolve.stdlib import import_stdlib_extension


def test_only_top_level_stdlib_extension_modules_are_imported() -> None:
    assert import_stdlib_extension("_pickle") is not None
    assert import_stdlib_extension("_ctypes") is not None
    assert import_stdlib_extension("json") is None  # Python source: read, never imported
    assert import_stdlib_extension("os.path") is None
    assert import_stdlib_extension("hypothesis") is None  # not the standard library


def test_a_class_over_a_c_extension_base_is_resolved(tmp_path: Path) -> None:
    module = tmp_path / "loader.py"
    module.write_text(
        "import pickle\n"
        "\n"
        "class Strict(pickle.Unpickler):\n"
        "    def find_class(self, module_name: str, name: str) -> type: ...\n"
    )
    result = analyze([module], root=tmp_path)
    assert dict(result.unresolved_bases) == {}
    assert [(f.code, f.symbol) for f in result.findings] == [("KVR001", "Strict.find_class")]
