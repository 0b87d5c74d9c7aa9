import pytest

from kvref.testing.vllm import SecondaryTierContract


class TestDictTier(SecondaryTierContract):
    persistent = False  # blocks live in the process: the restart rule does not apply

    @pytest.fixture
    def tier_config(self):
        return {"type": "DictTier", "module_path": "dict_tier"}
