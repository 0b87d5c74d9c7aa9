"""The Hypothesis profile is the one knob: in `ci` (the default) a test's own larger budget is
held to the profile's, in `thorough` raised to it, in `written` left as its author wrote it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from tests.conftest import CI_EXAMPLES, CI_STEPS, PROFILE, THOROUGH_EXAMPLES, budgeted, pytest_collection_modifyitems


@pytest.mark.parametrize(
    ("profile", "examples", "steps"),
    [("ci", CI_EXAMPLES, CI_STEPS), ("written", 300, 80), ("thorough", THOROUGH_EXAMPLES, 80)],
)
def test_a_larger_budget_follows_the_profile(profile: str, examples: int, steps: int) -> None:
    held = budgeted(settings(max_examples=300, stateful_step_count=80, deadline=None), profile)
    assert (held.max_examples, held.stateful_step_count, held.deadline) == (examples, steps, None)


def test_a_smaller_budget_stays_but_thorough_raises_it() -> None:
    small = settings(max_examples=5, stateful_step_count=5)
    assert budgeted(small, "ci") is small and budgeted(small, "written") is small
    assert budgeted(small, "thorough").max_examples == THOROUGH_EXAMPLES


def _expected(written: int) -> int:
    return {"ci": min(written, CI_EXAMPLES), "written": written, "thorough": max(written, THOROUGH_EXAMPLES)}[PROFILE]


def test_collection_holds_a_decorated_test_to_the_profile() -> None:
    seen: list[int] = []

    @settings(max_examples=300, database=None)
    @given(st.integers())
    def prop(value: int) -> None:
        seen.append(value)

    pytest_collection_modifyitems([SimpleNamespace(obj=prop, cls=None)])  # pyright: ignore[reportArgumentType]
    prop()
    assert len(seen) <= _expected(300)
    assert PROFILE != "ci" or len(seen) > 1


class _Counter(RuleBasedStateMachine):
    steps = 0

    @rule()
    def step(self) -> None:
        type(self).steps += 1


def test_collection_holds_a_state_machine_to_the_profile() -> None:
    case = _Counter.TestCase
    case.settings = settings(max_examples=200, stateful_step_count=50, database=None)
    pytest_collection_modifyitems([SimpleNamespace(obj=case("runTest").runTest, cls=case)])  # pyright: ignore[reportArgumentType]
    assert case.settings.max_examples == _expected(200)
    if PROFILE == "ci":
        assert case.settings.stateful_step_count == CI_STEPS
        case("runTest").runTest()
        assert 0 < _Counter.steps <= CI_EXAMPLES * CI_STEPS
