"""Cache policies: one behavioural suite run against every policy, each policy's own rules, and
`CachePolicyFactory` (by name and by module path).

The helpers play the manager's part: they move reference counts and call the hooks as
`CPUOffloadingManager` does. That LRU and ARC decide as vLLM 0.33's do on every evicting store
is `test_stateful.py`'s.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

import pytest
from typing_extensions import override

from kvref.base import OffloadKey, ReqContext
from kvref.cpu.manager import CPUOffloadingManager
from kvref.cpu.policies.arc import ARCCachePolicy
from kvref.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys
from kvref.cpu.policies.factory import CachePolicyFactory
from kvref.cpu.policies.lru import LRUCachePolicy
from tests.cpu.keys import COLLECTIONS, to_key, to_keys
from tests.cpu.manager_state import describe_policy, policy_of

REQ = ReqContext("req-0")
POLICY_CLASSES: list[type[CachePolicy]] = [LRUCachePolicy, ARCCachePolicy]


def add_pending(policy: CachePolicy, *ints: int, request: ReqContext = REQ) -> None:
    """prepare_store: a new chunk whose write is in flight (its slot id is the key's integer)."""
    for i in ints:
        policy.insert(to_key(i), ChunkStatus(i), request)


def complete(policy: CachePolicy, *ints: int) -> None:
    """complete_store: ref_cnt -1 -> 0."""
    for i in ints:
        chunk = policy.get(to_key(i))
        assert chunk is not None and chunk.ref_cnt == -1
        chunk.ref_cnt = 0
        policy.mark_evictable(to_key(i))


def add_idle(policy: CachePolicy, *ints: int) -> None:
    add_pending(policy, *ints)
    complete(policy, *ints)


def pin(policy: CachePolicy, *ints: int) -> None:
    """prepare_load."""
    for i in ints:
        chunk = policy.get(to_key(i))
        assert chunk is not None and chunk.ref_cnt >= 0
        if chunk.ref_cnt == 0:
            policy.mark_non_evictable(to_key(i))
        chunk.ref_cnt += 1


def unpin(policy: CachePolicy, *ints: int) -> None:
    """complete_load."""
    for i in ints:
        chunk = policy.get(to_key(i))
        assert chunk is not None and chunk.ref_cnt > 0
        chunk.ref_cnt -= 1
        if chunk.ref_cnt == 0:
            policy.mark_evictable(to_key(i))


def touch(policy: CachePolicy, *ints: int) -> None:
    policy.touch(to_keys(ints), REQ)


def finish(policy: CachePolicy, request: ReqContext, ints: list[int], inserted: set[int], reused: set[int]) -> None:
    """on_request_finished: the request named `ints` (one KV-cache group)."""
    policy.on_request_finished((tuple(to_keys(ints)),), set(to_keys(inserted)), set(to_keys(reused)), request)


def eviction_order(policy: CachePolicy) -> list[int]:
    """Which idle chunks, by integer, `evict` would take, in order (read from a copy)."""
    twin = copy.deepcopy(policy)
    order: list[int] = []
    while (evicted := twin.evict(1, set())) is not None:
        order.extend(chunk.chunk_id for _, chunk in evicted)
    return order


def positioned_request(name: str, ints: Iterable[int]) -> ReqContext:
    """A request whose keys end at token 16, 32, ... in the order given."""
    request = ReqContext(name)
    for position, key in enumerate(to_keys(ints), start=1):
        request.set_offload_key_position(key, 16 * position)
    return request


# --- every policy ---


@pytest.fixture(params=POLICY_CLASSES, ids=lambda cls: cls.__name__)
def policy(request: pytest.FixtureRequest) -> CachePolicy:
    policy_class: type[CachePolicy] = request.param
    return policy_class(cache_capacity=4)


def test_get_returns_the_inserted_chunk_or_none(policy: CachePolicy) -> None:
    add_pending(policy, 1)
    chunk = policy.get(to_key(1))
    assert chunk is not None and (chunk.chunk_id, chunk.ref_cnt, chunk.is_ready) == (1, -1, False)
    assert policy.get(to_key(2)) is None


def test_idle_chunks_are_evicted_in_store_order(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2, 3)
    assert eviction_order(policy) == [1, 2, 3]


def test_completing_stores_and_loads_is_not_a_use(policy: CachePolicy) -> None:
    # stored 1, 2, 3; their writes complete in reverse, 1 is read and released
    add_pending(policy, 1, 2, 3)
    complete(policy, 3, 2, 1)
    pin(policy, 1)
    unpin(policy, 1)
    assert eviction_order(policy) == [1, 2, 3]


def test_pending_and_read_chunks_are_never_evicted(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2)
    add_pending(policy, 3)
    pin(policy, 1)
    assert eviction_order(policy) == [2]
    assert policy.evict(2, set()) is None


def test_protected_chunks_are_skipped(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2, 3)
    evicted = policy.evict(2, set(to_keys([1])))
    assert evicted is not None and [chunk.chunk_id for _, chunk in evicted] == [2, 3]
    assert policy.get(to_key(1)) is not None and policy.get(to_key(2)) is None


def test_a_failed_eviction_changes_nothing(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2, 3)
    touch(policy, 2)
    before = eviction_order(policy), describe_policy(policy)
    # evict 3 while 3 is protected -> only two are eligible: None, and nothing moved
    assert policy.evict(3, set(to_keys([3]))) is None
    assert (eviction_order(policy), describe_policy(policy)) == before
    assert [policy.get(key) is not None for key in to_keys([1, 2, 3])] == [True, True, True]


def test_evicting_nothing_returns_an_empty_list(policy: CachePolicy) -> None:
    assert policy.evict(0, set()) == []
    add_pending(policy, 1)
    assert policy.evict(0, set()) == []


def test_touch_applies_keys_last_first_so_the_first_ends_most_recent(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2, 3, 4)
    touch(policy, 2, 1)
    assert eviction_order(policy)[:2] == [3, 4]
    assert eviction_order(policy)[-1] == 2


@pytest.mark.parametrize("container", COLLECTIONS)
def test_touch_takes_any_collection_and_ignores_absent_keys(policy: CachePolicy, container: str) -> None:
    add_idle(policy, 1, 2)
    policy.touch(COLLECTIONS[container](to_keys([1, 9])), REQ)
    assert eviction_order(policy) == [2, 1]
    assert policy.get(to_key(9)) is None


def test_remove_drops_a_pending_chunk(policy: CachePolicy) -> None:
    add_idle(policy, 1)
    add_pending(policy, 2)
    policy.remove(to_key(2))  # a failed store
    assert policy.get(to_key(2)) is None and eviction_order(policy) == [1]


def test_touch_reranks_pending_and_read_chunks(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2)
    add_pending(policy, 3)
    pin(policy, 1)
    # touch [1, 3] while 1 is read and 3 written -> once idle, they rank after 2, 1 last
    touch(policy, 1, 3)
    complete(policy, 3)
    unpin(policy, 1)
    assert eviction_order(policy) == [2, 3, 1]


def test_clear_drops_every_chunk_whatever_its_state(policy: CachePolicy) -> None:
    add_idle(policy, 1, 2)
    add_pending(policy, 3)
    pin(policy, 1)
    policy.clear()
    assert [policy.get(key) for key in to_keys([1, 2, 3])] == [None, None, None]
    add_idle(policy, 4)
    assert eviction_order(policy) == [4]


def test_order_request_keys_sorts_by_position_only_when_every_key_has_one() -> None:
    groups = ((to_key(1), to_key(2)), (to_key(3),))
    request = positioned_request("r", [3, 2, 1])
    assert order_request_keys(groups, request) == to_keys([3, 2, 1])
    request = positioned_request("r", [3, 2])  # 1 has no position: the groups as given
    assert order_request_keys(groups, request) == to_keys([1, 2, 3])


# --- LRU ---


def test_lru_a_running_request_ranks_its_chunks_tail_first_then_commits_at_finish() -> None:
    policy = LRUCachePolicy(4)
    add_idle(policy, 9)
    request = positioned_request("r", [1, 2, 3])
    # the request stores its chunks head first: provisionally they rank tail first
    for i in (1, 2, 3):
        add_pending(policy, i, request=request)
    complete(policy, 1, 2, 3)
    assert eviction_order(policy) == [9, 3, 2, 1]
    # touch [9] -> 9 is a fresh use, newer than the running request's rank
    touch(policy, 9)
    assert eviction_order(policy) == [3, 2, 1, 9]
    # the request finishes -> its chunks are re-ranked tail first: the head is the most recent
    finish(policy, request, [1, 2, 3], inserted={1, 2, 3}, reused=set())
    assert eviction_order(policy) == [9, 3, 2, 1]


def test_lru_a_request_access_moves_a_chunk_to_its_rank_but_never_back() -> None:
    policy = LRUCachePolicy(4)
    older, newer = positioned_request("older", [1, 2]), positioned_request("newer", [1, 2])
    add_idle(policy, 1, 2)
    policy.on_request_access(to_keys([1]), older)  # older's rank (1) is taken now
    policy.on_request_access(to_keys([2]), newer)
    # newer's rank is the highest; older, which ranked 1 first, now names 2: it stays newer's
    policy.on_request_access(to_keys([2]), older)
    assert eviction_order(policy) == [1, 2]
    assert policy.ranks[to_key(2)][0] > policy.ranks[to_key(1)][0]


# --- ARC ---


def test_arc_a_touched_ready_chunk_moves_to_t2_a_pending_one_stays_in_t1() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1)
    add_pending(policy, 2)
    touch(policy, 1, 2)
    assert (list(policy.t1), list(policy.t2)) == (to_keys([2]), to_keys([1]))


