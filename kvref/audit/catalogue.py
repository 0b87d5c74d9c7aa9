"""What the command line knows about each rule: code, name, default, fixability, documentation.

The rules themselves live in `kvref.audit.rules` (the engine's side); this module reads their
class attributes once into plain `RuleInfo` records so selection, `kvref rules`, `kvref explain`
and the SARIF rule table never depend on the rule classes' internals.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RuleInfo", "load_rule_catalogue", "find_rule", "doc_section"]


@dataclass(frozen=True, slots=True)
class RuleInfo:
    """One rule as the command line presents it.

    Attributes:
        code: e.g. "KVR001".
        name: the pattern the rule reports, e.g. "missing-override".
        default_enabled: whether the rule runs without being selected explicitly.
        fixable: whether the rule offers a fix (safe or unsafe).
        doc: the rule's documentation (What it does / Why is this bad? / Example / ...).
    """

    code: str
    name: str
    default_enabled: bool
    fixable: bool
    doc: str

    @property
    def summary(self) -> str:
        """One sentence: the docstring's opening sentence, else the first of "What it does"."""
        opening = inspect.cleandoc(self.doc).split("\n\n", 1)[0]
        first_line = opening.splitlines()[0] if opening else ""
        if not first_line or _HEADING.match(first_line):
            opening = doc_section(self.doc, "What it does").split("\n\n", 1)[0]
        text = " ".join(opening.split())
        sentence_end = re.search(r"(?<=[.!?])\s", text)
        return text[: sentence_end.start()] if sentence_end else text


_HEADING = re.compile(r"^\s*(?:#+\s*)?(?P<title>[A-Z][A-Za-z ?]*?)\s*:?\s*$")


def doc_section(doc: str, title: str) -> str:
    """The text under heading `title` (`## Title`, `Title:` or `Title`), up to the next heading."""
    lines = inspect.cleandoc(doc).splitlines()
    known = {"What it does", "Why is this bad?", "Example", "Use instead", "Fix safety", "References"}
    collected: list[str] | None = None
    for line in lines:
        heading = _HEADING.match(line)
        if heading is not None and heading.group("title").rstrip(":") in known:
            if collected is not None:
                break
            if heading.group("title").rstrip(":").lower() == title.lower():
                collected = []
            continue
        if collected is not None:
            collected.append(line)
    return textwrap.dedent("\n".join(collected)).strip() if collected is not None else ""


def load_rule_catalogue() -> tuple[RuleInfo, ...]:
    """Read the engine's rule registry (imported lazily: `kvref rules` should not pay for it)."""
    from kvref.audit.rules import ALL_RULES

    return tuple(
        RuleInfo(
            code=rule.code,
            name=rule.name,
            default_enabled=rule.default_enabled,
            fixable=rule.fixable,
            doc=inspect.cleandoc(rule.__doc__ or ""),
        )
        for rule in ALL_RULES
    )


def find_rule(rules: Sequence[RuleInfo], code_or_name: str) -> RuleInfo | None:
    """The rule with this code (case-insensitive) or name, or None."""
    wanted = code_or_name.strip()
    for rule in rules:
        if rule.code.upper() == wanted.upper() or rule.name == wanted.lower():
            return rule
    return None
