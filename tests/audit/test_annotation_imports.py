"""The KVR101/KVR103 fixes import what the base's annotation names, or are not offered.

Each scenario is a small multi-module project: the fix must write an annotation whose every
name means in the override's module what it means in the base's, by reusing a binding, by
adding the import the base's module uses, or else by offering no fix at all.
"""

from __future__ import annotations

import ast

import importlib
import sys
import typing
from pathlib import Path

import pytest

from kvref.audit import AnalysisOptions, Finding, Fix, RequiredImport, analyze, apply_fixes
from kvref.audit.fixes.annotation_imports import annotation_names

BASE = """\
from collections.abc import Collection

class Key: ...

class Base:
    def touch(self, keys: Collection[Key]) -> None: ...
"""


def write(root: Path, files: dict[str, str]) -> list[Path]:
    paths: list[Path] = []
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def narrowed(root: Path, files: dict[str, str], path: str, search: tuple[str, ...] = ()) -> Finding:
    """The one KVR101 finding in `path`."""
    result = analyze(
        write(root, files), root=root, options=AnalysisOptions(), search_paths=[root / s for s in search]
    )
    assert result.errors == []
    found = [f for f in result.findings if f.code == "KVR101" and f.path == path]
    assert len(found) == 1, result.findings
    return found[0]


def _imports(text: str) -> set[RequiredImport]:
    found: set[RequiredImport] = set()
    for statement in ast.parse(text).body:
        if isinstance(statement, ast.ImportFrom):
            module = "." * statement.level + (statement.module or "")
            found.update(RequiredImport(module, a.name, a.asname or "") for a in statement.names)
        elif isinstance(statement, ast.Import):
            found.update(RequiredImport(a.name, "", a.asname or "") for a in statement.names)
    return found


def added_imports(source: str, *fixes: Fix | None) -> set[RequiredImport]:
    """The imports the fixes' edits add to `source` (the fixes carry their imports as edits)."""
    assert all(fix is not None for fix in fixes)
    fixed = apply_fixes(source.encode(), [fix for fix in fixes if fix is not None]).decode()
    return _imports(fixed) - _imports(source)


def fix_file(root: Path, path: str, finding: Finding) -> str:
    assert finding.fix is not None
    target = root / path
    target.write_bytes(apply_fixes(target.read_bytes(), [finding.fix]))
    return target.read_text(encoding="utf-8")


def test_imports_reuse_the_override_modules_relative_spelling_and_the_result_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    impl = (
        "from collections.abc import Sequence\n\nfrom .base import Base\n\n\n"
        "class Impl(Base):\n    def touch(self, keys: Sequence[int]) -> None: ...\n"
    )
    files = {"pkg_fix_rel/__init__.py": "", "pkg_fix_rel/base.py": BASE, "pkg_fix_rel/impl.py": impl}
    finding = narrowed(tmp_path, files, "pkg_fix_rel/impl.py")
    assert finding.fix is not None
    assert added_imports(impl, finding.fix) == {
        RequiredImport("collections.abc", "Collection"),
        RequiredImport(".base", "Key"),
    }
    fixed = fix_file(tmp_path, "pkg_fix_rel/impl.py", finding)
    assert fixed.startswith(
        "from collections.abc import Collection\n\nfrom .base import Base, Key\n"
    )
    assert "def touch(self, keys: Collection[Key])" in fixed
    # The fixed module imports, and its annotations evaluate (no future import here).
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    module = importlib.import_module("pkg_fix_rel.impl")
    try:
        hints = typing.get_type_hints(module.Impl.touch)
        assert "Key" in repr(hints["keys"])
    finally:
        for name in [n for n in sys.modules if n.startswith("pkg_fix_rel")]:
            del sys.modules[name]
    again = analyze(sorted(tmp_path.rglob("*.py")), root=tmp_path)
    assert [f for f in again.findings if f.code == "KVR101"] == []


def test_names_already_bound_alike_need_no_import(tmp_path: Path) -> None:
    impl = (
        "import typing\nfrom base import Base, Key\n\n"
        "class Impl(Base):\n    def touch(self, keys: typing.Sequence[Key]) -> None: ...\n"
    )
    impl = "from typing import Collection\n" + impl  # the typing alias is the same class
    finding = narrowed(tmp_path, {"base.py": BASE, "impl.py": impl}, "impl.py")
    assert finding.fix is not None and added_imports(impl, finding.fix) == set()


