"""The core types of `kvref.base`: keys, request contexts, specs, events, statistics, and the
manager ABC's contract and defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from contextlib import nullcontext

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typing_extensions import override

import kvref
import kvref.base
from kvref.base import (
    MAX_OFFLOAD_KEY_POSITION,
    CacheHitSource,
    ConfigInfo,
    GPULoadStoreSpec,
    LoadStoreSpec,
    Locality,
    LookupResult,
    Medium,
    OffloadingConnectorStats,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    OffloadPolicy,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TierFilter,
    TierMatcher,
    check_key_collection,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from kvref.cpu.common import CPULoadStoreSpec

# --- keys ---


def test_key_is_the_hash_then_the_group_as_4_big_endian_bytes() -> None:
    key = make_offload_key(b"\xab\xcd", 258)
    assert key == b"\xab\xcd\x00\x00\x01\x02"
    assert (get_offload_block_hash(key), get_offload_group_idx(key)) == (b"\xab\xcd", 258)


@given(block_hash=st.binary(max_size=40), group_idx=st.integers(0, 2**32 - 1))
def test_key_round_trips(block_hash: bytes, group_idx: int) -> None:
    key = make_offload_key(block_hash, group_idx)
    assert (get_offload_block_hash(key), get_offload_group_idx(key)) == (block_hash, group_idx)


@pytest.mark.parametrize("group_idx", [-1, 2**32])
def test_group_index_out_of_range_is_rejected(group_idx: int) -> None:
    with pytest.raises(ValueError, match=r"group_idx must be in \[0, 2\*\*32\)"):
        make_offload_key(b"h", group_idx)


_KEY = make_offload_key(b"h", 0)


@pytest.mark.parametrize("single", [_KEY, bytearray(_KEY), memoryview(_KEY), "key"])
def test_a_single_key_is_not_a_collection_of_keys(single: object) -> None:
    with pytest.raises(TypeError, match=r"^touch: keys must be a collection of OffloadKey, got a single"):
        check_key_collection(single, "touch")


@pytest.mark.parametrize("keys", [[], (), set[OffloadKey](), frozenset([_KEY]), {_KEY: 1}.keys(), {_KEY: 1}, [_KEY]])
def test_collections_of_keys_pass(keys: Collection[OffloadKey]) -> None:
    check_key_collection(keys, "touch")


# --- requests ---


def test_req_context_defaults_to_every_tier() -> None:
    context = ReqContext("r1")
    assert (context.req_id, context.kv_transfer_params, context.kv_hints) == ("r1", None, None)
    assert context.load_tier_filter is TierFilter.ALL


def test_req_context_keeps_one_record_per_type_and_key_positions() -> None:
    context = ReqContext("r")
    assert context.get_state(TierMatcher) is None
    record = TierMatcher(Medium.CPU)
    context.set_state(record)
    context.set_state(TierMatcher(Medium.STORAGE))  # replaces the record of its type
    assert context.get_state(TierMatcher) == TierMatcher(Medium.STORAGE)
    assert context.get_offload_key_position(_KEY) is None
    context.set_offload_key_position(_KEY, 32)
    assert context.get_offload_key_position(_KEY) == 32
    assert "32" not in repr(context)  # scratch space is not part of the repr


@pytest.mark.parametrize("end_token", [-1, MAX_OFFLOAD_KEY_POSITION + 1])
def test_key_positions_out_of_range_are_rejected(end_token: int) -> None:
    with pytest.raises(ValueError, match="end_token must be in"):
        ReqContext("r").set_offload_key_position(_KEY, end_token)


@pytest.mark.parametrize(
    ("matcher", "medium", "locality", "matches"),
    [
        (TierMatcher(), Medium.STORAGE, Locality.REMOTE, True),
        (TierMatcher(Medium.CPU), Medium.CPU, Locality.LOCAL, True),
        (TierMatcher(Medium.CPU), Medium.STORAGE, None, False),
        (TierMatcher(locality=Locality.LOCAL), Medium.STORAGE, Locality.REMOTE, False),
        (TierMatcher(Medium.STORAGE, Locality.REMOTE), None, None, True),  # an unknown side matches
    ],
)
def test_tier_matchers(matcher: TierMatcher, medium: Medium | None, locality: Locality | None, matches: bool) -> None:
    assert matcher.matches(medium, locality) is matches


def test_tier_filters_allow_what_any_matcher_matches() -> None:
    local_cpu = TierFilter((TierMatcher(Medium.CPU, Locality.LOCAL), TierMatcher(Medium.STORAGE, Locality.LOCAL)))
    assert local_cpu.allows(Medium.STORAGE, Locality.LOCAL)
    assert not local_cpu.allows(Medium.STORAGE, Locality.REMOTE)
    assert not TierFilter().allows(Medium.CPU, None)  # no matcher: nothing
    assert TierFilter.ALL.allows(Medium.STORAGE, Locality.REMOTE)


def test_lookup_results_and_offload_policies_are_vllm_s() -> None:
    assert [result.name for result in LookupResult] == ["MISS", "HIT", "HIT_PENDING", "RETRY"]
    assert [policy.value for policy in OffloadPolicy] == ["chunk_level", "request_level"]
    assert RequestOffloadingContext().policy is OffloadPolicy.CHUNK_LEVEL
    assert [medium.value for medium in Medium] == ["CPU", "STORAGE"]
    context = ScheduleEndContext(new_req_ids=["a"], preempted_req_ids=())
    assert context._fields == ("new_req_ids", "preempted_req_ids")


# --- specs, outputs and events ---


def test_block_id_specs_hold_int64_ids() -> None:
    spec = CPULoadStoreSpec(iter([3, 1, 2]))
    assert spec.block_ids.typecode == "q" and spec.chunk_ids is spec.block_ids
    assert spec.chunk_ids.tolist() == [3, 1, 2]
    assert repr(spec) == "CPULoadStoreSpec([3, 1, 2])"
    with pytest.raises(OverflowError):
        CPULoadStoreSpec([1 << 63])


def test_specs_compare_by_type_and_content() -> None:
    assert CPULoadStoreSpec([1, 2]) == CPULoadStoreSpec((1, 2))
    assert CPULoadStoreSpec([1, 2]) != CPULoadStoreSpec([2, 1])
    assert CPULoadStoreSpec([1, 2]) != GPULoadStoreSpec([1, 2], [2], [0])
    assert GPULoadStoreSpec([1, 2], [2], [0]) == GPULoadStoreSpec([1, 2], [2], [0])
    assert GPULoadStoreSpec([1, 2], [2], [0]) != GPULoadStoreSpec([1, 2], [1, 1], [0, 0])


@pytest.mark.parametrize(
    ("block_ids", "group_sizes", "block_indices", "message"),
    [
        pytest.param([1], [1], [0, 0], "block_indices has 2 entries but group_sizes has 1", id="groups"),
        pytest.param([1, 2], [1], [0], r"must be non-negative and sum to the 2 block ids", id="sum"),
        pytest.param([1], [2, -1], [0, 0], r"must be non-negative", id="negative-size"),
    ],
)
def test_gpu_spec_validation(
    block_ids: list[int], group_sizes: list[int], block_indices: list[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        GPULoadStoreSpec(block_ids, group_sizes, block_indices)


def test_events_default_to_a_stored_chunk_of_the_primary_tier() -> None:
    event = OffloadingEvent([_KEY], Medium.CPU, removed=False)
    assert (event.locality, event.ownership, event.removal_expected, event.metadata_only) == (None, None, False, False)
    output = PrepareStoreOutput([_KEY], CPULoadStoreSpec([0]), evicted_keys=[])
    assert [field.name for field in dataclasses.fields(output)] == ["keys_to_store", "store_spec", "evicted_keys"]


# --- statistics ---


def test_stats_count_gauge_and_sample_since_the_last_call() -> None:
    stats = OffloadingConnectorStats()
    assert stats.is_empty()
    stats.increase_counter("skips", 2)
    stats.increase_counter("skips")
    stats.set_gauge("usage", 0.25)
    stats.set_gauge("usage", 0.5)
    stats.observe_histogram("sizes", 3)
    stats.observe_histogram("sizes", 5)
    stats.increase_counter("by_tier", 1, labelvalues=("disk",))
    assert stats.reduce() == {"skips": 3, "usage": 0.5, "sizes_count": 2, "sizes_sum": 8, "by_tier:('disk',)": 1}
    later = OffloadingConnectorStats()
    later.increase_counter("skips", 4)
    later.set_gauge("usage", 0.75)
    later.observe_histogram("sizes", 1)
    later.set_info([{"cpu_num_chunks": 8}])
    # aggregate: counters add, gauges and info take the later value, samples append
    merged = stats.aggregate(later).reduce()
    assert (merged["skips"], merged["usage"], merged["sizes_count"], merged["sizes_sum"]) == (7, 0.75, 3, 9)
    assert stats.to_dict()["info"] == [{"cpu_num_chunks": 8}]
    stats.reset()
    assert stats.is_empty()


def test_stats_from_elsewhere_must_name_their_types() -> None:
    untyped = OffloadingConnectorStats({"types": {}, "data": {"x": {(): 1}}, "info": None})
    with pytest.raises(ValueError, match="metric 'x' has type None"):
        OffloadingConnectorStats().aggregate(untyped)


def test_config_info_labels_are_the_fields_and_none_is_spelled_out() -> None:
    @dataclasses.dataclass(frozen=True)
    class Info(ConfigInfo):
        num_chunks: int
        tokens: int | None

    assert Info.config_info_keys() == ("num_chunks", "tokens")
    assert Info(8, None).as_config_info() == {"num_chunks": 8, "tokens": "None"}


def test_the_outermost_hit_source_wins() -> None:
    assert CacheHitSource.outermost([CacheHitSource.HOST, CacheHitSource.DISK]) is CacheHitSource.DISK
    assert CacheHitSource.outermost([CacheHitSource.EXTERNAL_UNSPECIFIED, CacheHitSource.HOST]) is (
        CacheHitSource.EXTERNAL_UNSPECIFIED
    )


# --- the manager ABC ---


class MinimalManager(OffloadingManager):
    """A manager overriding only the abstract methods."""

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.MISS

    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        return CPULoadStoreSpec([])

    @override
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        return None

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()


def test_the_manager_abc_has_four_abstract_methods() -> None:
    assert OffloadingManager.__abstractmethods__ == {"lookup", "prepare_load", "prepare_store", "on_new_request"}


def test_the_manager_defaults_say_nothing_is_known_or_pending() -> None:
    manager = MinimalManager()
    context = ReqContext("r")
    keys = [_KEY]
    with manager.lock:  # a no-op lock: the manager is only ever entered from one thread
        assert isinstance(manager.lock, nullcontext)
    assert manager.get_load_source(_KEY, context) is CacheHitSource.EXTERNAL_UNSPECIFIED
    assert manager.touch(keys, context) is None
    assert manager.complete_load(keys, context) is None
    assert manager.complete_store(keys, context, success=False) is None
    assert manager.on_request_finished(context) is None
    assert manager.on_schedule_end(ScheduleEndContext([], [])) is None
    assert manager.has_pending_work() is False
    assert list(manager.take_events()) == []
    assert manager.get_stats() is None
    assert list(manager.config_info()) == [{}]
    manager.reset_cache()
    manager.on_reset_flushed()
    manager.shutdown()


def test_public_api_resolves() -> None:
    for module in (kvref, kvref.base):
        assert len(set(module.__all__)) == len(module.__all__)
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
