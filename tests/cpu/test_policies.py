"""Cache policies: one behavioural suite run against every policy, then each policy's own rules.

The helpers below play the manager's part: they move reference counts and call the hooks the
way `CPUOffloadingManager` does.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable
from typing import Any, cast

import pytest
from typing_extensions import override

from kvref.base import OffloadKey, ReqContext, get_offload_block_hash, make_offload_key
from kvref.cpu.policies.arc import ARCCachePolicy
from kvref.cpu.policies.base import BlockStatus, CachePolicy, is_no_op_hook
from kvref.cpu.policies.factory import (
    create_cache_policy,
    get_cache_policy_class,
    register_cache_policy,
    registered_cache_policies,
)
from kvref.cpu.policies._lru_ranks import Bucket
from kvref.cpu.policies.lru import LRUCachePolicy

POLICY_CLASSES: list[type[CachePolicy]] = [LRUCachePolicy, ARCCachePolicy]


def to_key(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def to_keys(ints: Iterable[int]) -> list[OffloadKey]:
    return [to_key(i) for i in ints]


def add_pending(policy: CachePolicy, *ints: int) -> None:
    """prepare_store: a new block whose write is in flight (slot id = the key's integer)."""
    for i in ints:
        policy.insert(to_key(i), BlockStatus(i))


def complete(policy: CachePolicy, *ints: int) -> None:
    """complete_store: ref_cnt -1 -> 0."""
    for i in ints:
        block = policy.get(to_key(i))
        assert block is not None and block.ref_cnt == -1
        block.ref_cnt = 0
        policy.mark_evictable(to_key(i))


def add_idle(policy: CachePolicy, *ints: int) -> None:
    add_pending(policy, *ints)
    complete(policy, *ints)


def pin(policy: CachePolicy, *ints: int) -> None:
    """prepare_load."""
    for i in ints:
        block = policy.get(to_key(i))
        assert block is not None and block.ref_cnt >= 0
        if block.ref_cnt == 0:
            policy.mark_non_evictable(to_key(i))
        block.ref_cnt += 1


def unpin(policy: CachePolicy, *ints: int) -> None:
    """complete_load."""
    for i in ints:
        block = policy.get(to_key(i))
        assert block is not None and block.ref_cnt > 0
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            policy.mark_evictable(to_key(i))


def touch(policy: CachePolicy, *ints: int) -> None:
    policy.touch(to_keys(ints))


def evict(policy: CachePolicy, n: int, protected: Collection[int] = ()) -> list[int] | None:
    """Evict n blocks; return their integers (checking each block came back with its key)."""
    evicted = policy.evict(n, frozenset(to_keys(protected)))
    if evicted is None:
        return None
    assert all(key == to_key(block.block_id) for key, block in evicted)
    return [block.block_id for _, block in evicted]


def evict_order(policy: CachePolicy) -> list[int]:
    """The order a copy of the policy evicts all its idle blocks in."""
    idle = sum(1 for i in range(16) if (b := policy.get(to_key(i))) is not None and b.ref_cnt == 0)
    victims = copy.deepcopy(policy).evict(idle, frozenset())
    assert victims is not None
    return [int.from_bytes(get_offload_block_hash(key), "big") for key, _ in victims]


def state(policy: CachePolicy) -> dict[str, Any]:
    """Every attribute of the policy, containers as ordered lists (for "nothing changed")."""

    def describe(value: Any) -> Any:
        if isinstance(value, BlockStatus):
            return (value.block_id, value.ref_cnt)
        if isinstance(value, dict):
            entries = cast(dict[Any, Any], value)
            return [(key, describe(item)) for key, item in entries.items()]
        return value

    return {name: describe(value) for name, value in vars(policy).items()}


@pytest.fixture(params=POLICY_CLASSES, ids=lambda cls: cls.__name__)
def policy(request: pytest.FixtureRequest) -> CachePolicy:
    policy_class = cast(type[CachePolicy], request.param)
    return policy_class(8)


# --- the behaviour every policy shares ---


def test_get_returns_the_inserted_block_or_none(policy: CachePolicy) -> None:
    block = BlockStatus(3)
    policy.insert(to_key(3), block)
    assert policy.get(to_key(3)) is block
    assert policy.get(to_key(4)) is None


def test_idle_blocks_are_evicted_oldest_first(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2, 3, 4)
    assert evict(policy, 2) == [1, 2]
    assert policy.get(to_key(1)) is None and policy.get(to_key(3)) is not None
    assert evict(policy, 2) == [3, 4]


def test_get_does_not_change_recency(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2)
    policy.get(to_key(1))
    assert evict(policy, 1) == [1]


def test_completing_stores_does_not_reorder_blocks(policy: CachePolicy) -> None:
    """Recency is logical (vLLM 0.33): the first store is the use, not its completion."""
    add_pending(policy, 1, 2, 3)
    complete(policy, 3, 1, 2)
    assert evict(policy, 3) == [1, 2, 3]


def test_pending_and_read_blocks_are_never_evicted(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2)
    add_pending(policy, 3)
    pin(policy, 1)
    assert evict(policy, 2) is None
    assert evict(policy, 1) == [2]


def test_a_released_block_keeps_its_recency(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2, 3)
    pin(policy, 1)
    pin(policy, 1)
    unpin(policy, 1)  # still read once: not idle yet
    assert evict(policy, 1) == [2]
    unpin(policy, 1)
    assert evict(policy, 2) == [1, 3]


def test_touch_reranks_pending_and_read_blocks(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2)
    add_pending(policy, 3)
    pin(policy, 1)
    touch(policy, 1, 3)  # both busy; the touch still counts (1 ends most recent)
    complete(policy, 3)
    unpin(policy, 1)
    assert evict(policy, 3) == [2, 3, 1]


def test_protected_blocks_are_skipped(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2, 3)
    assert evict(policy, 2, protected={1, 9}) == [2, 3]
    assert evict(policy, 1, protected={1}) is None
    assert evict(policy, 1) == [1]


def test_failed_eviction_changes_nothing(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2, 3, 4)
    touch(policy, 3, 4)
    pin(policy, 2)
    add_pending(policy, 5)
    before = state(policy)
    # 3 idle blocks, one protected: 3 cannot be found
    assert evict(policy, 3, protected={4}) is None
    assert state(policy) == before


def test_evicting_nothing_returns_an_empty_list(policy: CachePolicy) -> None:
    assert evict(policy, 0) == []
    add_idle(policy, 1)
    assert evict(policy, 0) == []
    assert policy.get(to_key(1)) is not None


def test_touch_applies_keys_last_first(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2, 3, 4)
    # touch [1, 2, 3] -> the request's head, 1, ends most recent: 4, then 3, 2, 1
    touch(policy, 1, 2, 3)
    assert evict(policy, 4) == [4, 3, 2, 1]


@pytest.mark.parametrize("container", [list, tuple, set, dict.fromkeys], ids=lambda c: c.__name__)
def test_touch_accepts_any_collection(policy: CachePolicy, container: Any) -> None:
    add_idle(policy, 1, 2)
    policy.touch(container([to_key(1)]))
    assert evict(policy, 1) == [2]


def test_touch_ignores_absent_keys_and_does_not_free_busy_blocks(policy: CachePolicy) -> None:
    add_idle(policy, 1)
    add_pending(policy, 2)
    touch(policy, 9, 2)
    assert policy.get(to_key(9)) is None
    assert evict(policy, 2) is None
    assert evict(policy, 1) == [1]


def test_remove_drops_a_block_in_any_state(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2)
    add_pending(policy, 3)
    policy.remove(to_key(1))
    policy.remove(to_key(3))
    policy.remove(to_key(9))  # absent: ignored
    assert policy.get(to_key(1)) is None and policy.get(to_key(3)) is None
    assert evict(policy, 2) is None
    assert evict(policy, 1) == [2]


def test_clear_drops_everything(policy: CachePolicy) -> None:
    empty = state(policy)
    empty.pop("_generation", None)  # clear() starts a new generation of request ranks
    add_idle(policy, 1, 2, 3)
    add_pending(policy, 4)
    pin(policy, 3)
    touch(policy, 1)
    evict(policy, 1)
    policy.clear()
    cleared = state(policy)
    cleared.pop("_generation", None)
    assert cleared == empty
    assert evict(policy, 1) is None


# --- LRU ---


def test_lru_load_completion_does_not_refresh_recency() -> None:
    """Issue 13 point 5, as in vLLM's seed-era scan LRU and 0.33's logical LRU: [2, 3, 4]."""
    policy = LRUCachePolicy(4)
    add_idle(policy, 2)
    add_pending(policy, 3, 4, 5)
    complete(policy, 3, 4, 5)
    pin(policy, 2, 3)
    unpin(policy, 2, 3)
    assert evict(policy, 3) == [2, 3, 4]


def test_lru_ranks_a_running_request_tail_first_and_commits_at_finish() -> None:
    policy = LRUCachePolicy(8)
    early, request = ReqContext("early"), ReqContext("running")
    keys = to_keys([1, 2, 3])
    for position, key in enumerate(keys, start=1):
        request.set_offload_key_position(key, 16 * position)
    policy.on_request_access(keys, request)  # takes the request's provisional rank first
    policy.insert_for_request(keys, [BlockStatus(1), BlockStatus(2), BlockStatus(3)], request)
    policy.insert_for_request(to_keys([4]), [BlockStatus(4)], early)  # no position: a fresh rank
    complete(policy, 1, 2, 3, 4)
    # One provisional rank, older than 4's; within it the tail (latest position) goes first.
    assert evict_order(policy) == [3, 2, 1, 4]
    policy.on_request_finished([keys], set(keys), set(), request)
    # Committed: fresh ranks tail first, so the head ends most recent.
    assert evict_order(policy) == [4, 3, 2, 1]


def test_lru_a_touch_after_an_access_overrides_only_the_keys_it_touches() -> None:
    """The access is applied lazily (LRU skips joins a touch undoes): untouched keys still join."""
    policy = LRUCachePolicy(8)
    add_idle(policy, 1, 2, 3, 4)  # fresh ranks, oldest first
    request = ReqContext("loader")
    for position, key in enumerate(to_keys([1, 2, 3]), start=1):
        request.set_offload_key_position(key, 16 * position)
    policy.on_request_access(to_keys([1, 2, 3]), request)  # its rank is newer than 1..4's
    touch(policy, 2)
    # 4 keeps its rank; 1 and 3 share the request's, tail first; 2 is the most recent.
    assert evict_order(policy) == [4, 3, 1, 2]
    again = ReqContext("again")
    for position, key in enumerate(to_keys([4, 1]), start=1):
        again.set_offload_key_position(key, 16 * position)
    policy.on_request_access(to_keys([4, 1]), again)
    touch(policy, 1, 2, 3, 4)  # covers every key the access named: nothing joins
    assert evict_order(policy) == [4, 3, 2, 1]
    assert not any(isinstance(entry, Bucket) and entry.keys for entry in policy.order)


def test_lru_order_holds_every_block_busy_or_not_in_rank_order() -> None:
    policy = LRUCachePolicy(4)
    add_idle(policy, 1, 2)
    add_pending(policy, 3)
    pin(policy, 2)
    assert list(policy.order) == to_keys([1, 2, 3])
    touch(policy, 2, 3)  # busy blocks are re-ranked too (3 ends before 2: first key most recent)
    assert list(policy.order) == to_keys([1, 3, 2])
    assert policy.ranks[to_key(1)] < policy.ranks[to_key(3)] < policy.ranks[to_key(2)]
    unpin(policy, 2)
    complete(policy, 3)
    assert evict_order(policy) == [1, 3, 2]


def test_lru_a_finished_request_that_stores_again_keeps_its_old_rank() -> None:
    """Rare: the request's bucket was dropped when it finished; the block goes back to its place."""
    policy = LRUCachePolicy(8)
    request = ReqContext("r")
    request.set_offload_key_position(to_key(1), 16)
    request.set_offload_key_position(to_key(2), 32)
    policy.insert_for_request(to_keys([1]), [BlockStatus(1)], request)
    policy.on_request_finished([to_keys([1])], {to_key(1)}, set(), request)
    add_idle(policy, 3)
    policy.insert_for_request(to_keys([2]), [BlockStatus(2)], request)  # the old provisional rank
    complete(policy, 1, 2)
    assert evict_order(policy) == [2, 1, 3]


def test_lru_an_empty_bucket_eviction_dropped_stays_out_until_a_block_joins() -> None:
    """A request whose blocks have no position never fills its bucket: once an eviction drops
    it, later calls must not put it back (each did, by rebuilding the whole order)."""
    policy = LRUCachePolicy(8)
    request = ReqContext("no-positions")
    for step in range(4):
        keys = to_keys([2 * step + 1, 2 * step + 2])
        policy.on_request_access(keys, request)
        buckets = [entry for entry in policy.order if isinstance(entry, Bucket)]
        assert len(buckets) == (1 if step == 0 else 0)  # placed when taken, not after a drop
        policy.insert_for_request(keys, [BlockStatus(2 * step + 1), BlockStatus(2 * step + 2)], request)
        complete(policy, 2 * step + 1, 2 * step + 2)
        assert evict(policy, 1) == [step + 1]  # the walk drops the empty bucket
    assert evict_order(policy) == [5, 6, 7, 8]


def test_lru_a_bucket_emptied_by_eviction_goes_back_to_its_rank_when_blocks_join() -> None:
    policy = LRUCachePolicy(8)
    request = ReqContext("long")
    for position, n in enumerate(range(1, 6), start=1):
        request.set_offload_key_position(to_key(n), 16 * position)
    policy.insert_for_request(to_keys([1]), [BlockStatus(1)], request)  # the request's rank
    add_idle(policy, 6, 7)  # fresh ranks, newer than the request's
    complete(policy, 1)
    assert evict(policy, 1) == [1]  # the bucket empties and leaves the order
    policy.insert_for_request(to_keys([2, 3]), [BlockStatus(2), BlockStatus(3)], request)
    complete(policy, 2, 3)
    ranks = list(policy.order.values())
    assert ranks == sorted(ranks)
    assert evict_order(policy) == [3, 2, 6, 7]  # the old provisional rank, tail first


def test_lru_keeps_no_capacity_state() -> None:
    policy = LRUCachePolicy(1)
    add_idle(policy, 1, 2, 3)  # the manager bounds the blocks, not the policy
    assert evict(policy, 3) == [1, 2, 3]


# --- ARC ---


def test_arc_promotes_a_touched_ready_block_to_t2() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1)
    add_pending(policy, 2)
    touch(policy, 1, 2)
    assert list(policy.t1) == [to_key(2)]  # pending: prepared, not used twice
    assert list(policy.t2) == [to_key(1)]


