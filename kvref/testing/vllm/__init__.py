"""vLLM's unwritten contracts, executable: a conformance kit for secondary tiers and managers.

    import pytest
    from kvref.testing.vllm import OffloadingManagerContract, SecondaryTierContract

    class TestMyTier(SecondaryTierContract):
        @pytest.fixture
        def tier_config(self, tmp_path):   # the dict an operator puts in `secondary_tiers`
            return {"type": "MyTier", "module_path": "my_pkg.tiers", "root_dir": str(tmp_path / "t")}

    class TestMyManager(OffloadingManagerContract):
        policy = "lru"                      # optional: "lru" | "arc" | None (the default)
        @pytest.fixture
        def make_manager(self):             # (num_chunks, enable_events) -> vLLM OffloadingManager
            return lambda num_chunks, enable_events: MyManager(num_chunks, enable_events=enable_events)

Every rule is a test of its own, inherited: a rule added to the kit reaches every subclass by
itself. The rules, what vLLM does when each is broken, and how to opt out of one are in
docs/CONFORMANCE.md. `pytest --kvref-conformance=deep` runs the random programs far longer.
Needs vLLM 0.33, pytest and Hypothesis: `pip install 'kvref[vllm-conformance]'`.
"""

from __future__ import annotations

_EXTRA = "pip install 'kvref[vllm-conformance]'"
try:
    import hypothesis as _hypothesis
    import pytest as _pytest
    import vllm.v1.kv_offload.tiering.factory as _factory
except ImportError as _exc:
    _missing = getattr(_exc, "name", None) or str(_exc)
    raise ImportError(
        f"kvref.testing.vllm needs vLLM 0.33, pytest and Hypothesis ({_missing} did not import): {_EXTRA}"
    ) from _exc
del _hypothesis, _pytest, _factory

from kvref.testing.vllm._common import ContractViolation
from kvref.testing.vllm._manager_harness import MakeManager
from kvref.testing.vllm.manager import OffloadingManagerContract
from kvref.testing.vllm.tier import DamageBlock, SecondaryTierContract

__all__ = ["SecondaryTierContract", "OffloadingManagerContract", "ContractViolation", "DamageBlock", "MakeManager"]
