"""`kvref rules` and `kvref explain`: the rule catalogue as text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from kvref.audit.catalogue import RuleInfo, find_rule

__all__ = ["list_rules", "explain_rule"]

_EXIT_CLEAN = 0
_EXIT_ERROR = 2


def list_rules(rules: Sequence[RuleInfo], out: TextIO) -> int:
    """Print a table of the rules: code, name, default, fixable, summary."""
    name_width = max((len(rule.name) for rule in rules), default=4)
    out.write(f"{'code':<7} {'name':<{name_width}} {'default':<7} {'fix':<6} summary\n")
    for rule in rules:
        out.write(
            f"{rule.code:<7} {rule.name:<{name_width}} "
            f"{'on' if rule.default_enabled else 'off':<7} "
            f"{rule.fix_safety:<6} {rule.summary}\n"
        )
    return _EXIT_CLEAN


def explain_rule(rules: Sequence[RuleInfo], code: str, out: TextIO, err: TextIO) -> int:
    """Print one rule's documentation; exit 2 for an unknown code."""
    rule = find_rule(rules, code)
    if rule is None:
        known = ", ".join(r.code for r in rules)
        err.write(f"kvref: error: unknown rule {code!r} (known: {known})\n")
        return _EXIT_ERROR
    default = "on by default" if rule.default_enabled else "off by default: select it by code"
    fixable = {"safe": "safe fix", "unsafe": "unsafe fix (--unsafe-fixes)"}.get(rule.fix_safety, "no fix")
    out.write(f"{rule.code} {rule.name} ({default}; {fixable})\n\n{rule.doc.rstrip()}\n")
    return _EXIT_CLEAN
