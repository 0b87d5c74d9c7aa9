"""Module names follow the import system: namespace packages (PEP 420) and src layouts.

A directory below an import root is a package whether or not it holds `__init__.py`; the
findings on a tree must not change when empty `__init__.py` files are added to it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvref.audit import analyze
from kvref.audit.resolve.modules import module_names_for

BASE = "class Base:\n    def run(self) -> None: ...\n"


def write(root: Path, files: Mapping[str, str]) -> list[Path]:
    paths: list[Path] = []
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        paths.append(path)
    return paths


def names(root: Path, relative: str, *, src: bool = False) -> tuple[str, ...]:
    roots = [str(root / "src"), str(root)] if src else [str(root)]

    def is_package(directory: str) -> bool:
        return os.path.isfile(os.path.join(directory, "__init__.py"))

    return module_names_for(str(root / relative), roots, is_package)


def child(import_line: str) -> str:
    return f"{import_line}\n\n\nclass Child(Base):\n    def run(self) -> None: ...\n"


def test_a_regular_package_inside_a_namespace_directory_is_named_from_the_root(
    tmp_path: Path,
) -> None:
    write(tmp_path, {"pkg/__init__.py": "", "pkg/ns/sub/__init__.py": "", "pkg/ns/sub/mod.py": ""})
    # The full name first; the `__init__` chain alone (its top on sys.path) is an alias.
    assert names(tmp_path, "pkg/ns/sub/mod.py") == ("pkg.ns.sub.mod", "sub.mod")
    assert names(tmp_path, "pkg/ns/sub/__init__.py") == ("pkg.ns.sub", "sub")


def test_namespace_directories_and_scripts_are_named_by_their_path(tmp_path: Path) -> None:
    write(tmp_path, {"tests/unit/test_a.py": "", "tool.py": "", "ns/pkg/__init__.py": ""})
    assert names(tmp_path, "tests/unit/test_a.py") == ("tests.unit.test_a",)
    assert names(tmp_path, "tool.py") == ("tool",)
    assert names(tmp_path, "ns/pkg/__init__.py") == ("ns.pkg", "pkg")


def test_src_layout_names_come_from_src_first(tmp_path: Path) -> None:
    write(tmp_path, {"src/pkg/__init__.py": "", "src/pkg/ns/mod.py": ""})
    assert names(tmp_path, "src/pkg/ns/mod.py", src=True) == ("pkg.ns.mod", "src.pkg.ns.mod")


def test_a_root_that_is_a_package_names_its_files_through_the_init_chain(tmp_path: Path) -> None:
    write(tmp_path, {"outer/__init__.py": "", "outer/inner/__init__.py": "", "outer/inner/m.py": ""})
    root = tmp_path / "outer"
    assert module_names_for(
        str(root / "inner" / "m.py"),
        [str(root)],
        lambda directory: os.path.isfile(os.path.join(directory, "__init__.py")),
    ) == ("outer.inner.m",)


def test_a_package_named_like_the_standard_library_gets_no_short_alias(tmp_path: Path) -> None:
    write(tmp_path, {"examples/demo/json/__init__.py": "", "examples/demo/json/codec.py": ""})
    assert names(tmp_path, "examples/demo/json/codec.py") == ("examples.demo.json.codec",)


def test_unimportable_directory_names_are_a_last_resort(tmp_path: Path) -> None:
    write(tmp_path, {".ci/check.py": "", "my-scripts/pkg/__init__.py": ""})
    assert names(tmp_path, ".ci/check.py") == (".ci.check",)
    assert names(tmp_path, "my-scripts/pkg/__init__.py") == ("pkg",)


def test_absolute_and_relative_imports_through_namespace_packages_resolve(tmp_path: Path) -> None:
    files = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/base.py": BASE,
            # `ns` has no __init__.py; `sub` below it is a regular package again.
            "pkg/ns/sub/__init__.py": "",
            "pkg/ns/sub/absolute.py": child("from pkg.base import Base"),
            "pkg/ns/sub/relative.py": child("from ...base import Base"),
            "pkg/ns/helpers.py": BASE.replace("Base", "Helper"),
            "pkg/ns/sub/sibling.py": child("from ..helpers import Helper as Base"),
        },
    )
    result = analyze(files, root=tmp_path)
    assert sorted(f.path for f in result.findings) == [
        "pkg/ns/sub/absolute.py",
        "pkg/ns/sub/relative.py",
        "pkg/ns/sub/sibling.py",
    ]
    assert not result.unresolved_bases


def test_a_src_layout_namespace_package_resolves(tmp_path: Path) -> None:
    files = write(
        tmp_path,
        {
            "src/company/product/base.py": BASE,  # no __init__.py anywhere
            "src/company/product/impl.py": child("from company.product.base import Base"),
            "tests/test_impl.py": child("from company.product.base import Base"),
        },
    )
    result = analyze(files, root=tmp_path)
    assert sorted(f.path for f in result.findings) == [
        "src/company/product/impl.py",
        "tests/test_impl.py",
    ]


_DIRECTORIES = ("a", "a/b", "a/b/c", "a/d", "e")


def _tree() -> dict[str, str]:
    """Every module imports the base with an absolute import and its sibling's subclass with
    a relative one, across directories that may or may not be regular packages."""
    files = {"a/base.py": BASE}
    for directory in _DIRECTORIES:
        dotted = directory.replace("/", ".")
        depth = directory.count("/") + 1
        files[f"{directory}/impl.py"] = child("from a.base import Base")
        files[f"{directory}/more.py"] = (
            f"from .impl import Child\nfrom {'.' * depth}base import Base\n\n\n"
            "class More(Child, Base):\n    def run(self) -> None: ...\n"
            if directory.startswith("a")
            else f"from {dotted}.impl import Child\n\n\nclass More(Child):\n"
            "    def run(self) -> None: ...\n"
        )
    return files


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(without_init=st.sets(st.sampled_from(_DIRECTORIES)))
def test_findings_do_not_depend_on_which_directories_have_init_files(
    tmp_path_factory: pytest.TempPathFactory, without_init: set[str]
) -> None:
    findings: list[list[tuple[str, int, str]]] = []
    for variant in ("all", "some"):
        root = tmp_path_factory.mktemp(variant)
        files = _tree()
        for directory in _DIRECTORIES:
            if variant == "all" or directory not in without_init:
                files[f"{directory}/__init__.py"] = ""
        result = analyze(write(root, files), root=root)
        assert not result.unresolved_bases
        findings.append([(f.path, f.line, f.message) for f in result.findings])
    assert findings[0] == findings[1]
    assert len(findings[0]) == 2 * len(_DIRECTORIES)


def test_only_importable_names_count_as_missing_modules(tmp_path: Path) -> None:
    paths = write(
        tmp_path,
        {
            "models.py": "import torch\n\n\nclass Manager:\n    pass\n\n\n"
            "class Net(torch.nn.Module):\n    def forward(self) -> None: ...\n\n\n"
            "class Custom(Manager.from_queryset(object)):\n    def get(self) -> None: ...\n",
        },
    )
    result = analyze(paths, root=tmp_path)
    assert set(result.unresolved_bases) == {"torch.nn.Module", "Manager.from_queryset(object)"}
    # A call is not a module to install; `torch` is.
    assert dict(result.missing_modules) == {"torch": 1}
