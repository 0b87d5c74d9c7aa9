"""kvref's CPU manager evicts what vLLM 0.33's does, on a prefix-sharing trace driven into both.

vLLM's manager and policies are executed from the published sdist (downloaded once into the
cache outside the repository by `tools/_audit_corpus.py`; CI reaches PyPI), so this compares
against the real code rather than a transcription of it. See `tools/compare_vllm_manager.py`.
"""

from __future__ import annotations

import sys

import pytest

from kvref.cpu.policies.factory import CachePolicyName
from kvref.cpu.policies.lru import LRUCachePolicy
from tools.compare_vllm_manager import TraceShape, VLLMKVOffload, compare, load_vllm_kv_offload

SMALL = TraceShape(num_blocks=64, num_requests=150, num_prefixes=8, prefix_blocks=12, suffix_blocks=6)


@pytest.fixture(scope="module")
def vllm() -> VLLMKVOffload:
    return load_vllm_kv_offload()


def test_loading_vllm_leaves_no_module_behind(vllm: VLLMKVOffload) -> None:
    assert not [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]
    assert vllm.manager_class.__name__ == "CPUOffloadingManager"


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", [0, 1])
def test_same_evictions_as_vllm(vllm: VLLMKVOffload, policy: CachePolicyName, seed: int) -> None:
    shape = TraceShape(**{**SMALL.__dict__, "seed": seed})
    result = compare(policy, shape, vllm)
    assert result.evicting_stores > result.stores // 2, "the trace must keep the cache evicting"
    assert result.agreement >= 0.99, result


def test_single_group_without_positions_agrees_too(vllm: VLLMKVOffload) -> None:
    # One group, a long queue: exercises insertion ranks and touches over many requests.
    shape = TraceShape(**{**SMALL.__dict__, "num_groups": 1, "concurrency": 1, "lag": 0})
    for policy in ("lru", "arc"):
        result = compare(policy, shape, vllm)
        assert result.agreement >= 0.99, result


def test_the_comparison_notices_a_divergence(vllm: VLLMKVOffload, monkeypatch: pytest.MonkeyPatch) -> None:
    # kvref's pre-0.33 rule, "a block that becomes idle is most recent", must show up.
    original = LRUCachePolicy.mark_evictable

    def refreshing(self: LRUCachePolicy, key: bytes) -> None:
        self.touch([key])  # type: ignore[list-item]
        original(self, key)  # type: ignore[arg-type]

    monkeypatch.setattr(LRUCachePolicy, "mark_evictable", refreshing)
    assert compare("lru", SMALL, vllm).agreement < 0.5
