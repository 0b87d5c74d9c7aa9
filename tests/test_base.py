"""The core types of `kvref.base`: keys, specs, their validation, and the manager ABC."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Collection

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typing_extensions import override

from kvref.base import (
    MAX_OFFLOAD_KEY_POSITION,
    BlockIDsLoadStoreSpec,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadingStats,
    TierStats,
    OffloadKey,
    OffloadPolicy,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
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
    assert isinstance(key, bytes)
    assert get_offload_block_hash(key) == b"\xab\xcd"
    assert get_offload_group_idx(key) == 258


@given(block_hash=st.binary(max_size=40), group_idx=st.integers(0, 2**32 - 1))
def test_key_round_trips(block_hash: bytes, group_idx: int) -> None:
    key = make_offload_key(block_hash, group_idx)
    assert get_offload_block_hash(key) == block_hash
    assert get_offload_group_idx(key) == group_idx
    assert key == make_offload_key(block_hash, group_idx)


def test_groups_of_one_hash_are_distinct_keys() -> None:
    assert len({make_offload_key(b"h", group) for group in range(3)}) == 3


@pytest.mark.parametrize("group_idx", [-1, 2**32])
def test_group_index_out_of_range_is_rejected(group_idx: int) -> None:
    with pytest.raises(ValueError, match=r"group_idx must be in \[0, 2\*\*32\)"):
        make_offload_key(b"h", group_idx)


# --- request context ---


def test_req_context_defaults() -> None:
    context = ReqContext("r1")
    assert (context.req_id, context.kv_transfer_params) == ("r1", None)
    assert ReqContext("r1", {"a": 1}).kv_transfer_params == {"a": 1}


def test_request_offloading_context_defaults_to_block_level() -> None:
    context = RequestOffloadingContext()
    assert context.policy is OffloadPolicy.BLOCK_LEVEL
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.policy = OffloadPolicy.REQUEST_LEVEL  # pyright: ignore[reportAttributeAccessIssue]


# --- specs ---


def test_block_id_specs_hold_int64_ids_and_name_their_medium() -> None:
    spec = CPULoadStoreSpec(iter([3, 1, 2]))
    assert spec.block_ids.typecode == "q" and spec.block_ids.tolist() == [3, 1, 2]
    assert spec.medium() == CPULoadStoreSpec.medium() == "CPU"
    assert GPULoadStoreSpec([], [], []).medium() == "GPU"
    assert repr(spec) == "CPULoadStoreSpec([3, 1, 2])"


def test_a_spec_built_from_an_id_list_packs_it_when_first_read() -> None:
    ids = [4, 0, 7]
    spec = CPULoadStoreSpec.from_id_list(ids)
    assert spec == CPULoadStoreSpec([4, 0, 7])  # equal to a spec packed at once
    assert spec.block_ids.typecode == "q" and spec.block_ids.tolist() == [4, 0, 7]
    assert spec.block_ids is spec.block_ids  # packed once
    assert repr(spec) == "CPULoadStoreSpec([4, 0, 7])"
    copied = pickle.loads(pickle.dumps(CPULoadStoreSpec.from_id_list([5, 6])))  # as sent to a worker
    assert copied.block_ids.tolist() == [5, 6]
    with pytest.raises(OverflowError):
        CPULoadStoreSpec([1 << 63])  # the constructor packs (and checks) at once


def test_specs_compare_by_type_and_content() -> None:
    assert CPULoadStoreSpec([1, 2]) == CPULoadStoreSpec((1, 2))
    assert CPULoadStoreSpec([1, 2]) != CPULoadStoreSpec([2, 1])
    assert CPULoadStoreSpec([1, 2]) != GPULoadStoreSpec([1, 2], [2], [0])
    assert GPULoadStoreSpec([1, 2], [2], [0]) == GPULoadStoreSpec([1, 2], [2], [0])
    assert GPULoadStoreSpec([1, 2], [2], [0]) != GPULoadStoreSpec([1, 2], [1, 1], [0, 0])
    assert GPULoadStoreSpec([1, 2], [2], [0]) != GPULoadStoreSpec([1, 2], [2], [1])


def test_gpu_spec_keeps_its_groups() -> None:
    spec = GPULoadStoreSpec([7, 8, 9], group_sizes=[2, 1], block_indices=[4, 0])
    assert (spec.group_sizes, spec.block_indices) == ((2, 1), (4, 0))
    assert repr(spec) == "GPULoadStoreSpec([7, 8, 9], group_sizes=[2, 1], block_indices=[4, 0])"


@pytest.mark.parametrize(
    ("block_ids", "group_sizes", "block_indices", "message"),
    [
        pytest.param([1], [1], [0, 0], "block_indices has 2 entries but group_sizes has 1", id="groups"),
        pytest.param([1, 2], [1], [0], r"must be non-negative and sum to the 2 block ids", id="sum"),
        pytest.param([1], [2, -1], [0, 0], r"must be non-negative", id="negative-size"),
        pytest.param([1], [1], [-1], r"block_indices \[-1\] must be non-negative", id="negative-index"),
    ],
)
def test_gpu_spec_validation(
    block_ids: list[int], group_sizes: list[int], block_indices: list[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        GPULoadStoreSpec(block_ids, group_sizes, block_indices)


def test_load_store_spec_is_abstract() -> None:
    with pytest.raises(TypeError):
        LoadStoreSpec()  # pyright: ignore[reportAbstractUsage]
    with pytest.raises(TypeError):
        BlockIDsLoadStoreSpec([1])  # pyright: ignore[reportAbstractUsage]


def test_outputs_and_events_are_plain_records() -> None:
    output = PrepareStoreOutput([OffloadKey(b"k")], CPULoadStoreSpec([0]), [])
    assert output.keys_to_store == [b"k"] and output.evicted_keys == []
    event = OffloadingEvent([OffloadKey(b"k")], "CPU", removed=True)
    assert (event.keys, event.medium, event.removed) == ([b"k"], "CPU", True)


# --- the manager ABC ---


class MinimalManager(OffloadingManager):
    """A manager overriding only the four abstract methods."""

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        return False

    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        return CPULoadStoreSpec([])

    @override
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        return None

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()


def test_manager_abc_has_exactly_four_abstract_methods() -> None:
    assert OffloadingManager.__abstractmethods__ == {
        "lookup",
        "prepare_load",
        "prepare_store",
        "on_new_request",
    }


def test_manager_defaults_are_no_ops() -> None:
    manager = MinimalManager()
    context = ReqContext("r")
    keys = [make_offload_key(b"h", 0)]
    manager.touch(keys, context)
    manager.complete_load(keys, context)
    manager.complete_store(keys, context, success=False)
    manager.on_request_finished(context)
    manager.reset_cache()
    manager.shutdown()
    assert list(manager.take_events()) == []


# --- request context, key collections, statistics (issue 13) ---


def test_req_context_keeps_one_record_per_type_and_key_positions() -> None:
    context = ReqContext("r")
    assert context.get_state(OffloadingStats) is None
    record = OffloadingStats(lookups=1)
    context.set_state(record)
    assert context.get_state(OffloadingStats) is record
    key = make_offload_key(b"h", 0)
    assert context.get_offload_key_position(key) is None
    context.set_offload_key_position(key, 32)
    assert context.get_offload_key_position(key) == 32
    assert dict(context.offload_key_positions) == {key: 32}
    # State and positions are scratch space: they take no part in equality or repr.
    assert context == ReqContext("r") and "32" not in repr(context)


@pytest.mark.parametrize("end_token", [-1, MAX_OFFLOAD_KEY_POSITION + 1])
def test_key_positions_out_of_range_are_rejected(end_token: int) -> None:
    with pytest.raises(ValueError, match="end_token must be in"):
        ReqContext("r").set_offload_key_position(make_offload_key(b"h", 0), end_token)


@pytest.mark.parametrize("single", [b"key", bytearray(b"key"), memoryview(b"key"), "key"])
def test_a_single_key_is_not_a_collection_of_keys(single: object) -> None:
    with pytest.raises(TypeError, match=r"touch: keys must be a collection of OffloadKey, got a single"):
        check_key_collection(single, "touch")


_KEY = make_offload_key(b"h", 0)
_COLLECTIONS: list[Collection[OffloadKey]] = [[], (), set[OffloadKey](), frozenset([_KEY]), {_KEY: 1}.keys(), [_KEY]]


@pytest.mark.parametrize("keys", _COLLECTIONS)
def test_collections_of_keys_pass(keys: object) -> None:
    check_key_collection(keys, "touch")


def test_stats_ratios_and_default() -> None:
    assert OffloadingStats().usage == 0.0 and OffloadingStats().hit_rate == 0.0
    stats = OffloadingStats(lookups=4, hits=3, num_blocks=8, used_blocks=2)
    assert (stats.usage, stats.hit_rate) == (0.25, 0.75)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.hits = 0  # type: ignore[misc]
    cpu = TierStats("CPU", lookups=4, hits=3, misses=1, usage=0.25)
    tiered = OffloadingStats(tiers={"CPU": cpu})
    assert tiered.tiers["CPU"] is cpu


def test_a_manager_without_statistics_says_so() -> None:
    class Minimal(OffloadingManager):
        @override
        def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
            return False

        @override
        def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
            raise AssertionError

        @override
        def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
            return None

        @override
        def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
            return RequestOffloadingContext()

    assert Minimal().get_stats() is None
