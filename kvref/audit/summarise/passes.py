"""KVR102's analysis: how many times one run of a function consumes each Iterable parameter.

It runs while a file is summarised, since the summary keeps no `ast`, so it lives in the
summariser's layer, below the rule: `freeze.py` calls `multi_pass_facts` for each function with
an `Iterable`/`Iterator` annotation and stores the `MultiPass` facts it returns, which
`kvref.audit.rules.kvr102_multi_pass_iterable` reports.

A pass is a `for` loop, a comprehension, an `in` test, unpacking, `*x` spreading, `yield
from`, or a call that consumes its argument (`len`, `list`, `sorted`, `sum`, `str.join`,
`list.extend`...). A name is reported when some path through the body consumes it twice.

Paths are followed the way the code runs: the arms of an `if`/`else`, of a conditional
expression and the cases of a `match` exclude each other; a `return`, `raise`, `break` or
`continue` ends its path (`if cached: return list(xs)` then `for x in xs:` is one pass on
either path); a loop body runs zero, one or two times (two are enough to exhaust a generator,
so a pass inside a loop counts twice unless its path leaves the loop); an `except` handler
starts from the state before its `try` (the exception usually came from the pass being made).
Rebinding a name stops following it on that path, and nested functions, lambdas and classes
are not entered (they may run any number of times, or never).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from kvref.audit.summarise.assignments import target_names
from kvref.audit.summarise.records import MultiPass, ParamRow

__all__ = ["Pass", "count_passes", "multi_pass_facts"]

_ITERATION_HEADS = frozenset({"collections.abc.Iterable", "collections.abc.Iterator"})


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
_MAX_LOOP_DEPTH: Final = 6
"""Loops nested deeper than this run their body once here: each level walks its body twice,
and a pathological nesting must not cost 2**depth walks."""


@dataclass(frozen=True, slots=True)
class Pass:
    """One consumption of a name: where, and whether it is an earlier one again.

    Attributes:
        line, col: the consuming expression (1-based line, 0-based UTF-8 byte column).
        loop_line: nonzero when this is the same expression consumed again on a later
            iteration of the loop (or comprehension) starting at that line.
    """

    line: int
    col: int
    loop_line: int = 0


_Passes = dict[str, tuple[Pass, ...]]


@dataclass(frozen=True, slots=True)
class _State:
    """One path's facts so far: the passes (at most two kept) of each tracked name still
    bound to its parameter on this path. Never changed once built: paths share them freely."""

    passes: _Passes


@dataclass(slots=True)
class _Loop:
    """The paths that left a loop body early: by `break` (past the loop) or `continue`."""

    breaks: list[_State] = field(default_factory=lambda: [])
    continues: list[_State] = field(default_factory=lambda: [])


def count_passes(body: Sequence[ast.stmt], names: set[str]) -> dict[str, tuple[Pass, Pass]]:
    """The names of `names` that some path through `body` consumes twice, with those passes.

    Args:
        body: a function's statements.
        names: the parameters to follow.

    Returns:
        name -> (first pass, second pass) on the path with the most passes, for each
        multi-pass name.
    """
    counter = _PassCounter(names)
    try:
        counter.statements(body)
        counter.finish_path()
    except RecursionError:  # a pathological expression (thousands of chained operators)
        return {}
    return {
        name: (passes[0], passes[1])
        for name, passes in counter.worst.items()
        if len(passes) >= 2
    }


def multi_pass_facts(
    node: ast.FunctionDef | ast.AsyncFunctionDef, params: Sequence[ParamRow]
) -> tuple[MultiPass, ...]:
    """The parameters annotated `Iterable`/`Iterator` (not `*args`/`**kwargs`) that some path
    through the function's body consumes twice."""
    tracked = {
        name: annotation.text
        for name, kind, _, _, annotation, _ in params
        if annotation is not None
        and annotation.head in _ITERATION_HEADS
        and kind not in ("vararg", "kwarg")
    }
    if not tracked:
        return ()
    return tuple(
        MultiPass(name, tracked[name], first.line, second.line, second.loop_line)
        for name, (first, second) in count_passes(node.body, set(tracked)).items()
    )