def test_arc_finished_request_promotes_what_it_reused_only() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1, 2, 3)
    request = ReqContext("r")
    policy.on_request_finished([to_keys([1, 2])], {to_key(2)}, {to_key(1)}, request)
    assert list(policy.t1) == to_keys([3, 2])  # 2 was only stored: it stays in t1, most recent
    assert list(policy.t2) == to_keys([1])


def test_arc_store_miss_learns_from_ghosts() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1, 2)
    evict(policy, 1)  # b1 = [1]
    policy.on_store_miss(to_keys([1]), ReqContext("r"))
    assert policy.target_t1_size == 1.0


def test_arc_evicts_t1_before_t2_while_t1_is_over_target() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1, 2, 3)
    touch(policy, 1)  # t1 = [2, 3], t2 = [1], target 0
    assert evict(policy, 3) == [2, 3, 1]
    assert list(policy.b1) == to_keys([2, 3])
    assert list(policy.b2) == to_keys([1])


def test_arc_ghost_hits_move_the_target() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1, 2, 3, 4)
    touch(policy, 3, 4)  # t1 = [1, 2], t2 = [4, 3]
    assert evict(policy, 3) == [1, 2, 4]  # b1 = [1, 2], b2 = [4]

    touch(policy, 1)  # b1 hit: target += max(1, |b2| / |b1|) = 1
    assert policy.target_t1_size == 1.0
    assert list(policy.b1) == to_keys([2, 1])
    touch(policy, 4)  # b2 hit: target -= max(1, |b1| / |b2|) = 2, floored at 0
    assert policy.target_t1_size == 0.0

    for _ in range(10):
        touch(policy, 1)
    assert policy.target_t1_size == 4.0  # capped at the capacity


