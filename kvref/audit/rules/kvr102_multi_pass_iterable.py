"""KVR102 multi-pass-iterable: an `Iterable`/`Iterator` parameter consumed more than once."""

from __future__ import annotations

from collections.abc import Iterator

from typing_extensions import override

from kvref.audit.rules.context import ModuleContext, param_symbol
from kvref.audit.model import Finding
from kvref.audit.rules.base import Rule
from kvref.audit.summarise.records import FunctionSummary, MultiPass

__all__ = ["MultiPassIterable"]


class MultiPassIterable(Rule):
    """Reports a parameter annotated `Iterable[...]`/`Iterator[...]` that the body consumes twice.

    What it does:
        Counts the passes a function makes over such a parameter: `for` loops,
        comprehensions, `in` tests, unpacking, `*args` spreading, `yield from`, and calls that
        consume their argument (`len`, `list`, `tuple`, `set`, `sorted`, `sum`, `any`, `all`,
        `min`, `max`, `zip`, `str.join`, `list.extend`, `set.update`...). A pass inside a loop
        body counts as several. Only passes on one path through the body add up: the arms
        of an `if`/`else`, a conditional expression or a `match` exclude each other, a
        `return`/`raise`/`break`/`continue` ends its path, and an `except` handler starts
        from the state before its `try`. Rebinding the name stops following it; nested
        functions are not followed. Methods of a class with a base that cannot be resolved
        are skipped, as by every rule.

    Why is this bad?
        The annotation promises that any iterable will do, but a generator or an iterator is
        exhausted after the first pass: the second loop silently sees nothing and the result
        is wrong, with no error.

    Example:
        def total_and_count(values: Iterable[int]) -> tuple[int, int]:
            return sum(values), len(list(values))

    Use instead:
        def total_and_count(values: Collection[int]) -> tuple[int, int]:
            return sum(values), len(values)

    Fix safety:
        No fix: widening the callers' obligation to `Collection` (or materializing the
        iterable once with `list(...)`) is a design decision for the author.
    """

    code = "KVR102"
    reads_parameters = True
    name = "multi-pass-iterable"
    summary = "Reports a parameter annotated `Iterable[...]`/`Iterator[...]` that the body consumes twice."
    message = (
        'Parameter "{param}" of "{function}" is annotated "{annotation}" but consumed more '
        "than once ({where}); a generator is empty on the second pass: annotate it Collection"
    )
    where_lines = "lines {first} and {second}"
    where_same_line = "twice on line {first}"
    where_loop = "on line {first}, again on each iteration of the loop on line {loop}"
    where_loop_here = "on line {first}, once per iteration of the loop there"

    @override
    def check(self, context: ModuleContext) -> Iterator[Finding]:
        functions: list[FunctionSummary] = list(context.summary.functions)
        for cls in context.classes:  # like every rule, silent on classes with unknown bases
            if cls.info.summary is not None:
                functions.extend(cls.info.summary.methods)
        for function in functions:
            if not function.multi_pass:  # nearly all: no parameters to look at
                continue
            params = {p.name: p for p in function.params}
            for fact in function.multi_pass:
                param = params[fact.param]
                yield self.report(
                    context,
                    param.span,
                    param_symbol(function, param.name),
                    param=param.name,
                    function=function.qualname,
                    annotation=fact.annotation,
                    where=self._where(fact),
                )

    def _where(self, fact: MultiPass) -> str:
        """Where the two passes are, without naming one line twice."""
        if fact.loop_line and fact.loop_line == fact.first_line:
            template = self.where_loop_here
        elif fact.loop_line:
            template = self.where_loop
        elif fact.first_line == fact.second_line:
            template = self.where_same_line
        else:
            template = self.where_lines
        return template.format(first=fact.first_line, second=fact.second_line, loop=fact.loop_line)