def _merge(states: Sequence[_State | None]) -> _State | None:
    """The paths joined: per name, the worst of the paths on which it is still the parameter
    (a path that rebound it has handed its passes to `_PassCounter.worst` already)."""
    reachable = [state for state in states if state is not None]
    if not reachable:
        return None
    if len(reachable) == 1:
        return reachable[0]
    passes: _Passes = dict(reachable[0].passes)
    for state in reachable[1:]:
        for name, found in state.passes.items():
            if name not in passes or len(found) > len(passes[name]):
                passes[name] = found
    return _State(passes)


class _PassCounter:
    """Walks a body with the current path's `_State` (None past a `return`: unreachable)."""

    def __init__(self, tracked: set[str]) -> None:
        self.state: _State | None = _State({name: () for name in tracked})
        self.worst: _Passes = {name: () for name in tracked}
        self.loops: list[_Loop] = []
        # The line of the innermost loop walked for its second iteration (0: none), and how
        # many loops enclose the statement being walked.
        self.repeating = 0
        self.depth = 0

    # --- paths ----------------------------------------------------------------------------

    def finish_path(self) -> None:
        """The current path leaves the function: keep its passes if they are the worst."""
        state = self.state
        if state is not None:
            for name, found in state.passes.items():
                self._keep(name, found)
        self.state = None

    def _keep(self, name: str, found: tuple[Pass, ...]) -> None:
        if len(found) > len(self.worst[name]):
            self.worst[name] = found

    def consume(self, node: ast.expr) -> None:
        state = self.state
        if state is None or not isinstance(node, ast.Name):
            return
        found = state.passes.get(node.id)
        if found is not None and len(found) < 2:  # two passes decide; more only cost copies
            now = Pass(node.lineno, node.col_offset, self.repeating)
            self.state = _State({**state.passes, node.id: (*found, now)})

    def rebind(self, target: ast.expr) -> None:
        state = self.state
        if state is not None:
            bound = [name for name in target_names(target) if name in state.passes]
            if bound:
                # From here on this path's name holds another object: its passes are final.
                for name in bound:
                    self._keep(name, state.passes[name])
                passes = dict(state.passes)
                for name in bound:
                    del passes[name]
                self.state = _State(passes)

    # --- statements -----------------------------------------------------------------------

    def statements(self, body: Sequence[ast.stmt]) -> None:
        for statement in body:
            if self.state is None:
                return  # the rest of the block is unreachable
            self.statement(statement)

    def statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return
        if isinstance(node, ast.Return):
            if node.value is not None:
                self.expression(node.value)
            self.finish_path()
        elif isinstance(node, ast.Raise):
            if node.exc is not None:
                self.expression(node.exc)
            self.finish_path()
        elif isinstance(node, ast.Break | ast.Continue):
            if self.loops and self.state is not None:
                loop = self.loops[-1]
                (loop.breaks if isinstance(node, ast.Break) else loop.continues).append(self.state)
            self.state = None
        elif isinstance(node, ast.For | ast.AsyncFor):
            self.expression(node.iter)
            self.consume(node.iter)
            self.loop(node, node.body, node.orelse, None, node.target)
        elif isinstance(node, ast.While):
            self.loop(node, node.body, node.orelse, node.test, None)
        elif isinstance(node, ast.If):
            self.expression(node.test)
            self.branches([node.body, node.orelse])
        elif isinstance(node, ast.Match):
            self.match(node)
        elif isinstance(node, ast.Try | ast.TryStar):
            self.try_statement(node)
        elif isinstance(node, ast.Assign):
            self.expression(node.value)
            if any(isinstance(t, ast.Tuple | ast.List) for t in node.targets):
                self.consume(node.value)  # unpacking
            for target in node.targets:
                self.rebind(target)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            if node.value is not None:
                self.expression(node.value)
            self.rebind(node.target)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                self.rebind(target)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                self.expression(item.context_expr)
            self.statements(node.body)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expression(child)

    def branches(self, arms: Sequence[Sequence[ast.stmt]]) -> None:
        """Arms that exclude each other, each from the current state (an empty arm: none ran)."""
        start = self.state
        ends: list[_State | None] = []
        for arm in arms:
            self.state = start
            self.statements(arm)
            ends.append(self.state)
        self.state = _merge(ends)

    def match(self, node: ast.Match) -> None:
        self.expression(node.subject)
        start = self.state
        ends: list[_State | None] = []
        exhaustive = False
        for case in node.cases:
            self.state = start
            if case.guard is not None:
                self.expression(case.guard)
            self.statements(case.body)
            ends.append(self.state)
            pattern = case.pattern
            if case.guard is None and isinstance(pattern, ast.MatchAs) and pattern.pattern is None:
                exhaustive = True  # `case _:` or `case name:` matches anything
        if not exhaustive:
            ends.append(start)  # no case matched
        self.state = _merge(ends)

    def try_statement(self, node: ast.Try | ast.TryStar) -> None:
        start = self.state
        self.statements(node.body)
        self.statements(node.orelse)
        ends: list[_State | None] = [self.state]
        for handler in node.handlers:
            self.state = start
            self.statements(handler.body)
            ends.append(self.state)
        self.state = _merge(ends)
        if node.finalbody:
            self.statements(node.finalbody)

    def loop(
        self,
        node: ast.For | ast.AsyncFor | ast.While,
        body: Sequence[ast.stmt],
        orelse: Sequence[ast.stmt],
        test: ast.expr | None,
        target: ast.expr | None,
    ) -> None:
        """A loop's body runs zero, one or two times; `test` is a `while` loop's condition."""
        forever = test is not None and isinstance(test, ast.Constant) and bool(test.value)
        exits: list[_State | None] = []  # paths that end the loop normally (then `else:`)
        breaks: list[_State] = []
        outer_repeating = self.repeating
        self.depth += 1
        try:
            for _ in range(2 if self.depth <= _MAX_LOOP_DEPTH else 1):
                start = self.state
                if test is not None:
                    self.expression(test)
                if not forever:
                    exits.append(self.state)
                if target is not None:
                    self.rebind(target)
                loop = _Loop()
                self.loops.append(loop)
                self.statements(body)
                self.loops.pop()
                breaks.extend(loop.breaks)
                self.state = _merge([self.state, *loop.continues])
                self.repeating = node.lineno
                if self.state is None or self.state == start:
                    break  # nothing consumed: another iteration would consume nothing either
            if test is not None:
                self.expression(test)  # the test that ends the loop
            if not forever:
                exits.append(self.state)
        finally:
            self.depth -= 1
            self.repeating = outer_repeating
        self.state = _merge(exits)
        self.statements(orelse)
        self.state = _merge([self.state, *breaks])

    # --- expressions ----------------------------------------------------------------------

    def expression(self, node: ast.expr) -> None:
        if self.state is None or isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Call):
            callee = node.func
            self.expression(callee)
            for argument in node.args:
                self.expression(argument)
            for keyword in node.keywords:
                self.expression(keyword.value)
            if (isinstance(callee, ast.Name) and callee.id in _CONSUMING_CALLS) or (
                isinstance(callee, ast.Attribute) and callee.attr in _CONSUMING_METHODS
            ):
                for argument in node.args:
                    self.consume(argument)
            return
        if isinstance(node, ast.Compare):
            self.expression(node.left)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                self.expression(comparator)
                if isinstance(op, ast.In | ast.NotIn):
                    self.consume(comparator)
            return
        if isinstance(node, ast.Starred | ast.YieldFrom):
            self.expression(node.value)
            self.consume(node.value)
            return
        if isinstance(node, ast.NamedExpr):
            self.expression(node.value)
            self.rebind(node.target)
            return
        if isinstance(node, ast.IfExp):
            self.expression(node.test)
            start = self.state
            self.expression(node.body)
            then_state = self.state
            self.state = start
            self.expression(node.orelse)
            self.state = _merge([then_state, self.state])
            return
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            self.comprehension(node)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expression(child)

    def comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        """The first iterable is consumed once; the rest runs once per element (twice here)."""
        first = node.generators[0]
        self.expression(first.iter)
        self.consume(first.iter)
        outer_repeating = self.repeating
        self.depth += 1
        try:
            for _ in range(2 if self.depth <= _MAX_LOOP_DEPTH else 1):
                start = self.state
                for index, generator in enumerate(node.generators):
                    if index > 0:
                        self.expression(generator.iter)
                        self.consume(generator.iter)
                    for condition in generator.ifs:
                        self.expression(condition)
                if isinstance(node, ast.DictComp):
                    self.expression(node.key)
                    self.expression(node.value)
                else:
                    self.expression(node.elt)
                self.repeating = node.lineno
                if self.state == start:
                    break  # nothing consumed per element
        finally:
            self.depth -= 1
            self.repeating = outer_repeating