def test_arc_prefers_t2_when_t1_is_below_target() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1, 2)
    evict(policy, 1)  # b1 = [1]
    touch(policy, 1)  # target 1
    add_idle(policy, 3)
    touch(policy, 3)  # t1 = [2], t2 = [3]
    # |t1| = 1 >= int(target) = 1 -> t1 first; then |t1| = 0 < 1 -> t2
    assert evict(policy, 2) == [2, 3]
    for _ in range(2):
        touch(policy, 2)  # b1 hit again: target 3
    add_idle(policy, 4, 5, 6)
    touch(policy, 6)  # t1 = [4, 5], t2 = [6]; |t1| = 2 < 3 -> t2 first
    assert evict(policy, 1) == [6]


def test_arc_falls_back_to_the_other_list_rather_than_fail() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1, 2)
    evict(policy, 1)
    for _ in range(4):
        touch(policy, 1)  # target 4: t2 preferred, but t2 is empty
    assert policy.target_t1_size == 4.0 and not policy.t2
    assert evict(policy, 1) == [2]


def test_arc_reinserting_a_ghost_leaves_the_ghost_list() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1)
    evict(policy, 1)
    add_pending(policy, 1)
    assert not policy.b1 and list(policy.t1) == [to_key(1)]


def test_arc_ghost_lists_are_bounded_by_the_capacity() -> None:
    policy = ARCCachePolicy(3)
    for i in range(10):
        add_idle(policy, i)
        if i % 2:
            touch(policy, i)  # odd keys go to t2, so both ghost lists fill up
        evict(policy, 1)
        assert len(policy.b1) <= 3 and len(policy.b2) <= 3
    assert list(policy.b1) == to_keys([4, 6, 8])  # the most recent ghosts survive
    assert list(policy.b2) == to_keys([5, 7, 9])


