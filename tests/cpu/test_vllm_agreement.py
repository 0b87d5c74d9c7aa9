"""kvref's CPU manager evicts what vLLM 0.33's does, on a prefix-sharing trace driven into both.

vLLM's manager and policies are executed from the published sdist (downloaded once into the
cache outside the repository by `tools/_audit_corpus.py`; CI reaches PyPI), so this compares
against the real code rather than a transcription of it. See `tools/compare_vllm_manager.py`.
"""

from __future__ import annotations

import copy
import sys
from typing import Any, ClassVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from kvref.base import OffloadKey, PrepareStoreOutput, ReqContext, make_offload_key
from kvref.cpu.manager import CPUOffloadingManager
from kvref.cpu.policies.factory import CachePolicyName
from kvref.cpu.policies.lru import LRUCachePolicy
from kvref.reuse_manager import FilterReusedOffloadingManager
from tools.compare_vllm_manager import TraceShape, VLLMKVOffload, compare, load_vllm_kv_offload
from tools.compare_vllm_manager import main as compare_main

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


# --- random programs against vLLM, step by step ---

_KEYS = [make_offload_key(i.to_bytes(2, "big"), i % 2) for i in range(10)]
_CAPACITY = 4


class _AgainstVLLM(RuleBasedStateMachine):
    """Random valid call sequences into kvref's and vLLM's managers; every answer must agree.

    Covers what the trace does not: failed stores, touches of pending and read blocks, refused
    stores, requests that finish with loads or stores still in flight, and resets.
    """

    policy: ClassVar[CachePolicyName]
    vllm: ClassVar[VLLMKVOffload]

    def __init__(self) -> None:
        super().__init__()
        self.ours = CPUOffloadingManager(_CAPACITY, self.policy)
        self.theirs: Any = self.vllm.manager_class(num_chunks=_CAPACITY, cache_policy=self.policy)
        self.requests: list[tuple[ReqContext, Any]] = []
        self.finished: set[int] = set()
        self.ref_cnts: dict[OffloadKey, int] = {}
        self.loads: list[tuple[int, list[OffloadKey]]] = []

    @initialize()
    def first_request(self) -> None:
        self.new_request(positions=True)

    @rule(positions=st.booleans())
    def new_request(self, positions: bool) -> None:
        name = f"req-{len(self.requests)}"
        ours, theirs = ReqContext(name), self.vllm.req_context_class(name)
        if positions:
            for index, key in enumerate(_KEYS):
                ours.set_offload_key_position(key, 16 * (index // 2 + 1))
                theirs.set_offload_key_position(key, 16 * (index // 2 + 1))
        self.ours.on_new_request(ours)
        self.theirs.on_new_request(theirs)
        self.requests.append((ours, theirs))

    def running(self, data: st.DataObject) -> int | None:
        running = [i for i in range(len(self.requests)) if i not in self.finished]
        return data.draw(st.sampled_from(running)) if running else None

    @rule(data=st.data(), keys=st.lists(st.sampled_from(_KEYS), max_size=_CAPACITY + 1, unique=True))
    def prepare_store(self, data: st.DataObject, keys: list[OffloadKey]) -> None:
        index = self.running(data)
        if index is None:
            return
        ours, theirs = self.requests[index]
        mine = self.ours.prepare_store(keys, ours)
        other = self.theirs.prepare_store(keys, theirs)
        assert (mine is None) == (other is None)
        if mine is None:
            return
        assert mine.keys_to_store == other.keys_to_store
        assert mine.evicted_keys == other.evicted_keys
        assert list(mine.store_spec.block_ids) == [int(i) for i in other.store_spec.block_ids]  # type: ignore[attr-defined]
        for key in mine.evicted_keys:
            del self.ref_cnts[key]
        for key in mine.keys_to_store:
            self.ref_cnts[key] = -1

    @rule(data=st.data(), success=st.sampled_from([True, True, True, False]))
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        pending = [key for key, count in self.ref_cnts.items() if count < 0]
        if not pending:
            return
        keys = data.draw(st.lists(st.sampled_from(pending), min_size=1, unique=True))
        ours, theirs = self.requests[data.draw(st.integers(0, len(self.requests) - 1))]
        self.ours.complete_store(keys, ours, success)
        self.theirs.complete_store(keys, theirs, success)
        for key in keys:
            if success:
                self.ref_cnts[key] = 0
            else:
                del self.ref_cnts[key]

    @rule(data=st.data())
    def prepare_load(self, data: st.DataObject) -> None:
        ready = [key for key, count in self.ref_cnts.items() if count >= 0]
        index = self.running(data)
        if not ready or index is None:
            return
        keys = data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True))
        ours, theirs = self.requests[index]
        mine = self.ours.prepare_load(keys, ours)
        other = self.theirs.prepare_load(keys, theirs)
        assert list(mine.block_ids) == [int(i) for i in other.block_ids]
        for key in keys:
            self.ref_cnts[key] += 1
        self.loads.append((index, keys))

    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        if not self.loads:
            return
        index, keys = self.loads.pop(data.draw(st.integers(0, len(self.loads) - 1)))
        ours, theirs = self.requests[index]
        self.ours.complete_load(keys, ours)
        self.theirs.complete_load(keys, theirs)
        for key in keys:
            self.ref_cnts[key] -= 1

    @rule(data=st.data(), keys=st.lists(st.sampled_from(_KEYS), max_size=4))
    def touch(self, data: st.DataObject, keys: list[OffloadKey]) -> None:
        ours, theirs = self.requests[data.draw(st.integers(0, len(self.requests) - 1))]
        self.ours.touch(keys, ours)
        self.theirs.touch(keys, theirs)

    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        index = self.running(data)
        if index is None:
            return
        ours, theirs = self.requests[index]
        self.ours.on_request_finished(ours)
        self.theirs.on_request_finished(theirs)
        self.finished.add(index)

    @rule(now=st.sampled_from([False] * 19 + [True]))
    def reset_cache(self, now: bool) -> None:
        if now and not self.loads and all(count >= 0 for count in self.ref_cnts.values()):
            self.ours.reset_cache()
            self.theirs.reset_cache()
            self.ref_cnts.clear()

    @invariant()
    def lookups_agree(self) -> None:
        answers = {True: "HIT", None: "HIT_PENDING", False: "MISS"}
        for ours, theirs in self.requests[-1:]:
            for key in _KEYS:
                assert answers[self.ours.lookup(key, ours)] == self.theirs.lookup(key, theirs).name

    @invariant()
    def eviction_orders_agree(self) -> None:
        idle = sum(1 for count in self.ref_cnts.values() if count == 0)
        mine = copy.deepcopy(self.ours.policy).evict(idle, frozenset())
        other = copy.deepcopy(self.theirs._policy).evict(idle, set())
        assert mine is not None and other is not None
        assert [key for key, _ in mine] == [key for key, _ in other]



@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_random_programs_agree_with_vllm(vllm: VLLMKVOffload, policy: CachePolicyName) -> None:
    machine = type(f"AgainstVLLM_{policy}", (_AgainstVLLM,), {"policy": policy, "vllm": vllm})
    run_state_machine_as_test(
        machine, settings=settings(max_examples=60, stateful_step_count=50, deadline=None)
    )


def test_the_tool_prints_the_agreement(capsys: pytest.CaptureFixture[str]) -> None:
    assert compare_main(["--blocks", "48", "--requests", "80", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "| lru | 0 |" in out and "| arc | 0 |" in out
    assert "worst agreement: 100.00%" in out


def test_the_tool_refuses_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert compare_main(["--blocks", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_reuse_filter_counts_lookups_where_vllm_counts_store_offers(vllm: VLLMKVOffload) -> None:
    """Documented divergence: vLLM 0.33 moved the reuse filter into its CPU manager
    (`store_threshold`) and counts `prepare_store` offers; kvref's FilterReusedOffloadingManager
    keeps the earlier rule and counts lookups (a request that could reuse the block)."""
    key = make_offload_key(b"block", 0)
    theirs: Any = vllm.manager_class(num_chunks=4, cache_policy="lru", store_threshold=2)
    first, second = vllm.req_context_class("a"), vllm.req_context_class("b")
    assert theirs.prepare_store([key], first).keys_to_store == []  # offered once: skipped
    assert theirs.prepare_store([key], second).keys_to_store == [key]  # offered twice: stored

    ours = FilterReusedOffloadingManager(CPUOffloadingManager(4), store_threshold=2)
    a, b = ReqContext("a"), ReqContext("b")
    assert _stored(ours.prepare_store([key], a)) == []
    assert _stored(ours.prepare_store([key], b)) == []  # offers do not count
    ours.lookup(key, a)
    ours.lookup(key, b)
    assert _stored(ours.prepare_store([key], b)) == [key]  # two lookups do


def _stored(output: PrepareStoreOutput | None) -> list[OffloadKey]:
    assert output is not None
    return output.keys_to_store