def test_arc_a_finished_request_promotes_what_it_reused_and_keeps_insertions_in_t1() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1, 2, 3)
    finish(policy, REQ, [1, 2, 3], inserted={3}, reused={1})
    # 1 reused -> t2; 3 inserted -> stays in t1, moved to its recent end; 2 untouched
    assert (list(policy.t1), list(policy.t2)) == (to_keys([2, 3]), to_keys([1]))


def test_arc_evicts_t1_first_while_it_is_at_or_over_its_target() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1, 2, 3, 4)
    touch(policy, 1, 2)  # t1 = [3, 4], t2 = [2, 1]; the target is 0
    assert eviction_order(policy) == [3, 4, 2, 1]
    assert policy.evict(1, set()) is not None
    assert list(policy.b1) == to_keys([3])


def test_arc_ghost_hits_move_the_target_and_a_high_target_spares_t1() -> None:
    policy = ARCCachePolicy(4)
    add_idle(policy, 1, 2, 3, 4)
    touch(policy, 4)  # t1 = [1, 2, 3], t2 = [4]
    assert policy.evict(2, set()) is not None  # 1, 2 -> b1
    # store misses of 1 and 2: two b1 hits (t1 was evicted too early), each grows the target by 1
    policy.on_store_miss(to_keys([1, 2]), REQ)
    assert policy.target_t1_size == 2.0
    # t1 holds 1 chunk, below its target of 2 -> the next eviction takes t2's 4
    evicted = policy.evict(1, set())
    assert evicted is not None and [key for key, _ in evicted] == to_keys([4])
    # a b2 hit shrinks the target by max(1, |b1| / |b2|) = 2
    policy.on_store_miss(to_keys([4]), REQ)
    assert policy.target_t1_size == 0.0
    # inserting a ghost's key takes it out of its ghost list
    add_idle(policy, 1)
    assert list(policy.b1) == to_keys([2])


