"""The provisional request ranks of kvref's LRU policy (see `kvref.cpu.policies.lru`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter

from kvref.base import OffloadKey

__all__ = ["Bucket", "RequestRank"]

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
