"""The conformance kit as a product: its rules documented, its opt-outs, its depth, its import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvref.testing.vllm import OffloadingManagerContract, SecondaryTierContract
from kvref.testing.vllm._common import run_settings
from tests.vllm.kit_plugin import KIT_PLUGIN, NO_KIT_PLUGIN
from tools.conformance_rules import DOC, updated

_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("contract", [SecondaryTierContract, OffloadingManagerContract])
def test_every_rule_says_what_breaks_in_vllm(contract: type[SecondaryTierContract | OffloadingManagerContract]) -> None:
    rules = contract.rules()
    assert len(rules) >= 15
    assert all(rule.statement and rule.in_vllm for rule in rules.values()), [r.id for r in rules.values() if not r.in_vllm]


def test_the_rule_tables_in_the_docs_are_current() -> None:
    text = DOC.read_text()
    assert updated(text) == text, "docs/CONFORMANCE.md is stale: run tools/conformance_rules.py"
    for contract in (SecondaryTierContract, OffloadingManagerContract):
        for rule_id in contract.rules():
            assert f"| `{rule_id}` |" in text


def test_an_opt_out_names_a_rule() -> None:
    with pytest.raises(TypeError, match="not_applicable names no rule: lookups_are_fast"):

        class _Typo(SecondaryTierContract):  # pyright: ignore[reportUnusedClass]
            not_applicable = {"lookups_are_fast": "typo"}


_SUBJECT = """
import pytest
from kvref.testing.vllm import SecondaryTierContract

class TestTier(SecondaryTierContract):
    persistent = False
    not_applicable = {"locality_is_the_configured_one": "the tier has no locality"}

    @pytest.fixture
    def tier_config(self):
        return {"type": "DictTier", "module_path": "examples.vllm_dict_tier.dict_tier"}
"""


def test_rules_that_do_not_apply_are_deselected_and_listed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_subject=_SUBJECT)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", *KIT_PLUGIN, "-k", "locality or survive or damaged")
    # -k sets aside every test but the three, and the plugin those three: none runs, none skips.
    tests = [name for name in dir(SecondaryTierContract) if name.startswith("test_")]
    result.assert_outcomes(deselected=len(tests))
    result.stdout.fnmatch_lines(
        [
            "*kvref conformance: rules that do not apply (deselected)*",
            "TestTier: locality_is_the_configured_one: the tier has no locality",
            "TestTier: a_damaged_block_fails_its_load: no damage_block fixture: give one to check loads of damaged blocks",
            "TestTier: blocks_survive_a_new_instance: persistent = False: the tier's blocks die with it",
        ],
        consecutive=True,
    )


def test_without_the_plugin_they_report_skipped_with_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_subject=_SUBJECT)
    result = pytester.runpytest_inprocess("-q", "-rs", "-p", "no:cacheprovider", *NO_KIT_PLUGIN, "-k", "locality")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*rule 'locality_is_the_configured_one' not applicable: the tier has no locality*"])


def test_deep_runs_explore_more(pytester: pytest.Pytester) -> None:
    quick = run_settings(_request_with(pytester, []), 10)
    deep = run_settings(_request_with(pytester, [*KIT_PLUGIN, "--kvref-conformance=deep"]), 10)
    assert (quick.max_examples, quick.derandomize) == (10, True)
    assert deep.max_examples == 200 and not deep.derandomize
    assert deep.stateful_step_count > quick.stateful_step_count


def _request_with(pytester: pytest.Pytester, args: list[str]) -> pytest.FixtureRequest:
    config = pytester.parseconfigure(*args)

    class _Request:
        pass

    request = _Request()
    request.config = config  # type: ignore[attr-defined]
    return request  # type: ignore[return-value]


def test_importing_the_kit_without_vllm_is_one_clear_import_error() -> None:
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'vllm' or name.startswith('vllm.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import kvref.testing, kvref.testing.pytest_plugin\n"
        "try:\n"
        "    import kvref.testing.vllm\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocker], capture_output=True, text=True, cwd=_ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(_ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "ImportError kvref.testing.vllm needs vLLM 0.33, pytest and Hypothesis "
        "(vllm did not import): pip install 'kvref[vllm-conformance]'"
    )


def test_the_readme_points_at_the_kit() -> None:
    readme = (_ROOT / "README.md").read_text()
    assert "docs/CONFORMANCE.md" in readme and "kvref.testing.vllm" in readme
