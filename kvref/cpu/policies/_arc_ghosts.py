"""The ghost lists of kvref's ARC policy (see `kvref.cpu.policies.arc`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from typing_extensions import override

from kvref.base import OffloadKey

__all__ = ["GhostList"]


class GhostList:
    """Keys recently evicted from one of ARC's lists (no blocks), oldest first.

    An OrderedDict (vLLM's ghost lists) keeps a linked node per key beside its hash table, and
    an array of node pointers as large as that table, and a ghost list may hold as many keys as
    the cache holds blocks. Here each key is in a plain dict and a deque, and a key that moves
    leaves a stale copy behind in the deque instead of being unlinked:

    * `order`: keys in the order they became ghosts or were refreshed (moved to the MRU end).
      A refreshed key's earlier copies, and every copy of a key that was discarded (stored
      again), are stale.
    * `copies[key]`: how many copies of the key `order` holds; positive while the key is a
      ghost, negative once it was discarded and copies remain. A ghost's place in the list is
      its last copy.

    Dropping the oldest ghosts pops copies from the left, skipping stale ones; `order` is
    rebuilt when stale copies outnumber the ghosts (by a small slack), so it stays within about
    twice their number.
    """

    __slots__ = ("copies", "order", "size")

    def __init__(self) -> None:
        self.copies: dict[OffloadKey, int] = {}
        self.order: deque[OffloadKey] = deque()
        self.size: int = 0  # the keys with a positive count: the ghosts

    def __contains__(self, key: OffloadKey) -> bool:
        return self.copies.get(key, 0) > 0

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[OffloadKey]:
        """The ghosts, oldest first."""
        copies = self.copies
        newest_first = [key for key in dict.fromkeys(reversed(self.order)) if copies[key] > 0]
        return reversed(newest_first)

    @override
    def __repr__(self) -> str:
        return f"GhostList({list(self)!r})"

    def extend(self, keys: Iterable[OffloadKey]) -> None:
        """Add keys that are not ghosts at the MRU end, in order."""
        copies, append = self.copies, self.order.append
        added = 0
        for key in keys:
            # A discarded key's stale copies stay counted: they come first, and are skipped.
            copies[key] = 1 - copies.get(key, 0)
            append(key)
            added += 1
        self.size += added

    def refresh(self, key: OffloadKey) -> None:
        """Move a ghost to the MRU end."""
        self.copies[key] += 1
        self.order.append(key)
        self._bound_stale_copies()

    def discard(self, keys: Iterable[OffloadKey]) -> None:
        """Drop those of `keys` that are ghosts (their copies become stale)."""
        copies = self.copies
        for key in keys:
            count = copies.get(key, 0)
            if count > 0:
                copies[key] = -count
                self.size -= 1
        self._bound_stale_copies()

    def trim(self, capacity: int) -> None:
        """Drop the oldest ghosts until at most `capacity` are left."""
        if self.size <= capacity:
            return
        copies, popleft = self.copies, self.order.popleft
        excess = self.size - capacity
        while excess:
            key = popleft()
            count = copies[key]
            if count == 1:  # the ghost's place: it is the oldest
                del copies[key]
                excess -= 1
            elif count == -1:  # the last stale copy of a discarded key
                del copies[key]
            else:  # a stale copy (the key has a later one, or was discarded)
                copies[key] = count - 1 if count > 0 else count + 1
        self.size = capacity

    def clear(self) -> None:
        """Drop every key."""
        self.copies.clear()
        self.order.clear()
        self.size = 0

    def _bound_stale_copies(self) -> None:
        order = self.order
        if len(order) <= 2 * self.size + 64:
            return
        # Each ghost's last copy, in order; nothing else. Both containers stay the same objects
        # (ARC holds `copies` across calls that may get here).
        copies = self.copies
        ghosts = [key for key in dict.fromkeys(reversed(order)) if copies[key] > 0]
        ghosts.reverse()  # oldest first
        order.clear()
        order.extend(ghosts)
        copies.clear()
        copies.update(dict.fromkeys(ghosts, 1))
