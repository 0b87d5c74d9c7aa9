"""The names an assignment binds, which the summary records as module and class bindings and
KVR102's pass counting (`passes.py`) stops following once they are rebound."""

from __future__ import annotations

import ast
from collections.abc import Iterator

__all__ = ["target_names"]


def target_names(target: ast.expr) -> Iterator[str]:
    """The names an assignment target binds (through tuples, lists and starred targets)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from target_names(element)
    elif isinstance(target, ast.Starred):
        yield from target_names(target.value)
