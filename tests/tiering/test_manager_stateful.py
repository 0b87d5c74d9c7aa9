"""A hypothesis state machine over a tiering manager with two secondary tiers.

Invariants: no completed block is ever lost. After any sequence of operations and step ends,
every block that completed a store is found in the primary, or in every secondary tier that
has not announced (by an event) that it dropped the block. Loads always return the block's own
bytes, reference counts return to the loads in progress once no job is in flight, and a block
held by a tier can always be promoted within one step (unless the primary has no room). Idle
steps (step ends and nothing else) settle every job of tiers that are not held, so the engine
stops stepping; promotions may fail or be asked for by several requests in one step; a
`complete_load` the caller never prepared is refused and changes nothing.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from typing_extensions import override

from kvref.base import OffloadingEvent, OffloadKey, ReqContext
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.policies.factory import CachePolicyName
from kvref.errors import OffloadProtocolError
from kvref.tiering.manager import TieringOffloadingManager
from tests.tiering.helpers import BLOCK_BYTES, ScriptedTier, content, make_tiering, to_keys

KEYS = to_keys(range(8))
NUM_PRIMARY_BLOCKS = 4


class TieringMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="kvref-tiering-"))
        self.manager: TieringOffloadingManager | None = None
        self.tiers: list[ScriptedTier] = []
        self.request_ids = itertools.count()
        self.requests = [self.new_request() for _ in range(3)]
        self.pending_stores: list[tuple[ReqContext, list[OffloadKey]]] = []
        self.active_loads: list[tuple[ReqContext, OffloadKey]] = []
        self.completed: set[OffloadKey] = set()
        self.removed_from: defaultdict[OffloadKey, set[str]] = defaultdict(set)

    def new_request(self) -> ReqContext:
        return ReqContext(req_id=f"r{next(self.request_ids)}")

    @property
    def m(self) -> TieringOffloadingManager:
        assert self.manager is not None
        return self.manager

    @initialize(policy=st.sampled_from(["lru", "arc"]))
    def build(self, policy: CachePolicyName) -> None:
        self.manager, self.tiers = make_tiering(
            self.tmp, NUM_PRIMARY_BLOCKS, num_tiers=2, cache_policy=policy, enable_events=True
        )
        # The second tier is small: it evicts, and announces it.
        self.tiers[1]._capacity = 3  # pyright: ignore[reportPrivateUsage]

    @override
    def teardown(self) -> None:
        if self.manager is not None:
            self.manager.shutdown()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def rows(self) -> memoryview:
        return self.m.primary.get_kv_memoryview().cast("B")

    def check_load(self, ctx: ReqContext, key: OffloadKey) -> None:
        spec = self.m.prepare_load([key], ctx)
        block_id = spec.block_ids[0]
        data = bytes(self.rows()[block_id * BLOCK_BYTES : (block_id + 1) * BLOCK_BYTES])
        assert data == content(key), f"wrong bytes loaded for {key.hex()}"
        self.active_loads.append((ctx, key))

    # --- GPU side ---

    @rule(request=st.integers(0, 2), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3))
    def prepare_store(self, request: int, keys: list[OffloadKey]) -> None:
        ctx = self.requests[request]
        output = self.m.prepare_store(keys, ctx)
        if output is None or not output.keys_to_store:
            return
        assert isinstance(output.store_spec, CPULoadStoreSpec)
        rows = self.rows()
        for key, block_id in zip(output.keys_to_store, output.store_spec.block_ids):
            rows[block_id * BLOCK_BYTES : (block_id + 1) * BLOCK_BYTES] = content(key)
        self.pending_stores.append((ctx, output.keys_to_store))

    @precondition(lambda self: self.pending_stores)
    @rule(data=st.data(), success=st.booleans())
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        index = data.draw(st.integers(0, len(self.pending_stores) - 1))
        ctx, keys = self.pending_stores.pop(index)
        self.m.complete_store(keys, ctx, success)
        if success:
            self.completed.update(keys)

    @rule(request=st.integers(0, 2), key=st.sampled_from(KEYS))
    def lookup(self, request: int, key: OffloadKey) -> None:
        ctx = self.requests[request]
        if self.m.lookup(key, ctx) is True:
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
        self.m.on_request_finished(self.requests[request])
        self.requests[request] = self.new_request()

    # --- steps, tiers, reset ---

    @rule(via_take_events=st.booleans())
    def end_step(self, via_take_events: bool) -> None:
        if via_take_events:
            self.record_events(self.m.take_events())
        else:
            self.m.end_step()

    @rule(tier=st.integers(0, 1))
    def toggle_hold(self, tier: int) -> None:
        self.tiers[tier].hold = not self.tiers[tier].hold

    @precondition(lambda self: not self.active_loads)
    @rule()
    def reset_cache(self) -> None:
        for tier in self.tiers:
            tier.hold = False  # a held job never finishes: reset would wait for it
        self.m.reset_cache()
        self.pending_stores.clear()  # their completions are ignored after a reset
        assert self.m.num_inflight_jobs == 0
        assert self.m.primary.num_free_blocks == NUM_PRIMARY_BLOCKS

    @rule(key=st.sampled_from(KEYS))
    def promote_within_a_step(self, key: OffloadKey) -> None:
        for tier in self.tiers:
            tier.hold = False
        ctx = self.requests[0]
        self.m.end_step()
        found = self.m.lookup(key, ctx)
        # A promotion takes one step; when it fails (`make_promotions_fail`) the next lookup
        # falls back to the next tier holding the block, which takes one more step.
        for _ in self.tiers:
            if found is not None:
                break
            self.m.end_step()
            found = self.m.lookup(key, ctx)
        if found is None:
            being_stored = any(key in keys for _, keys in self.pending_stores)
            assert being_stored, f"{key.hex()} still not loadable after a step per tier"
        held = [tier for tier in self.tiers if tier.lookup(key, ctx) is True]
        if found is False and held:
            # Only a full, pinned primary may turn a tier hit into a miss.
            assert self.m.primary.num_free_blocks == 0
            assert self.m.primary.num_idle_blocks == 0
        if found is True:
            self.check_load(ctx, key)

    @rule(steps=st.integers(1, 3))
    def idle_steps(self, steps: int) -> None:
        for _ in range(steps):
            self.m.end_step()
        if steps >= 2 and not any(tier.hold for tier in self.tiers):
            # Step 1 collects what was running and submits staged promotions; step 2 collects
            # those: nothing is left to step for.
            assert self.m.num_inflight_jobs == 0
            assert not self.m.has_pending_work()

    @rule(tier=st.integers(0, 1), key=st.sampled_from(KEYS))
    def make_promotions_fail(self, tier: int, key: OffloadKey) -> None:
        self.tiers[tier].failing_loads.add(key)

    @rule(tier=st.integers(0, 1))
    def heal(self, tier: int) -> None:
        self.tiers[tier].failing_loads.clear()

    @rule(key=st.sampled_from(KEYS), requests=st.lists(st.integers(0, 2), min_size=2, max_size=3))
    def concurrent_promotions(self, key: OffloadKey, requests: list[int]) -> None:
        loads_before = sum(
            1 for tier in self.tiers for _, _, keys in tier.kinds("load") if key in keys
        )
        answers = [self.m.lookup(key, self.requests[request]) for request in requests]
        self.m.end_step()
        loads_after = sum(
            1 for tier in self.tiers for _, _, keys in tier.kinds("load") if key in keys
        )
        # However many requests ask in one step, the block is promoted at most once.
        assert loads_after - loads_before <= 1, answers
        for answer, request in zip(answers, requests):
            if answer is True:
                self.check_load(self.requests[request], key)

    @rule(data=st.data())
    def stray_complete_load(self, data: st.DataObject) -> None:
        loading = {key for _, key in self.active_loads}
        # Blocks a cascade is reading are the interesting ones: their reference count is > 0.
        read = [
            key
            for key in KEYS
            if key not in loading
            and (block := self.m.primary.policy.get(key)) is not None
            and block.ref_cnt > 0
        ]
        key = data.draw(st.sampled_from(read or [k for k in KEYS if k not in loading] or KEYS))
        if key in loading:
            return
        block = self.m.primary.policy.get(key)
        before = None if block is None else block.ref_cnt
        try:
            self.m.complete_load([key], self.requests[0])
        except OffloadProtocolError:
            pass
        else:
            raise AssertionError(f"complete_load of {key.hex()}, never prepared, was accepted")
        block = self.m.primary.policy.get(key)
        assert (None if block is None else block.ref_cnt) == before

    # --- invariants ---

    def record_events(self, events: Iterable[OffloadingEvent]) -> None:
        for event in events:
            for key in event.keys:
                if event.removed:
                    self.removed_from[key].add(event.medium)
                else:
                    self.removed_from[key].discard(event.medium)

    @invariant()
    def no_completed_block_is_lost(self) -> None:
        if self.manager is None:
            return
        # Read the tiers' events directly (not through take_events, which ends the step).
        self.record_events(list(self.m.primary.take_events()))
        for tier in self.tiers:
            self.record_events(list(tier.take_events()))
        for key in self.completed:
            ctx = self.requests[0]
            if self.m.primary.lookup(key, ctx) is not False:
                continue
            for tier in self.tiers:
                if tier.medium not in self.removed_from[key]:
                    assert tier.lookup(key, ctx) is not False, (
                        f"{key.hex()} lost: not in the primary nor in {tier.medium}, "
                        f"which never announced its removal"
                    )

    @invariant()
    def references_match_loads_once_jobs_settle(self) -> None:
        if self.manager is None or self.m.num_inflight_jobs:
            return
        for key in KEYS:
            block = self.m.primary.policy.get(key)
            if block is not None and block.ref_cnt >= 0:
                expected = sum(1 for _, loading in self.active_loads if loading == key)
                assert block.ref_cnt == expected, (key.hex(), block.ref_cnt, expected)


TieringMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_tiering_manager_never_loses_a_completed_block = TieringMachine.TestCase
