"""A hypothesis state machine over a tiering manager with two secondary tiers.

Invariants: no completed chunk is ever lost. After any sequence of operations and step ends,
every chunk that completed a store is in the primary, or in every secondary tier that has not
announced (by an event) that it dropped it. Loads always return the chunk's own bytes, reference
counts return to the loads in progress once no job is in flight, and a chunk a tier holds is
promoted within a few steps (unless the primary has no room, or promotions are held after a
reset). Idle steps settle every job of tiers that are not held, so the engine stops stepping;
promotions may fail (the tier then answers MISS for what it lost, and the manager falls back to
the next tier) or be asked for by several requests in one step (promoted once); a
`complete_load` the caller never prepared is refused and changes nothing.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from typing_extensions import override

from kvref.base import LookupResult, OffloadingEvent, OffloadKey, ReqContext
from kvref.cpu.common import CPULoadStoreSpec
from kvref.errors import OffloadProtocolError
from kvref.tiering.base import PrimaryBlocks
from kvref.tiering.manager import TieringOffloadingManager
from tests.tiering.helpers import END_OF_STEP, ScriptedTier, content, make_tiering, to_keys

KEYS = to_keys(range(8))
NUM_PRIMARY_CHUNKS = 4
PRIMARY = "primary"


class TieringMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.manager: TieringOffloadingManager | None = None
        self.tiers: list[ScriptedTier] = []
        self.request_ids = itertools.count()
        self.requests: list[ReqContext] = []
        self.pending_stores: list[tuple[ReqContext, list[OffloadKey]]] = []
        self.active_loads: list[tuple[ReqContext, OffloadKey]] = []
        self.completed: set[OffloadKey] = set()
        self.removed_from: defaultdict[OffloadKey, set[str]] = defaultdict(set)
        self.promotions_held = False

    @property
    def m(self) -> TieringOffloadingManager:
        assert self.manager is not None
        return self.manager

    def new_request(self) -> ReqContext:
        ctx = ReqContext(req_id=f"r{next(self.request_ids)}")
        self.m.on_new_request(ctx)
        return ctx

    @initialize(policy=st.sampled_from(["lru", "arc"]))
    def build(self, policy: str) -> None:
        self.manager, self.tiers = make_tiering(NUM_PRIMARY_CHUNKS, num_tiers=2, cache_policy=policy, enable_events=True)
        # The second tier is small: it evicts, and announces it.
        self.tiers[1]._capacity = 3  # pyright: ignore[reportPrivateUsage]
        self.requests = [self.new_request() for _ in range(3)]

    @override
    def teardown(self) -> None:
        if self.manager is not None:
            self.manager.shutdown()

    def step(self) -> None:
        self.m.on_schedule_end(END_OF_STEP)

    def ref_cnt(self, key: OffloadKey) -> int | None:
        chunk = self.m.primary_tier._policy.get(key)  # pyright: ignore[reportPrivateUsage]
        return None if chunk is None else chunk.ref_cnt

    def check_load(self, ctx: ReqContext, key: OffloadKey) -> None:
        spec = self.m.prepare_load([key], ctx)
        rows = PrimaryBlocks(self.m.primary_tier.get_kv_memoryview())
        assert bytes(rows.row(spec.chunk_ids[0])) == content(key), f"wrong bytes loaded for {key.hex()}"
        rows.release()
        self.active_loads.append((ctx, key))

    # --- GPU side ---

    @rule(request=st.integers(0, 2), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3))
    def prepare_store(self, request: int, keys: list[OffloadKey]) -> None:
        ctx = self.requests[request]
        output = self.m.prepare_store(keys, ctx)
        if output is None or not output.keys_to_store:
            return
        assert isinstance(output.store_spec, CPULoadStoreSpec)
        rows = PrimaryBlocks(self.m.primary_tier.get_kv_memoryview())
        for key, chunk_id in zip(output.keys_to_store, output.store_spec.chunk_ids):
            rows.row(chunk_id)[:] = content(key)
        rows.release()
        self.pending_stores.append((ctx, output.keys_to_store))

    @precondition(lambda self: self.pending_stores)
    @rule(data=st.data(), success=st.booleans())
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        index = data.draw(st.integers(0, len(self.pending_stores) - 1))
        ctx, keys = self.pending_stores.pop(index)
        self.m.complete_store(keys, ctx, success)
        if success:
            self.completed.update(keys)

    def draw_key(self, data: st.DataObject) -> OffloadKey:
        """A key, most often one that completed a store (the interesting lookups)."""
        completed = sorted(self.completed)
        return data.draw(st.sampled_from(completed) if completed and data.draw(st.booleans()) else st.sampled_from(KEYS))

    @rule(request=st.integers(0, 2), data=st.data())
    def lookup(self, request: int, data: st.DataObject) -> None:
        key = self.draw_key(data)
        ctx = self.requests[request]
        if self.m.lookup(key, ctx) is LookupResult.HIT:
            self.check_load(ctx, key)

    @precondition(lambda self: self.active_loads)
    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        ctx, key = self.active_loads.pop(data.draw(st.integers(0, len(self.active_loads) - 1)))
        self.m.complete_load([key], ctx)

    @rule(request=st.integers(0, 2), keys=st.lists(st.sampled_from(KEYS), max_size=4))
    def touch(self, request: int, keys: list[OffloadKey]) -> None:
        self.m.touch(keys, self.requests[request])

    @rule(request=st.integers(0, 2))
    def finish_request(self, request: int) -> None:
        if any(ctx is self.requests[request] for ctx, _ in self.active_loads):
            return  # vLLM finishes a request once its loads completed
        self.m.on_request_finished(self.requests[request])
        self.requests[request] = self.new_request()

    # --- steps, tiers, reset ---

    @rule(take_events=st.booleans())
    def end_step(self, take_events: bool) -> None:
        self.step()
        if take_events:
            self.record_events(self.m.take_events())

    @rule(tier=st.integers(0, 1))
    def toggle_hold(self, tier: int) -> None:
        self.tiers[tier].hold = not self.tiers[tier].hold

    @precondition(lambda self: not self.active_loads)
    @rule()
    def reset_cache(self) -> None:
        for tier in self.tiers:
            tier.hold = False  # a held job never finishes: reset would wait for it
        self.m.reset_cache()
        self.pending_stores.clear()  # vLLM completes no store from before a reset after it
        assert not self.m.has_pending_work()
        assert self.m.primary_tier._get_num_free_chunks() == NUM_PRIMARY_CHUNKS  # pyright: ignore[reportPrivateUsage]
        self.promotions_held = True

    @precondition(lambda self: self.promotions_held)
    @rule()
    def reset_flushed(self) -> None:
        self.m.on_reset_flushed()
        self.promotions_held = False

    @rule(data=st.data())
    def promote_within_a_few_steps(self, data: st.DataObject) -> None:
        key = self.draw_key(data)
        for tier in self.tiers:
            tier.hold = False
        ctx = self.requests[0]
        answers = [self.m.lookup(key, ctx)]
        # A promotion is submitted at the step's end and collected by the next step's first
        # lookup; a failed one makes its tier answer MISS, and the next tier is asked.
        for _ in range(3 * len(self.tiers)):
            if answers[-1] in (LookupResult.HIT, LookupResult.MISS):
                break
            self.step()
            answers.append(self.m.lookup(key, ctx))
        if answers[-1] is LookupResult.HIT:
            self.check_load(ctx, key)
            return
        if any(key in keys for _, keys in self.pending_stores):
            return  # its store from the GPU is in flight: HIT_PENDING until it completes
        assert answers[-1] is LookupResult.MISS, answers
        held = [tier.tier_type for tier in self.tiers if tier.lookup(key, ctx) is LookupResult.HIT]
        if held and not self.promotions_held:
            # Only a full, pinned primary may turn a tier's hit into a miss.
            primary = self.m.primary_tier
            assert primary._get_num_free_chunks() == 0, (answers, held)  # pyright: ignore[reportPrivateUsage]
            assert primary._num_evictable_cache_chunks == 0, (answers, held)  # pyright: ignore[reportPrivateUsage]

    @rule(steps=st.integers(1, 3))
    def idle_steps(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
        if steps == 3 and not any(tier.hold for tier in self.tiers):
            # Collected at the second step's end at the latest (the first may be gated by a
            # call of the step that collected already), promotions staged before included.
            assert not self.m.has_pending_work()

    @rule(tier=st.integers(0, 1), key=st.sampled_from(KEYS))
    def make_promotions_fail(self, tier: int, key: OffloadKey) -> None:
        self.tiers[tier].failing_loads.add(key)

    @rule(tier=st.integers(0, 1))
    def heal(self, tier: int) -> None:
        self.tiers[tier].heal()

    @rule(data=st.data(), requests=st.lists(st.integers(0, 2), min_size=2, max_size=3))
    def concurrent_promotions(self, data: st.DataObject, requests: list[int]) -> None:
        key = self.draw_key(data)
        def loads() -> int:
            return sum(1 for tier in self.tiers for _, _, keys in tier.kinds("load") if key in keys)

        before = loads()
        answers = [self.m.lookup(key, self.requests[request]) for request in requests]
        self.step()
        # However many requests ask in one step, the chunk is promoted at most once.
        assert loads() - before <= 1, answers
        for answer, request in zip(answers, requests):
            if answer is LookupResult.HIT:
                self.check_load(self.requests[request], key)

    @rule(data=st.data())
    def stray_complete_load(self, data: st.DataObject) -> None:
        loading = {key for _, key in self.active_loads}
        # Chunks a cascade is reading are the interesting ones: their reference count is > 0.
        read = [key for key in KEYS if key not in loading and (self.ref_cnt(key) or 0) > 0]
        key = data.draw(st.sampled_from(read or [k for k in KEYS if k not in loading] or KEYS))
        if key in loading:
            return
        before = self.ref_cnt(key)
        try:
            self.m.complete_load([key], self.requests[0])
        except OffloadProtocolError:
            pass
        else:
            raise AssertionError(f"complete_load of {key.hex()}, never prepared, was accepted")
        assert self.ref_cnt(key) == before

    # --- invariants ---

    def record_events(self, events: Iterable[OffloadingEvent]) -> None:
        for event in events:
            where = event.ownership or PRIMARY
            for key in event.keys:
                if event.removed:
                    self.removed_from[key].add(where)
                else:
                    self.removed_from[key].discard(where)

    @invariant()
    def no_completed_chunk_is_lost(self) -> None:
        if self.manager is None:
            return
        # Read the events directly: the manager's take_events has no side effect to spare.
        self.record_events(list(self.m.primary_tier.take_events()))
        for tier in self.tiers:
            self.record_events(list(tier.take_events()))
        for key in self.completed:
            if self.m.primary_tier.lookup(key, self.requests[0]) is not LookupResult.MISS:
                continue
            for tier in self.tiers:
                if tier.tier_type not in self.removed_from[key]:
                    assert key in tier, (
                        f"{key.hex()} lost: not in the primary nor in {tier.tier_type}, which never announced its removal"
                    )

    @invariant()
    def references_match_loads_once_jobs_settle(self) -> None:
        if self.manager is None or self.m.has_pending_work():
            return  # a job in flight holds references of its own
        for key in KEYS:
            ref_cnt = self.ref_cnt(key)
            if ref_cnt is not None and ref_cnt >= 0:
                expected = sum(1 for _, loading in self.active_loads if loading == key)
                assert ref_cnt == expected, (key.hex(), ref_cnt, expected)


TieringMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_tiering_manager_never_loses_a_completed_chunk = TieringMachine.TestCase
