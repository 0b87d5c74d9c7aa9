"""Everything observable about a `CPUOffloadingManager`, for tests that assert a call changed
nothing (kvref's misuse errors are raised before any state changes)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from kvref.base import OffloadingEvent, OffloadKey, ReqContext
from kvref.cpu.manager import CPUOffloadingManager
from kvref.cpu.manager import _RequestCacheAccess as RequestCacheAccess  # pyright: ignore[reportPrivateUsage]
from kvref.cpu.policies.arc import ARCCachePolicy
from kvref.cpu.policies.base import CachePolicy
from kvref.cpu.policies.lru import LRUCachePolicy
from kvref.cpu.policies.lru import _RequestRank as RequestRank  # pyright: ignore[reportPrivateUsage]

__all__ = ["policy_of", "seen_keys", "eviction_order", "describe_events", "describe_policy", "observe"]


def policy_of(manager: CPUOffloadingManager) -> CachePolicy:
    """The manager's policy (vLLM's tests read `manager._policy` too)."""
    return manager._policy  # pyright: ignore[reportPrivateUsage]


def seen_keys(req_context: ReqContext) -> set[OffloadKey]:
    """The keys a request has named to the manager (those it may still name after finishing)."""
    state = req_context.get_state(RequestCacheAccess)
    return set() if state is None else set(state.seen_keys)


def eviction_order(manager: CPUOffloadingManager) -> list[OffloadKey]:
    """The order in which the policy would evict every idle chunk now (read from a copy)."""
    policy = copy.deepcopy(policy_of(manager))
    idle = manager._num_evictable_cache_chunks  # pyright: ignore[reportPrivateUsage]
    evicted = policy.evict(idle, set())
    assert evicted is not None, "the manager counts more idle chunks than its policy can evict"
    return [key for key, _ in evicted]


def describe_events(events: Iterable[OffloadingEvent]) -> list[tuple[list[OffloadKey], bool, bool]]:
    """(keys, removed, metadata_only) of each event, after checking it names the CPU medium."""
    described: list[tuple[list[OffloadKey], bool, bool]] = []
    for event in events:
        assert event.medium.value == "CPU"
        described.append((list(event.keys), event.removed, event.metadata_only))
    return described


def describe_policy(policy: CachePolicy) -> Any:
    """LRU's ranks; ARC's lists and target; another policy's attributes."""
    if isinstance(policy, LRUCachePolicy):
        return sorted(policy.ranks.items())
    if isinstance(policy, ARCCachePolicy):
        return (list(policy.t1), list(policy.t2), list(policy.b1), list(policy.b2), policy.target_t1_size)
    return repr(vars(policy))


def _describe_request(req_context: ReqContext) -> Any:
    access = req_context.get_state(RequestCacheAccess)
    rank = req_context.get_state(RequestRank)
    return (
        None
        if access is None
        else (
            access.cache_generation,
            list(access.seen_keys),  # in the order first named
            sorted(access.inserted_keys),
            sorted(access.reused_keys),
            sorted(access.store_miss_keys),
            access.finished,
        ),
        None if rank is None else (rank.bucket.rank, dict(rank.bucket.keys)),
    )


def observe(manager: CPUOffloadingManager, keys: Iterable[OffloadKey], requests: Iterable[ReqContext]) -> Any:
    """Lookups and chunks of `keys`, the policy's state and eviction order, the chunk pool, the
    reuse filter, pending events, the next `get_stats`, and each request's access record.

    What reading would consume (events, batch statistics) is read from a copy.
    """
    keys = list(keys)
    twin = copy.deepcopy(manager)
    policy = policy_of(manager)
    chunks = [policy.get(key) for key in keys]
    observer = ReqContext("observer")
    return (
        [manager.lookup(key, observer).name for key in keys],
        [None if chunk is None else (chunk.chunk_id, chunk.ref_cnt) for chunk in chunks],
        describe_policy(policy),
        eviction_order(manager),
        (
            list(manager._free_list),  # pyright: ignore[reportPrivateUsage]
            manager._num_allocated_chunks,  # pyright: ignore[reportPrivateUsage]
            manager._num_evictable_cache_chunks,  # pyright: ignore[reportPrivateUsage]
            manager._num_write_pending_chunks,  # pyright: ignore[reportPrivateUsage]
        ),
        None if manager.counts is None else list(manager.counts.items()),
        describe_events(twin.take_events()),
        twin.get_stats().to_dict(),
        [_describe_request(request) for request in requests],
    )
