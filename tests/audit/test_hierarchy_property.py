"""KVR001/KVR002 agree with Python itself on random class hierarchies spread over modules.

Hypothesis draws classes (bases among earlier classes, `dict` or `Generic[T]` subscripted as
`C0[int]` by subclasses, C3-consistent), methods with and
without `@override` (plain, static, class methods, properties), and how each base is
imported (directly, under an alias, through a module alias, relatively, or through a relay
module that re-exports with `*`). The package is written to a temporary directory, audited,
then imported under a fresh name; the ground truth is each class's real `__mro__`: a method
overrides iff a later class in the MRO has the name in its `__dict__`.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.audit import DEFAULT_EXEMPT_NAMES, analyze, apply_fixes

METHOD_NAMES = ("run", "stop", "load", "store", "size", "__repr__", "__len__", "__init__")
KINDS = ("plain", "static", "class", "property")
IMPORT_STYLES = ("direct", "alias", "module_alias", "relative_module", "relay")
_COUNTER = itertools.count()


@pytest.fixture
def no_bytecode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Generated modules are rewritten and re-imported: no stale .pyc may stand in."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)


@dataclass(frozen=True)
class MethodSpec:
    name: str
    kind: str
    decorated: bool


@dataclass(frozen=True)
class ClassSpec:
    index: int
    module: int
    bases: tuple[int, ...]  # indexes of earlier classes; -1 is `dict`, -2 is `Generic[T]`
    methods: tuple[MethodSpec, ...]
    import_style: str


def c3(heads: list[list[int]]) -> list[int] | None:
    result: list[int] = []
    sequences = [list(s) for s in heads if s]
    while sequences:
        for sequence in sequences:
            if not any(sequence[0] in other[1:] for other in sequences):
                head = sequence[0]
                break
        else:
            return None
        result.append(head)
        sequences = [[c for c in s if c != head] for s in sequences]
        sequences = [s for s in sequences if s]
    return result


@st.composite
def hierarchies(draw: st.DrawFn) -> list[ClassSpec]:
    module_count = draw(st.integers(1, 3))
    class_count = draw(st.integers(2, 7))
    classes: list[ClassSpec] = []
    linearizations: dict[int, list[int]] = {-1: [-1], -2: [-2]}
    module_of_class: list[int] = []
    for index in range(class_count):
        module = draw(st.integers(0, module_count - 1))
        candidates = [i for i in range(index) if module_of_class[i] <= module]
        bases = tuple(
            draw(st.lists(st.sampled_from([-1, *candidates]), max_size=3, unique=True))
            if candidates
            else draw(st.lists(st.sampled_from([-1, -2]), max_size=1))
        )
        linear = c3([linearizations[b] for b in bases] + [list(bases)]) if bases else []
        if linear is None:  # not C3-consistent: Python would refuse the class
            bases = bases[:1]
            linear = linearizations[bases[0]] if bases else []
        linearizations[index] = [index, *linear]
        methods = draw(
            st.lists(
                st.builds(
                    MethodSpec,
                    st.sampled_from(METHOD_NAMES),
                    st.sampled_from(KINDS),
                    st.booleans(),
                ),
                max_size=4,
                unique_by=lambda m: m.name,
            )
        )
        style = draw(st.sampled_from(IMPORT_STYLES))
        classes.append(ClassSpec(index, module, bases, tuple(methods), style))
        module_of_class.append(module)
    return classes


def method_source(method: MethodSpec) -> list[str]:
    lines: list[str] = []
    if method.name.startswith("__") and method.kind != "plain":
        method = MethodSpec(method.name, "plain", method.decorated)
    decorator = {"static": "@staticmethod", "class": "@classmethod", "property": "@property"}
    if method.kind in decorator:
        lines.append(f"    {decorator[method.kind]}")
    if method.decorated:
        lines.append("    @override")
    receiver = {"static": "", "class": "cls", "plain": "self", "property": "self"}[method.kind]
    returns = {"__repr__": "'x'", "__len__": "0", "__init__": "None"}.get(method.name, "None")
    extra = ", *args, **kwargs" if method.name == "__init__" else ""
    lines.append(f"    def {method.name}({receiver}{extra}):")
    lines.append(f"        return {returns}")
    return lines


def write_package(root: Path, package: str, classes: list[ClassSpec]) -> None:
    directory = root / package
    directory.mkdir()
    (directory / "__init__.py").write_text("")
    modules = max(c.module for c in classes) + 1
    for module in range(modules):
        (directory / f"relay{module}.py").write_text(f"from .m{module} import *\n")
        decorated = any(m.decorated for c in classes if c.module == module for m in c.methods)
        # Without decorated methods the import is left out: the fixer must add it.
        body = ["from typing_extensions import override", ""] if decorated else [""]
        body.insert(0, 'from typing import Generic, TypeVar\nT = TypeVar("T")')
        for cls in (c for c in classes if c.module == module):
            base_names: list[str] = []
            for base in cls.bases:
                if base < 0:
                    base_names.append("dict" if base == -1 else "Generic[T]")
                    continue
                source = classes[base]
                # A generic class is subclassed through a subscript: `C0[int]`.
                subscript = "[int]" if -2 in source.bases else ""
                if source.module == module:
                    base_names.append(f"C{base}{subscript}")
                    continue
                style = cls.import_style
                if style == "direct":
                    body.insert(0, f"from {package}.m{source.module} import C{base}")
                    base_names.append(f"C{base}{subscript}")
                elif style == "alias":
                    body.insert(0, f"from {package}.m{source.module} import C{base} as Alias{base}")
                    base_names.append(f"Alias{base}{subscript}")
                elif style == "module_alias":
                    body.insert(0, f"import {package}.m{source.module} as mod{source.module}")
                    base_names.append(f"mod{source.module}.C{base}{subscript}")
                elif style == "relative_module":
                    body.insert(0, f"from . import m{source.module}")
                    base_names.append(f"m{source.module}.C{base}{subscript}")
                else:
                    body.insert(0, f"from .relay{source.module} import C{base}")
                    base_names.append(f"C{base}{subscript}")
            header = f"class C{cls.index}({', '.join(base_names)}):" if base_names else f"class C{cls.index}:"
            body.append(header)
            for method in cls.methods:
                body.extend(method_source(method))
            if not cls.methods:
                body.append("    pass")
            body.append("")
        (directory / f"m{module}.py").write_text("\n".join(body) + "\n")


def ground_truth(package: str, classes: list[ClassSpec]) -> set[tuple[str, str]]:
    expected: set[tuple[str, str]] = set()
    for cls in classes:
        runtime = getattr(importlib.import_module(f"{package}.m{cls.module}"), f"C{cls.index}")
        for method in cls.methods:
            overrides = any(method.name in base.__dict__ for base in runtime.__mro__[1:])
            symbol = f"C{cls.index}.{method.name}"
            if overrides and not method.decorated and method.name not in DEFAULT_EXEMPT_NAMES:
                expected.add((symbol, "KVR001"))
            if method.decorated and not overrides:
                expected.add((symbol, "KVR002"))
    return expected


@settings(max_examples=40, deadline=None)
@pytest.mark.usefixtures("no_bytecode")
@given(hierarchies())
def test_override_findings_match_the_runtime_mro(classes: list[ClassSpec]) -> None:
    package = f"kvref_hypothesis_pkg_{next(_COUNTER)}"
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        write_package(root, package, classes)
        files = sorted((root / package).glob("*.py"))
        result = analyze(files, root=root)
        assert result.errors == []
        assert result.unresolved_bases == {}
        found = {(f.symbol, f.code) for f in result.findings if f.code in ("KVR001", "KVR002")}
        sys.path.insert(0, temporary)
        try:
            expected = ground_truth(package, classes)
        finally:
            sys.path.remove(temporary)
            for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
                del sys.modules[name]
        assert found == expected
        assert_fixes_hold(root, package, files, found)


def assert_fixes_hold(root: Path, package: str, files: list[Path], found: set[tuple[str, str]]) -> None:
    """Applying every fix leaves no KVR001, the same KVR002s, and a package that imports."""
    result = analyze(files, root=root)
    for path in files:
        relative = path.relative_to(root).as_posix()
        fixes = [f.fix for f in result.findings if f.path == relative and f.fix is not None]
        path.write_bytes(apply_fixes(path.read_bytes(), fixes))
    again = {(f.symbol, f.code) for f in analyze(files, root=root).findings}
    assert again == {item for item in found if item[1] == "KVR002"}
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        for path in files:
            importlib.import_module(f"{package}.{path.stem}")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[name]
