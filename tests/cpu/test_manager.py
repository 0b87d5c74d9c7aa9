"""Scenario tests of `CPUOffloadingManager` where vLLM 0.33's own tests (which also run against
kvref: `tools/vllm_suite.py --kvref`) say nothing: collections of keys, misuse, events, the reuse
filter, statistics and configuration. Keys are small integers; comments state each transition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvref.base import (
    CacheHitSource,
    LoadStoreSpec,
    LookupResult,
    OffloadPolicy,
    PrepareStoreOutput,
    ReqContext,
    ScheduleEndContext,
)
from kvref.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from kvref.cpu.common import CPULoadStoreSpec, CPUOffloadingInfo, CPUOffloadingMetrics
from kvref.cpu.manager import CPUOffloadingManager
from kvref.errors import OffloadProtocolError
from tests.cpu.keys import COLLECTIONS, to_key, to_keys
from tests.cpu.manager_state import describe_events, eviction_order, observe

REQ = ReqContext("req-0")
both_policies = pytest.mark.parametrize("cache_policy", ["lru", "arc"])


def make_manager(
    num_chunks: int = 4,
    cache_policy: str = "lru",
    enable_events: bool = True,
    store_threshold: int = 1,
    max_tracker_size: int = 64_000,
    info: CPUOffloadingInfo | None = None,
) -> CPUOffloadingManager:
    return CPUOffloadingManager(
        num_chunks=num_chunks,
        cache_policy=cache_policy,
        enable_events=enable_events,
        store_threshold=store_threshold,
        max_tracker_size=max_tracker_size,
        info=info,
    )


@dataclass
class ExpectedPrepareStoreOutput:
    keys_to_store: list[int]
    store_chunk_ids: list[int]
    evicted_keys: list[int]


@dataclass
class ExpectedEvent:
    keys: list[int]
    removed: bool
    metadata_only: bool = False


def verify_store_output(output: PrepareStoreOutput | None, expected: ExpectedPrepareStoreOutput) -> None:
    assert output is not None
    assert output.keys_to_store == to_keys(expected.keys_to_store)
    assert output.evicted_keys == to_keys(expected.evicted_keys)
    assert isinstance(output.store_spec, CPULoadStoreSpec)
    assert output.store_spec.chunk_ids.tolist() == expected.store_chunk_ids


def verify_load_output(spec: LoadStoreSpec, expected_chunk_ids: list[int]) -> None:
    assert isinstance(spec, CPULoadStoreSpec)
    assert spec.chunk_ids.tolist() == expected_chunk_ids


def verify_events(manager: CPUOffloadingManager, expected: list[ExpectedEvent]) -> None:
    """Drain the manager's events and compare them, in order."""
    assert describe_events(manager.take_events()) == [(to_keys(e.keys), e.removed, e.metadata_only) for e in expected]


def verify_unchanged(manager: CPUOffloadingManager, call: Callable[[], object], *requests: ReqContext) -> Exception:
    """`call` must raise and leave everything observable as it was; returns the error."""
    before = observe(manager, to_keys(range(10)), requests or (REQ,))
    with pytest.raises((OffloadProtocolError, TypeError)) as caught:
        call()
    assert observe(manager, to_keys(range(10)), requests or (REQ,)) == before
    return caught.value


def store(manager: CPUOffloadingManager, ints: Iterable[int], request: ReqContext = REQ) -> list[int]:
    """Prepare and complete a store of `ints`; return the chunk ids it was given."""
    keys = to_keys(ints)
    output = manager.prepare_store(keys, request)
    assert output is not None and isinstance(output.store_spec, CPULoadStoreSpec)
    manager.complete_store(keys, request)
    return output.store_spec.chunk_ids.tolist()


def reduced_stats(manager: CPUOffloadingManager) -> dict[str, int | float]:
    return manager.get_stats().reduce()


# --- keys: any collection, never a single key ---


