"""Engine behaviours found by comparing KVR001 with pyright, mypy and ty on vLLM.

Each case is one the three checkers agree on (see `tools/compare_checkers.py`, BENCHMARKS.md).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from kvref.audit.pipeline import analyze


def audit(tmp_path: Path, files: dict[str, str]) -> set[tuple[str, int, str]]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    result = analyze(sorted(tmp_path.rglob("*.py")), root=tmp_path)
    return {(f.path, f.line, f.code) for f in result.findings if f.code in ("KVR001", "KVR002")}


def test_uninstalled_base_still_checked_against_known_bases(tmp_path: Path) -> None:
    found = audit(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/base.py": """
                import torch.nn as nn

                class Layer(nn.Module):
                    def slice(self) -> None: ...
            """,
            "pkg/lora.py": """
                import uninstalled
                from typing_extensions import override
                from pkg.base import Layer

                class LoRA(Layer):
                    def slice(self) -> None: ...

                    def forward(self) -> None: ...

                    def __repr__(self) -> str: ...

                class Mixed(uninstalled.Base, Layer):
                    def slice(self) -> None: ...

                    @override
                    def maybe_in_uninstalled(self) -> None: ...
            """,
        },
    )
    # slice overrides Layer.slice and __repr__ overrides object's whatever nn.Module holds;
    # forward may override nn.Module.forward, which nobody can see: no finding, as pyright,
    # mypy and ty decide without torch. An @override the unknown base may justify is not
    # stale either.
    assert found == {
        ("pkg/lora.py", 6, "KVR001"),
        ("pkg/lora.py", 10, "KVR001"),
        ("pkg/lora.py", 13, "KVR001"),
    }


def test_classes_defined_in_functions_are_checked(tmp_path: Path) -> None:
    found = audit(
        tmp_path,
        {
            "m.py": """
                class Base:
                    def run(self) -> None: ...

                def factory():
                    class Local(Base):
                        def run(self) -> None: ...

                        def __reduce__(self):
                            return (Local, ())

                    if True:
                        class Sibling(Local):
                            def run(self) -> None: ...
                    return Local

                class Outer:
                    def method(self):
                        class InMethod(Base):
                            def run(self) -> None: ...
                        return InMethod
            """,
        },
    )
    assert found == {
        ("m.py", 6, "KVR001"),
        ("m.py", 8, "KVR001"),
        ("m.py", 13, "KVR001"),
        ("m.py", 19, "KVR001"),
    }


def test_rich_comparisons_other_than_eq_override_nothing(tmp_path: Path) -> None:
    # typeshed's object declares __eq__ and __ne__ only; the slot wrappers for __lt__ and
    # friends exist at runtime but no type checker counts them.
    found = audit(
        tmp_path,
        {
            "m.py": """
                class Ordered:
                    def __lt__(self, other: object) -> bool: ...

                    def __ge__(self, other: object) -> bool: ...

                    def __eq__(self, other: object) -> bool: ...
            """,
        },
    )
    assert found == {("m.py", 6, "KVR001")}


def test_class_python_refuses_gets_no_finding(tmp_path: Path) -> None:
    found = audit(
        tmp_path,
        {
            "m.py": """
                class Top:
                    def area(self) -> float: ...

                class Left(Top): ...

                class Bad(Top, Left):
                    def area(self) -> float: ...
            """,
        },
    )
    assert found == set()
