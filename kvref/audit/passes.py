"""KVR102's pass counting: how many times a function body consumes each of some names.

A pass is a `for` loop, a comprehension, an `in` test, unpacking, `*x` spreading, `yield
from`, or a call that consumes its argument (`len`, `list`, `sorted`, `sum`, `str.join`,
`list.extend`...). A pass inside a loop body counts twice (once per iteration is enough to
exhaust a generator), an `if`/`match` counts its worst arm, rebinding a name stops following
it, and nested functions and lambdas are not entered (they may run any number of times, or
never).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

__all__ = ["count_passes", "target_names"]


def target_names(target: ast.expr) -> Iterator[str]:
    """The names an assignment target binds (through tuples, lists and starred targets)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from target_names(element)
    elif isinstance(target, ast.Starred):
        yield from target_names(target.value)


_CONSUMING_CALLS = frozenset(
    {
        "all", "any", "dict", "enumerate", "filter", "frozenset", "len", "list", "map", "max",
        "min", "reversed", "set", "sorted", "sum", "tuple", "zip",
    }
)
_CONSUMING_METHODS = frozenset(
    {
        "difference", "extend", "extendleft", "fromkeys", "intersection", "isdisjoint",
        "issubset", "issuperset", "join", "symmetric_difference", "union", "update",
        "writelines",
    }
)


def count_passes(body: Sequence[ast.stmt], names: set[str]) -> dict[str, tuple[int, int]]:
    """The names of `names` that `body` consumes more than once, with the first two lines.

    Args:
        body: a function's statements.
        names: the parameters to follow.

    Returns:
        name -> (line of the first pass, line of the second pass), for each multi-pass name.
    """
    counter = _PassCounter(names)
    try:
        counter.statements(body, False)
    except RecursionError:  # a pathological expression (thousands of chained operators)
        return {}
    return {
        name: (passes[0], passes[1]) for name, passes in counter.passes.items() if len(passes) >= 2
    }


class _PassCounter:
    """Counts consumptions per tracked name in flow order; a branch counts its worst arm.

    Rebinding a name (`values = list(values)`) stops tracking it: from there on it holds
    another object, usually a materialized collection.
    """

    def __init__(self, tracked: set[str]) -> None:
        self.passes: dict[str, list[int]] = {name: [] for name in tracked}
        self.live = set(tracked)

    def consume(self, node: ast.expr, in_loop: bool) -> None:
        if isinstance(node, ast.Name) and node.id in self.live:
            self.passes[node.id].append(node.lineno)
            if in_loop:  # each iteration of the enclosing loop is one more pass
                self.passes[node.id].append(node.lineno)

    def rebind(self, target: ast.expr) -> None:
        self.live.difference_update(target_names(target))

    def statements(self, body: Sequence[ast.stmt], in_loop: bool) -> None:
        for statement in body:
            self.statement(statement, in_loop)

    def statement(self, node: ast.stmt, in_loop: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return
        if isinstance(node, ast.For | ast.AsyncFor):
            self.expression(node.iter, in_loop)
            self.consume(node.iter, in_loop)
            self.rebind(node.target)
            self.statements(node.body, True)
            self.statements(node.orelse, in_loop)
        elif isinstance(node, ast.While):
            self.expression(node.test, True)
            self.statements(node.body, True)
            self.statements(node.orelse, in_loop)
        elif isinstance(node, ast.If):
            self.expression(node.test, in_loop)
            self.branches([node.body, node.orelse], in_loop)
        elif isinstance(node, ast.Match):
            self.expression(node.subject, in_loop)
            self.branches([case.body for case in node.cases], in_loop)
        elif isinstance(node, ast.Assign):
            self.expression(node.value, in_loop)
            if any(isinstance(t, ast.Tuple | ast.List) for t in node.targets):
                self.consume(node.value, in_loop)
            for target in node.targets:
                self.rebind(target)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            if node.value is not None:
                self.expression(node.value, in_loop)
            self.rebind(node.target)
        elif isinstance(node, ast.Try | ast.TryStar):
            self.statements(node.body, in_loop)
            for handler in node.handlers:
                self.statements(handler.body, in_loop)
            self.statements(node.orelse, in_loop)
            self.statements(node.finalbody, in_loop)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                self.expression(item.context_expr, in_loop)
            self.statements(node.body, in_loop)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expression(child, in_loop)

    def branches(self, arms: list[list[ast.stmt]], in_loop: bool) -> None:
        before, live_before = self.passes, self.live
        worst = {name: list(p) for name, p in before.items()}
        live: set[str] = set()
        for arm in arms:
            self.passes = {name: list(p) for name, p in before.items()}
            self.live = set(live_before)
            self.statements(arm, in_loop)
            live |= self.live
            for name, passes in self.passes.items():
                if len(passes) > len(worst[name]):
                    worst[name] = passes
        if len(arms) < 2 or not arms[-1]:  # an `if` without `else` may run no arm at all
            live |= live_before
        self.passes, self.live = worst, live

    def expression(self, node: ast.expr, in_loop: bool) -> None:
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Call):
            callee = node.func
            if (isinstance(callee, ast.Name) and callee.id in _CONSUMING_CALLS) or (
                isinstance(callee, ast.Attribute) and callee.attr in _CONSUMING_METHODS
            ):
                for argument in node.args:
                    self.consume(argument, in_loop)
        elif isinstance(node, ast.Compare):
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, ast.In | ast.NotIn):
                    self.consume(comparator, in_loop)
        elif isinstance(node, ast.Starred | ast.YieldFrom):
            self.consume(node.value, in_loop)
        elif isinstance(node, ast.NamedExpr):
            self.expression(node.value, in_loop)
            self.rebind(node.target)
            return
        elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            for index, generator in enumerate(node.generators):
                inner = in_loop or index > 0
                self.expression(generator.iter, inner)
                self.consume(generator.iter, inner)
                for condition in generator.ifs:
                    self.expression(condition, True)
            elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for element in elements:
                self.expression(element, True)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expression(child, in_loop)