@pytest.mark.parametrize("container", COLLECTIONS)
def test_every_keyed_call_takes_any_collection_of_keys(container: str) -> None:
    manager = make_manager()
    keys = COLLECTIONS[container](to_keys([1, 2, 3]))
    order = list(keys)  # a set's order, whatever it is: specs follow iteration order
    # prepare store {1, 2, 3} -> fresh ids 0, 1, 2 in iteration order
    output = manager.prepare_store(keys, REQ)
    assert output is not None and output.keys_to_store == order
    manager.complete_store(keys, REQ)
    # prepare load {1, 2, 3} -> the ids it was stored to, co-indexed with the keys
    verify_load_output(manager.prepare_load(keys, REQ), [0, 1, 2])
    manager.touch(keys, REQ)
    manager.complete_load(keys, REQ)
    # every chunk is idle again: a store of 4 new keys evicts the three
    assert describe_events(manager.take_events()) == [(order, False, False)]
    output = manager.prepare_store(to_keys([4, 5, 6, 7]), REQ)
    assert output is not None and sorted(output.evicted_keys) == to_keys([1, 2, 3])


@pytest.mark.parametrize("operation", ["prepare_store", "prepare_load", "touch", "complete_load", "complete_store"])
@pytest.mark.parametrize(
    "single", [to_key(1), to_key(1).hex(), bytearray(to_key(1))], ids=["bytes", "str", "bytearray"]
)
def test_a_single_key_is_a_type_error_naming_the_call(operation: str, single: object) -> None:
    manager = make_manager()
    store(manager, [1])
    manager.prepare_load(to_keys([1]), REQ)
    error = verify_unchanged(manager, lambda: getattr(manager, operation)(single, REQ))
    assert isinstance(error, TypeError)
    assert str(error).startswith(f"{operation}: keys must be a collection of OffloadKey, got a single")


# --- misuse: OffloadProtocolError, and nothing changed ---


@both_policies
@pytest.mark.parametrize(
    ("pending", "keys", "bad", "state"),
    [
        pytest.param([], [1, 9], 9, "absent", id="absent"),
        pytest.param([2], [1, 2], 2, "pending", id="pending"),
    ],
)
def test_prepare_load_of_an_unreadable_chunk_is_refused(
    cache_policy: str, pending: list[int], keys: list[int], bad: int, state: str
) -> None:
    manager = make_manager(cache_policy=cache_policy)
    store(manager, [1, 3])
    manager.prepare_store(to_keys(pending), REQ)
    # prepare load [3, 1, bad] -> refused at `bad`; 3 and 1, listed first, stay unpinned
    error = verify_unchanged(manager, lambda: manager.prepare_load(to_keys([3, *keys]), REQ))
    assert isinstance(error, OffloadProtocolError)
    assert (error.operation, error.key, error.state) == ("prepare_load", to_key(bad), state)
    assert f"prepare_load: key {to_key(bad).hex()} is {state}" in str(error)


@both_policies
@pytest.mark.parametrize(
    ("keys", "bad", "state"),
    [
        pytest.param([2], 2, "read by 0 loads", id="never-loaded"),
        pytest.param([9], 9, "absent", id="absent"),
        pytest.param([3], 3, "read by 0 loads", id="pending"),
        pytest.param([1, 1], 1, "read by 2 loads", id="more-completions-than-loads"),
    ],
)
def test_complete_load_without_its_load_is_refused(cache_policy: str, keys: list[int], bad: int, state: str) -> None:
    manager = make_manager(cache_policy=cache_policy)
    store(manager, [1, 2])
    manager.prepare_store(to_keys([3]), REQ)
    manager.prepare_load(to_keys([1, 1]), REQ)  # 1 is read by two loads
    # complete load [1, ...] -> refused; the first 1 is not released either
    error = verify_unchanged(manager, lambda: manager.complete_load(to_keys([1, *keys]), REQ))
    assert isinstance(error, OffloadProtocolError)
    assert (error.operation, error.key, error.state) == ("complete_load", to_key(bad), state)


@both_policies
def test_a_finished_request_may_not_name_new_keys(cache_policy: str) -> None:
    manager = make_manager(cache_policy=cache_policy)
    request, other = ReqContext("done"), ReqContext("other")
    store(manager, [1], request)
    store(manager, [2], other)
    manager.on_request_finished(request)

    # prepare store [3] / prepare load [2] by the finished request -> refused, naming it
    for operation, ints in (("prepare_store", [3]), ("prepare_load", [2])):
        call = getattr(manager, operation)
        error = verify_unchanged(manager, lambda: call(to_keys(ints), request), request, other)
        assert isinstance(error, OffloadProtocolError)
        assert (error.operation, error.key, error.state) == (operation, None, "finished")
        assert str(error) == f"{operation}: request is finished (request 'done' already finished)"

    # keys it named before are accepted, as in vLLM: a load of 1, a store of 1 (present)
    verify_load_output(manager.prepare_load(to_keys([1]), request), [0])
    verify_store_output(manager.prepare_store(to_keys([1]), request), ExpectedPrepareStoreOutput([], [], []))
    # completions and touches of a finished request still arrive
    manager.complete_load(to_keys([1]), request)
    manager.touch(to_keys([2]), request)
    manager.complete_store(to_keys([1]), request)


