"""The names an assignment binds, which the summary records as module and class bindings and
KVR102's pass counting (`passes.py`) stops following once they are rebound; and the instance
attributes methods declare by assigning `self.name`, members of the class to a type checker."""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterator, Sequence

__all__ = ["instance_assignments", "instance_attributes", "target_names"]

# `self.name = ...`, `self.name: T = ...` or `self.name: T` starting a line (inside a method).
_SELF_ASSIGNMENT = re.compile(r"^[ \t]+self\.([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?(?:=(?!=)|$)", re.MULTILINE)


def instance_assignments(text: str) -> tuple[list[int], list[str]]:
    """(lines, names) of every line that assigns or declares `self.name`, in line order.

    A pattern over the text rather than a walk of every method body: a cold run summarises
    every file, and function bodies are otherwise not walked at all.
    """
    lines: list[int] = []
    names: list[str] = []
    if "self." not in text:
        return lines, names
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    line, position = 1, 0
    for match in _SELF_ASSIGNMENT.finditer(text):
        line += text.count("\n", position, match.start())
        position = match.start()
        lines.append(line)
        names.append(match.group(1))
    return lines, names


def instance_attributes(
    assignments: tuple[list[int], list[str]], methods: Sequence[ast.FunctionDef | ast.AsyncFunctionDef]
) -> tuple[str, ...]:
    """The names `methods` assign on `self` (their lines are in the methods' ranges)."""
    lines, names = assignments
    found: dict[str, None] = {}
    for method in methods:
        start = bisect.bisect_left(lines, method.lineno)
        end = bisect.bisect_right(lines, method.end_lineno or method.lineno)
        for index in range(start, end):
            found[names[index]] = None
    return tuple(found)


def target_names(target: ast.expr) -> Iterator[str]:
    """The names an assignment target binds (through tuples, lists and starred targets)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from target_names(element)
    elif isinstance(target, ast.Starred):
        yield from target_names(target.value)
