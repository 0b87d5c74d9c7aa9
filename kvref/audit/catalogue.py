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
        if not first_line or _heading(first_line) is not None:
            opening = doc_section(self.doc, "What it does").split("\n\n", 1)[0]
        text = " ".join(opening.split())
        sentence_end = re.search(r"(?<=[.!?])\s", text)
        return text[: sentence_end.start()] if sentence_end else text

    @property
    def fix_safety(self) -> str:
        """"safe", "unsafe" or "none", from the first word of the "Fix safety" section."""
        if not self.fixable:
            return "none"
        first_word = doc_section(self.doc, "Fix safety").split(":", 1)[0].strip().lower()
        return "unsafe" if first_word.startswith("unsafe") else "safe"


_HEADING = re.compile(r"^\s*(?:#+\s*)?(?P<title>[A-Z][A-Za-z ?]*?)\s*:?\s*$")
_SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety", "References")


def _heading(line: str) -> str | None:
    """The section title a line introduces (`## Title`, `Title:` or `Title`), if any."""
    match = _HEADING.match(line)
    if match is None:
        return None
    title = match.group("title").rstrip(":")
    return title if title in _SECTIONS else None


def doc_section(doc: str, title: str) -> str:
    """The text under heading `title`, up to the next heading (dedented)."""
    collected: list[str] | None = None
    for line in inspect.cleandoc(doc).splitlines():
        heading = _heading(line)
        if heading is not None:
            if collected is not None:
                break
            if heading.lower() == title.lower():
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