def test_lru_a_chunk_stored_after_its_request_finished_is_a_fresh_use() -> None:
    """Differs from vLLM 0.33 (docs/VLLM_DIFFERENCES.md): vLLM ranks it at the request's old
    provisional rank, older than every use since; kvref's finished request has no rank left."""
    manager = make_manager(num_chunks=4)
    request = ReqContext("a")
    for position, key in enumerate(to_keys([0, 1]), start=1):
        request.set_offload_key_position(key, 16 * position)
    manager.on_new_request(request)
    manager.prepare_store(to_keys([0, 1]), request)
    manager.complete_store(to_keys([0]), request)
    manager.complete_store(to_keys([1]), request, success=False)  # 1 named, then dropped
    manager.on_request_finished(request)
    store(manager, [2], ReqContext("b"))
    # store [1] by the finished request (a key it named) -> the most recent chunk
    store(manager, [1], request)
    assert eviction_order(manager) == to_keys([0, 2, 1])  # vLLM: [1, 0, 2]


# --- events ---


def test_without_events_there_is_nothing_to_take() -> None:
    manager = make_manager(enable_events=False)
    store(manager, [1, 2])
    manager.prepare_store(to_keys([3]), REQ)
    manager.complete_store(to_keys([3]), REQ, success=False)
    assert manager.events is None
    assert list(manager.take_events()) == []


@both_policies
def test_an_eviction_is_announced_before_the_store_that_reuses_its_slot(cache_policy: str) -> None:
    manager = make_manager(num_chunks=2, cache_policy=cache_policy)
    store(manager, [1, 2])
    # complete store [1, 2] -> one stored event on the CPU medium
    verify_events(manager, [ExpectedEvent([1, 2], removed=False)])
    # prepare store [3] -> evicts 1 (slot 0); complete store [3] into that slot
    verify_store_output(manager.prepare_store(to_keys([3]), REQ), ExpectedPrepareStoreOutput([3], [0], [1]))
    manager.complete_store(to_keys([3]), REQ)
    verify_events(manager, [ExpectedEvent([1], removed=True), ExpectedEvent([3], removed=False)])


@both_policies
def test_a_failed_store_is_a_metadata_only_removal(cache_policy: str) -> None:
    manager = make_manager(cache_policy=cache_policy)
    store(manager, [1])
    manager.prepare_store(to_keys([2, 3]), REQ)
    # complete store [1, 2, 3] with failure -> 2 and 3 dropped (slots freed), ready 1 untouched
    manager.complete_store(to_keys([1, 2, 3]), REQ, success=False)
    lookups = [manager.lookup(key, REQ) for key in to_keys([1, 2, 3])]
    assert lookups == [LookupResult.HIT, LookupResult.MISS, LookupResult.MISS]
    verify_events(manager, [ExpectedEvent([1], removed=False), ExpectedEvent([2, 3], removed=True, metadata_only=True)])


@both_policies
def test_take_events_drops_the_cleanup_of_keys_stored_again(cache_policy: str) -> None:
    manager = make_manager(cache_policy=cache_policy)
    manager.prepare_store(to_keys([1, 2]), REQ)
    manager.complete_store(to_keys([1, 2]), REQ, success=False)
    manager.prepare_store(to_keys([3]), REQ)
    manager.complete_store(to_keys([3]), REQ, success=False)
    # a retry allocates 1 and 3 again before the events are taken
    manager.prepare_store(to_keys([1, 3]), REQ)
    # -> the cleanup of [1, 2] names 2 only; the cleanup of [3] is dropped entirely
    verify_events(manager, [ExpectedEvent([2], removed=True, metadata_only=True)])


