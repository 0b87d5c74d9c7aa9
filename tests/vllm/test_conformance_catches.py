"""The conformance kit catches broken code: each broken tier and manager here (one bug each) fails
the rule it breaks, with the rule named in the message, and the correct tier it is made from
passes. Each runs through pytest itself (`pytester`), as an author's test file would.

The full contract class also runs against every one of them in `tools/conformance_score.py`,
which counts how many the kit catches by any rule.
"""

from __future__ import annotations

import pytest

from kvref.testing.vllm import SecondaryTierContract
from tests.vllm import broken_managers, broken_tiers
from tests.vllm.kit_plugin import KIT_PLUGIN

_TIER_TEST = """
import pytest
from kvref.testing.vllm import SecondaryTierContract

class TestTier(SecondaryTierContract):
    persistent = {persistent}

    @pytest.fixture
    def tier_config(self):
        return {{"type": "{name}", "module_path": "{module}"}}
"""

_MANAGER_TEST = """
import pytest
from kvref.testing.vllm import OffloadingManagerContract
from tests.vllm.broken_managers import make

class TestManager(OffloadingManagerContract):
    policy = {policy!r}

    @pytest.fixture
    def make_manager(self):
        return lambda num_chunks, enable_events: make("{name}", num_chunks, enable_events)
"""


def run_rule(pytester: pytest.Pytester, source: str, test: str) -> tuple[pytest.RunResult, str]:
    pytester.makepyfile(test_subject=source)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", *KIT_PLUGIN, "-k", f"test_{test}")
    return result, result.stdout.str()


@pytest.mark.parametrize(("name", "rule"), sorted(broken_tiers.BREAKS.items()))
def test_a_broken_tier_fails_the_rule_it_breaks(pytester: pytest.Pytester, name: str, rule: str) -> None:
    source = _TIER_TEST.format(name=name, module=broken_tiers.__name__, persistent=name in broken_tiers.PERSISTENT)
    result, output = run_rule(pytester, source, broken_tiers.FOUND_BY.get(name, rule))
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    assert f"vLLM contract rule '{rule}' broken" in output, output


@pytest.mark.parametrize(("name", "rule"), sorted(broken_managers.BREAKS.items()))
def test_a_broken_manager_fails_the_rule_it_breaks(pytester: pytest.Pytester, name: str, rule: str) -> None:
    source = _MANAGER_TEST.format(name=name, policy=broken_managers.POLICY[name])
    result, output = run_rule(pytester, source, rule)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    assert f"vLLM contract rule '{rule}' broken" in output, output


@pytest.mark.parametrize(("name", "persistent"), [("DictTier", False), ("PersistentDictTier", True)])
def test_the_correct_tiers_they_are_made_from_pass(pytester: pytest.Pytester, name: str, persistent: bool) -> None:
    module = "examples.vllm_dict_tier.dict_tier" if name == "DictTier" else broken_tiers.__name__
    pytester.makepyfile(test_subject=_TIER_TEST.format(name=name, module=module, persistent=persistent))
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", *KIT_PLUGIN)
    # Not applicable: the damaged-block rule (no damage_block fixture), and for the
    # non-persistent one the restart and sharing rules.
    inapplicable = 1 if persistent else 3
    result.assert_outcomes(passed=len(SecondaryTierContract.rules()) - inapplicable, deselected=inapplicable)
