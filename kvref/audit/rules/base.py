"""The rule base class: what every rule declares (as data) and how it reports a finding."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from kvref.audit.catalogue import FixSafety
from kvref.audit.model import Finding, Fix

if TYPE_CHECKING:
    from kvref.audit.rules.context import ModuleContext
    from kvref.audit.summarise.records import Span

__all__ = ["Rule"]


class Rule(abc.ABC):
    """One check over a module (with the whole project indexed behind it).

    A rule declares its `code`, the `name` of the pattern it reports (reads as "allow
    missing-override"), a one-sentence `summary`, a message template (formatted with
    `str.format`), whether it is on by default and how safe its fix is; its docstring (printed
    by `kvref explain`) has the sections `What it does`, `Why is this bad?`, `Example`,
    `Use instead` and `Fix safety`, and opens with the summary.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    message: ClassVar[str]
    default_enabled: ClassVar[bool] = True
    fix_safety: ClassVar[FixSafety] = FixSafety.NONE
    fix_title: ClassVar[str] = ""
    """What a fix does, in the imperative ("Add @override"); empty for rules without one."""
    unsafe_fix_reason: ClassVar[str] = ""
    """Why the rule's fixes are unsafe, one clause (its `Fix.unsafe_reason`); empty where they
    are safe, or where each fix says why (KVR001's depend on the project's declarations)."""
    reads_parameters: ClassVar[bool] = False
    """Whether the rule reads functions' parameters (their kinds, annotations and KVR102's
    facts): a run none of whose rules does may summarise modules without them."""

    @property
    def fixable(self) -> bool:
        """Whether the rule offers a fix (safe or unsafe)."""
        return self.fix_safety is not FixSafety.NONE

    @abc.abstractmethod
    def check(self, context: ModuleContext) -> Iterator[Finding]:
        """Yield this rule's findings in one module.

        Args:
            context: the module, its resolved classes and the project index.

        Returns:
            The findings, in any order (the engine sorts them).
        """

    def report(
        self,
        context: ModuleContext,
        span: Span,
        symbol: str,
        fix: Fix | None = None,
        **fields: object,
    ) -> Finding:
        """A finding of this rule at a 0-based-column span, its message filled from `fields`."""
        return Finding(
            path=context.path,
            line=span.line,
            col=span.col + 1,
            end_line=span.end_line,
            end_col=span.end_col + 1,
            code=self.code,
            message=self.message.format(**fields),
            symbol=symbol,
            fix=fix,
        )
