"""What the command line knows about each rule: code, name, default, fix safety, documentation.

The rule classes (`kvref.audit.rules`) declare these as class attributes, and
`kvref.audit.rules.rule_catalogue` copies them into plain `RuleInfo` records. This module is
below both: it imports nothing of kvref, so the configuration (selection), the reports (the
SARIF rule table) and the rules themselves build on it without importing the engine.
"""

from __future__ import annotations

import enum
import inspect
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FixSafety", "RuleInfo", "find_rule", "doc_section"]


class FixSafety(enum.StrEnum):
    """How safe a rule's fix is ("none": the rule offers none)."""

    SAFE = "safe"
    UNSAFE = "unsafe"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class RuleInfo:
    """One rule as the command line presents it.

    Attributes:
        code: e.g. "KVR001".
        name: the pattern the rule reports, e.g. "missing-override".
        default_enabled: whether the rule runs without being selected explicitly.
        fix_safety: whether its fix is safe, unsafe, or there is none.
        summary: one sentence saying what it reports.
        doc: the rule's documentation (What it does / Why is this bad? / Example / ...).
    """

    code: str
    name: str
    default_enabled: bool
    fix_safety: FixSafety
    summary: str
    doc: str

    @property
    def fixable(self) -> bool:
        """Whether the rule offers a fix (safe or unsafe)."""
        return self.fix_safety is not FixSafety.NONE


_HEADING = re.compile(r"^\s*(?:#+\s*)?(?P<title>[A-Z][A-Za-z ?]*?)\s*:?\s*$")
_SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety", "References")


def doc_section(doc: str, title: str) -> str:
    """The text under heading `title` (`## Title`, `Title:` or `Title`), up to the next one."""
    collected: list[str] | None = None
    for line in inspect.cleandoc(doc).splitlines():
        match = _HEADING.match(line)
        heading = match.group("title").rstrip(":") if match else ""
        if heading in _SECTIONS:
            if collected is not None:
                break
            if heading.lower() == title.lower():
                collected = []
            continue
        if collected is not None:
            collected.append(line)
    return textwrap.dedent("\n".join(collected)).strip() if collected is not None else ""


def find_rule(rules: Sequence[RuleInfo], code_or_name: str) -> RuleInfo | None:
    """The rule with this code (case-insensitive) or name, or None."""
    wanted = code_or_name.strip()
    for rule in rules:
        if rule.code.upper() == wanted.upper() or rule.name == wanted.lower():
            return rule
    return None
