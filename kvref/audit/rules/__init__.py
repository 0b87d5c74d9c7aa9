"""The audit rules, one module per rule, collected here in code order (see `base.Rule`)."""

from __future__ import annotations

import inspect

from kvref.audit.catalogue import RuleInfo
from kvref.audit.rules.base import Rule
from kvref.audit.rules.kvr001_missing_override import MissingOverride
from kvref.audit.rules.kvr002_stale_override import StaleOverride
from kvref.audit.rules.kvr101_narrowed_collection_parameter import NarrowedCollectionParameter
from kvref.audit.rules.kvr102_multi_pass_iterable import MultiPassIterable
from kvref.audit.rules.kvr103_override_annotation_drift import OverrideAnnotationDrift

__all__ = ["ALL_RULES", "Rule", "get_rule", "rule_catalogue", "rules_for"]

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


def rules_for(codes: frozenset[str] | None) -> tuple[Rule, ...]:
    """The rules with these codes, in code order (None: every rule)."""
    if codes is None:
        return ALL_RULES
    return tuple(rule for rule in ALL_RULES if rule.code in codes)


def rule_catalogue() -> tuple[RuleInfo, ...]:
    """Every rule as the command line presents it (selection, `kvref rules`, the reports)."""
    return tuple(
        RuleInfo(
            rule.code,
            rule.name,
            rule.default_enabled,
            rule.fix_safety,
            rule.summary,
            inspect.cleandoc(rule.__doc__ or ""),
        )
        for rule in ALL_RULES
    )
