"""The ghost lists of kvref's ARC policy (see `kvref.cpu.policies.arc`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from kvref.base import OffloadKey

__all__ = ["GhostList"]


class GhostList:
    """Keys recently evicted from one of ARC's lists (no chunks), oldest first.

    vLLM keeps a ghost list in an OrderedDict, a linked node per key beside its hash table, and
    a ghost list holds as many keys as the cache holds chunks. Here a ghost is a key of
    `members` and a copy in `_order`; a ghost that moves to the most recent end leaves its older
    copy behind, stale, instead of being unlinked: half the memory per ghost.

    Attributes:
        members: each ghost, mapped to how many copies `_order` holds of it (its place is the
            last one). A plain dict, probed directly by ARC: `in` on a dict subclass is about
            twice as slow as on a dict.

    `_stale` counts the copies of keys that stopped being ghosts. Dropping the oldest ghosts
    pops copies from the left, skipping stale ones; `_order` is rebuilt when stale copies
    outnumber the ghosts, so it stays within about twice their number.
    """

    def __init__(self) -> None:
        self.members: dict[OffloadKey, int] = {}
        self._order: deque[OffloadKey] = deque()
        self._stale: dict[OffloadKey, int] = {}

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, key: OffloadKey) -> bool:
        return key in self.members

    def __iter__(self) -> Iterator[OffloadKey]:
        return iter(self.ordered())

    def extend(self, keys: Sequence[OffloadKey]) -> None:
        """Make keys that are not ghosts the most recent ones, in order."""
        members = self.members
        if self._stale:
            for key in keys:
                members[key] = 1 + self._stale.pop(key, 0)  # its stale copies are counted, and skipped
        else:
            members.update(dict.fromkeys(keys, 1))
        self._order.extend(keys)

    def move_to_end(self, key: OffloadKey) -> None:
        """Make a ghost the most recent one."""
        self.members[key] += 1
        self._order.append(key)
        self._bound_stale_copies()

    def discard(self, key: OffloadKey) -> None:
        """Stop `key` being a ghost, if it is one (its copies become stale)."""
        copies = self.members.pop(key, 0)
        if copies:
            self._stale[key] = copies
            self._bound_stale_copies()

    def trim(self, capacity: int) -> None:
        """Drop the oldest ghosts until at most `capacity` are left."""
        members, stale = self.members, self._stale
        while len(members) > capacity:
            key = self._order.popleft()
            if key in members:
                if members[key] == 1:  # its place: it is the oldest ghost
                    del members[key]
                else:
                    members[key] -= 1
            elif stale[key] == 1:
                del stale[key]
            else:
                stale[key] -= 1

    def ordered(self) -> list[OffloadKey]:
        """The ghosts, oldest first."""
        last_copies = [key for key in dict.fromkeys(reversed(self._order)) if key in self.members]
        last_copies.reverse()
        return last_copies

    def items(self) -> list[tuple[OffloadKey, None]]:
        """The ghosts, oldest first, as `(key, None)`: what vLLM's ghost lists (an
        `OrderedDict[OffloadKey, None]` each) give, and its tests read."""
        return [(key, None) for key in self.ordered()]

    def clear(self) -> None:
        """Forget every ghost."""
        self.members.clear()
        self._order.clear()
        self._stale.clear()

    def _bound_stale_copies(self) -> None:
        if len(self._order) > 2 * len(self.members) + 64:
            ghosts = self.ordered()
            self.members.clear()  # in place: callers may hold `members`
            self.members.update(dict.fromkeys(ghosts, 1))
            self._order = deque(ghosts)
            self._stale.clear()