def test_arc_ghost_lists_are_bounded_by_the_capacity() -> None:
    policy = ARCCachePolicy(2)
    for i in range(6):
        add_idle(policy, i)
        if i >= 2:
            assert policy.evict(1, set()) is not None
    assert list(policy.b1) == to_keys([2, 3])
    policy.clear()
    assert (list(policy.b1), policy.target_t1_size) == ([], 0.0)


# --- CachePolicyFactory ---


class ModulePathPolicy(LRUCachePolicy):
    """An out-of-tree policy, loaded from this module by `cache_policy_module_path`."""


NotAPolicy = dict
NOT_A_CLASS = 4


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    original = dict(CachePolicyFactory._registry)  # pyright: ignore[reportPrivateUsage]
    yield
    CachePolicyFactory._registry = original  # pyright: ignore[reportPrivateUsage]


def test_policies_by_name() -> None:
    assert CachePolicyFactory.get_cache_policy_cls("lru") is LRUCachePolicy
    assert CachePolicyFactory.get_cache_policy_cls("arc") is ARCCachePolicy
    manager = CPUOffloadingManager(num_chunks=7, cache_policy="arc")
    assert isinstance(policy_of(manager), ARCCachePolicy) and policy_of(manager).cache_capacity == 7


@pytest.mark.parametrize("name", ["fifo", "LRU", ""])
def test_an_unknown_name_is_a_value_error_listing_the_known_ones(name: str) -> None:
    with pytest.raises(ValueError, match=rf"Unknown cache policy: {name!r}\. Supported: \['lru', 'arc'"):
        CachePolicyFactory.get_cache_policy_cls(name)


