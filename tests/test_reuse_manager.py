"""`FilterReusedOffloadingManager`: lookups are counted, rarely seen keys never reach the store."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typing_extensions import override

from kvref.base import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadingStats,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    make_offload_key,
)
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.manager import CPUOffloadingManager
from kvref.reuse_manager import FilterReusedOffloadingManager

REQ = ReqContext("req-0")


def to_key(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def to_keys(ints: Iterable[int]) -> list[OffloadKey]:
    return [to_key(i) for i in ints]


def look_up(manager: OffloadingManager, *ints: int) -> None:
    for key in to_keys(ints):
        manager.lookup(key, REQ)


class RecordingManager(OffloadingManager):
    """Records every call and answers with fixed sentinels."""

    LOAD_SPEC = CPULoadStoreSpec([7])
    STORE_OUTPUT = PrepareStoreOutput([], CPULoadStoreSpec([]), [])
    EVENTS = [OffloadingEvent([OffloadKey(b"k")], "CPU", removed=False)]
    CONTEXT = RequestOffloadingContext()

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        self.calls.append(("lookup", (key, req_context)))
        return None

    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        self.calls.append(("prepare_load", (keys, req_context)))
        return self.LOAD_SPEC

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.calls.append(("touch", (keys, req_context)))

    @override
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.calls.append(("complete_load", (keys, req_context)))

    @override
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        self.calls.append(("prepare_store", (keys, req_context)))
        return self.STORE_OUTPUT

    @override
    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        self.calls.append(("complete_store", (keys, req_context, success)))

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self.calls.append(("on_new_request", (req_context,)))
        return self.CONTEXT

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        self.calls.append(("on_request_finished", (req_context,)))

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        self.calls.append(("take_events", ()))
        return self.EVENTS

    @override
    def reset_cache(self) -> None:
        self.calls.append(("reset_cache", ()))

    @override
    def shutdown(self) -> None:
        self.calls.append(("shutdown", ()))


# --- configuration ---


@pytest.mark.parametrize("store_threshold", [1, 0, -3])
def test_threshold_below_two_is_rejected(store_threshold: int) -> None:
    with pytest.raises(ValueError, match=rf"store_threshold must be an integer >= 2, got {store_threshold}"):
        FilterReusedOffloadingManager(RecordingManager(), store_threshold=store_threshold)


@pytest.mark.parametrize("max_tracker_size", [0, -1])
def test_empty_tracker_is_rejected(max_tracker_size: int) -> None:
    with pytest.raises(ValueError, match=rf"max_tracker_size must be an integer >= 1, got {max_tracker_size}"):
        FilterReusedOffloadingManager(RecordingManager(), max_tracker_size=max_tracker_size)


# --- filtering ---


def test_keys_seen_fewer_times_than_the_threshold_never_reach_the_backing_store() -> None:
    backing = RecordingManager()
    manager = FilterReusedOffloadingManager(backing, store_threshold=3)
    look_up(manager, 1, 2, 2, 3, 3, 3, 4, 4, 4, 4)
    backing.calls.clear()

    manager.prepare_store(to_keys([1, 2, 3, 4, 5]), REQ)
    assert backing.calls == [("prepare_store", (to_keys([3, 4]), REQ))]
    assert [manager.lookup_count(key) for key in to_keys([1, 2, 3, 4, 5])] == [1, 2, 3, 4, 0]


def test_filtered_keys_take_no_room_and_evict_nothing() -> None:
    backing = CPUOffloadingManager(num_blocks=2, enable_events=True)
    manager = FilterReusedOffloadingManager(backing)
    look_up(manager, 1, 1, 2, 2)
    output = manager.prepare_store(to_keys([1, 2]), REQ)
    assert output is not None and output.keys_to_store == to_keys([1, 2])
    manager.complete_store(to_keys([1, 2]), REQ)

    # 3 and 4 were looked up once: the full backing manager must not evict for them
    look_up(manager, 3, 4)
    output = manager.prepare_store(to_keys([3, 4]), REQ)
    assert output is not None
    assert (output.keys_to_store, output.evicted_keys) == ([], [])
    assert [manager.lookup(key, REQ) for key in to_keys([1, 2])] == [True, True]

    # a second lookup of 3 makes it eligible: now it evicts the oldest block, 1
    look_up(manager, 3)
    output = manager.prepare_store(to_keys([3, 4]), REQ)
    assert output is not None
    assert (output.keys_to_store, output.evicted_keys) == (to_keys([3]), to_keys([1]))


def test_the_tracker_forgets_the_least_recently_looked_up_key() -> None:
    manager = FilterReusedOffloadingManager(RecordingManager(), max_tracker_size=2)
    look_up(manager, 1, 2, 1)  # 1 is now the most recent
    look_up(manager, 3)  # forgets 2
    assert [manager.lookup_count(key) for key in to_keys([1, 2, 3])] == [2, 0, 1]
    look_up(manager, 2)  # forgets 1, then 2 starts over
    assert [manager.lookup_count(key) for key in to_keys([1, 2, 3])] == [0, 1, 1]


@given(
    lookups=st.lists(st.integers(0, 9), max_size=60),
    candidates=st.lists(st.integers(0, 9), max_size=10),
    store_threshold=st.integers(2, 4),
    max_tracker_size=st.integers(1, 8),
)
def test_filter_matches_a_bounded_lru_counter(
    lookups: list[int], candidates: list[int], store_threshold: int, max_tracker_size: int
) -> None:
    backing = RecordingManager()
    manager = FilterReusedOffloadingManager(backing, store_threshold, max_tracker_size)
    model: OrderedDict[int, int] = OrderedDict()
    for i in lookups:
        manager.lookup(to_key(i), REQ)
        model[i] = model.pop(i, 0) + 1
        if len(model) > max_tracker_size:
            model.popitem(last=False)
    assert len(model) <= max_tracker_size

    manager.prepare_store(to_keys(candidates), REQ)
    expected = [i for i in candidates if model.get(i, 0) >= store_threshold]
    assert backing.calls[-1] == ("prepare_store", (to_keys(expected), REQ))


# --- delegation ---


def test_lookup_counts_then_answers_like_the_backing_manager() -> None:
    backing = RecordingManager()
    manager = FilterReusedOffloadingManager(backing)
    assert manager.lookup(to_key(1), REQ) is None
    assert backing.calls == [("lookup", (to_key(1), REQ))]
    assert manager.backing is backing


KEYS = to_keys([1, 2])


@pytest.mark.parametrize(
    ("method", "args", "expected_call", "expected_result"),
    [
        ("prepare_load", (KEYS, REQ), ("prepare_load", (KEYS, REQ)), RecordingManager.LOAD_SPEC),
        ("touch", (KEYS, REQ), ("touch", (KEYS, REQ)), None),
        ("complete_load", (KEYS, REQ), ("complete_load", (KEYS, REQ)), None),
        ("complete_store", (KEYS, REQ), ("complete_store", (KEYS, REQ, True)), None),
        ("complete_store", (KEYS, REQ, False), ("complete_store", (KEYS, REQ, False)), None),
        ("on_new_request", (REQ,), ("on_new_request", (REQ,)), RecordingManager.CONTEXT),
        ("on_request_finished", (REQ,), ("on_request_finished", (REQ,)), None),
        ("take_events", (), ("take_events", ()), RecordingManager.EVENTS),
        ("reset_cache", (), ("reset_cache", ()), None),
        ("shutdown", (), ("shutdown", ()), None),
    ],
)
def test_other_methods_are_delegated_unchanged(
    method: str, args: tuple[Any, ...], expected_call: tuple[str, tuple[Any, ...]], expected_result: Any
) -> None:
    backing = RecordingManager()
    manager = FilterReusedOffloadingManager(backing)
    result = getattr(manager, method)(*args)
    assert backing.calls == [expected_call]
    assert result is expected_result
    # the same objects are passed on, not copies
    assert all(got is want for got, want in zip(backing.calls[0][1], expected_call[1]))


def test_reset_keeps_the_lookup_counts() -> None:
    manager = FilterReusedOffloadingManager(CPUOffloadingManager(num_blocks=2))
    look_up(manager, 1, 1)
    manager.reset_cache()
    assert manager.lookup_count(to_key(1)) == 2


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("store_threshold", {"store_threshold": 2.5}),
        ("store_threshold", {"store_threshold": True}),
        ("max_tracker_size", {"max_tracker_size": "8"}),
    ],
)
def test_configuration_errors_name_the_field(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=field):
        FilterReusedOffloadingManager(CPUOffloadingManager(4), **kwargs)


def test_backing_must_be_a_manager() -> None:
    with pytest.raises(TypeError, match="backing must be an OffloadingManager"):
        FilterReusedOffloadingManager(object())  # pyright: ignore[reportArgumentType]


def test_a_single_bytes_key_is_a_type_error_and_counts_nothing() -> None:
    manager = FilterReusedOffloadingManager(CPUOffloadingManager(4))
    key = make_offload_key(b"k", 0)
    with pytest.raises(TypeError, match="prepare_store: keys must be a collection"):
        manager.prepare_store(key, ReqContext("r"))  # pyright: ignore[reportArgumentType]
    assert manager.backing.get_stats() == manager.get_stats()
    assert manager.get_stats() == OffloadingStats(num_blocks=4)
