"""The audit rules: one module per rule, registered here in code order.

A rule is a small class: its `code`, the `name` of the pattern it reports (reads as "allow
missing-override"), a message template (data, formatted with `str.format`), whether it is on
by default and whether it offers fixes, and a docstring with the sections `What it does`,
`Why is this bad?`, `Example`, `Use instead` and `Fix safety` (printed by `kvref explain`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import ClassVar

from kvref.audit.rules.context import ModuleContext, make_finding
from kvref.audit.model import Finding, Fix
from kvref.audit.summarise.summary import Span

__all__ = ["ALL_RULES", "Rule", "get_rule"]


class Rule(abc.ABC):
    """One check over a module (with the whole project indexed behind it)."""

    code: ClassVar[str]
    name: ClassVar[str]
    message: ClassVar[str]
    default_enabled: ClassVar[bool] = True
    fixable: ClassVar[bool] = False
    fix_title: ClassVar[str] = ""
    """What a fix does, in the imperative ("Add @override"); empty for rules without one."""

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
        """A finding of this rule with its message template filled from `fields`."""
        return make_finding(
            context.path, self.code, self.message.format(**fields), span, symbol, fix
        )


# The rule modules import `Rule` from this package, so they are imported after it exists.
from kvref.audit.rules.kvr001_missing_override import MissingOverride  # noqa: E402
from kvref.audit.rules.kvr002_stale_override import StaleOverride  # noqa: E402
from kvref.audit.rules.kvr101_narrowed_collection_parameter import (  # noqa: E402
    NarrowedCollectionParameter,
)
from kvref.audit.rules.kvr102_multi_pass_iterable import MultiPassIterable  # noqa: E402
from kvref.audit.rules.kvr103_override_annotation_drift import (  # noqa: E402
    OverrideAnnotationDrift,
)

ALL_RULES: tuple[Rule, ...] = (
    MissingOverride(),
    StaleOverride(),
    NarrowedCollectionParameter(),
    MultiPassIterable(),
    OverrideAnnotationDrift(),
)
_BY_CODE = {rule.code: rule for rule in ALL_RULES}


def get_rule(code: str) -> Rule:
    """The rule with a code (e.g. "KVR001").

    Raises:
        ValueError: no rule has that code (the message lists the codes).
    """
    try:
        return _BY_CODE[code.upper()]
    except KeyError:
        allowed = ", ".join(_BY_CODE)
        raise ValueError(f"code: unknown rule {code!r}; expected one of {allowed}") from None
