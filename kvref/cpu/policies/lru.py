"""Least-recently-used replacement with logical recency (vLLM 0.33: `cpu/policies/lru.py`).

Recency is what requests did with a chunk, never when a transfer finished. A use is a chunk's
first store, a `touch`, or a request's access, committed when the request finishes. A touch
re-ranks a chunk even while its store is pending or while it is being read, and a chunk that
becomes idle keeps the rank it had.

A rank is the pair (counter, -position), ties broken by key. A fresh use takes the next counter
value with position 0. A running request takes one counter value when it first names a chunk
(its provisional rank) and ranks its chunks by token position under it, tail before head, so
its tail is evicted first; when it finishes, its chunks get fresh ranks tail first, so its head
ends up the most recent.

vLLM keeps idle chunks in a lazily invalidated heap, and a touch pushes one entry per chunk.
Here every chunk sits in one `OrderedDict` in rank order instead: a fresh rank is the highest,
so a use is a `move_to_end`. A request's provisional rank is one entry of that order, a
`_RequestBucket` holding the request's chunks, placed when the rank is taken (it was the
highest then). Eviction walks the order from the oldest end and skips busy chunks: O(evicted +
skipped) rather than O(evicted * log n), and no heap entry per use.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from typing_extensions import override

from kvref.base import OffloadKey, ReqContext
from kvref.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys

__all__ = ["LRUCachePolicy"]


def _new_members() -> dict[OffloadKey, int]:
    return {}  # not dict[OffloadKey, int](): a parameterised builtin is ten times slower to call


@dataclass(eq=False, slots=True)
class _RequestBucket:
    """The chunks holding one request's provisional rank (hashed by identity).

    Attributes:
        rank: the request's counter value.
        keys: each member's -position (the second half of its rank).
        ordered: the members in eviction order, or None when a member joined since it was
            sorted; members that left since are still listed (readers skip them).
    """

    rank: int
    keys: dict[OffloadKey, int] = field(default_factory=_new_members)
    ordered: list[OffloadKey] | None = None

    def in_eviction_order(self) -> list[OffloadKey]:
        if self.ordered is None:
            self.ordered = sorted(self.keys, key=lambda key: (self.keys[key], key))
        return self.ordered


@dataclass(slots=True)
class _RequestRank:
    """The provisional rank one policy gave one request (kept in the request's context)."""

    owner: object
    cache_generation: int
    bucket: _RequestBucket


class LRUCachePolicy(CachePolicy):
    """Evict the idle chunk whose last use is oldest (see the module docstring).

    Attributes:
        chunks: every held chunk.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        # Fresh-ranked keys (value: their counter) and request buckets (value: their rank), in
        # rank order, oldest first.
        self._order: OrderedDict[OffloadKey | _RequestBucket, int] = OrderedDict()
        self._bucket_of: dict[OffloadKey, _RequestBucket] = {}
        self._next_rank = 0
        self._cache_generation = 0

    @property
    def ranks(self) -> Mapping[OffloadKey, tuple[int, int]]:
        """Each held chunk's rank pair (counter, -position); larger is more recent. A copy."""
        ranks: dict[OffloadKey, tuple[int, int]] = {}
        for entry, rank in self._order.items():
            if isinstance(entry, _RequestBucket):
                ranks.update((key, (rank, minus_position)) for key, minus_position in entry.keys.items())
            else:
                ranks[entry] = (rank, 0)
        return ranks

    def _request_bucket(self, req_context: ReqContext) -> _RequestBucket:
        state = req_context.get_state(_RequestRank)
        # A bucket not in the order was dropped when its request finished: a request named
        # again after that (which the manager refuses) takes a new rank.
        if (
            state is None
            or state.owner is not self
            or state.cache_generation != self._cache_generation
            or state.bucket not in self._order
        ):
            self._next_rank += 1
            state = _RequestRank(self, self._cache_generation, _RequestBucket(self._next_rank))
            req_context.set_state(state)
            # The newest rank: its place in the order is the end, now.
            self._order[state.bucket] = self._next_rank
        return state.bucket

    def _take_out(self, key: OffloadKey) -> None:
        """Remove a held key's rank (its own entry, or its place in a bucket)."""
        bucket = self._bucket_of.pop(key, None)
        if bucket is None:
            del self._order[key]
        else:
            del bucket.keys[key]  # its stale place in bucket.ordered is skipped

    def _use(self, keys: Iterator[OffloadKey]) -> None:
        """Give each held key a fresh rank, in iteration order (the last ends most recent)."""
        chunks, order, bucket_of = self.chunks, self._order, self._bucket_of
        rank = self._next_rank
        for key in keys:  # runs for every key a request touches: _take_out is inlined
            if key in chunks:
                bucket = bucket_of.pop(key, None)
                if bucket is None:
                    del order[key]
                else:
                    del bucket.keys[key]
                rank += 1
                order[key] = rank
        self._next_rank = rank

    @override
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    @override
    def chunk_map(self) -> Mapping[OffloadKey, ChunkStatus]:
        return self.chunks

    @override
    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self.chunks[key] = chunk
        position = req_context.get_offload_key_position(key)
        if position is None:
            self._next_rank += 1
            self._order[key] = self._next_rank
            return
        bucket = self._request_bucket(req_context)
        bucket.keys[key] = -position
        bucket.ordered = None
        self._bucket_of[key] = bucket

    @override
    def remove(self, key: OffloadKey) -> None:
        del self.chunks[key]
        self._take_out(key)

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        # A list (what the manager is given) is walked backwards in place, not copied first.
        self._use(reversed(keys if isinstance(keys, list) else list(keys)))

    @override
    def on_request_access(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        bucket = self._request_bucket(req_context)  # taken even if no key moves, as in vLLM
        positions = req_context.offload_key_positions
        for key in keys:
            position = positions.get(key)
            if position is None or key not in self.chunks:
                continue
            # A rank only ever grows: skip a key already ranked at or above (bucket.rank, -position).
            held = self._bucket_of.get(key)
            if held is None:
                if self._order[key] > bucket.rank:
                    continue
                del self._order[key]
            elif held.rank > bucket.rank or (held is bucket and held.keys[key] >= -position):
                continue
            else:
                del held.keys[key]
            bucket.keys[key] = -position
            bucket.ordered = None
            self._bucket_of[key] = bucket

    @override
    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        self._use(reversed(order_request_keys(key_groups, req_context)))
        state = req_context.get_state(_RequestRank)
        if state is not None and state.owner is self and not state.bucket.keys:
            self._order.pop(state.bucket, None)  # an empty bucket ranks nothing

    def _idle_in_eviction_order(self, protected: set[OffloadKey]) -> Iterator[OffloadKey]:
        for entry in self._order:
            if isinstance(entry, _RequestBucket):
                members = entry.keys
                for key in entry.in_eviction_order():
                    if key in members and self.chunks[key].ref_cnt == 0 and key not in protected:
                        yield key
            elif self.chunks[entry].ref_cnt == 0 and entry not in protected:
                yield entry

    @override
    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        victims: list[OffloadKey] = []
        for key in self._idle_in_eviction_order(protected):
            victims.append(key)
            if len(victims) == n:
                break
        else:
            return None
        evicted: list[tuple[OffloadKey, ChunkStatus]] = []
        for key in victims:
            self._take_out(key)
            evicted.append((key, self.chunks.pop(key)))
        return evicted

    @override
    def clear(self) -> None:
        self.chunks.clear()
        self._order.clear()
        self._bucket_of.clear()
        self._next_rank = 0
        self._cache_generation += 1
