"""Hypothesis state machines for the cache policies and the CPU manager.

Policies run side by side with naive reference policies (one `OrderedDict` per list, scanned on
every eviction) and must agree with them on every eviction; the manager runs against a plain
model of block states and the events it emits. Invariants are checked after every step.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Collection, Set
from typing import Any, ClassVar

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from typing_extensions import override

from kvref.base import OffloadKey, ReqContext, make_offload_key
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.manager import CPUOffloadingManager
from kvref.cpu.policies.arc import ARCCachePolicy
from kvref.cpu.policies.base import BlockStatus, CachePolicy
from kvref.cpu.policies.factory import CachePolicyName
from kvref.cpu.policies.lru import LRUCachePolicy
from kvref.errors import OffloadProtocolError

CAPACITY = 4
KEYS = [make_offload_key(i.to_bytes(2, "big"), i % 2) for i in range(12)]
MACHINE_SETTINGS = settings(max_examples=60, stateful_step_count=60, deadline=None)

keys_st = st.sampled_from(KEYS)
key_lists = st.lists(keys_st, max_size=CAPACITY + 2)
# Mostly valid calls, so that runs get deep into eviction; misuse now and then.
mostly_true = st.sampled_from([True, True, True, True, False])
mostly_false = st.sampled_from([False, False, False, False, True])
# Hypothesis favours the first rule and the simplest values: keep wiping everything rare.
rarely = st.sampled_from([False] * 29 + [True])


def is_pending(ref_cnt: int) -> bool:
    return ref_cnt < 0


def is_idle(ref_cnt: int) -> bool:
    return ref_cnt == 0


def is_ready(ref_cnt: int) -> bool:
    return ref_cnt >= 0


# --- naive reference policies (the "scan" forms, made to refresh recency the same way) ---


class NaiveLRU(CachePolicy):
    """Logical recency in its plainest form: a use counter per block; eviction sorts idle blocks."""

    @override
    def __init__(self, cache_capacity: int) -> None:
        self.blocks: dict[OffloadKey, BlockStatus] = {}
        self.last_use: dict[OffloadKey, int] = {}
        self.clock = 0

    def use(self, key: OffloadKey) -> None:
        self.clock += 1
        self.last_use[key] = self.clock

    @override
    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.blocks.get(key)

    @override
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.blocks[key] = block
        self.use(key)  # the first store is a use

    @override
    def remove(self, key: OffloadKey) -> None:
        self.blocks.pop(key, None)

    @override
    def touch(self, keys: Collection[OffloadKey]) -> None:
        for key in reversed(list(keys)):
            if key in self.blocks:
                self.use(key)  # whatever the block's state

    @override
    def evict(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        idle = [k for k, b in self.blocks.items() if b.ref_cnt == 0 and k not in protected]
        victims = sorted(idle, key=lambda k: (self.last_use[k], k))[:n]
        if len(victims) < n:
            return None
        return [(key, self.blocks.pop(key)) for key in victims]

    @override
    def clear(self) -> None:
        self.blocks.clear()

    # mark_evictable / mark_non_evictable: becoming idle or busy is not a use (base no-ops).


class NaiveARC(CachePolicy):
    """ARC with every block in t1/t2 in recency order; eviction rescans from the old end."""

    @override
    def __init__(self, cache_capacity: int) -> None:
        self.capacity = cache_capacity
        self.target = 0.0
        self.t1: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self.b1: list[OffloadKey] = []
        self.b2: list[OffloadKey] = []

    @override
    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.t1.get(key) or self.t2.get(key)

    @override
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.t1[key] = block
        self.b1 = [k for k in self.b1 if k != key]
        self.b2 = [k for k in self.b2 if k != key]

    @override
    def remove(self, key: OffloadKey) -> None:
        self.t1.pop(key, None)
        self.t2.pop(key, None)

    @override
    def touch(self, keys: Collection[OffloadKey]) -> None:
        for key in reversed(list(keys)):
            if key in self.t1:
                block = self.t1.pop(key)
                if block.ref_cnt >= 0:
                    self.t2[key] = block
                else:
                    self.t1[key] = block  # pending: re-ranked within t1
            elif key in self.t2:
                self.t2.move_to_end(key)
            elif key in self.b1:
                self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.capacity)
                self.b1 = [k for k in self.b1 if k != key] + [key]
            elif key in self.b2:
                self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2 = [k for k in self.b2 if k != key] + [key]

    @override
    def evict(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        chosen: list[tuple[OffloadKey, BlockStatus, bool]] = []
        t1_size = len(self.t1)

        def oldest(entries: OrderedDict[OffloadKey, BlockStatus]) -> tuple[OffloadKey, BlockStatus] | None:
            taken = {key for key, _, _ in chosen}
            for key, block in entries.items():
                if block.ref_cnt == 0 and key not in protected and key not in taken:
                    return key, block
            return None

        while len(chosen) < n:
            order = [(self.t1, True), (self.t2, False)]
            if t1_size < int(self.target):
                order.reverse()
            for entries, from_t1 in order:
                entry = oldest(entries)
                if entry is not None:
                    chosen.append((*entry, from_t1))
                    t1_size -= from_t1
                    break
            else:
                return None
        for key, _, from_t1 in chosen:
            (self.t1 if from_t1 else self.t2).pop(key)
            (self.b1 if from_t1 else self.b2).append(key)
        self.b1 = self.b1[-self.capacity :] if self.capacity else []
        self.b2 = self.b2[-self.capacity :] if self.capacity else []
        return [(key, block) for key, block, _ in chosen]

    @override
    def clear(self) -> None:
        self.target = 0.0
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()



# --- policies against their references ---


class PolicyMachine(RuleBasedStateMachine):
    """Drive a policy and its naive reference like a manager would, and compare them."""

    policy_class: ClassVar[type[CachePolicy]]
    reference_class: ClassVar[type[CachePolicy]]

    def __init__(self) -> None:
        super().__init__()
        self.policy = self.policy_class(CAPACITY)
        self.reference = self.reference_class(CAPACITY)
        self.ref_cnts: dict[OffloadKey, int] = {}  # the model: every held key's ref_cnt

    def keys_with(self, wanted: Callable[[int], bool]) -> list[OffloadKey]:
        return [key for key, count in self.ref_cnts.items() if wanted(count)]

    def set_ref_cnt(self, key: OffloadKey, ref_cnt: int) -> None:
        for policy in (self.policy, self.reference):
            block = policy.get(key)
            assert block is not None
            block.ref_cnt = ref_cnt
        self.ref_cnts[key] = ref_cnt

    @rule(keys=st.lists(keys_st, min_size=1, max_size=3), complete_now=mostly_true)
    def insert(self, keys: list[OffloadKey], complete_now: bool) -> None:
        # The manager never holds more than CAPACITY blocks; neither does this driver.
        for key in keys:
            if key in self.ref_cnts or len(self.ref_cnts) >= CAPACITY:
                continue
            block_id = KEYS.index(key)
            self.policy.insert(key, BlockStatus(block_id))
            self.reference.insert(key, BlockStatus(block_id))
            self.ref_cnts[key] = -1
            if complete_now:
                self.finish_store(key)

    def finish_store(self, key: OffloadKey) -> None:
        self.set_ref_cnt(key, 0)
        self.policy.mark_evictable(key)
        self.reference.mark_evictable(key)

    @rule(data=st.data())
    def complete_store(self, data: st.DataObject) -> None:
        pending = self.keys_with(is_pending)
        if pending:
            self.finish_store(data.draw(st.sampled_from(pending)))

    @rule(data=st.data(), now=mostly_false)
    def fail_store(self, data: st.DataObject, now: bool) -> None:
        pending = self.keys_with(is_pending)
        if pending and now:
            key = data.draw(st.sampled_from(pending))
            self.policy.remove(key)
            self.reference.remove(key)
            del self.ref_cnts[key]

    @rule(data=st.data(), now=st.booleans())
    def prepare_load(self, data: st.DataObject, now: bool) -> None:
        # Pins pile up (runs favour some rules), and pinned blocks cannot be evicted: pin half
        # of the time only, so that runs keep idle blocks to evict.
        ready = self.keys_with(is_ready)
        if ready and now:
            key = data.draw(st.sampled_from(ready))
            if self.ref_cnts[key] == 0:
                self.policy.mark_non_evictable(key)
                self.reference.mark_non_evictable(key)
            self.set_ref_cnt(key, self.ref_cnts[key] + 1)

    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        reading = [key for key, count in self.ref_cnts.items() if count > 0]
        if reading:
            key = data.draw(st.sampled_from(reading))
            self.set_ref_cnt(key, self.ref_cnts[key] - 1)
            if self.ref_cnts[key] == 0:
                self.policy.mark_evictable(key)
                self.reference.mark_evictable(key)

    @rule(keys=key_lists)
    def touch(self, keys: list[OffloadKey]) -> None:
        self.policy.touch(keys)
        self.reference.touch(keys)

    @rule(n=st.integers(0, 2) | st.integers(0, CAPACITY + 1), protected=st.frozensets(keys_st, max_size=3))
    def evict(self, n: int, protected: frozenset[OffloadKey]) -> None:
        before = self.policy_state()
        evicted = self.policy.evict(n, protected)
        expected = self.reference.evict(n, protected)
        assert (evicted and [k for k, _ in evicted]) == (expected and [k for k, _ in expected])
        event("evict: " + ("refused" if evicted is None else "done"))
        if evicted is None:
            assert self.policy_state() == before, "a failed evict changed the policy"
            eligible = [key for key in self.keys_with(is_idle) if key not in protected]
            assert len(eligible) < n
            return
        assert len(evicted) == n
        for key, block in evicted:
            assert self.ref_cnts.pop(key) == 0, "evicted a pending or read block"
            assert key not in protected and block.block_id == KEYS.index(key)

    @rule(now=rarely)
    def clear(self, now: bool) -> None:
        if not now:
            return
        self.policy.clear()
        self.reference.clear()
        self.ref_cnts.clear()

    def policy_state(self) -> list[tuple[str, Any]]:
        return [(name, repr(value)) for name, value in vars(self.policy).items()]

    @invariant()
    def blocks_match_the_model(self) -> None:
        for key in KEYS:
            block = self.policy.get(key)
            if key in self.ref_cnts:
                assert block is not None and block.ref_cnt == self.ref_cnts[key] >= -1
            else:
                assert block is None

    @invariant()
    def eviction_order_matches_the_reference(self) -> None:
        # Evict every idle block from copies: the whole order must agree, not just the head.
        idle = len(self.keys_with(is_idle))
        policy, reference = copy.deepcopy(self.policy), copy.deepcopy(self.reference)
        evicted, expected = policy.evict(idle, frozenset()), reference.evict(idle, frozenset())
        assert evicted is not None and expected is not None
        assert [key for key, _ in evicted] == [key for key, _ in expected]

    @invariant()
    def every_idle_block_can_be_evicted(self) -> None:
        # Atomic evict: asking for one more than there is must change nothing.
        idle = len(self.keys_with(is_idle))
        assert self.policy.evict(idle + 1, frozenset()) is None


class LRUMachine(PolicyMachine):
    policy_class = LRUCachePolicy
    reference_class = NaiveLRU

    @invariant()
    def order_holds_every_block_once_in_rank_order(self) -> None:
        policy = self.policy
        assert isinstance(policy, LRUCachePolicy)
        assert set(policy.blocks) == set(self.ref_cnts) == set(policy.ranks)
        # No request buckets here (no positions): the order is the blocks by rank.
        assert list(policy.order) == sorted(policy.blocks, key=policy.ranks.__getitem__)


class ARCMachine(PolicyMachine):
    policy_class = ARCCachePolicy
    reference_class = NaiveARC

    @invariant()
    def lists_are_consistent_and_bounded(self) -> None:
        policy = self.policy
        assert isinstance(policy, ARCCachePolicy)
        assert not policy.t1.keys() & policy.t2.keys()
        assert policy.t1.keys() | policy.t2.keys() == self.ref_cnts.keys()
        assert len(policy.b1) <= CAPACITY and len(policy.b2) <= CAPACITY
        assert not (set(policy.b1) | set(policy.b2)) & self.ref_cnts.keys()
        for ghosts in (policy.b1, policy.b2):  # stale copies stay bounded
            assert len(ghosts.order) <= 2 * len(ghosts) + 64
        assert 0 <= policy.target_t1_size <= CAPACITY
        reference = self.reference
        assert isinstance(reference, NaiveARC)
        assert policy.target_t1_size == reference.target
        assert (list(policy.b1), list(policy.b2)) == (reference.b1, reference.b2)


# --- the manager against a model of block states and events ---


class ManagerMachine(RuleBasedStateMachine):
    cache_policy: ClassVar[CachePolicyName]

    def __init__(self) -> None:
        super().__init__()
        self.manager = CPUOffloadingManager(CAPACITY, self.cache_policy, enable_events=True)
        # The running request; finish_request commits its recency and starts another.
        self.requests = 0
        self.req = ReqContext("req-0")
        # The model: ref_cnt (-1 pending) and slot of every block the manager holds.
        self.ref_cnts: dict[OffloadKey, int] = {}
        self.slots: dict[OffloadKey, int] = {}
        # Keys whose store completed and whose removal no event has reported yet.
        self.announced: set[OffloadKey] = set()

    @initialize()
    def no_events_yet(self) -> None:
        assert list(self.manager.take_events()) == []

    def keys_with(self, wanted: Callable[[int], bool]) -> list[OffloadKey]:
        return [key for key, count in self.ref_cnts.items() if wanted(count)]

    def drain(self, expect_removed: list[OffloadKey], expect_stored: list[OffloadKey]) -> None:
        events = list(self.manager.take_events())
        expected = [(keys, removed) for keys, removed in ((expect_removed, True), (expect_stored, False)) if keys]
        assert [(event.keys, event.removed) for event in events] == expected
        assert all(event.medium == "CPU" for event in events)
        self.announced -= set(expect_removed)
        self.announced |= set(expect_stored)

    def snapshot(self, with_policy: bool = True) -> Any:
        manager = self.manager
        blocks = [manager.policy.get(key) for key in KEYS]
        # LRU may drop empty request buckets on any eviction walk (no rank changes): its order is
        # compared through the ranks and the eviction order instead.
        skipped = ("_order", "_bucket_of", "_pending_join")
        policy = [(name, repr(value)) for name, value in vars(manager.policy).items() if name not in skipped]
        idle = manager.num_idle_blocks
        order = copy.deepcopy(manager.policy).evict(idle, frozenset())
        described = [None if b is None else (b.block_id, b.ref_cnt) for b in blocks]
        if not with_policy:
            return described, manager.num_free_blocks, idle
        return described, manager.num_free_blocks, idle, policy, order and [k for k, _ in order]

    @rule(keys=st.lists(keys_st, max_size=3) | key_lists, complete_now=mostly_true)
    def prepare_store(self, keys: list[OffloadKey], complete_now: bool) -> None:
        new = [key for key in dict.fromkeys(keys) if key not in self.ref_cnts]
        need = len(new) - (CAPACITY - len(self.ref_cnts))
        evictable = [key for key in self.keys_with(is_idle) if key not in keys]
        before = self.snapshot()
        output = self.manager.prepare_store(keys, self.req)
        event("prepare_store: " + ("none" if need > len(evictable) else "evicts" if need > 0 else "fits"))
        if need > len(evictable):
            assert output is None
            # Blocks, slots and events unchanged; the request's access is still recorded for
            # recency (and ARC learns from ghost hits), as in vLLM.
            assert self.snapshot(with_policy=False) == before[:3]
            self.drain([], [])
            return
        assert output is not None
        assert output.keys_to_store == new
        assert len(output.evicted_keys) == max(need, 0)
        for key in output.evicted_keys:
            assert self.ref_cnts.pop(key) == 0 and key not in keys, "evicted a busy or named block"
            self.slots.pop(key)
        assert isinstance(output.store_spec, CPULoadStoreSpec)
        block_ids = output.store_spec.block_ids.tolist()
        assert len(block_ids) == len(new)
        assert not set(block_ids) & set(self.slots.values()), "a slot was handed out twice"
        for key, block_id in zip(new, block_ids):
            self.ref_cnts[key], self.slots[key] = -1, block_id
        self.drain(output.evicted_keys, [])
        if complete_now:
            self.manager.complete_store(new, self.req)
            for key in new:
                self.ref_cnts[key] = 0
            self.drain([], new)

    @rule(data=st.data(), success=mostly_true)
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        pending = self.keys_with(is_pending)
        keys = data.draw(st.lists(st.sampled_from(pending + KEYS[:2]), max_size=5)) if pending else []
        finalized = [key for key in dict.fromkeys(keys) if self.ref_cnts.get(key) == -1]
        self.manager.complete_store(keys, self.req, success=success)
        for key in finalized:
            if success:
                self.ref_cnts[key] = 0
            else:
                del self.ref_cnts[key], self.slots[key]
        self.drain([], finalized if success else [])

    @rule(data=st.data(), corrupt=mostly_false, release_now=st.booleans())
    def prepare_load(self, data: st.DataObject, corrupt: bool, release_now: bool) -> None:
        ready = self.keys_with(is_ready)
        keys = data.draw(st.lists(st.sampled_from(ready), max_size=4)) if ready else []
        if corrupt:
            keys.insert(data.draw(st.integers(0, len(keys))), data.draw(keys_st))
        if any(self.ref_cnts.get(key, -1) < 0 for key in keys):
            before = self.snapshot()
            try:
                self.manager.prepare_load(keys, self.req)
            except OffloadProtocolError as error:
                assert error.state in ("absent", "pending")
                assert self.snapshot() == before
                event(f"prepare_load refused: {error.state}")
            else:
                raise AssertionError(f"prepare_load of an unready key accepted: {keys}")
            return
        spec = self.manager.prepare_load(keys, self.req)
        assert isinstance(spec, CPULoadStoreSpec)
        assert spec.block_ids.tolist() == [self.slots[key] for key in keys]
        for key in keys:
            self.ref_cnts[key] += 1
        if release_now:
            self.manager.complete_load(keys, self.req)
            for key in keys:
                self.ref_cnts[key] -= 1

    @rule(data=st.data(), extra=mostly_false)
    def complete_load(self, data: st.DataObject, extra: bool) -> None:
        reading = [key for key, count in self.ref_cnts.items() for _ in range(count)]
        # Drawn with repetition, so a key may be released more often than it was loaded.
        keys = data.draw(st.lists(st.sampled_from(reading), max_size=4)) if reading else []
        if extra:
            keys.insert(data.draw(st.integers(0, len(keys))), data.draw(keys_st))
        counts = {key: keys.count(key) for key in keys}
        if any(self.ref_cnts.get(key, 0) < count for key, count in counts.items()):
            before = self.snapshot()
            try:
                self.manager.complete_load(keys, self.req)
            except OffloadProtocolError as error:
                assert self.snapshot() == before
                event(f"complete_load refused: {error.state.split('(')[0]}")
            else:
                raise AssertionError(f"complete_load without a load accepted: {keys}")
            return
        self.manager.complete_load(keys, self.req)
        event(f"complete_load of {len(keys)} keys")
        for key, count in counts.items():
            self.ref_cnts[key] -= count

    @rule(keys=key_lists)
    def touch(self, keys: list[OffloadKey]) -> None:
        self.manager.touch(keys, self.req)

    @rule(keys=key_lists)
    def prepare_store_with_a_policy_that_evicts_too_few(self, keys: list[OffloadKey]) -> None:
        new = [key for key in dict.fromkeys(keys) if key not in self.ref_cnts]
        need = len(new) - (CAPACITY - len(self.ref_cnts))
        evictable = [key for key in self.keys_with(is_idle) if key not in keys]
        if need <= 0 or need > len(evictable):
            return  # only stores that must evict reach the policy
        policy = self.manager.policy
        real_evict = type(policy).evict

        def evict_one_fewer(n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
            return real_evict(policy, n - 1, protected)

        before = self.snapshot(with_policy=False)
        setattr(policy, "evict", evict_one_fewer)
        try:
            assert self.manager.prepare_store(keys, self.req) is None
        finally:
            delattr(policy, "evict")
        # The blocks it did take are put back: blocks, slots and events are as they were.
        assert self.snapshot(with_policy=False) == before
        self.drain([], [])
        event("prepare_store: short eviction refused")

    @rule()
    def finish_request(self) -> None:
        before = self.snapshot(with_policy=False)
        self.manager.on_request_finished(self.req)
        self.manager.on_request_finished(self.req)  # only the first finish counts
        assert self.snapshot(with_policy=False) == before, "finishing a request moved blocks"
        self.requests += 1
        self.req = ReqContext(f"req-{self.requests}")
        for position, key in enumerate(KEYS, start=1):
            self.req.set_offload_key_position(key, 16 * position)

    @rule(data=st.data())
    def bytes_instead_of_keys(self, data: st.DataObject) -> None:
        key = data.draw(keys_st)
        before = self.snapshot()
        operation = data.draw(st.sampled_from(["prepare_store", "prepare_load", "complete_load", "touch"]))
        try:
            getattr(self.manager, operation)(key, self.req)
        except TypeError:
            pass
        else:
            raise AssertionError(f"{operation} accepted a single bytes key")
        assert self.snapshot() == before

    @rule(now=rarely)
    def reset_cache(self, now: bool) -> None:
        if not now:
            return
        self.manager.reset_cache()
        self.ref_cnts.clear()
        self.slots.clear()
        self.announced.clear()
        assert list(self.manager.take_events()) == []

    @invariant()
    def capacity_is_never_exceeded(self) -> None:
        assert len(self.ref_cnts) <= CAPACITY
        assert self.manager.num_free_blocks == CAPACITY - len(self.ref_cnts)
        assert all(0 <= slot < CAPACITY for slot in self.slots.values())
        assert len(set(self.slots.values())) == len(self.slots)

    @invariant()
    def ref_counts_match_and_never_go_negative(self) -> None:
        for key in KEYS:
            block = self.manager.policy.get(key)
            if key in self.ref_cnts:
                assert block is not None and block.ref_cnt == self.ref_cnts[key] >= -1
                assert block.block_id == self.slots[key]
            else:
                assert block is None

    @invariant()
    def lookups_agree_with_the_model(self) -> None:
        for key in KEYS:
            count = self.ref_cnts.get(key)
            expected = False if count is None else (None if count < 0 else True)
            assert self.manager.lookup(key, self.req) is expected
        for key in self.announced:
            assert self.manager.lookup(key, self.req) is True, "a stored key vanished without an event"

    @invariant()
    def idle_count_matches_a_brute_force_count(self) -> None:
        brute = 0
        for key in KEYS:
            block = self.manager.policy.get(key)
            brute += block is not None and block.ref_cnt == 0
        assert self.manager.num_idle_blocks == brute


class ManagerLRUMachine(ManagerMachine):
    cache_policy = "lru"


class ManagerARCMachine(ManagerMachine):
    cache_policy = "arc"


TestLRUPolicy = LRUMachine.TestCase
TestARCPolicy = ARCMachine.TestCase
TestManagerLRU = ManagerLRUMachine.TestCase
TestManagerARC = ManagerARCMachine.TestCase
for _case in (TestLRUPolicy, TestARCPolicy, TestManagerLRU, TestManagerARC):
    _case.settings = MACHINE_SETTINGS
del _case
