"""What `FileSystemSecondaryTier` tells the engine besides its jobs' results: whether a block
file exists (checked on a lookup thread), the events and counters of its blocks, and its
config-info labels. The tier (`kvref.tiering.fs.tier`) calls these from the scheduler thread,
under the tiering manager's lock.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from typing_extensions import override

from kvref.base import ConfigInfo, OffloadKey, ReqContext
from kvref.tiering.async_lookup import AsyncLookupManager
from kvref.tiering.fs.capacity import RootCapacity
from kvref.tiering.tier_reporting import TierCounters, TierEvents

__all__ = ["BlockFileLookups", "BlockReports", "FileSystemTierInfo"]


@dataclass(frozen=True)
class FileSystemTierInfo(ConfigInfo):
    """What a `FileSystemSecondaryTier` publishes on the config-info metric."""

    fs_capacity_bytes: int | None
    fs_fsync: bool


class BlockFileLookups(AsyncLookupManager):
    """Existence checks of block files: one `stat` each, on the lookup thread.

    Args:
        tier_type: names the thread.
        block_path: the path of a key's block file (called on the lookup thread).
    """

    def __init__(self, tier_type: str, block_path: Callable[[OffloadKey], str]) -> None:
        self._block_path = block_path  # before the base class starts its thread
        super().__init__(tier_type)

    @override
    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        # The file is the truth (any engine may have stored or evicted it): answered from the
        # kernel's dentry cache (the attribute cache on NFS).
        return [os.path.exists(self._block_path(key)) for key in keys]


class BlockReports:
    """The events and counters of one engine's view of the root's blocks.

    A block is announced as stored once, when this engine's store of it succeeds, and as
    removed once, when this engine evicts it, finds it gone or damaged on a load, or no longer
    finds it when listing the root (another engine evicted it).

    Args:
        events: the tier's event buffer.
        capacity: the root's budget, whose evictions and vanished files are reported here.
    """

    def __init__(self, events: TierEvents, capacity: RootCapacity) -> None:
        self.events = events
        self.counters = TierCounters()
        self._capacity = capacity
        # Blocks announced as stored and not yet as removed, by file name (events only).
        self._announced: dict[str, OffloadKey] | None = {} if events.enabled else None

    def stored(self, blocks: Iterable[tuple[str, OffloadKey]]) -> None:
        """Announce the (file name, key) blocks this engine stored that it had not announced."""
        if self._announced is None:
            return
        stored: list[OffloadKey] = []
        for name, key in blocks:
            if name not in self._announced:
                self._announced[name] = key
                stored.append(key)
        self.events.announce(stored, removed=False)

    def removed(self, names: Iterable[str]) -> None:
        """Announce as removed those of these announced blocks (gone for every engine)."""
        if self._announced is None:
            return
        keys = [key for name in names if (key := self._announced.pop(name, None)) is not None]
        self.events.announce(keys, removed=True)

    def report_evictions(self) -> None:
        """Count this engine's evictions, and announce as removed the announced blocks it
        evicted or that its listings no longer find (evicted by another engine, or deleted)."""
        evicted, vanished = self._capacity.evicted, self._capacity.vanished
        names: list[str] = []
        while evicted:
            names.append(evicted.popleft())
            self.counters.chunks_evicted += 1
        while vanished:
            names.append(vanished.popleft())
        self.removed(names)
