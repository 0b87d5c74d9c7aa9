"""Test-wide settings: Hypothesis budgets, bounded for CI by default and deeper on request.

`KVREF_HYPOTHESIS_PROFILE` picks the profile, and the profile also bounds each test's own
budget (a test's `@settings(max_examples=...)`, a state machine's `TestCase.settings`), so it
is the one knob:

- `ci`, the default (`make test`): at most 25 examples per property and 25 steps per
  stateful run;
- `written`: each test's own budget, as its author wrote it;
- `thorough`: at least 1,000 examples per property, for a deeper run on your machine, e.g.
  `KVREF_HYPOTHESIS_PROFILE=thorough .venv/bin/python -m pytest tests/cpu`.

tests/vllm (run in `.venv-vllm`) is under this directory, so the same profile applies there.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

__all__ = ["CI_EXAMPLES", "CI_STEPS", "PROFILE", "THOROUGH_EXAMPLES", "budgeted"]

CI_EXAMPLES = 25
CI_STEPS = 25
THOROUGH_EXAMPLES = 1000
# No deadline, and slow data generation tolerated: the machine is shared.
_RELAXED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

settings.register_profile("ci", _RELAXED, max_examples=CI_EXAMPLES, stateful_step_count=CI_STEPS)
settings.register_profile("written", _RELAXED)
settings.register_profile("thorough", _RELAXED, max_examples=THOROUGH_EXAMPLES)
PROFILE = os.environ.get("KVREF_HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "written", "thorough"):
    raise ValueError(f"KVREF_HYPOTHESIS_PROFILE must be ci, written or thorough, not {PROFILE!r}")
settings.load_profile(PROFILE)


def budgeted(own: settings, profile: str = PROFILE) -> settings:
    """A test's own settings within the profile's budget."""
    if profile == "ci" and (own.max_examples > CI_EXAMPLES or own.stateful_step_count > CI_STEPS):
        return settings(
            own, max_examples=min(own.max_examples, CI_EXAMPLES),
            stateful_step_count=min(own.stateful_step_count, CI_STEPS),
        )  # fmt: skip
    if profile == "thorough" and own.max_examples < THOROUGH_EXAMPLES:
        return settings(own, max_examples=THOROUGH_EXAMPLES)
    return own


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put every Hypothesis test's own settings within the profile's budget."""
    for item in items:
        test: object = getattr(item, "obj", None)
        function: object = getattr(test, "__func__", test)  # a method: its function
        own: object = getattr(function, "_hypothesis_internal_use_settings", None)
        if getattr(function, "is_hypothesis_test", False) and isinstance(own, settings):
            setattr(function, "_hypothesis_internal_use_settings", budgeted(own))
        machine: object = getattr(item, "cls", None)  # a state machine's unittest TestCase
        own = getattr(machine, "settings", None)
        if getattr(getattr(machine, "runTest", None), "_hypothesis_state_machine_class", None) and isinstance(own, settings):
            setattr(machine, "settings", budgeted(own))
