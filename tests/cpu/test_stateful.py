"""kvref's CPU manager and vLLM 0.33's, driven through the same random programs, step by step.

vLLM's manager and policies are executed from its sdist (`tests/cpu/conftest.py`). After every
step both must give the same lookups, store decisions (keys, chunk ids, evicted keys), events,
policy state and chunk pool, and kvref's own invariants must hold. Misuse steps (a load of an
absent or pending chunk, a completion without a load, a finished request naming new keys, a
single key where a collection is expected) go to kvref alone: vLLM asserts, possibly half-way.
kvref must raise and change nothing observable.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from hypothesis import event, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from typing_extensions import override

from kvref.base import OffloadKey, ReqContext, make_offload_key
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.manager import CPUOffloadingManager
from kvref.cpu.policies.arc import ARCCachePolicy
from kvref.cpu.policies.lru import LRUCachePolicy
from kvref.errors import OffloadProtocolError
from tests.cpu.keys import COLLECTIONS
from tests.cpu.manager_state import describe_events, observe, policy_of, seen_keys
from tools.compare_vllm_manager import VLLMKVOffload

CAPACITY = 3
# Two KV-cache groups, so that finished requests order their keys across groups.
KEYS = [make_offload_key(i.to_bytes(2, "big"), i % 2) for i in range(10)]
# Examples as the Hypothesis profile says (tests/conftest.py: 60, or 1000 when thorough).
MACHINE_SETTINGS = settings(stateful_step_count=40, deadline=None)

key_lists = st.lists(st.sampled_from(KEYS), min_size=1, max_size=CAPACITY + 1, unique=True)
# Every keyed call gets one of these; both managers get the same object (same iteration order).
containers = st.sampled_from(sorted(COLLECTIONS))
positions = st.integers(1, 6).map(lambda block: 16 * block)
mostly_true = st.sampled_from([True, True, False])
# How a store's transfer ends: before the next step, or later (a complete_store step).
outcomes = st.sampled_from(["stored", "later", "failed"])
# A store of drawn keys, a retry of keys whose store failed, or a store after a key's end
# position changed.
store_variants = st.sampled_from(["plain", "plain", "retry", "reposition"])
# Hypothesis favours simple values: keep wiping everything rare.
rarely = st.sampled_from([False] * 19 + [True])


@dataclass
class Request:
    ours: ReqContext
    theirs: Any
    # The cache generation of the managers' record of it: a reset makes them forget it, and a
    # later prepare_* makes a new record; a finish with a stale record is ignored.
    generation: int = 0
    finished: bool = False  # no valid prepare_* names it any more
    finish_recorded: bool = False  # the managers know it finished


class AgainstVLLM(RuleBasedStateMachine):
    """One policy; the reuse filter's threshold and tracker size are drawn per run."""

    cache_policy: ClassVar[str]
    vllm: ClassVar[VLLMKVOffload]

    def __init__(self) -> None:
        super().__init__()
        self.ours: CPUOffloadingManager  # both built by `build`
        self.theirs: Any
        self.requests: list[Request] = []
        # The model: the ref_cnt of every chunk held (-1 pending), and the loads in flight.
        self.ref_cnts: dict[OffloadKey, int] = {}
        self.loads: list[tuple[int, list[OffloadKey]]] = []
        self.failed: list[OffloadKey] = []  # keys whose store failed, for retries
        self.generation = 0  # reset_cache calls so far
        self.evicting_stores = 0  # what the comparison is for: runs are steered towards them

    @initialize(store_threshold=st.sampled_from([1, 1, 2, 3]), max_tracker_size=st.integers(2, 8))
    def build(self, store_threshold: int, max_tracker_size: int) -> None:
        self.ours = CPUOffloadingManager(
            CAPACITY,
            self.cache_policy,
            enable_events=True,
            store_threshold=store_threshold,
            max_tracker_size=max_tracker_size,
        )
        self.theirs = self.vllm.manager_class(
            num_chunks=CAPACITY,
            cache_policy=self.cache_policy,
            enable_events=True,
            store_threshold=store_threshold,
            max_tracker_size=max_tracker_size,
        )
        self.start_request(None)

    # --- helpers ---

    def start_request(self, key_positions: list[int] | None) -> None:
        name = f"req-{len(self.requests)}"
        request = Request(ReqContext(name), self.vllm.req_context_class(name), self.generation)
        if key_positions is not None:
            for key, position in zip(KEYS, key_positions):
                request.ours.set_offload_key_position(key, position)
                request.theirs.set_offload_key_position(key, position)
        ours, theirs = self.ours.on_new_request(request.ours), self.theirs.on_new_request(request.theirs)
        assert ours.policy.value == theirs.policy.value == "chunk_level"
        self.requests.append(request)

    def running(self, data: st.DataObject) -> int | None:
        """A request that may still prepare loads and stores."""
        running = [index for index, request in enumerate(self.requests) if not request.finished]
        return data.draw(st.sampled_from(running)) if running else None

    def any_request(self, data: st.DataObject) -> Request:
        return self.requests[data.draw(st.integers(0, len(self.requests) - 1))]

    def keys_with(self, wanted: Callable[[int], bool]) -> list[OffloadKey]:
        return [key for key, count in self.ref_cnts.items() if wanted(count)]

    def refused_unchanged(self, call: Callable[[], object], error: type[Exception]) -> Exception:
        """Run a misuse on kvref alone: it must raise `error` and change nothing observable."""
        contexts = [request.ours for request in self.requests]
        before = observe(self.ours, KEYS, contexts)
        with pytest.raises(error) as caught:
            call()
        assert observe(self.ours, KEYS, contexts) == before
        return caught.value

    # --- valid steps, applied to both ---

    @rule(key_positions=st.none() | st.lists(positions, min_size=len(KEYS), max_size=len(KEYS)))
    def new_request(self, key_positions: list[int] | None) -> None:
        self.start_request(key_positions)

    @rule(data=st.data(), keys=key_lists, kind=containers, outcome=outcomes, variant=store_variants)
    def prepare_store(self, data: st.DataObject, keys: list[OffloadKey], kind: str, outcome: str, variant: str) -> None:
        index = self.running(data)
        if index is None:
            return
        request = self.requests[index]
        if variant == "retry" and self.failed:
            # A connector retries a failed store; a drain must then leave the keys out of the
            # failure's cleanup event if it is still pending.
            keys = data.draw(st.lists(st.sampled_from(self.failed), min_size=1, unique=True))
        elif variant == "reposition":  # the scheduler records where a key ends mid-request
            key, position = data.draw(st.sampled_from(KEYS)), data.draw(positions)
            request.ours.set_offload_key_position(key, position)
            request.theirs.set_offload_key_position(key, position)
        offered = COLLECTIONS[kind](keys)
        mine = self.ours.prepare_store(offered, request.ours)
        other = self.theirs.prepare_store(offered, request.theirs)
        request.generation = self.generation
        event("prepare_store: " + ("refused" if mine is None else "evicts" if mine.evicted_keys else "fits"))
        assert (mine is None) == (other is None)
        if mine is None:
            return
        assert mine.keys_to_store == other.keys_to_store
        assert mine.evicted_keys == other.evicted_keys
        self.evicting_stores += bool(mine.evicted_keys)
        assert isinstance(mine.store_spec, CPULoadStoreSpec)
        assert mine.store_spec.chunk_ids.tolist() == [int(i) for i in other.store_spec.chunk_ids]
        for key in mine.evicted_keys:
            assert self.ref_cnts.pop(key) == 0 and key not in offered, "evicted a busy or offered chunk"
        for key in mine.keys_to_store:
            self.ref_cnts[key] = -1
        if outcome != "later":  # the transfer ended before the next step
            success = outcome == "stored"
            self.ours.complete_store(mine.keys_to_store, request.ours, success)
            self.theirs.complete_store(mine.keys_to_store, request.theirs, success)
            self.record_completion(mine.keys_to_store, success)

    @rule(data=st.data(), success=st.sampled_from([True, True, True, False]), kind=containers)
    def complete_store(self, data: st.DataObject, success: bool, kind: str) -> None:
        # Pending keys, with now and then a stored or unknown one (both ignore those).
        candidates = self.keys_with(lambda count: count < 0) + KEYS[:2]
        keys = COLLECTIONS[kind](data.draw(st.lists(st.sampled_from(candidates), max_size=4)))
        request = self.any_request(data)  # completions may arrive after the request finished
        self.ours.complete_store(keys, request.ours, success)
        self.theirs.complete_store(keys, request.theirs, success)
        self.record_completion(keys, success)

    def record_completion(self, keys: Collection[OffloadKey], success: bool) -> None:
        """Pending keys become idle, or go; the others are ignored."""
        for key in keys:
            if self.ref_cnts.get(key) == -1:
                if success:
                    self.ref_cnts[key] = 0
                else:
                    del self.ref_cnts[key]
                    self.failed.append(key)

    @rule(data=st.data(), kind=containers, release_now=mostly_true)
    def prepare_load(self, data: st.DataObject, kind: str, release_now: bool) -> None:
        ready = self.keys_with(lambda count: count >= 0)
        index = self.running(data)
        if not ready or index is None:
            return
        keys = COLLECTIONS[kind](data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=3)))
        mine = self.ours.prepare_load(keys, self.requests[index].ours)
        other = self.theirs.prepare_load(keys, self.requests[index].theirs)
        self.requests[index].generation = self.generation
        assert isinstance(mine, CPULoadStoreSpec)
        assert mine.chunk_ids.tolist() == [int(i) for i in other.chunk_ids]
        for key in keys:
            self.ref_cnts[key] += 1
        self.loads.append((index, list(keys)))
        if release_now:  # read pins pile up otherwise, and pinned chunks are never evicted
            self.finish_load(len(self.loads) - 1)

    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        if self.loads:
            self.finish_load(data.draw(st.integers(0, len(self.loads) - 1)))

    def finish_load(self, load: int) -> None:
        index, keys = self.loads.pop(load)
        self.ours.complete_load(keys, self.requests[index].ours)
        self.theirs.complete_load(keys, self.requests[index].theirs)
        for key in keys:
            self.ref_cnts[key] -= 1

    @rule(data=st.data(), keys=st.lists(st.sampled_from(KEYS), max_size=4), kind=containers)
    def touch(self, data: st.DataObject, keys: list[OffloadKey], kind: str) -> None:
        request = self.any_request(data)
        touched = COLLECTIONS[kind](keys)
        self.ours.touch(touched, request.ours)
        self.theirs.touch(touched, request.theirs)

    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        request = self.any_request(data)  # finishing twice commits nothing the second time
        self.ours.on_request_finished(request.ours)
        self.theirs.on_request_finished(request.theirs)
        request.finished = True
        request.finish_recorded |= request.generation == self.generation
        self.name_a_new_key_after_finishing(data, request)  # at once, and later by `misuse`
        if all(request.finished for request in self.requests):
            self.start_request(None)  # keep one running, whichever rules this run draws

    @rule(now=rarely)
    def reset_cache(self, now: bool) -> None:
        if not now:
            return
        self.ours.reset_cache()
        self.theirs.reset_cache()
        # No completion of a job from before the reset arrives after it.
        self.ref_cnts.clear()
        self.loads.clear()
        self.generation += 1

    @rule(partial=st.booleans())
    def publish(self, partial: bool) -> None:
        """What the connector does each step: drain the events, read the statistics."""
        mine, other = iter(self.ours.take_events()), iter(self.theirs.take_events())
        if partial:  # a drain abandoned after its first event: the rest is gone, in both
            mine, other = [e for e in [next(mine, None)] if e], [e for e in [next(other, None)] if e]
        assert describe_events(mine) == describe_events(other)
        assert self.ours.get_stats().to_dict() == self.theirs.get_stats().to_dict()

    # --- misuse, applied to kvref alone (one rule, so that valid steps stay the majority) ---

    @rule(
        data=st.data(),
        misuse=st.sampled_from(
            ["load_an_unready_chunk", "complete_an_unprepared_load", "name_a_new_key_after_finishing", "pass_one_key"]
        ),
    )
    def misuse(self, data: st.DataObject, misuse: str) -> None:
        getattr(self, misuse)(data)

    def load_an_unready_chunk(self, data: st.DataObject) -> None:
        index = self.running(data)
        bad = data.draw(st.sampled_from(KEYS))
        if index is None or self.ref_cnts.get(bad, -1) >= 0:
            return
        ready = self.keys_with(lambda count: count >= 0)
        keys = data.draw(st.lists(st.sampled_from(ready), max_size=2)) if ready else []
        keys.insert(data.draw(st.integers(0, len(keys))), bad)  # ready keys before it stay unpinned
        request = self.requests[index]
        error = self.refused_unchanged(lambda: self.ours.prepare_load(keys, request.ours), OffloadProtocolError)
        assert isinstance(error, OffloadProtocolError)
        assert (error.operation, error.key) == ("prepare_load", bad)
        assert error.state == ("absent" if bad not in self.ref_cnts else "pending")
        event(f"misuse: prepare_load of a {error.state} chunk")

    def complete_an_unprepared_load(self, data: st.DataObject) -> None:
        loaded = [key for _, keys in self.loads for key in keys]
        keys = data.draw(st.lists(st.sampled_from(loaded), max_size=3)) if loaded else []
        keys.insert(data.draw(st.integers(0, len(keys))), data.draw(st.sampled_from(KEYS)))
        if all(keys.count(key) <= max(self.ref_cnts.get(key, 0), 0) for key in keys):
            return  # as many loads of each key are in flight: a valid call
        request = self.any_request(data)
        self.refused_unchanged(lambda: self.ours.complete_load(keys, request.ours), OffloadProtocolError)
        event("misuse: complete_load without a load")

    def name_a_new_key_after_finishing(self, data: st.DataObject, request: Request | None = None) -> None:
        if request is None:
            finished = [r for r in self.requests if r.finish_recorded and r.generation == self.generation]
            if not finished:
                return
            request = data.draw(st.sampled_from(finished))
        elif not (request.finish_recorded and request.generation == self.generation):
            return
        operation = data.draw(st.sampled_from(["prepare_store", "prepare_load"]))
        seen = seen_keys(request.ours)
        # A load must name a ready chunk, or it is refused as absent or pending first.
        candidates = [key for key in KEYS if key not in seen]
        if operation == "prepare_load":
            candidates = [key for key in candidates if self.ref_cnts.get(key, -1) >= 0]
        if not candidates:
            return
        keys = [data.draw(st.sampled_from(candidates))]
        call = getattr(self.ours, operation)
        error = self.refused_unchanged(lambda: call(keys, request.ours), OffloadProtocolError)
        assert isinstance(error, OffloadProtocolError) and error.state == "finished"
        assert error.operation == operation and request.ours.req_id in str(error)
        event(f"misuse: {operation} after the finish")

    def pass_one_key(self, data: st.DataObject) -> None:
        keyed_calls = ["prepare_store", "prepare_load", "complete_load", "complete_store", "touch"]
        operation = data.draw(st.sampled_from(keyed_calls))
        key = data.draw(st.sampled_from(KEYS))
        single: object = data.draw(st.sampled_from([key, key.hex()]))
        request = self.any_request(data)
        call = getattr(self.ours, operation)
        error = self.refused_unchanged(lambda: call(single, request.ours), TypeError)
        assert str(error).startswith(f"{operation}: keys must be a collection of OffloadKey")
        event("misuse: a single key")

    @override
    def teardown(self) -> None:
        target(self.evicting_stores, label="evicting stores")

    # --- after every step ---

    @invariant()
    def lookups_agree_with_vllm_and_the_model(self) -> None:
        request = self.requests[-1]
        for key in KEYS:
            mine = self.ours.lookup(key, request.ours)
            assert mine.name == self.theirs.lookup(key, request.theirs).name
            count = self.ref_cnts.get(key)
            assert mine.name == ("MISS" if count is None else "HIT_PENDING" if count < 0 else "HIT")

    @invariant()
    def policy_state_agrees_with_vllm(self) -> None:
        ours, theirs = policy_of(self.ours), self.theirs._policy
        if isinstance(ours, LRUCachePolicy):
            assert dict(ours.ranks) == theirs._ranks
        else:
            assert isinstance(ours, ARCCachePolicy)
            assert (list(ours.t1), list(ours.t2), ours.target_t1_size) == (
                list(theirs.t1),
                list(theirs.t2),
                theirs.target_t1_size,
            )
            assert (list(ours.b1), list(ours.b2)) == (list(theirs.b1), list(theirs.b2))
        # The whole eviction order, not just its head: evict every idle chunk from copies.
        idle = len(self.keys_with(lambda count: count == 0))
        mine = copy.deepcopy(ours).evict(idle, set())
        other = copy.deepcopy(theirs).evict(idle, set())
        assert mine is not None and other is not None
        assert [key for key, _ in mine] == [key for key, _ in other]

    @invariant()
    def pool_and_reuse_filter_agree_with_vllm(self) -> None:
        for name in (
            "_free_list",
            "_num_allocated_chunks",
            "_num_evictable_cache_chunks",
            "_num_write_pending_chunks",
            "allocation_sizes_in_current_batch",
            "stores_skipped_in_current_batch",
            "counts",
        ):
            assert getattr(self.ours, name) == getattr(self.theirs, name), name

    @invariant()
    def events_agree_with_vllm(self) -> None:
        assert describe_events(self.ours.events or []) == describe_events(self.theirs.events)
        # What a drain now would publish (metadata-only cleanups of keys stored since left
        # out), drained from copies: the take_events rule drains the real ones now and then.
        mine = copy.deepcopy(self.ours).take_events()
        other = copy.deepcopy(self.theirs).take_events()
        assert describe_events(mine) == describe_events(other)

    @invariant()
    def capacity_and_ref_counts_hold(self) -> None:
        policy = policy_of(self.ours)
        chunks = {key: policy.get(key) for key in KEYS}
        held = {key: chunk for key, chunk in chunks.items() if chunk is not None}
        assert {key: chunk.ref_cnt for key, chunk in held.items()} == self.ref_cnts
        chunk_ids = [chunk.chunk_id for chunk in held.values()]
        assert len(set(chunk_ids)) == len(chunk_ids) and all(0 <= i < CAPACITY for i in chunk_ids)
        free = self.ours._get_num_free_chunks()  # pyright: ignore[reportPrivateUsage]
        assert free == CAPACITY - len(held)
        counts = [chunk.ref_cnt for chunk in held.values()]
        evictable = self.ours._num_evictable_cache_chunks  # pyright: ignore[reportPrivateUsage]
        pending = self.ours._num_write_pending_chunks  # pyright: ignore[reportPrivateUsage]
        assert (evictable, pending) == (counts.count(0), counts.count(-1))
        if self.ours.counts is not None:
            assert len(self.ours.counts) <= self.ours.max_tracker_size


def run_against_vllm(vllm: VLLMKVOffload, cache_policy: str) -> None:
    machine = type(f"AgainstVLLM_{cache_policy}", (AgainstVLLM,), {"cache_policy": cache_policy, "vllm": vllm})
    run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)


@pytest.mark.parametrize("cache_policy", ["lru", "arc"])
def test_random_programs_agree_with_vllm(vllm_kv_offload: VLLMKVOffload, cache_policy: str) -> None:
    run_against_vllm(vllm_kv_offload, cache_policy)
