"""What both contracts share: rules read from their tests' docstrings, violations that name the
rule, opt-outs, and the depth of the random programs.

A contract class's rules are its `test_<rule>` methods. Each docstring's first paragraph states
the rule; a paragraph starting "In vLLM:" says what breaks in vLLM when an implementation breaks
it. A check that fails raises `ContractViolation` naming the rule (whichever test found it), so a
message always points at the promise that was broken, not at the test that happened to notice.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings

__all__ = ["ContractViolation", "Contract", "Rule", "run_settings"]

_QUICK_STEPS = 40
_DEEP_EXAMPLES = 20  # times the class's quick examples
_DEEP_STEPS = 80


class ContractViolation(AssertionError):
    """An implementation broke one of vLLM's rules (the message names it and says why it matters)."""


class Rule:
    """One rule: its id (the test's name without `test_`), statement and consequence in vLLM."""

    __slots__ = ("id", "statement", "in_vllm")

    def __init__(self, rule_id: str, doc: str) -> None:
        paragraphs = [" ".join(part.split()) for part in inspect.cleandoc(doc).split("\n\n")]
        self.id = rule_id
        self.statement = paragraphs[0]
        self.in_vllm = next((p.removeprefix("In vLLM: ") for p in paragraphs if p.startswith("In vLLM:")), "")

    def violation(self, detail: str, *, expected: object = None, got: object = None) -> ContractViolation:
        lines = [f"vLLM contract rule '{self.id}' broken: {self.statement}", f"  {detail}"]
        if expected is not None or got is not None:
            lines += [f"  expected: {expected!r}", f"  got:      {got!r}"]
        if self.in_vllm:
            lines.append(f"  In vLLM: {self.in_vllm}")
        return ContractViolation("\n".join(lines))


class Contract:
    """Base of the contract classes: rule lookup and opt-outs.

    Attributes:
        not_applicable: rule ids a subclass opts out of, each with the reason. Ids that are no
            rule raise `TypeError` when the class is defined, so a typo cannot silently switch
            a rule off.
    """

    not_applicable: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unknown = set(cls.not_applicable) - set(cls.rules())
        if unknown:
            raise TypeError(f"{cls.__name__}.not_applicable names no rule: {', '.join(sorted(unknown))}")

    @classmethod
    def rules(cls) -> dict[str, Rule]:
        """The rules of this contract, by id, in definition order."""
        found: dict[str, Rule] = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                if name.startswith("test_") and callable(member) and member.__doc__:
                    found[name.removeprefix("test_")] = Rule(name.removeprefix("test_"), member.__doc__)
        return found

    @classmethod
    def rule(cls, rule_id: str) -> Rule:
        return cls.rules()[rule_id]

    @classmethod
    def inapplicable_rules(cls) -> dict[str, str]:
        """The rules that cannot apply to this subclass, by id, each with the reason.

        `not_applicable` plus what the class's settings rule out (a contract adds those).
        The kit's pytest plugin deselects these tests when it collects them and lists them with
        their reasons at the end of the run: a rule that cannot apply is no test of this
        implementation, so it is neither run nor counted as skipped. Without the plugin they
        report SKIPPED with the same reasons.
        """
        return dict(cls.not_applicable)

    @pytest.fixture(autouse=True)
    def _opt_out(self, request: pytest.FixtureRequest) -> Iterator[None]:
        name = getattr(request, "function", None)
        rule_id = re.sub(r"^test_", "", name.__name__) if name is not None else ""
        reason = self.inapplicable_rules().get(rule_id)
        if reason is not None:
            pytest.skip(f"rule '{rule_id}' not applicable: {reason}")
        yield


def run_settings(request: pytest.FixtureRequest, quick_examples: int) -> settings:
    """Hypothesis settings for a contract's random programs at the run's `--kvref-conformance`."""
    deep = request.config.getoption("kvref_conformance", default="quick") == "deep"
    return settings(
        max_examples=quick_examples * (_DEEP_EXAMPLES if deep else 1),
        stateful_step_count=_DEEP_STEPS if deep else _QUICK_STEPS,
        # Quick runs are the same every time (CI answers do not change from run to run);
        # deep runs explore new programs each time.
        derandomize=not deep,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        print_blob=True,
    )
