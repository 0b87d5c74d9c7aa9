"""The KVR001 fix on random files: only `@override` lines and one import line are added.

Hypothesis draws a module layout (BOM, `\\n` or `\\r\\n`, a shebang and coding comment, a
docstring, `from __future__`, an existing `from typing_extensions import ...` to merge into,
space or tab indentation, decorators, a non-ASCII string) and a subclass whose methods
override or not. After `--fix`: the result parses, keeps the BOM and line endings, equals
the original once the added lines are taken out, and a second audit finds nothing to fix.
"""

from __future__ import annotations

import ast
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.audit import analyze, apply_fixes


@dataclass(frozen=True)
class Layout:
    bom: bool
    newline: str
    header: bool
    docstring: bool
    future: bool
    merge_into: bool
    indent: str
    decorated: tuple[bool, ...]  # per subclass method: @staticmethod above it or not
    overriding: tuple[bool, ...]  # per subclass method: the base has it or not


layouts = st.builds(
    Layout,
    bom=st.booleans(),
    newline=st.sampled_from(["\n", "\r\n"]),
    header=st.booleans(),
    docstring=st.booleans(),
    future=st.booleans(),
    merge_into=st.booleans(),
    indent=st.sampled_from(["    ", "  ", "\t"]),
    decorated=st.lists(st.booleans(), min_size=1, max_size=4).map(tuple),
    overriding=st.lists(st.booleans(), min_size=4, max_size=4).map(tuple),
)


def render(layout: Layout) -> tuple[bytes, str]:
    """The module's bytes, and the import line the fixer should add ("" when merged)."""
    lines: list[str] = []
    if layout.header:
        lines += ["#!/usr/bin/env python3", "# -*- coding: utf-8 -*-"]
    if layout.docstring:
        lines += ['"""A module with a docstring: ünïcödé."""', ""]
    if layout.future:
        lines += ["from __future__ import annotations", ""]
    if layout.merge_into:
        lines += ["from typing_extensions import Final"]
    lines += ["import os", "", "", "class Base:"]
    names = [f"m{i}" for i in range(len(layout.decorated))]
    for name, overrides in zip(names, layout.overriding, strict=False):
        if overrides:
            lines += [f"{layout.indent}@staticmethod", f"{layout.indent}def {name}() -> str:"]
            lines += [f"{layout.indent}{layout.indent}return os.sep"]
    lines += [f"{layout.indent}pass", "", "", "class Child(Base):"]
    for name, decorated in zip(names, layout.decorated, strict=True):
        if decorated:
            lines.append(f"{layout.indent}@staticmethod")
        lines.append(f"{layout.indent}def {name}() -> str:  # 'é'")
        lines.append(f"{layout.indent}{layout.indent}return 'x'")
    text = layout.newline.join(lines) + layout.newline
    data = text.encode("utf-8")
    added = "" if layout.merge_into else "from typing_extensions import override"
    return (b"\xef\xbb\xbf" + data if layout.bom else data), added


@settings(max_examples=60, deadline=None)
@given(layouts)
def test_fixes_add_only_decorators_and_one_import(layout: Layout) -> None:
    source, added_import = render(layout)
    with tempfile.TemporaryDirectory() as temporary:
        path = Path(temporary) / "module.py"
        path.write_bytes(source)
        findings = analyze([path], root=path.parent).findings
        fixes = [f.fix for f in findings if f.fix is not None]
        fixed = apply_fixes(source, fixes)
        expected = sum(layout.overriding[: len(layout.decorated)])
        assert len(fixes) == expected
        ast.parse(fixed)
        assert fixed.startswith(b"\xef\xbb\xbf") == layout.bom
        text = fixed.decode("utf-8-sig")
        if layout.newline == "\r\n":
            assert "\n" not in text.replace("\r\n", "")
        lines = text.split(layout.newline)
        decorator = f"{layout.indent}@override"
        assert lines.count(decorator) == expected
        stripped = text
        if expected and added_import:
            # A third-party import after the standard library's `import os`: its own section.
            chunk = layout.newline + added_import + layout.newline
            assert stripped.count(chunk) == 1 and f"import os{layout.newline}{chunk}" in stripped
            stripped = stripped.replace(chunk, "", 1)
        stripped = stripped.replace(decorator + layout.newline, "")
        if expected and not added_import:
            stripped = stripped.replace("import Final, override", "import Final")
        assert stripped == source.decode("utf-8-sig")
        path.write_bytes(fixed)
        again = analyze([path], root=path.parent).findings
        assert [f for f in again if f.fix is not None] == []
