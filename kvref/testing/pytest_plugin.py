"""pytest plugin of the conformance kit: the `--kvref-conformance=quick|deep` option, and rules
that cannot apply set aside with their reasons.

Registered as a `pytest11` entry point, so pytest loads it wherever kvref is installed; it
imports nothing but pytest. `quick` (the default) keeps each contract class within a minute on
two cores; `deep` runs the kit's random programs many times longer (Hypothesis examples and
steps), for a tier or manager about to be submitted, or a nightly job.

A contract class says which of its rules cannot apply to the implementation under test
(`inapplicable_rules()`: its `not_applicable`, a tier that is not `persistent`, no
`damage_block` fixture, a manager without `policy`). Those tests are deselected when collected,
not skipped: they test nothing about this implementation, and a run whose policy is "nothing
skips" stays honest. The end of the run lists each with its reason.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

__all__ = ["OPTION", "DEPTHS", "pytest_addoption", "pytest_collection_modifyitems", "pytest_terminal_summary"]

OPTION = "kvref_conformance"
DEPTHS = ("quick", "deep")

# Deselected rules of this run, for the summary: (class name, rule id, reason).
_inapplicable_key = pytest.StashKey[list[tuple[str, str, str]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("kvref").addoption(
        "--kvref-conformance",
        dest=OPTION,
        choices=DEPTHS,
        default="quick",
        help="how hard kvref.testing.vllm's contracts search for broken promises (default: quick)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    inapplicable: list[tuple[str, str, str]] = []
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        reason = _inapplicable_reason(item)
        if reason is None:
            kept.append(item)
        else:
            dropped.append(item)
            contract: type = getattr(item, "cls")
            inapplicable.append((contract.__name__, *reason))
    config.stash[_inapplicable_key] = inapplicable
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    inapplicable = config.stash.get(_inapplicable_key, None)
    if not inapplicable:
        return
    terminalreporter.section("kvref conformance: rules that do not apply (deselected)")
    for class_name, rule_id, reason in inapplicable:
        terminalreporter.line(f"{class_name}: {rule_id}: {reason}")


def _inapplicable_reason(item: pytest.Item) -> tuple[str, str] | None:
    """(rule id, reason) when `item` is a contract's rule that its class says cannot apply."""
    # Contract classes are recognised by the classmethod, not imported: this plugin must load
    # where neither vLLM nor Hypothesis is installed.
    inapplicable_rules: Callable[[], dict[str, str]] | None = getattr(getattr(item, "cls", None), "inapplicable_rules", None)
    name = getattr(item, "originalname", None)
    if inapplicable_rules is None or not isinstance(name, str):
        return None
    rule_id = name.removeprefix("test_")
    reason = inapplicable_rules().get(rule_id)
    return None if reason is None else (rule_id, reason)