def test_arc_clear_resets_the_target() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1, 2)
    evict(policy, 1)
    touch(policy, 1)
    assert policy.target_t1_size > 0
    policy.clear()
    assert policy.target_t1_size == 0.0 and not policy.b1


# --- factory ---


def test_factory_builds_policies_by_name() -> None:
    assert registered_cache_policies() == ["arc", "lru"]
    assert get_cache_policy_class("arc") is ARCCachePolicy
    policy = create_cache_policy("lru", 4)
    assert isinstance(policy, LRUCachePolicy)


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test vanish with it."""
    monkeypatch.setattr(
        "kvref.cpu.policies.factory._POLICIES", {"lru": LRUCachePolicy, "arc": ARCCachePolicy}
    )


# The registry behaves as the tier registry does (tests/tiering/test_base_factory.py asserts the
# same behaviours of register_tier).


@pytest.mark.usefixtures("fresh_registry")
def test_register_lists_sorted_names_and_builds_them() -> None:
    class NewestFirstPolicy(LRUCachePolicy):
        """An out-of-tree policy (here simply LRU under another name)."""

    register_cache_policy("fifo", NewestFirstPolicy)
    assert registered_cache_policies() == ["arc", "fifo", "lru"]
    assert isinstance(create_cache_policy("fifo", 2), NewestFirstPolicy)


@pytest.mark.parametrize("unknown", ["mru", "", "LRU"])
def test_unknown_names_fail_listing_the_registered_ones(unknown: str) -> None:
    with pytest.raises(ValueError, match=rf"{unknown!r} is not registered; .*: arc, lru$"):
        create_cache_policy(unknown, 4)


@pytest.mark.usefixtures("fresh_registry")
def test_register_refuses_duplicates_unless_replacing() -> None:
    with pytest.raises(ValueError, match=r"'lru' is already registered; pass replace=True"):
        register_cache_policy("lru", ARCCachePolicy)
    assert get_cache_policy_class("lru") is LRUCachePolicy
    register_cache_policy("lru", ARCCachePolicy, replace=True)
    assert get_cache_policy_class("lru") is ARCCachePolicy


@pytest.mark.usefixtures("fresh_registry")
def test_register_refuses_an_empty_name() -> None:
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        register_cache_policy("", LRUCachePolicy)
    assert registered_cache_policies() == ["arc", "lru"]


@pytest.mark.usefixtures("fresh_registry")
@pytest.mark.parametrize("not_a_name", [None, 3, b"lru"])
def test_register_refuses_a_name_that_is_not_a_str(not_a_name: Any) -> None:
    with pytest.raises(TypeError, match="name must be a str"):
        register_cache_policy(not_a_name, LRUCachePolicy)
    assert registered_cache_policies() == ["arc", "lru"]


def test_policy_modules_stay_small() -> None:
    """STYLE.md point 9: policy modules stay small (<= 250 lines), ARC excepted for its docstring."""
    import kvref.cpu.policies.base as base
    import kvref.cpu.policies.factory as factory
    import kvref.cpu.policies.lru as lru

    for module in (base, factory, lru):
        assert module.__file__ is not None
        with open(module.__file__, encoding="utf-8") as source:
            # vLLM 0.33's own lru.py is 233 lines; kvref's docstring explains its index too.
            assert len(source.readlines()) <= 270, module.__name__


@pytest.mark.parametrize("not_a_policy", [dict, object(), "lru", None])
def test_register_rejects_what_is_not_a_cache_policy(not_a_policy: Any) -> None:
    with pytest.raises(TypeError, match="policy_class must be a CachePolicy subclass"):
        register_cache_policy("not-a-policy", not_a_policy)
    assert "not-a-policy" not in registered_cache_policies()


def test_no_op_hooks_are_declared_and_overrides_are_not() -> None:
    """The manager skips hooks declared with @no_op_hook; an override is always called."""
    lru, arc = LRUCachePolicy(2), ARCCachePolicy(2)
    for name in ("mark_evictable", "mark_non_evictable", "on_request_access"):
        assert is_no_op_hook(arc, name), name
    assert is_no_op_hook(lru, "on_store_miss") and is_no_op_hook(lru, "mark_evictable")
    assert not is_no_op_hook(arc, "on_store_miss")  # ARC learns from ghost hits there
    assert not is_no_op_hook(lru, "on_request_access")  # LRU ranks the request's blocks

    class Indexing(LRUCachePolicy):
        @override
        def mark_evictable(self, key: OffloadKey) -> None:
            super().mark_evictable(key)

    assert not is_no_op_hook(Indexing(2), "mark_evictable")
