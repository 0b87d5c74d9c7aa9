"""The provisional request ranks of kvref's LRU policy (see `kvref.cpu.policies.lru`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import itemgetter

from kvref.base import OffloadKey
from kvref.cpu.policies.base import BlockStatus

__all__ = ["Bucket", "PendingJoin", "RequestRank", "place_joined"]

# Sorts a bucket's (key, -position) items by -position, then key, in C.
_RANK_THEN_KEY = itemgetter(1, 0)


@dataclass(eq=False, slots=True)
class Bucket:
    """One request's provisional rank and the blocks that hold it (hashed by identity)."""

    rank: int
    # key -> -position: the second half of its rank pair (rank, -position).
    keys: dict[OffloadKey, int] = field(default_factory=dict[OffloadKey, int])
    # Keys in eviction order, rebuilt after a key joins. A key that leaves is only deleted from
    # `keys` (it leaves per key on every touch): readers skip listed keys no longer in `keys`.
    ordered: list[OffloadKey] | None = None

    def in_order(self) -> list[OffloadKey]:
        """The keys in eviction order; may list keys that left since (not in `keys`)."""
        if self.ordered is None:
            self.ordered = [key for key, _ in sorted(self.keys.items(), key=_RANK_THEN_KEY)]
        return self.ordered


@dataclass(slots=True)
class RequestRank:
    """The provisional rank one policy gave one request (kept in the request's context)."""

    owner: object
    generation: int
    bucket: Bucket


@dataclass(slots=True)
class PendingJoin:
    """A request's access that gives its blocks the request's provisional rank, not applied yet.

    Attributes:
        bucket: the request's bucket.
        keys: the keys it accessed that had a recorded position then (vLLM reads them then).
        positions: the request's recorded key positions.
    """

    bucket: Bucket
    keys: list[OffloadKey]
    positions: Mapping[OffloadKey, int]

    def apply(
        self,
        blocks: Mapping[OffloadKey, BlockStatus],
        bucket_of: dict[OffloadKey, Bucket],
        order: OrderedDict[OffloadKey | Bucket, int],
    ) -> None:
        """Move each held key into the bucket where the request's rank is younger than its own."""
        bucket, positions = self.bucket, self.positions
        rank, joined = bucket.rank, bucket.keys
        bucket.ordered = None  # keys may join: once here rather than per key
        for key in self.keys:
            if key not in blocks:
                continue
            end = positions[key]
            # Only ever younger: a later position of the same request ranks below an earlier one.
            # (r, 0) >= (rank, -end) for a fresh rank r; pairs compared for a bucketed key.
            held = bucket_of.get(key)
            if held is None:
                if order[key] >= rank:
                    continue
                del order[key]
            else:
                if held.rank > rank or (held.rank == rank and held.keys[key] >= -end):
                    continue
                del held.keys[key]
            bucket_of[key] = bucket
            joined[key] = -end


def place_joined(order: OrderedDict[OffloadKey | Bucket, int], bucket: Bucket) -> None:
    """Put a bucket that keys have joined at its rank's place in `order`, if it is not there.

    `order` is sorted by its values (a bucket's is its rank). An empty bucket ranks nothing, so
    one that eviction dropped comes back only when a key joins it, in O(entries newer than it),
    which are moved behind it in their order.
    """
    if not bucket.keys or bucket in order:
        return
    rank = bucket.rank
    newer: list[OffloadKey | Bucket] = []
    for entry in reversed(order):
        if order[entry] < rank:
            break
        newer.append(entry)
    order[bucket] = rank
    to_end = order.move_to_end
    for entry in reversed(newer):
        to_end(entry)
