"""Scenario tests of `CPUOffloadingManager`, one rule of kv-offload.md sections 3-4 per test.

Keys are small integers turned into offload keys; comments state the expected transition.
"""

from __future__ import annotations

import copy

from collections.abc import Collection, Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any, cast

import pytest
from typing_extensions import override

from kvref.base import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingStats,
    OffloadKey,
    OffloadPolicy,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    make_offload_key,
)
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.manager import CPUOffloadingManager
from kvref.cpu.policies._arc_ghosts import GhostList
from kvref.cpu.policies.arc import ARCCachePolicy
from kvref.cpu.policies.base import BlockStatus
from kvref.cpu.policies.factory import CachePolicyName
from kvref.cpu.policies.lru import LRUCachePolicy
from kvref.errors import OffloadProtocolError

REQ = ReqContext(req_id="req-0")
POLICIES: list[CachePolicyName] = ["lru", "arc"]
both_policies = pytest.mark.parametrize("cache_policy", POLICIES)


def to_key(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def to_keys(ints: Iterable[int]) -> list[OffloadKey]:
    return [to_key(i) for i in ints]


def make_manager(
    num_blocks: int = 4, cache_policy: CachePolicyName = "lru", enable_events: bool = True
) -> CPUOffloadingManager:
    return CPUOffloadingManager(num_blocks, cache_policy=cache_policy, enable_events=enable_events)


@dataclass
class ExpectedPrepareStoreOutput:
    keys_to_store: list[int]
    store_block_ids: list[int]
    evicted_keys: list[int]


@dataclass
class ExpectedEvent:
    keys: list[int]
    removed: bool


def verify_store_output(output: PrepareStoreOutput | None, expected: ExpectedPrepareStoreOutput) -> None:
    assert output is not None
    assert output.keys_to_store == to_keys(expected.keys_to_store)
    assert output.evicted_keys == to_keys(expected.evicted_keys)
    assert isinstance(output.store_spec, CPULoadStoreSpec)
    assert output.store_spec.block_ids.tolist() == expected.store_block_ids


def verify_load_output(spec: LoadStoreSpec, expected_block_ids: list[int]) -> None:
    assert isinstance(spec, CPULoadStoreSpec)
    assert spec.block_ids.tolist() == expected_block_ids


def verify_events(events: Iterable[OffloadingEvent], expected: list[ExpectedEvent]) -> None:
    got = [(event.medium, event.keys, event.removed) for event in events]
    assert got == [("CPU", to_keys(e.keys), e.removed) for e in expected]


def store(manager: CPUOffloadingManager, ints: Iterable[int], request: ReqContext = REQ) -> list[int]:
    """Prepare and complete a store of `ints`; return the block ids it was given."""
    keys = to_keys(ints)
    output = manager.prepare_store(keys, request)
    assert output is not None
    manager.complete_store(keys, request)
    assert isinstance(output.store_spec, CPULoadStoreSpec)
    return output.store_spec.block_ids.tolist()


def _describe(value: Any) -> Any:
    if isinstance(value, BlockStatus):
        return ("block", value.block_id, value.ref_cnt)
    if isinstance(value, GhostList):
        return ("ghosts", list(value))
    if isinstance(value, dict):
        entries = cast(dict[Any, Any], value)
        return [(key, _describe(item)) for key, item in entries.items()]
    return value


def snapshot(manager: CPUOffloadingManager, universe: Iterable[int] = range(12)) -> Any:
    """Everything observable about a manager, policy internals (in order) included."""
    return (
        [manager.lookup(key, REQ) for key in to_keys(universe)],
        manager.num_free_blocks,
        manager.num_idle_blocks,
        repr(manager),
        # LRU's order may drop empty request buckets on any eviction walk (no rank changes):
        # what it orders is compared through the ranks and the eviction order instead.
        # clear() bumps LRU's generation (so stale request ranks are never reused): not compared.
        {
            name: _describe(value)
            for name, value in vars(manager.policy).items()
            if name not in ("_order", "_bucket_of", "_pending_join", "_generation")
        },
        eviction_order(manager),
    )


def eviction_order(manager: CPUOffloadingManager) -> list[OffloadKey]:
    """The order in which the manager's policy would evict all of its idle blocks now."""
    policy = copy.deepcopy(manager.policy)
    # Through the class: a test may have replaced the instance's evict.
    evicted = type(policy).evict(policy, manager.num_idle_blocks, frozenset())
    assert evicted is not None
    return [key for key, _ in evicted]


# --- the whole protocol, as in vLLM's test_cpu_manager, with the later (idle-index) LRU ---


def test_lru_walkthrough() -> None:
    manager = make_manager(num_blocks=4, cache_policy="lru")

    # prepare store [1, 2] -> fresh ids 0, 1
    output = manager.prepare_store(to_keys([1, 2]), REQ)
    verify_store_output(output, ExpectedPrepareStoreOutput([1, 2], [0, 1], []))
    # lookup [1, 2] -> write in flight: retry (None), not miss
    assert manager.lookup(to_key(1), REQ) is None
    assert manager.lookup(to_key(2), REQ) is None
    verify_events(manager.take_events(), [])

    # complete store [1, 2] -> one stored event, now readable
    manager.complete_store(to_keys([1, 2]), REQ)
    verify_events(manager.take_events(), [ExpectedEvent([1, 2], removed=False)])
    assert manager.lookup(to_key(1), REQ) is True
    assert manager.lookup(to_key(3), REQ) is False

    # prepare store [2, 3, 4, 5] -> 2 is skipped, 3 slots needed, 2 free -> evicts [1] (id 0)
    output = manager.prepare_store(to_keys([2, 3, 4, 5]), REQ)
    verify_store_output(output, ExpectedPrepareStoreOutput([3, 4, 5], [2, 3, 0], [1]))
    verify_events(manager.take_events(), [ExpectedEvent([1], removed=True)])

    # prepare store [1, 6] -> only 2 is idle but 2 slots are needed -> None
    assert manager.prepare_store(to_keys([1, 6]), REQ) is None

    # complete store [2, 3, 4, 5] -> 2 was already stored: the event names only [3, 4, 5]
    manager.complete_store(to_keys([2, 3, 4, 5]), REQ)
    verify_events(manager.take_events(), [ExpectedEvent([3, 4, 5], removed=False)])

    # prepare load [2, 3] -> ids co-indexed with the keys
    verify_load_output(manager.prepare_load(to_keys([2, 3]), REQ), [1, 2])
    # prepare store [6, 7, 8] -> 2 and 3 are being read, only [4, 5] idle -> None
    assert manager.prepare_store(to_keys([6, 7, 8]), REQ) is None

    # complete load [2, 3] -> finishing a load is not a use: the order stays 2, 3, 4, 5
    manager.complete_load(to_keys([2, 3]), REQ)

    # prepare store [6, 7, 8] -> evicts [2, 3, 4] (ids 1, 2, 3) and reuses them last-freed-first
    output = manager.prepare_store(to_keys([6, 7, 8]), REQ)
    verify_store_output(output, ExpectedPrepareStoreOutput([6, 7, 8], [3, 2, 1], [2, 3, 4]))
    manager.complete_store(to_keys([6, 7, 8]), REQ)

    # touch [5, 6, 7] -> order 8, 7, 6, 5 (the first key ends most recent)
    manager.touch(to_keys([5, 6, 7]), REQ)
    output = manager.prepare_store(to_keys([9]), REQ)
    verify_store_output(output, ExpectedPrepareStoreOutput([9], [1], [8]))

    # complete store [7, 9] with failure -> 9 dropped (slot freed), 7 untouched, no event
    manager.complete_store(to_keys([7, 9]), REQ, success=False)
    assert manager.lookup(to_key(7), REQ) is True
    assert manager.lookup(to_key(9), REQ) is False
    assert manager.num_free_blocks == 1

    verify_events(
        manager.take_events(),
        [
            ExpectedEvent([2, 3, 4], removed=True),
            ExpectedEvent([6, 7, 8], removed=False),
            ExpectedEvent([8], removed=True),
        ],
    )


# --- block pool ---


@both_policies
def test_fresh_ids_first_then_freed_ids_last_freed_first(cache_policy: CachePolicyName) -> None:
    manager = make_manager(num_blocks=4, cache_policy=cache_policy)
    assert store(manager, [0, 1, 2, 3]) == [0, 1, 2, 3]
    # touch [0] -> 0 is the most recent (LRU) / frequent (ARC): keys 1, 2, 3 go first
    manager.touch(to_keys([0]), REQ)

    # evicting ids [1, 2, 3] then allocating 3 yields [3, 2, 1]
    output = manager.prepare_store(to_keys([4, 5, 6]), REQ)
    verify_store_output(output, ExpectedPrepareStoreOutput([4, 5, 6], [3, 2, 1], [1, 2, 3]))


@both_policies
def test_fresh_ids_are_used_before_freed_ones(cache_policy: CachePolicyName) -> None:
    manager = make_manager(num_blocks=4, cache_policy=cache_policy)
    # a failed store frees ids 0, 1 (in that order) while ids 2, 3 were never handed out
    manager.prepare_store(to_keys([1, 2]), REQ)
    manager.complete_store(to_keys([1, 2]), REQ, success=False)
    assert manager.num_free_blocks == 4

    assert store(manager, [3]) == [2]
    assert store(manager, [4]) == [3]
    assert store(manager, [5, 6]) == [1, 0]
    assert manager.num_free_blocks == 0


# --- prepare_store ---


@both_policies
def test_prepare_store_never_evicts_its_own_keys(cache_policy: CachePolicyName) -> None:
    manager = make_manager(num_blocks=4, cache_policy=cache_policy)
    store(manager, [1, 2])
    # touch [1] -> 2 is now the first eviction candidate
    manager.touch(to_keys([1]), REQ)

    # prepare store [2, 3, 4, 5] -> 2 is already stored and named, so 1 is evicted instead
    output = manager.prepare_store(to_keys([2, 3, 4, 5]), REQ)
    verify_store_output(output, ExpectedPrepareStoreOutput([3, 4, 5], [2, 3, 0], [1]))
    manager.complete_store(to_keys([2, 3, 4, 5]), REQ)
    assert manager.lookup(to_key(2), REQ) is True


@both_policies
def test_prepare_store_is_all_or_nothing(cache_policy: CachePolicyName) -> None:
    manager = make_manager(num_blocks=2, cache_policy=cache_policy)
    store(manager, [1, 2])
    before = snapshot(manager)

    # prepare store [1, 2, 3] -> 1 slot needed and 2 idle blocks, but both are named: None
    assert manager.prepare_store(to_keys([1, 2, 3]), REQ) is None
    assert snapshot(manager) == before
    verify_events(manager.take_events(), [ExpectedEvent([1, 2], removed=False)])


@both_policies
def test_prepare_store_fails_fast_without_asking_the_policy(
    cache_policy: CachePolicyName, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = make_manager(num_blocks=3, cache_policy=cache_policy)
    store(manager, [1, 2])
    manager.prepare_load(to_keys([1]), REQ)

    def must_not_be_called(n: int, protected: object) -> None:
        raise AssertionError(f"evict({n}) called although only 1 block is idle")

    monkeypatch.setattr(manager.policy, "evict", must_not_be_called)
    before = snapshot(manager)
    # prepare store [3, 4, 5] -> 3 slots needed, 1 free, 1 idle (2); 1 is being read -> None
    assert manager.prepare_store(to_keys([3, 4, 5]), REQ) is None
    assert snapshot(manager) == before


@both_policies
def test_prepare_store_of_present_keys_returns_an_empty_output(cache_policy: CachePolicyName) -> None:
    manager = make_manager(num_blocks=2, cache_policy=cache_policy)
    store(manager, [1])
    manager.prepare_store(to_keys([2]), REQ)  # 2 stays pending
    before = snapshot(manager)

    # prepare store [1, 2] -> 1 is stored and 2 in flight: nothing to do, but not None
    verify_store_output(manager.prepare_store(to_keys([1, 2]), REQ), ExpectedPrepareStoreOutput([], [], []))
    verify_store_output(manager.prepare_store([], REQ), ExpectedPrepareStoreOutput([], [], []))
    assert snapshot(manager) == before


@both_policies
def test_prepare_store_takes_one_slot_per_distinct_key(cache_policy: CachePolicyName) -> None:
    manager = make_manager(num_blocks=4, cache_policy=cache_policy)
    output = manager.prepare_store(to_keys([1, 2, 1, 2, 3]), REQ)
    verify_store_output(output, ExpectedPrepareStoreOutput([1, 2, 3], [0, 1, 2], []))
    assert manager.num_free_blocks == 1




@both_policies
def test_pending_blocks_are_never_evicted(cache_policy: CachePolicyName) -> None:
    manager = make_manager(num_blocks=2, cache_policy=cache_policy)
    manager.prepare_store(to_keys([1, 2]), REQ)
    # prepare store [3] -> both blocks pending -> None
    assert manager.prepare_store(to_keys([3]), REQ) is None
    manager.complete_store(to_keys([2]), REQ)
    # prepare store [3] -> evicts 2, never the still-pending 1
    verify_store_output(manager.prepare_store(to_keys([3]), REQ), ExpectedPrepareStoreOutput([3], [1], [2]))


# --- lookup and loads ---


@both_policies
def test_lookup_reports_in_flight_stores_as_retry(cache_policy: CachePolicyName) -> None:
    manager = make_manager(cache_policy=cache_policy)
    assert manager.lookup(to_key(1), REQ) is False
    manager.prepare_store(to_keys([1]), REQ)
    assert manager.lookup(to_key(1), REQ) is None
    manager.complete_store(to_keys([1]), REQ)
    assert manager.lookup(to_key(1), REQ) is True
    manager.prepare_load(to_keys([1]), REQ)
    assert manager.lookup(to_key(1), REQ) is True


@both_policies
def test_load_specs_are_co_indexed_with_the_keys(cache_policy: CachePolicyName) -> None:
    manager = make_manager(cache_policy=cache_policy)
    block_ids = dict(zip([1, 2, 3], store(manager, [1, 2, 3])))
    for order in ([1, 2, 3], [2, 3, 1], [3, 1, 2]):
        spec = manager.prepare_load(to_keys(order), REQ)
        verify_load_output(spec, [block_ids[i] for i in order])
        manager.complete_load(to_keys(reversed(order)), REQ)  # completion order is irrelevant
    assert manager.num_idle_blocks == 3


@both_policies
def test_loads_stack_and_protect_blocks(cache_policy: CachePolicyName) -> None:
    manager = make_manager(num_blocks=1, cache_policy=cache_policy)
    store(manager, [1])
    # two loads of 1 (one with the key twice) -> ref_cnt 3
    manager.prepare_load(to_keys([1]), REQ)
    manager.prepare_load(to_keys([1, 1]), REQ)
    block = manager.policy.get(to_key(1))
    assert block is not None and block.ref_cnt == 3
    assert manager.num_idle_blocks == 0
    assert manager.prepare_store(to_keys([2]), REQ) is None

    manager.complete_load(to_keys([1, 1]), REQ)
    assert manager.prepare_store(to_keys([2]), REQ) is None  # still read once
    manager.complete_load(to_keys([1]), REQ)
    assert manager.num_idle_blocks == 1
    verify_store_output(manager.prepare_store(to_keys([2]), REQ), ExpectedPrepareStoreOutput([2], [0], [1]))


# --- complete_store ---


@both_policies
def test_complete_store_is_idempotent_and_ignores_unknown_keys(cache_policy: CachePolicyName) -> None:
    manager = make_manager(cache_policy=cache_policy)
    manager.prepare_store(to_keys([1, 2]), REQ)
    # a superset, with a repeat and an unknown key -> one event for the blocks finalized
    manager.complete_store(to_keys([1, 2, 2, 9]), REQ)
    manager.complete_store(to_keys([1, 2]), REQ)
    manager.complete_store(to_keys([1]), REQ, success=False)  # ready blocks survive failures
    verify_events(manager.take_events(), [ExpectedEvent([1, 2], removed=False)])
    assert manager.num_idle_blocks == 2
    assert manager.lookup(to_key(1), REQ) is True


@both_policies
@pytest.mark.parametrize("success", [True, False])
def test_completing_no_pending_block_changes_nothing(cache_policy: CachePolicyName, success: bool) -> None:
    manager = make_manager(num_blocks=4, cache_policy=cache_policy, enable_events=True)
    store(manager, [1, 2])
    manager.take_events()
    before, stats = snapshot(manager), manager.get_stats()
    # already stored, never prepared, both, as a list and as other collections
    for keys in (to_keys([1]), to_keys([9]), to_keys([2, 9, 1]), tuple(to_keys([1, 9])), set(to_keys([2]))):
        manager.complete_store(keys, REQ, success=success)
    assert manager.get_stats() == stats  # (before snapshot, whose lookups count)
    assert snapshot(manager) == before
    assert manager.take_events() == []


@both_policies
def test_failed_store_frees_its_pending_blocks_silently(cache_policy: CachePolicyName) -> None:
    manager = make_manager(num_blocks=3, cache_policy=cache_policy)
    store(manager, [1])
    manager.prepare_store(to_keys([2, 3]), REQ)
    manager.complete_store(to_keys([1, 2, 3]), REQ, success=False)
    assert [manager.lookup(key, REQ) for key in to_keys([1, 2, 3])] == [True, False, False]
    assert manager.num_free_blocks == 2
    verify_events(manager.take_events(), [ExpectedEvent([1], removed=False)])
    # the freed ids come back last-freed-first
    assert store(manager, [4, 5]) == [2, 1]


# --- events ---


@both_policies
def test_events_are_buffered_only_when_enabled(cache_policy: CachePolicyName) -> None:
    manager = make_manager(num_blocks=1, cache_policy=cache_policy, enable_events=False)
    store(manager, [1])
    store(manager, [2])  # evicts 1
    assert list(manager.take_events()) == []


@both_policies
def test_one_removal_event_per_evicting_store_before_its_stored_event(
    cache_policy: CachePolicyName,
) -> None:
    manager = make_manager(num_blocks=2, cache_policy=cache_policy)
    store(manager, [1, 2])
    store(manager, [3, 4])  # evicts both in one call
    store(manager, [5])
    verify_events(
        manager.take_events(),
        [
            ExpectedEvent([1, 2], removed=False),
            ExpectedEvent([1, 2], removed=True),
            ExpectedEvent([3, 4], removed=False),
            ExpectedEvent([3], removed=True),
            ExpectedEvent([5], removed=False),
        ],
    )
    verify_events(manager.take_events(), [])  # drained


# --- lifecycle ---


@both_policies
def test_reset_cache_empties_everything(cache_policy: CachePolicyName) -> None:
    manager = make_manager(num_blocks=3, cache_policy=cache_policy)
    store(manager, [1, 2, 3])
    manager.touch(to_keys([1, 2]), REQ)
    manager.prepare_load(to_keys([2]), REQ)
    manager.prepare_store(to_keys([4]), REQ)  # evicts 3, 4 pending

    manager.reset_cache()
    assert snapshot(manager) == snapshot(make_manager(num_blocks=3, cache_policy=cache_policy))
    verify_events(manager.take_events(), [])
    # fresh ids restart at 0
    assert store(manager, [5, 6, 7]) == [0, 1, 2]


@both_policies
def test_request_hooks(cache_policy: CachePolicyName) -> None:
    manager = make_manager(cache_policy=cache_policy)
    context = manager.on_new_request(REQ)
    assert context == RequestOffloadingContext()
    assert context.policy is OffloadPolicy.BLOCK_LEVEL
    manager.on_request_finished(REQ)
    manager.shutdown()


# --- protocol misuse: an error naming the key and its state, and nothing changed ---


@pytest.mark.parametrize(
    ("pending", "keys", "bad", "state"),
    [
        pytest.param([], [1, 4], 4, "absent", id="absent"),
        pytest.param([2], [1, 2, 4], 2, "pending", id="pending"),
    ],
)
@both_policies
def test_prepare_load_of_an_unready_block_is_refused(
    cache_policy: CachePolicyName, pending: list[int], keys: list[int], bad: int, state: str
) -> None:
    manager = make_manager(cache_policy=cache_policy)
    store(manager, [1, 3])
    manager.prepare_store(to_keys(pending), REQ)
    before = snapshot(manager)

    # the good keys listed before the bad one must not stay pinned
    with pytest.raises(OffloadProtocolError) as caught:
        manager.prepare_load(to_keys([3, *keys]), REQ)
    assert (caught.value.operation, caught.value.key, caught.value.state) == (
        "prepare_load",
        to_key(bad),
        state,
    )
    assert f"key {to_key(bad).hex()} is {state}" in str(caught.value)
    assert snapshot(manager) == before


@pytest.mark.parametrize(
    ("keys", "bad", "state"),
    [
        pytest.param([2], 2, "idle", id="never-loaded"),
        pytest.param([9], 9, "absent", id="absent"),
        pytest.param([3], 3, "pending", id="pending"),
        pytest.param([1, 1, 1], 1, "reading(2)", id="more-completions-than-loads"),
        pytest.param([2, 9], 2, "idle", id="first-bad-key-is-reported"),
    ],
)
@both_policies
def test_complete_load_without_a_prepared_load_is_refused(
    cache_policy: CachePolicyName, keys: list[int], bad: int, state: str
) -> None:
    manager = make_manager(cache_policy=cache_policy)
    store(manager, [1, 2])
    manager.prepare_store(to_keys([3]), REQ)
    manager.prepare_load(to_keys([1, 1]), REQ)
    before = snapshot(manager)

    with pytest.raises(OffloadProtocolError) as caught:
        manager.complete_load(to_keys([1, *keys]), REQ)
    assert (caught.value.operation, caught.value.key, caught.value.state) == (
        "complete_load",
        to_key(bad),
        state,
    )
    assert to_key(bad).hex() in str(caught.value)
    assert snapshot(manager) == before


# --- configuration ---


@pytest.mark.parametrize("num_blocks", [0, -1, 2.5, "4", True])
def test_num_blocks_must_be_a_positive_integer(num_blocks: Any) -> None:
    with pytest.raises(ValueError, match=rf"num_blocks must be an integer >= 1, got {num_blocks!r}"):
        CPUOffloadingManager(num_blocks)


def test_unknown_policy_is_rejected() -> None:
    message = r"cache_policy 'fifo' is not registered; registered cache policies: arc, lru"
    with pytest.raises(ValueError, match=message):
        CPUOffloadingManager(4, cache_policy="fifo")


def test_policy_is_built_from_its_name() -> None:
    manager = make_manager(num_blocks=7, cache_policy="arc")
    assert isinstance(manager.policy, ARCCachePolicy)
    assert manager.policy.cache_capacity == 7
    assert manager.num_blocks == 7


# --- bad input (issue 13 point 4) and statistics (point 6) ---


@pytest.mark.parametrize("operation", ["prepare_store", "prepare_load", "complete_load", "complete_store", "touch"])
def test_a_single_bytes_key_is_a_type_error(operation: str) -> None:
    manager = make_manager(num_blocks=4, cache_policy="lru")
    store(manager, [1])
    before = snapshot(manager)
    with pytest.raises(TypeError, match=rf"{operation}: keys must be a collection of OffloadKey, got a single bytes"):
        getattr(manager, operation)(to_key(1), REQ)
    assert snapshot(manager) == before


class _ShortEvictingPolicy(LRUCachePolicy):
    """Evicts one block fewer than asked for (a buggy out-of-tree policy)."""

    @override
    def evict(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        victims = super().evict(n, protected)
        if not victims:
            return victims
        kept_key, kept_block = victims.pop()
        self.insert(kept_key, kept_block)
        return victims


def test_a_policy_that_evicts_too_few_blocks_refuses_the_store() -> None:
    manager = make_manager(num_blocks=2, cache_policy="lru")
    store(manager, [1, 2])
    manager._policy = _ShortEvictingPolicy(2)  # pyright: ignore[reportPrivateUsage]
    # Rebuild the same two idle blocks inside the buggy policy.
    for key, block_id in zip(to_keys([1, 2]), [0, 1]):
        block = BlockStatus(block_id)
        block.ref_cnt = 0
        manager.policy.insert(key, block)
    idle_before, free_before = manager.num_idle_blocks, manager.num_free_blocks
    assert manager.prepare_store(to_keys([3, 4]), REQ) is None
    assert (manager.num_idle_blocks, manager.num_free_blocks) == (idle_before, free_before)
    assert [manager.lookup(key, REQ) for key in to_keys([1, 2, 3, 4])] == [True, True, False, False]
    assert manager.get_stats().stores_refused == 1


def test_stats_count_lookups_transfers_and_usage() -> None:
    manager = make_manager(num_blocks=2, cache_policy="lru")
    assert manager.get_stats() == OffloadingStats(num_blocks=2)
    store(manager, [1, 2])
    manager.prepare_store(to_keys([3]), REQ)  # evicts 1, 3 pending
    manager.lookup(to_key(2), REQ)
    manager.lookup(to_key(3), REQ)
    manager.lookup(to_key(9), REQ)
    manager.prepare_load(to_keys([2]), REQ)
    assert manager.prepare_store(to_keys([4]), REQ) is None  # 2 read, 3 pending
    stats = manager.get_stats()
    assert (stats.lookups, stats.hits, stats.pending, stats.misses) == (3, 1, 1, 1)
    assert (stats.blocks_stored, stats.blocks_loaded, stats.blocks_evicted) == (2, 1, 1)
    assert stats.stores_refused == 1
    assert (stats.num_blocks, stats.used_blocks, stats.usage) == (2, 2, 1.0)
    assert stats.tiers == {}
    manager.reset_cache()
    assert manager.get_stats().used_blocks == 0
    assert manager.get_stats().blocks_stored == 2  # counters are cumulative


def test_accesses_after_the_finish_are_ignored_not_asserted() -> None:
    """Divergence from vLLM, which asserts: a late store of a finished request still works."""
    manager = make_manager(num_blocks=3, cache_policy="lru")
    request = ReqContext("late")
    store(manager, [1], request)
    manager.on_request_finished(request)
    order = eviction_order(manager)
    output = manager.prepare_store(to_keys([2]), request)  # after the finish
    verify_store_output(output, ExpectedPrepareStoreOutput([2], [1], []))
    manager.complete_store(to_keys([2]), request)
    manager.on_request_finished(request)  # a second finish commits nothing
    assert eviction_order(manager) == order + to_keys([2])


def test_a_refused_store_still_records_the_request_access() -> None:
    """As in vLLM: the request named the keys, so its finish commits them (here: ARC's reuse)."""
    manager = make_manager(num_blocks=2, cache_policy="arc")
    early, late = ReqContext("early"), ReqContext("late")
    store(manager, [1], early)
    store(manager, [2], late)
    manager.prepare_load(to_keys([2]), late)  # its own block: an internal re-read, not a reuse
    assert manager.prepare_store(to_keys([2, 3, 4]), early) is None  # no room: 2 is being read
    manager.complete_load(to_keys([2]), late)
    manager.on_request_finished(late)
    policy = manager.policy
    assert isinstance(policy, ARCCachePolicy)
    assert list(policy.t2) == []
    manager.on_request_finished(early)  # early offered 2 while it was ready: a reuse
    assert list(policy.t2) == to_keys([2])


# --- fast paths (issue 16): they change no answer ---


class _GetOnlyLRU(LRUCachePolicy):
    """LRU without a block map: the manager must go through `get` (an out-of-tree policy)."""

    @override
    def block_map(self) -> None:  # pyright: ignore[reportIncompatibleMethodOverride]
        return None


class _GetOnlyARC(ARCCachePolicy):
    @override
    def block_maps(self) -> tuple[Mapping[OffloadKey, BlockStatus], ...]:
        return ()


def _drive(manager: CPUOffloadingManager) -> list[object]:
    """A fixed program of stores, loads, touches and evictions; every answer, in order."""
    answers: list[object] = []
    for index, ints in enumerate([[1, 2, 3], [2, 3, 4, 5], [1, 6], [7, 8, 2], [3, 9, 1]]):
        request = ReqContext(f"r{index}")
        for position, key in enumerate(to_keys(ints), start=1):
            request.set_offload_key_position(key, 16 * position)
        manager.on_new_request(request)
        hits = [manager.lookup(key, request) for key in to_keys(ints)]
        answers.append(hits)
        ready = [key for key, hit in zip(to_keys(ints), hits) if hit]
        if ready:
            answers.append(manager.prepare_load(ready, request).block_ids.tolist())
        manager.touch(to_keys(ints), request)
        output = manager.prepare_store(to_keys(ints), request)
        answers.append(None if output is None else (output.keys_to_store, output.evicted_keys))
        if output is not None:
            manager.complete_store(output.keys_to_store, request)
        if ready:
            manager.complete_load(ready, request)
        manager.on_request_finished(request)
    answers.append(eviction_order(manager))
    answers.append(manager.get_stats())
    return answers


@pytest.mark.parametrize(("cache_policy", "get_only"), [("lru", _GetOnlyLRU), ("arc", _GetOnlyARC)])
def test_a_policy_without_a_block_map_gives_the_same_answers(
    cache_policy: CachePolicyName, get_only: type[LRUCachePolicy] | type[ARCCachePolicy]
) -> None:
    fast = make_manager(num_blocks=5, cache_policy=cache_policy)
    slow = make_manager(num_blocks=5, cache_policy=cache_policy)
    slow._policy = get_only(5)  # pyright: ignore[reportPrivateUsage]
    assert _drive(slow) == _drive(fast)
    with pytest.raises(OffloadProtocolError):
        slow.prepare_load(to_keys([42]), REQ)


def test_a_slot_keeps_its_block_status_and_a_reused_slot_starts_pending() -> None:
    manager = make_manager(num_blocks=2)
    store(manager, [1, 2])
    first = manager.policy.get(to_key(1))
    assert first is not None and first.ref_cnt == 0
    output = manager.prepare_store(to_keys([3]), REQ)  # evicts 1: its slot is reused
    assert output is not None and output.evicted_keys == to_keys([1])
    assert manager.policy.get(to_key(3)) is first
    assert isinstance(output.store_spec, CPULoadStoreSpec)
    assert (first.block_id, first.ref_cnt) == (output.store_spec.block_ids.tolist()[0], -1)
    assert manager.lookup(to_key(3), REQ) is None  # pending, as a fresh block would be


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_copied_or_unpickled_manager_looks_up_its_own_blocks(policy: CachePolicyName) -> None:
    import pickle

    manager = CPUOffloadingManager(4, policy)
    output = manager.prepare_store(to_keys([1]), REQ)
    assert output is not None
    manager.complete_store(to_keys([1]), REQ)
    assert manager.lookup(to_key(1), REQ) is True
    stats = manager.get_stats()
    for twin in (copy.deepcopy(manager), pickle.loads(pickle.dumps(manager))):
        assert twin.get_stats() == stats  # the lookup counts come along
        twin.reset_cache()
        assert twin.lookup(to_key(1), REQ) is False  # its own (now empty) blocks
        assert manager.lookup(to_key(1), REQ) is True  # the original keeps its own
        assert twin.get_stats().misses == 1


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_copied_or_unpickled_manager_touches_its_own_blocks(policy: CachePolicyName) -> None:
    import pickle

    # Blocks 1 and 2 stored in that order: 1 is the least recent, the first to go.
    manager = CPUOffloadingManager(2, policy)
    for block in (1, 2):
        assert manager.prepare_store(to_keys([block]), REQ) is not None
        manager.complete_store(to_keys([block]), REQ)
    for twin in (copy.deepcopy(manager), pickle.loads(pickle.dumps(manager))):
        twin.touch(to_keys([1]), REQ)  # the twin's 1 becomes its most recent block
        twin_output = twin.prepare_store(to_keys([3]), REQ)
        assert twin_output is not None and twin_output.evicted_keys == to_keys([2])
    # The original was not touched: 1 is still its least recent block.
    output = manager.prepare_store(to_keys([3]), REQ)
    assert output is not None and output.evicted_keys == to_keys([1])


def test_a_subclass_that_overrides_touch_is_called() -> None:
    touched: list[list[OffloadKey]] = []

    class Recording(CPUOffloadingManager):
        @override
        def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
            touched.append(list(keys))
            super().touch(keys, req_context)

    manager = Recording(2, "lru")
    manager.touch(to_keys([1]), REQ)
    assert touched == [to_keys([1])]
    with pytest.raises(TypeError, match="touch"):
        manager.touch(to_key(1), REQ)  # pyright: ignore[reportArgumentType]  # super() checks a single key


def test_a_finishing_request_passes_one_key_list_per_kv_cache_group(monkeypatch: pytest.MonkeyPatch) -> None:
    # While every key offered had one group suffix, the manager knows a request's keys are one
    # group without checking each; the first key of another group, stored or refused, ends that.
    manager = CPUOffloadingManager(2, "lru")
    finished: list[list[list[OffloadKey]]] = []
    original = manager.policy.on_request_finished

    def record(key_groups: Any, insertion_only_keys: Any, reused_keys: Any, req_context: ReqContext) -> None:
        finished.append([list(group) for group in key_groups])
        original(key_groups, insertion_only_keys, reused_keys, req_context)

    monkeypatch.setattr(manager.policy, "on_request_finished", record)

    def key(block: int, group: int) -> OffloadKey:
        return make_offload_key(block.to_bytes(8, "big"), group)

    def request(name: str, keys: list[OffloadKey]) -> PrepareStoreOutput | None:
        context = ReqContext(name)
        manager.on_new_request(context)
        output = manager.prepare_store(keys, context)
        manager.on_request_finished(context)
        return output

    assert request("group 0", [key(1, 0), key(2, 0)]) is not None  # both slots, pending
    assert request("refused", [key(3, 0), key(3, 1)]) is None  # no idle slot to evict
    assert finished == [[[key(1, 0), key(2, 0)]], [[key(3, 0)], [key(3, 1)]]]
    manager.complete_store([key(1, 0), key(2, 0)], ReqContext("worker"))
    assert request("stored", [key(4, 1), key(4, 0)]) is not None
    assert finished[-1] == [[key(4, 0)], [key(4, 1)]]