def test_a_policy_by_module_path_needs_no_registration() -> None:
    assert CachePolicyFactory.get_cache_policy_cls("ModulePathPolicy", __name__) is ModulePathPolicy
    manager = CPUOffloadingManager(4, cache_policy="ModulePathPolicy", cache_policy_module_path=__name__)
    assert type(policy_of(manager)) is ModulePathPolicy
    # a registered name wins over the module path
    assert CachePolicyFactory.get_cache_policy_cls("lru", __name__) is LRUCachePolicy


def test_a_module_path_class_that_is_not_a_cache_policy_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=rf"{__name__}\.NotAPolicy is not a CachePolicy subclass: <class 'dict'>"):
        CachePolicyFactory.get_cache_policy_cls("NotAPolicy", __name__)
    with pytest.raises(TypeError, match="is not a CachePolicy subclass: 4"):
        CachePolicyFactory.get_cache_policy_cls("NOT_A_CLASS", __name__)


def test_a_module_path_that_does_not_import_is_an_import_error() -> None:
    with pytest.raises(ImportError):
        CachePolicyFactory.get_cache_policy_cls("Policy", "tests.cpu.no_such_module")


@pytest.mark.usefixtures("fresh_registry")
def test_registered_names_load_lazily_and_are_checked() -> None:
    CachePolicyFactory.register_cache_policy("module-path", __name__, "ModulePathPolicy")
    CachePolicyFactory.register_cache_policy("not-a-policy", __name__, "NotAPolicy")
    assert CachePolicyFactory.get_cache_policy_cls("module-path") is ModulePathPolicy
    with pytest.raises(TypeError, match="is not a CachePolicy subclass"):
        CachePolicyFactory.get_cache_policy_cls("not-a-policy")
    with pytest.raises(ValueError, match="Cache policy 'lru' is already registered"):
        CachePolicyFactory.register_cache_policy("lru", __name__, "ModulePathPolicy")


class _Minimal(CachePolicy):
    """Only the abstract methods: the hooks' defaults must make a working policy."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        self.touched: list[list[OffloadKey]] = []

    @override
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    @override
    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self.chunks[key] = chunk

    @override
    def remove(self, key: OffloadKey) -> None:
        del self.chunks[key]

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.touched.append(list(keys))

    @override
    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        idle = [key for key, chunk in self.chunks.items() if chunk.ref_cnt == 0 and key not in protected][:n]
        return None if len(idle) < n else [(key, self.chunks.pop(key)) for key in idle]

    @override
    def clear(self) -> None:
        self.chunks.clear()


def test_the_hooks_default_to_touches_so_a_minimal_policy_works() -> None:
    policy = _Minimal(2)
    # a store miss and a finished request's groups are touches; a request access is nothing
    policy.on_store_miss(to_keys([1]), REQ)
    policy.on_request_access(to_keys([2]), REQ)
    finish(policy, REQ, [1, 2], inserted={1}, reused=set())
    assert policy.touched == [to_keys([1]), to_keys([1, 2])]
    assert CachePolicy.__abstractmethods__ == {"get", "insert", "remove", "touch", "evict", "clear"}


@pytest.mark.parametrize("module", ["base", "factory", "lru"])
def test_policy_modules_stay_small(module: str) -> None:
    """STYLE.md point 9: policy modules stay small, ARC excepted for its algorithm docstring."""
    # vLLM 0.33's own lru.py is 233 lines; kvref's docstring explains its rank order too.
    source = importlib.import_module(f"kvref.cpu.policies.{module}").__file__
    assert source is not None
    assert len(Path(source).read_text(encoding="utf-8").splitlines()) <= 270
