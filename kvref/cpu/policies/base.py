"""The `CachePolicy` ABC: how CPU blocks are organised and which ones are evicted.

A policy owns the mapping key -> `BlockStatus` and the replacement order; the manager owns slot
allocation, reference counts and events, and calls the policy's hooks when a block's reference
count moves between 0 (evictable) and non-zero (protected).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Set

from typing_extensions import override

from kvref.base import OffloadKey

__all__ = ["BlockStatus", "CachePolicy"]


class BlockStatus:
    """One CPU block: its slot and how many transfers use it.

    `ref_cnt` is -1 while its write is pending (visible to lookup, not readable, not
    evictable), 0 when idle (readable and evictable) and n > 0 while n transfers read it.
    """

    __slots__ = ("ref_cnt", "block_id")

    def __init__(self, block_id: int) -> None:
        self.ref_cnt: int = -1
        self.block_id: int = block_id

    @property
    def is_ready(self) -> bool:
        """True once the block's write completed (it can be read)."""
        return self.ref_cnt >= 0

    @override
    def __repr__(self) -> str:
        return f"BlockStatus(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class CachePolicy(ABC):
    """Block organisation and replacement decisions for the CPU tier."""

    @abstractmethod
    def __init__(self, cache_capacity: int) -> None:
        """Create an empty policy for at most `cache_capacity` blocks.

        Args:
            cache_capacity: the number of CPU blocks (bounds ghost lists where the policy has
                them).
        """

    @abstractmethod
    def get(self, key: OffloadKey) -> BlockStatus | None:
        """Return the block of `key`, or None. Does not change recency.

        Args:
            key: the block's key.

        Returns:
            Its status, or None when the policy does not hold it.
        """

    @abstractmethod
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        """Add a newly allocated block (its write still pending unless `block.ref_cnt` >= 0).

        Args:
            key: a key the policy does not hold.
            block: its status.
        """

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Drop `key` (used to clean up a failed store). Absent keys are ignored.

        Args:
            key: the block's key.
        """

    @abstractmethod
    def touch(self, keys: Collection[OffloadKey]) -> None:
        """Mark blocks recently used; absent keys are ignored.

        Keys are applied in reverse, so the first key (a request's prefix head) ends up the
        most recently used.

        Args:
            keys: the blocks, in request order.
        """

    @abstractmethod
    def evict(self, n: int, protected: Set[OffloadKey]) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """Evict exactly `n` idle blocks (`ref_cnt == 0`) none of which is in `protected`.

        Atomic: either `n` blocks are removed and returned, or None is returned and nothing
        changed.

        Args:
            n: how many blocks to evict (n >= 1).
            protected: keys that must survive this call.

        Returns:
            The evicted (key, block) pairs in eviction order, or None.
        """

    @abstractmethod
    def clear(self) -> None:
        """Drop every block, whatever its state, and any adaptive or ghost state."""

    def mark_evictable(self, key: OffloadKey) -> None:
        """Hook: the block of `key` just became idle (ref_cnt -1 -> 0 or 1 -> 0).

        Args:
            key: the block's key (held by the policy).
        """
        return None

    def mark_non_evictable(self, key: OffloadKey) -> None:
        """Hook: the idle block of `key` just became protected (ref_cnt 0 -> 1).

        Args:
            key: the block's key (held by the policy).
        """
        return None
