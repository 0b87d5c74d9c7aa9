"""Least-recently-used replacement with logical recency (vLLM 0.33: `cpu/policies/lru.py`).

Recency is logical: it is what requests did with a block, never when a transfer finished. A use
is the first store of a block, a `touch`, or a request's access (committed when the request
finishes). A touch re-ranks a block even while its store is pending or while it is being read;
a block that becomes idle (its store or its last load completed) keeps the rank it had.

Ranks: a fresh use takes the next value of a counter. The blocks of a running request share one
provisional rank, taken when the request first names a block, ordered by token position so that
the request's tail is evicted before its head; `on_request_finished` then gives every key of the
request a fresh rank, tail first, so its head ends most recent. A rank is vLLM's pair
`(rank, -position)` (a fresh rank's position is 0), kept as two small ints: the counter value
(the block's value in the order, or the bucket's) and, in a bucket, `-position`; equal ranks
(one position in several KV-cache groups) are ordered by key, as in vLLM's heap.

vLLM keeps idle blocks in a lazily invalidated heap. kvref keeps every block in one
`OrderedDict` in rank order instead: a fresh rank is the highest, so it is a `move_to_end`; a
request's provisional rank is a bucket of its blocks, one entry of the order. Eviction walks the
order from the oldest end, skipping busy (usually recent) blocks: O(evicted + skipped).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence, Set

from typing_extensions import override

from kvref.base import OffloadKey, ReqContext
from kvref.cpu.policies._lru_ranks import Bucket, PendingJoin, RequestRank, place_joined
from kvref.cpu.policies.base import BlockStatus, CachePolicy, no_op_hook, order_request_keys

__all__ = ["LRUCachePolicy"]


class LRUCachePolicy(CachePolicy):
    """Evict the idle block whose last use is oldest (see the module docstring for "use").

    State:
        blocks: every held block.
        order: held blocks with a fresh rank (each with its rank counter value: one table to
            probe per use), and request buckets (with theirs), oldest first.
        _bucket_of: the bucket of each block that holds a request's provisional rank (its rank
            is in the bucket).

    A request's access (`on_request_access`) is applied by the next call: the connector
    touches a request's blocks right after it loads them, giving them fresh ranks, which would
    undo joining them to the request's bucket at once. `order` applies it before it answers.
    """

    @override
    def __init__(self, cache_capacity: int) -> None:
        # cache_capacity is unused: the manager bounds the blocks; LRU keeps no ghosts.
        self.blocks: dict[OffloadKey, BlockStatus] = {}
        self._order: OrderedDict[OffloadKey | Bucket, int] = OrderedDict()
        self._bucket_of: dict[OffloadKey, Bucket] = {}
        self._next_rank = 0
        # Bumped by clear(), so ranks kept in request contexts from before are not reused.
        self._generation = 0
        self._pending_join: PendingJoin | None = None  # the last on_request_access, if not applied

    @property
    def order(self) -> OrderedDict[OffloadKey | Bucket, int]:
        """Held blocks with a fresh rank and request buckets, oldest first (see State)."""
        self._settle()
        return self._order

    def _request_bucket(self, req_context: ReqContext) -> Bucket:
        state = req_context.get_state(RequestRank)
        if state is None or state.owner is not self or state.generation != self._generation:
            self._next_rank += 1
            state = RequestRank(self, self._generation, Bucket(self._next_rank))
            req_context.set_state(state)
            self._order[state.bucket] = self._next_rank  # the newest rank: the order's end
        # Once eviction has dropped it (empty), it comes back only when a key joins it
        # (place_joined): a request whose blocks never join pays nothing per call.
        return state.bucket

    @property
    def ranks(self) -> dict[OffloadKey, int]:
        """The rank counter value of each block with a fresh rank (a copy, for inspection)."""
        return {key: rank for key, rank in self.order.items() if not isinstance(key, Bucket)}

    def _detach(self, key: OffloadKey) -> None:
        """Take a held key out of the order (from its bucket, or its own entry)."""
        bucket = self._bucket_of.pop(key, None)
        if bucket is None:
            del self._order[key]
            return
        del bucket.keys[key]  # its stale place in bucket.ordered is skipped (see Bucket)
        # An empty bucket stays in place while its request may still add blocks; eviction walks
        # and on_request_finished drop it.

    def _use(self, keys: Iterable[OffloadKey]) -> None:
        """Give each held key a fresh rank, in iteration order (the last ends most recent)."""
        blocks, order, bucket_of = self.blocks, self._order, self._bucket_of
        to_end = order.move_to_end  # bound once, outside the per-key loop
        rank = self._next_rank
        for key in keys:
            if key in blocks:
                rank += 1
                if key in bucket_of:  # _detach, inlined: this loop runs per key per request
                    del bucket_of.pop(key).keys[key]
                    order[key] = rank
                else:
                    order[key] = rank
                    to_end(key)
        self._next_rank = rank

    @override
    def block_map(self) -> Mapping[OffloadKey, BlockStatus]:
        return self.blocks  # the manager's lookups read it directly

    @override
    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.blocks.get(key)

    @override
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self._settle()
        self._next_rank += 1
        self.blocks[key] = block
        self._order[key] = self._next_rank

    @override
    def insert_for_request(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus], req_context: ReqContext
    ) -> None:
        if self._pending_join is not None:
            self._settle()
        positions = req_context.offload_key_positions
        if not positions:  # the common case without positions: fresh ranks, inlined
            rank, all_blocks, order = self._next_rank, self.blocks, self._order
            for key, block in zip(keys, blocks):
                rank += 1
                all_blocks[key] = block
                order[key] = rank
            self._next_rank = rank
            return
        bucket: Bucket | None = None
        all_blocks, bucket_of = self.blocks, self._bucket_of
        for key, block in zip(keys, blocks):
            end = positions.get(key)
            if end is None:
                self.insert(key, block)
                continue
            if bucket is None:
                bucket = self._request_bucket(req_context)
                bucket.ordered = None
            all_blocks[key] = block
            bucket_of[key] = bucket  # a new key: no fresh rank to drop
            bucket.keys[key] = -end
        if bucket is not None:
            place_joined(self._order, bucket)

    @override
    def remove(self, key: OffloadKey) -> None:
        self._settle()
        if self.blocks.pop(key, None) is not None:
            self._detach(key)

    @override
    def touch(self, keys: Collection[OffloadKey]) -> None:
        pending = self._pending_join
        if pending is not None:
            self._pending_join = None
            # A fresh rank outranks any request's: the access matters only for untouched keys
            # (and joining one key never changes another's rank, so the order of the two is free).
            touched = keys if isinstance(keys, (set, frozenset)) else set(keys)
            if not touched.issuperset(pending.keys):
                pending.keys = [key for key in pending.keys if key not in touched]
                pending.apply(self.blocks, self._bucket_of, self._order)
                place_joined(self._order, pending.bucket)
        # A list or tuple (what the manager passes) is reversed in place, not copied first.
        self._use(reversed(keys) if isinstance(keys, (list, tuple)) else reversed(list(keys)))

    @override
    @no_op_hook
    def on_store_miss(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        return None  # the keys are absent: the default's touch would change nothing

    @override
    def on_request_access(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if self._pending_join is not None:
            self._settle()
        bucket = self._request_bucket(req_context)  # taken even if no key moves, as in vLLM
        positions = req_context.offload_key_positions
        if positions:
            # Applied by the next call (see the class docstring); absent keys are skipped then.
            self._pending_join = PendingJoin(bucket, list(filter(positions.__contains__, keys)), positions)

    def _settle(self) -> None:
        """Apply the last request access if it is still pending (see the class docstring)."""
        pending, self._pending_join = self._pending_join, None
        if pending is not None:
            pending.apply(self.blocks, self._bucket_of, self._order)
            place_joined(self._order, pending.bucket)

    @override
    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: Set[OffloadKey],
        reused_keys: Set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        if self._pending_join is not None:
            self._settle()
        # One group is already head to tail (the contract): only several need merging.
        keys = key_groups[0] if len(key_groups) == 1 else order_request_keys(key_groups, req_context)
        self._use(reversed(keys))
        state = req_context.get_state(RequestRank)
        if state is not None and state.owner is self and not state.bucket.keys:
            self._order.pop(state.bucket, None)

    def _idle_in_order(self, protected: Set[OffloadKey], empty: list[Bucket]) -> Iterable[OffloadKey]:
        blocks = self.blocks
        for entry in self._order:
            if isinstance(entry, Bucket):
                if not entry.keys:
                    empty.append(entry)
                keys = entry.keys
                for key in entry.in_order():
                    if key in keys and blocks[key].ref_cnt == 0 and key not in protected:
                        yield key
            elif blocks[entry].ref_cnt == 0 and entry not in protected:
                yield entry

    @override
    def evict(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        if n <= 0:
            return []
        if self._pending_join is not None:
            self._settle()
        victims: list[OffloadKey] = []
        empty: list[Bucket] = []
        for key in self._idle_in_order(protected, empty):
            victims.append(key)
            if len(victims) == n:
                break
        for bucket in empty:  # dropping them changes no rank
            del self._order[bucket]
        if len(victims) < n:
            return None
        blocks = self.blocks
        evicted: list[tuple[OffloadKey, BlockStatus]] = []
        for key in victims:
            self._detach(key)
            evicted.append((key, blocks.pop(key)))
        return evicted

    @override
    def clear(self) -> None:
        self._pending_join = None
        self.blocks.clear()
        self._order.clear()
        self._bucket_of.clear()
        self._next_rank = 0
        self._generation += 1
