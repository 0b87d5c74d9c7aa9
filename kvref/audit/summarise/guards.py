"""Guards: the conditions under which the type checkers analyse a branch, kept as short strings.

pyright, mypy and ty evaluate a few conditions statically and never analyse a branch they find
false: `TYPE_CHECKING` (always true to them), `sys.version_info` compared with a tuple (against
the configured Python version) and `sys.platform` compared with a string or tested with
`startswith` (against the configured platform). kvref records, for every class, method and
class attribute and for every module-level binding made under such a condition, the
conjunction of the conditions that lead to it (its guard); the version and platform are those of
the project being audited, known only when it is indexed, so the summary keeps the condition
and `kvref.audit.resolve.reachability` decides it then. A summary thereby stays valid for every
project that shares the file (the standard library's stubs, a cached summary).

A guard is "" (always analysed), `NEVER` (never: the `else` of `if TYPE_CHECKING:`), or a
disjunction (`|`) of conjunctions (`&`) of atoms: `V>=3.12` (a version, compared as (major,
minor)), `P==win32`, `P!=win32`, `P^=linux` (starts with), `P!^=linux`. A condition kvref does
not understand guards nothing, as the checkers analyse both branches of such a test too.
"""

from __future__ import annotations

import ast
from typing import Final

__all__ = ["NEVER", "branch_guards", "either_guard", "join_guards", "negate_guard"]

NEVER: Final = "!"
"""The guard of a branch the checkers never analyse, whatever the version or platform."""

_COMPARISONS: Final[dict[type[ast.cmpop], str]] = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
}
_NEGATED: Final = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "==", "^=": "!^=", "!^=": "^="}


_Clauses = tuple[tuple[str, ...], ...]
"""A guard in disjunctive normal form: () is never, ((),) always."""

_ALWAYS: _Clauses = ((),)
_MAX_CLAUSES = 8  # a condition kvref would need more for guards nothing (always analysed)


def _parse(guard: str) -> _Clauses:
    if not guard:
        return _ALWAYS
    if guard == NEVER:
        return ()
    return tuple(tuple(clause.split("&")) for clause in guard.split("|"))


def _render(clauses: _Clauses) -> str:
    if not clauses:
        return NEVER
    if any(not clause for clause in clauses) or len(clauses) > _MAX_CLAUSES:
        return ""
    return "|".join("&".join(clause) for clause in dict.fromkeys(clauses))


def _both(left: _Clauses, right: _Clauses) -> _Clauses:
    return tuple(tuple(dict.fromkeys((*a, *b))) for a in left for b in right)


def join_guards(outer: str, inner: str) -> str:
    """The guard of a branch `inner` nested in one guarded by `outer` (both must hold)."""
    if not outer or not inner:
        return outer or inner
    return _render(_both(_parse(outer), _parse(inner)))


def either_guard(left: str, right: str) -> str:
    """The guard of code reached when either guard holds."""
    if not left or not right:
        return ""
    return _render((*_parse(left), *_parse(right)))


def negate_guard(guard: str) -> str:
    """The guard of the `else` branch of a test whose body has `guard`."""
    result: _Clauses = _ALWAYS
    for clause in _parse(guard):
        negated = tuple((_negate(atom),) for atom in clause)
        if any(not atom for (atom,) in negated):
            return ""
        result = _both(result, negated)
        if len(result) > _MAX_CLAUSES:
            return ""
    return _render(result)


def branch_guards(test: ast.expr) -> tuple[str, str] | None:
    """(the `if` body's guard, the `else` branch's guard) of a condition the checkers
    evaluate, or None for any other condition."""
    guards = _condition(test)
    return None if guards == ("", "") else guards


def _condition(test: ast.expr) -> tuple[str, str]:
    """(where `test` may be true, where it may be false) to the checkers: a part they cannot
    evaluate may be either, so `not TYPE_CHECKING and anything` is never true."""
    atom = _atom(test)
    if atom is not None:
        return atom, negate_guard(atom)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        true, false = _condition(test.operand)
        return false, true
    if isinstance(test, ast.BoolOp):
        true, false = _condition(test.values[0])
        for value in test.values[1:]:
            more_true, more_false = _condition(value)
            if isinstance(test.op, ast.And):
                true, false = join_guards(true, more_true), either_guard(false, more_false)
            else:
                true, false = either_guard(true, more_true), join_guards(false, more_false)
        return true, false
    return "", ""


def _negate(atom: str) -> str:
    kind, rest = atom[0], atom[1:]
    for operator in ("!^=", "^=", "<=", ">=", "==", "!=", "<", ">"):
        if rest.startswith(operator):
            return f"{kind}{_NEGATED[operator]}{rest[len(operator):]}"
    return ""


def _atom(test: ast.expr) -> str | None:
    """One condition: `TYPE_CHECKING`, a `sys.version_info` or `sys.platform` comparison."""
    if _is_type_checking(test):
        return ""  # always true: the body is always analysed, its `else` never
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, operator, right = test.left, _COMPARISONS.get(type(test.ops[0])), test.comparators[0]
        if operator is None:
            return None
        if _is_sys(left, "version_info") or _is_version_slice(left):
            version = _version(right)
            return None if version is None else f"V{operator}{version}"
        if _is_sys(left, "platform") and operator in ("==", "!=") and isinstance(right, ast.Constant):
            value = right.value
            return f"P{operator}{value}" if isinstance(value, str) and "&" not in value else None
        return None
    if (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Attribute)
        and test.func.attr == "startswith"
        and _is_sys(test.func.value, "platform")
        and len(test.args) == 1
        and not test.keywords
        and isinstance(test.args[0], ast.Constant)
        and isinstance(test.args[0].value, str)
        and "&" not in test.args[0].value
    ):
        return f"P^={test.args[0].value}"
    return None


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING" and isinstance(test.value, ast.Name)


def _is_sys(node: ast.expr, attribute: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attribute
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _is_version_slice(node: ast.expr) -> bool:
    """`sys.version_info[:2]` (compared the same as the whole tuple)."""
    return (
        isinstance(node, ast.Subscript)
        and _is_sys(node.value, "version_info")
        and isinstance(node.slice, ast.Slice)
        and node.slice.lower is None
        and node.slice.step is None
        and isinstance(node.slice.upper, ast.Constant)
        and node.slice.upper.value == 2
    )


def _version(node: ast.expr) -> str | None:
    """`(3, 12)` as "3.12"; a third element only when it is 0 (a micro version kvref cannot
    compare with a floor that has none)."""
    if not isinstance(node, ast.Tuple) or not 1 <= len(node.elts) <= 3:
        return None
    parts: list[int] = []
    for element in node.elts:
        if not isinstance(element, ast.Constant) or type(element.value) is not int:
            return None
        parts.append(element.value)
    if len(parts) == 3:
        if parts[2] != 0:
            return None
        parts = parts[:2]
    return ".".join(str(part) for part in parts)