def test_a_type_checking_only_stdlib_import_is_imported_at_run_time(tmp_path: Path) -> None:
    base = (
        "from __future__ import annotations\nfrom collections.abc import Collection\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from decimal import Decimal\n\n"
        "class Base:\n    def price(self, amounts: Collection[Decimal]) -> None: ...\n"
    )
    impl = "from base import Base\n\nclass Impl(Base):\n    def price(self, amounts: list[float]) -> None: ...\n"
    finding = narrowed(tmp_path, {"base.py": base, "impl.py": impl}, "impl.py")
    assert finding.fix is not None
    assert added_imports(impl, finding.fix) == {
        RequiredImport("collections.abc", "Collection"),
        RequiredImport("decimal", "Decimal"),
    }


BLOCKED: dict[str, tuple[dict[str, str], str]] = {
    # `Key` of the base's class body is no module name anywhere.
    "class-body name": (
        {
            "base.py": "from collections.abc import Collection\n\nclass Base:\n    Key = int\n"
            "    def touch(self, keys: Collection[Key]) -> None: ...\n",
            "impl.py": "from base import Base\n\nclass Impl(Base):\n"
            "    def touch(self, keys: list[int]) -> None: ...\n",
        },
        "impl.py",
    ),
    # `T` is the base class's type parameter, which `Impl` binds to `int`.
    "type parameter": (
        {
            "base.py": "from collections.abc import Collection\nfrom typing import Generic, TypeVar\n"
            "T = TypeVar('T')\n\nclass Base(Generic[T]):\n"
            "    def touch(self, keys: Collection[T]) -> None: ...\n",
            "impl.py": "from collections.abc import Collection\nfrom base import Base\n\n"
            "class Impl(Base[int]):\n    def touch(self, keys: list[int]) -> None: ...\n",
        },
        "impl.py",
    ),
    # The override's module binds `Key` to another class.
    "bound to something else": (
        {
            "base.py": BASE,
            "impl.py": "from base import Base\n\nclass Key: ...\n\nclass Impl(Base):\n"
            "    def touch(self, keys: list[Key]) -> None: ...\n",
        },
        "impl.py",
    ),
    # Importing the base module's `bytes` would change every other `bytes` of the module.
    "shadows a builtin": (
        {
            "kinds.py": "class bytes: ...\n",
            "base.py": "from collections.abc import Collection\nfrom kinds import bytes\n\n"
            "class Base:\n    def touch(self, keys: Collection[bytes]) -> None: ...\n",
            "impl.py": "from base import Base\n\nclass Impl(Base):\n"
            "    def touch(self, keys: list[str]) -> None: ...\n",
        },
        "impl.py",
    ),
    # A star import might already bind `Collection` (to anything).
    "star import": (
        {
            "base.py": BASE,
            "impl.py": "from base import Base, Key\nfrom os.path import *\n\nclass Impl(Base):\n"
            "    def touch(self, keys: list[Key]) -> None: ...\n",
        },
        "impl.py",
    ),
    # Only a type checker can import `Token` (maybe a cycle, maybe not installed).
    "type-checking-only project import": (
        {
            "tokens.py": "class Token: ...\n",
            "base.py": "from __future__ import annotations\nfrom collections.abc import Collection\n"
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tokens import Token\n\n"
            "class Base:\n    def touch(self, keys: Collection[Token]) -> None: ...\n",
            "impl.py": "from base import Base\n\nclass Impl(Base):\n"
            "    def touch(self, keys: list[object]) -> None: ...\n",
        },
        "impl.py",
    ),
    # The override's module has `Collection` for the type checker only, and evaluates
    # annotations when it runs.
    "override's binding is type-checking only": (
        {
            "base.py": BASE,
            "impl.py": "from typing import TYPE_CHECKING\nfrom base import Base, Key\n"
            "if TYPE_CHECKING:\n    from collections.abc import Collection\n\n"
            "class Impl(Base):\n    def touch(self, keys: list[Key]) -> None: ...\n",
        },
        "impl.py",
    ),
    # A stub may define names (`Handle = int`) that do not exist at run time.
    "stub-only alias": (
        {
            "site/remote/__init__.pyi": "from collections.abc import Collection\nHandle = int\n\n"
            "class Base:\n    def touch(self, keys: Collection[Handle]) -> None: ...\n",
            "impl.py": "from remote import Base\n\nclass Impl(Base):\n"
            "    def touch(self, keys: list[int]) -> None: ...\n",
        },
        "impl.py",
    ),
}


@pytest.mark.parametrize("case", sorted(BLOCKED))
def test_no_fix_when_a_name_cannot_be_imported_safely(case: str, tmp_path: Path) -> None:
    files, path = BLOCKED[case]
    search = ("site",) if any(name.startswith("site/") for name in files) else ()
    project = {name: text for name, text in files.items() if not name.startswith("site/")}
    write(tmp_path, {name: text for name, text in files.items() if name.startswith("site/")})
    finding = narrowed(tmp_path, project, path, search)
    assert finding.fix is None


def test_the_type_parameter_is_fine_when_the_override_class_keeps_it(tmp_path: Path) -> None:
    base = (
        "from collections.abc import Collection\nfrom typing import Generic, TypeVar\n"
        "T = TypeVar('T')\n\nclass Base(Generic[T]):\n    def touch(self, keys: Collection[T]) -> None: ...\n"
    )
    impl = "from base import Base, T\n\nclass Impl(Base[T]):\n    def touch(self, keys: list[T]) -> None: ...\n"
    finding = narrowed(tmp_path, {"base.py": base, "impl.py": impl}, "impl.py")
    assert finding.fix is not None
    assert added_imports(impl, finding.fix) == {RequiredImport("collections.abc", "Collection")}


def test_a_stub_class_is_imported_from_its_module(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "site/remote/__init__.pyi": "from collections.abc import Collection\n\nclass Token: ...\n\n"
            "class Base:\n    def touch(self, keys: Collection[Token]) -> None: ...\n",
        },
    )
    impl = "from remote import Base\n\nclass Impl(Base):\n    def touch(self, keys: list[int]) -> None: ...\n"
    finding = narrowed(tmp_path, {"impl.py": impl}, "impl.py", ("site",))
    assert finding.fix is not None
    assert added_imports(impl, finding.fix) == {
        RequiredImport("collections.abc", "Collection"),
        RequiredImport("remote", "Token"),
    }


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("Collection[Key]", [("Collection",), ("Key",)]),
        ("collections.abc.Set[t.Any]", [("collections", "abc", "Set"), ("t", "Any")]),
        ("'Collection[Key]'", [("Collection",), ("Key",)]),
        ("Collection['Key'] | None", [("Collection",), ("Key",)]),
        ("Mapping[Literal['a', 'b'], int]", [("Mapping",), ("Literal",), ("int",)]),
        ("Annotated[Seq[K], 'not a name']", [("Annotated",), ("Seq",), ("K",)]),
    ],
)
def test_annotation_names(text: str, names: list[tuple[str, ...]]) -> None:
    assert annotation_names(text) == tuple(names)


def test_annotation_names_of_an_unparsable_forward_reference_are_unknown() -> None:
    assert annotation_names("Collection['not a type']") is None


def test_an_alias_the_base_module_defines_is_imported_from_it(tmp_path: Path) -> None:
    base = (
        "import collections.abc\n\nHandle = int\n\nclass Base:\n"
        "    def touch(self, keys: collections.abc.Set[Handle]) -> None: ...\n"
        "    def fetch(self, keys: collections.abc.Collection[int]) -> None: ...\n"
    )
    impl = (
        "from base import Base\n\nclass Impl(Base):\n"
        "    def touch(self, keys: frozenset[int]) -> None: ...\n"
        "    def fetch(self, keys: list[int]) -> None: ...\n"
    )
    result = analyze(write(tmp_path, {"base.py": base, "impl.py": impl}), root=tmp_path)
    fixes = {f.symbol: f.fix for f in result.findings if f.code == "KVR101" and f.path == "impl.py"}
    touch, fetch = fixes["Impl.touch.keys"], fixes["Impl.fetch.keys"]
    assert touch is not None
    assert added_imports(impl, touch) == {RequiredImport("collections.abc"), RequiredImport("base", "Handle")}
    assert fetch is not None and added_imports(impl, fetch) == {RequiredImport("collections.abc")}
    fixed = apply_fixes((tmp_path / "impl.py").read_bytes(), [touch, fetch]).decode()
    assert fixed.startswith("import collections.abc\n\nfrom base import Base, Handle\n")