def test_a_drain_abandoned_half_way_takes_the_whole_batch() -> None:
    manager = make_manager(num_chunks=1)
    store(manager, [1])
    store(manager, [2])  # evicts 1
    events = iter(manager.take_events())
    assert describe_events([next(events)]) == [(to_keys([1]), False, False)]
    del events
    # the rest of that batch is gone: events are never replayed
    verify_events(manager, [])
    manager.complete_store(to_keys([2]), REQ)  # already stored: no new event
    verify_events(manager, [])


# --- the reuse filter (store_threshold, max_tracker_size) ---


def test_a_chunk_is_stored_once_offered_store_threshold_times() -> None:
    manager = make_manager(store_threshold=3)
    # offer [1, 2] twice (a key twice in one offer counts once) -> nothing stored, 4 skips
    for offer in ([1, 2, 1], [2, 1]):
        verify_store_output(manager.prepare_store(to_keys(offer), REQ), ExpectedPrepareStoreOutput([], [], []))
    assert reduced_stats(manager)[CPUOffloadingMetrics.STORES_SKIPPED] == 4
    # third offer of [1, 2], first of 3 -> 1 and 2 stored, 3 skipped
    verify_store_output(manager.prepare_store(to_keys([1, 2, 3]), REQ), ExpectedPrepareStoreOutput([1, 2], [0, 1], []))
    # the counter holds the skips since the last get_stats
    assert reduced_stats(manager)[CPUOffloadingMetrics.STORES_SKIPPED] == 1
    assert reduced_stats(manager)[CPUOffloadingMetrics.STORES_SKIPPED] == 0


def test_skipped_offers_take_no_room_and_evict_nothing() -> None:
    manager = make_manager(num_chunks=2, store_threshold=2)
    for _ in range(2):
        manager.prepare_store(to_keys([1, 2]), REQ)
    manager.complete_store(to_keys([1, 2]), REQ)
    verify_events(manager, [ExpectedEvent([1, 2], removed=False)])
    # offer [3, 4] once -> skipped: the full cache evicts nothing, and the answer is not None
    verify_store_output(manager.prepare_store(to_keys([3, 4]), REQ), ExpectedPrepareStoreOutput([], [], []))
    verify_events(manager, [])
    # offer [3] again -> stored, evicting the least recent chunk, 1
    verify_store_output(manager.prepare_store(to_keys([3]), REQ), ExpectedPrepareStoreOutput([3], [0], [1]))


def test_a_resident_chunk_offered_again_is_never_skipped() -> None:
    manager = make_manager(store_threshold=2, max_tracker_size=1)
    manager.prepare_store(to_keys([1]), REQ)
    store(manager, [1])
    manager.prepare_store(to_keys([2]), REQ)  # the tracker of one forgets 1
    assert manager.counts is not None and list(manager.counts) == to_keys([2])
    reduced_stats(manager)
    # offer [1] -> stored already: nothing to store and nothing skipped
    verify_store_output(manager.prepare_store(to_keys([1]), REQ), ExpectedPrepareStoreOutput([], [], []))
    assert reduced_stats(manager)[CPUOffloadingMetrics.STORES_SKIPPED] == 0


def test_the_tracker_forgets_the_least_recently_offered_keys_first() -> None:
    manager = make_manager(store_threshold=2, max_tracker_size=2)
    for offer in ([1], [2], [1], [3]):
        manager.prepare_store(to_keys(offer), REQ)
    # offers 1, 2, 1, 3 -> 2 was offered least recently: forgotten when 3 came
    assert manager.counts is not None
    assert list(manager.counts.items()) == [(to_key(1), 2), (to_key(3), 1)]


def test_the_tracker_never_forgets_a_key_of_the_current_offer() -> None:
    manager = make_manager(store_threshold=3, max_tracker_size=2)
    manager.prepare_store(to_keys([1, 2]), REQ)
    # offer [1, 2, 3] with room for two -> 1 and 2 are counted again, 3 is not tracked
    manager.prepare_store(to_keys([1, 2, 3]), REQ)
    assert manager.counts is not None
    assert list(manager.counts.items()) == [(to_key(1), 2), (to_key(2), 2)]
    # offer [3, 1] -> 1 stays (offered now), 2 makes room for 3
    manager.prepare_store(to_keys([3, 1]), REQ)
    assert list(manager.counts.items()) == [(to_key(1), 3), (to_key(3), 1)]


