"""kvref's CPU manager evicts what vLLM 0.33's does, on a prefix-sharing trace driven into both.

vLLM's manager and policies are executed from the published sdist (downloaded once into the
cache outside the repository by `tools/_audit_corpus.py`; CI reaches PyPI), so this compares
against the real code rather than a transcription of it. See `tools/compare_vllm_manager.py`;
random programs, step by step, are `test_stateful.py`'s.
"""

from __future__ import annotations

import sys

import pytest

from kvref.base import OffloadKey, ReqContext
from kvref.cpu.policies.lru import LRUCachePolicy
from tools.compare_vllm_manager import TraceShape, VLLMKVOffload, compare
from tools.compare_vllm_manager import main as compare_main

SMALL = TraceShape(num_blocks=64, num_requests=150, num_prefixes=8, prefix_blocks=12, suffix_blocks=6)


def test_loading_vllm_leaves_no_module_behind(vllm_kv_offload: VLLMKVOffload) -> None:
    assert not [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]
    assert vllm_kv_offload.manager_class.__name__ == "CPUOffloadingManager"


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", [0, 1])
def test_same_evictions_as_vllm(vllm_kv_offload: VLLMKVOffload, policy: str, seed: int) -> None:
    shape = TraceShape(**{**SMALL.__dict__, "seed": seed})
    result = compare(policy, shape, vllm_kv_offload)
    assert result.evicting_stores > result.stores // 2, "the trace must keep the cache evicting"
    assert result.agreement == 1.0, result


def test_single_group_without_positions_agrees_too(vllm_kv_offload: VLLMKVOffload) -> None:
    # One group, a long queue: exercises insertion ranks and touches over many requests.
    shape = TraceShape(**{**SMALL.__dict__, "num_groups": 1, "concurrency": 1, "lag": 0})
    for policy in ("lru", "arc"):
        result = compare(policy, shape, vllm_kv_offload)
        assert result.agreement == 1.0, result


def test_the_comparison_notices_a_divergence(vllm_kv_offload: VLLMKVOffload, monkeypatch: pytest.MonkeyPatch) -> None:
    # kvref's pre-0.33 rule, "a chunk that becomes idle is most recent", must show up.
    original = LRUCachePolicy.mark_evictable

    def refreshing(self: LRUCachePolicy, key: OffloadKey) -> None:
        self.touch([key], ReqContext("refresh"))
        original(self, key)

    monkeypatch.setattr(LRUCachePolicy, "mark_evictable", refreshing)
    assert compare("lru", SMALL, vllm_kv_offload).agreement < 0.5


def test_the_tool_prints_the_agreement(capsys: pytest.CaptureFixture[str]) -> None:
    assert compare_main(["--blocks", "48", "--requests", "80", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "| lru | 0 |" in out and "| arc | 0 |" in out
    assert "worst agreement: 100.00%" in out


def test_the_tool_refuses_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert compare_main(["--blocks", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err
