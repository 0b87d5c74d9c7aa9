"""Store only blocks that get reused (vLLM: `reuse_manager.py`).

`FilterReusedOffloadingManager` decorates any `OffloadingManager`. It counts how often each key
is looked up, in a bounded LRU table, and drops keys seen fewer than `store_threshold` times
from `prepare_store` before the backing manager sees them, so one-off blocks consume no
offload capacity and cause no evictions. Everything else is delegated unchanged.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import cast

from typing_extensions import override

from kvref.base import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    OffloadingStats,
    RequestOffloadingContext,
    check_key_collection,
)

__all__ = ["FilterReusedOffloadingManager"]


def _is_int(value: object) -> bool:
    # bool is an int subclass but never a count; numpy integers pass operator.index.
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)  # pyright: ignore[reportArgumentType]
    except TypeError:
        return False
    return True


class FilterReusedOffloadingManager(OffloadingManager):
    """Offload a block only once it has been looked up `store_threshold` times.

    Lookups, not stores, are counted, because a lookup is what a request that could reuse the
    block does. The scheduler may look a key up more than once for one request (a request that
    waits is scheduled again), so the count is an upper bound on the number of requests.

    Args:
        backing: the manager that stores the blocks.
        store_threshold: lookups a key needs before it may be stored, >= 2 (below 2 every
            key qualifies: use `backing` directly).
        max_tracker_size: how many keys the counter remembers, >= 1; beyond that the least
            recently looked-up key is forgotten.

    Raises:
        TypeError: `backing` is not an `OffloadingManager`.
        ValueError: `store_threshold` is not an integer >= 2 or `max_tracker_size` not one >= 1.
    """

    def __init__(
        self, backing: OffloadingManager, store_threshold: int = 2, max_tracker_size: int = 64_000
    ) -> None:
        given = cast(object, backing)  # checked at run time, whatever the annotation says
        if not isinstance(given, OffloadingManager):
            raise TypeError(f"backing must be an OffloadingManager, got {backing!r}")
        if not _is_int(store_threshold) or store_threshold < 2:
            raise ValueError(
                f"store_threshold must be an integer >= 2, got {store_threshold!r} "
                "(below 2 nothing is filtered: use the backing manager directly)"
            )
        if not _is_int(max_tracker_size) or max_tracker_size < 1:
            raise ValueError(f"max_tracker_size must be an integer >= 1, got {max_tracker_size!r}")
        self._backing = backing
        self.store_threshold: int = store_threshold
        self.max_tracker_size: int = max_tracker_size
        # Lookup counts, least recently looked-up key first (so forgetting one is O(1)).
        self._counts: OrderedDict[OffloadKey, int] = OrderedDict()

    @property
    def backing(self) -> OffloadingManager:
        """The decorated manager."""
        return self._backing

    def lookup_count(self, key: OffloadKey) -> int:
        """How many lookups of `key` the tracker remembers (0 if none or forgotten)."""
        return self._counts.get(key, 0)

    # ---- Intercepted methods ----

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        counts = self._counts
        count = counts.get(key)
        if count is not None:
            counts[key] = count + 1
            counts.move_to_end(key)
        else:
            if len(counts) >= self.max_tracker_size:
                counts.popitem(last=False)
            counts[key] = 1
        return self._backing.lookup(key, req_context)

    @override
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        check_key_collection(keys, "prepare_store")
        counts, threshold = self._counts, self.store_threshold
        reused = [key for key in keys if counts.get(key, 0) >= threshold]
        # An empty list still goes to the backing manager, which answers with an empty output.
        return self._backing.prepare_store(reused, req_context)

    # ---- Delegated methods ----

    @override
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        return self._backing.prepare_load(keys, req_context)

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._backing.touch(keys, req_context)

    @override
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._backing.complete_load(keys, req_context)

    @override
    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        self._backing.complete_store(keys, req_context, success)

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return self._backing.on_new_request(req_context)

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        self._backing.on_request_finished(req_context)

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        return self._backing.take_events()

    @override
    def get_stats(self) -> OffloadingStats | None:
        """The backing manager's counters (lookups reach it unfiltered, so they are the same)."""
        return self._backing.get_stats()

    @override
    def reset_cache(self) -> None:
        """Reset the backing manager; the lookup counts are kept.

        They describe how requests reuse prefixes, which a reset of the stored blocks does not
        change; they are bounded by `max_tracker_size` either way.
        """
        self._backing.reset_cache()

    @override
    def shutdown(self) -> None:
        self._backing.shutdown()