@given(
    offers=st.lists(st.lists(st.integers(0, 7), max_size=5), max_size=12),
    store_threshold=st.integers(2, 4),
    max_tracker_size=st.integers(1, 6),
)
def test_the_filter_stores_what_was_offered_often_enough(
    offers: list[list[int]], store_threshold: int, max_tracker_size: int
) -> None:
    manager = make_manager(num_chunks=64, store_threshold=store_threshold, max_tracker_size=max_tracker_size)
    for offer in offers:
        keys = list(dict.fromkeys(to_keys(offer)))
        counts = manager.counts
        assert counts is not None
        before = dict(counts)
        absent = [key for key in keys if manager.lookup(key, REQ) is LookupResult.MISS]
        output = manager.prepare_store(keys, REQ)
        assert output is not None and output.evicted_keys == []
        assert len(counts) <= max_tracker_size
        # a key tracked before its offer is counted once more, never forgotten by it
        assert all(counts[key] == before[key] + 1 for key in keys if key in before)
        # stored: what was absent and is now counted at least store_threshold times
        assert output.keys_to_store == [key for key in absent if counts.get(key, 0) >= store_threshold]
        manager.complete_store(output.keys_to_store, REQ)


@pytest.mark.parametrize("store_threshold", [0, 1])
def test_below_a_threshold_of_two_every_offer_is_stored(store_threshold: int) -> None:
    manager = make_manager(store_threshold=store_threshold)
    verify_store_output(manager.prepare_store(to_keys([1]), REQ), ExpectedPrepareStoreOutput([1], [0], []))
    assert manager.counts is None
    assert CPUOffloadingMetrics.STORES_SKIPPED not in reduced_stats(manager)


# --- statistics and config info ---


def test_usage_gauges_count_busy_chunks_and_allocations_are_sampled_per_store() -> None:
    manager = make_manager(num_chunks=4)
    usage, write, read = (
        CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC,
        CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC,
        CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC,
    )
    allocations = CPUOffloadingMetrics.CPU_ALLOCATION_SIZE
    # prepare store [1, 2] -> two chunks written: usage 0.5, all of it writes
    manager.prepare_store(to_keys([1, 2]), REQ)
    stats = reduced_stats(manager)
    assert (stats[usage], stats[write], stats[read]) == (0.5, 0.5, 0.0)
    assert (stats[f"{allocations}_count"], stats[f"{allocations}_sum"]) == (1, 2)
    # complete store [1, 2], prepare load [1] -> idle chunks are not "used"; one is read
    manager.complete_store(to_keys([1, 2]), REQ)
    manager.prepare_load(to_keys([1]), REQ)
    stats = reduced_stats(manager)
    assert (stats[usage], stats[write], stats[read]) == (0.25, 0.0, 0.25)
    assert f"{allocations}_count" not in stats  # samples since the last call only
    # prepare store [3, 4, 5, 6] -> refused (1 is read), but the allocation was attempted
    assert manager.prepare_store(to_keys([3, 4, 5, 6]), REQ) is None
    stats = reduced_stats(manager)
    assert (stats[f"{allocations}_count"], stats[f"{allocations}_sum"]) == (1, 4)


def test_a_manager_of_no_chunks_refuses_every_store_and_reports_zero_usage() -> None:
    manager = make_manager(num_chunks=0, store_threshold=2)
    assert manager.num_chunks == 0
    # offer [1] once -> skipped by the filter; twice -> a candidate, and no chunk to give it
    verify_store_output(manager.prepare_store(to_keys([1]), REQ), ExpectedPrepareStoreOutput([], [], []))
    assert manager.prepare_store(to_keys([1]), REQ) is None
    verify_store_output(manager.prepare_store([], REQ), ExpectedPrepareStoreOutput([], [], []))
    assert manager.lookup(to_key(1), REQ) is LookupResult.MISS
    stats = reduced_stats(manager)
    assert stats[CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC] == 0.0
    assert stats[CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC] == 0.0
    assert manager.config_info() == [{}]


def _config(max_model_len: int) -> OffloadingConfig:
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer.0",), group_id=0),),
        worker_kv_bytes_per_block=1024,
        enable_kv_cache_events=False,
        extra_config={},
        engine_id="engine-0",
        model=OffloadingModelConfig("model", "float16", max_model_len=max_model_len),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=2),
        parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, False),
    )


@pytest.mark.parametrize(("max_model_len", "tokens"), [(1000, 2000), (0, "None")])
def test_config_info_publishes_the_cache_facts(max_model_len: int, tokens: int | str) -> None:
    # 64 chunks of 2 blocks of 16 tokens; a 1000-token request takes ceil(1000 / 32) = 32 chunks
    info = CPUOffloadingInfo.from_config(_config(max_model_len), num_chunks=64, kv_bytes_per_chunk=2048)
    manager = make_manager(num_chunks=64, info=info)
    assert manager.config_info() == [
        {
            "cpu_num_chunks": 64,
            "cpu_blocks_per_chunk": 2,
            "cpu_kv_cache_size_bytes": 64 * 2048,
            "cpu_kv_cache_size_tokens": tokens,
        }
    ]
    assert make_manager().config_info() == [{}]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_chunks": -1}, "num_chunks must be >= 0, got -1"),
        ({"max_tracker_size": 0}, "max_tracker_size must be >= 1, got 0"),
        ({"cache_policy": "fifo"}, "Unknown cache policy: 'fifo'"),
    ],
)
def test_bad_configuration_is_a_value_error_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_manager(**kwargs)


# --- the rest of the contract ---


@both_policies
def test_lookup_load_source_and_the_step_hooks(cache_policy: str) -> None:
    manager = make_manager(cache_policy=cache_policy)
    assert manager.on_new_request(REQ).policy is OffloadPolicy.CHUNK_LEVEL
    # absent -> MISS; write in flight -> HIT_PENDING; stored -> HIT, from host memory
    assert manager.lookup(to_key(1), REQ) is LookupResult.MISS
    manager.prepare_store(to_keys([1]), REQ)
    assert manager.lookup(to_key(1), REQ) is LookupResult.HIT_PENDING
    manager.complete_store(to_keys([1]), REQ)
    assert manager.lookup(to_key(1), REQ) is LookupResult.HIT
    assert manager.get_load_source(to_key(1), REQ) is CacheHitSource.HOST
    assert isinstance(manager.lock, nullcontext)  # one thread: the caller's lock is a no-op
    assert manager.has_pending_work() is False
    before = observe(manager, to_keys(range(4)), [REQ])
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=["req-0"], preempted_req_ids=[]))
    manager.on_reset_flushed()
    assert observe(manager, to_keys(range(4)), [REQ]) == before


@both_policies
def test_reset_drops_every_chunk_and_forgets_every_request(cache_policy: str) -> None:
    manager = make_manager(num_chunks=3, cache_policy=cache_policy)
    request = ReqContext("before")
    store(manager, [1, 2], request)
    manager.prepare_load(to_keys([1]), request)
    manager.prepare_store(to_keys([3]), request)
    manager.on_request_finished(request)
    verify_events(manager, [ExpectedEvent([1, 2], removed=False)])
    # reset -> read and pending chunks go too, silently; fresh ids restart at 0
    manager.reset_cache()
    assert [manager.lookup(key, REQ) for key in to_keys([1, 2, 3])] == [LookupResult.MISS] * 3
    verify_events(manager, [])
    assert reduced_stats(manager)[CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC] == 0.0
    # the finished request is forgotten: it may name new keys (as in vLLM)
    assert store(manager, [5, 6, 7], request) == [0, 1, 2]


@both_policies
def test_a_key_offered_twice_in_one_store_takes_one_chunk(cache_policy: str) -> None:
    """Differs from vLLM 0.33, which gives each copy a chunk (docs/VLLM_DIFFERENCES.md)."""
    manager = make_manager(cache_policy=cache_policy)
    output = manager.prepare_store(to_keys([1, 2, 1]), REQ)
    verify_store_output(output, ExpectedPrepareStoreOutput([1, 2], [0, 1], []))


@both_policies
def test_complete_store_is_idempotent_and_ignores_unknown_keys(cache_policy: str) -> None:
    manager = make_manager(cache_policy=cache_policy)
    manager.prepare_store(to_keys([1, 2]), REQ)
    # complete [1, 2, 2, 9], then [1, 2] again, then fail [1] -> one event, both stored
    manager.complete_store(to_keys([1, 2, 2, 9]), REQ)
    manager.complete_store(to_keys([1, 2]), REQ)
    manager.complete_store(to_keys([1]), REQ, success=False)
    verify_events(manager, [ExpectedEvent([1, 2], removed=False)])
    assert [manager.lookup(key, REQ) for key in to_keys([1, 2])] == [LookupResult.HIT] * 2
