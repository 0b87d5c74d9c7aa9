"""Import facts: what a module imports, for resolving names and for the fixer's import edits."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import cast

from kvref.audit.source import TYPING_ALIASES, TYPING_MODULES, line_char_col
from kvref.audit.summarise.records import ImportFacts

__all__ = ["OVERRIDE_MODULES", "canonical_type_name", "dotted_name", "import_facts"]

OVERRIDE_MODULES = TYPING_MODULES


def canonical_type_name(dotted: str) -> str:
    """Map typing spellings to the runtime classes: `typing.List` -> `builtins.list`."""
    module, _, name = dotted.rpartition(".")
    if module in OVERRIDE_MODULES:
        return TYPING_ALIASES.get(name) or f"typing.{name}"
    if module == "collections.abc" and name == "AbstractSet":
        return "collections.abc.Set"
    return dotted


def dotted_name(node: ast.expr) -> str:
    """`a.b.c` for a Name/Attribute chain, the callee of a call, the value of `X[T]`."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return ".".join(reversed(parts))
        elif isinstance(node, ast.Call | ast.Subscript) and not parts:
            node = node.func if isinstance(node, ast.Call) else node.value
        else:
            return ""


def import_facts(tree: ast.Module, lines: Sequence[str], *, with_block: bool = True) -> ImportFacts:
    """Find where imports go, the leading import block and any `override` binding (top level).

    Args:
        tree: the parsed module.
        lines: its source lines (from `split_lines`), to turn byte columns into characters.
        with_block: describe the import block (only fixes in classes use it: a module
            without classes skips the work and the bytes in its cached summary).
    """
    body = tree.body
    insert_line = 1
    index = 0
    if body and _is_docstring(body[0]):
        insert_line = (body[0].end_lineno or body[0].lineno) + 1
        index = 1
    while index < len(body):
        statement = body[index]
        if not (isinstance(statement, ast.ImportFrom) and statement.module == "__future__"):
            break
        insert_line = (statement.end_lineno or statement.lineno) + 1
        index += 1
    if index == 0 and body:
        first = body[0]
        decorators: list[ast.expr] = getattr(first, "decorator_list", [])
        insert_line = min([first.lineno, *(d.lineno for d in decorators)])
    elif index == 0:
        insert_line = len(lines) + 1  # an empty module: append
    start = position = 1 if body and _is_docstring(body[0]) else 0
    while with_block and position < len(body) and isinstance(body[position], ast.Import | ast.ImportFrom):
        position += 1
    block = "\n".join(
        _encode_import(cast("ast.Import | ast.ImportFrom", statement), lines) for statement in body[start:position]
    )
    if position < len(body):
        following = body[position]
        decorators = cast("list[ast.expr]", getattr(following, "decorator_list", []))
        next_line = min([following.lineno, *(d.lineno for d in decorators)])
        definition = isinstance(following, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    else:
        next_line, definition = len(lines) + 1, False
    return ImportFacts(insert_line, block, next_line, definition)


def _encode_import(statement: ast.Import | ast.ImportFrom, lines: Sequence[str]) -> str:
    """One line of `ImportFacts.block`."""
    end_line = statement.end_lineno or statement.lineno
    head = f"{statement.lineno}\t{end_line}\t{line_char_col(lines, end_line, statement.end_col_offset or 0)}"
    if isinstance(statement, ast.Import):
        return f"{head}\t{statement.names[0].name}\t\t"
    module = "." * statement.level + (statement.module or "")
    names = ",".join(f"{a.name} as {a.asname}" if a.asname else a.name for a in statement.names)
    positions = ""
    if any("#" in lines[n - 1] for n in range(statement.lineno, min(end_line, len(lines)) + 1)):
        positions = ",".join(
            str(value)
            for a in statement.names
            for value in (
                a.lineno,
                line_char_col(lines, a.lineno, a.col_offset),
                a.end_lineno or a.lineno,
                line_char_col(lines, a.end_lineno or a.lineno, a.end_col_offset or 0),
            )
        )
    return f"{head}\t{module}\t{names}\t{positions}"


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )
