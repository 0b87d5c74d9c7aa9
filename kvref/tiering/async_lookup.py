"""`AsyncLookupManager`: non-blocking existence checks for a secondary tier (vLLM 0.33:
`tiering/async_lookup.py`).

A tier whose "is this chunk there?" needs I/O (a `stat`, a network round trip) composes one and
delegates to it: `lookup` -> `lookup`, `on_schedule_end` -> `flush`, `on_request_finished` ->
`cleanup`. A key's first lookup answers None ("retry": the tier answers RETRY); the step's new
keys go to a background thread in one batch at the step's end (`flush`), whose answers are
applied on the next lookup. A verdict then holds for as long as some request asks for the key.

No lock: ownership keeps it safe. The lookup state is touched only under the tiering manager's
lock (from the scheduler thread or the tier-poll thread); the background thread talks to it
through two thread-safe queues, one batch per step each way.
"""

from __future__ import annotations

import logging
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from enum import Enum, auto

from kvref.base import OffloadKey, ReqContext

__all__ = ["AsyncLookupManager", "LookupPhase", "LookupState"]

logger = logging.getLogger(__name__)

# One step's new keys: (key, the request that asked, the lookup's generation).
_Batch = list[tuple[OffloadKey, ReqContext, int]]


def _new_request_ids() -> set[str]:
    return set()  # not set[str](): a parameterised builtin is ten times slower to call


class LookupPhase(Enum):
    """Where a key's existence check is."""

    PENDING = auto()
    """Collected this step, not yet sent to the background thread."""
    IN_FLIGHT = auto()
    """Sent, not answered yet."""
    RESOLVED = auto()
    """Answered (or marked missing after a failed load)."""


@dataclass(slots=True)
class LookupState:
    """One key's existence check.

    Attributes:
        generation: tells this check apart from an earlier one of the same key, whose late
            answer must not be applied.
        phase: where it is.
        result: None until resolved; then whether the chunk is there.
        request_ids: the requests asking for it.
    """

    generation: int
    phase: LookupPhase = LookupPhase.PENDING
    result: bool | None = None
    request_ids: set[str] = field(default_factory=_new_request_ids)


class AsyncLookupManager(ABC):
    """A tier's non-blocking existence checks, answered by `batch_lookup` on a thread of its own.

    Subclasses implement `batch_lookup` only.

    Args:
        tier_type: names the background thread and the log messages.
    """

    def __init__(self, tier_type: str) -> None:
        self._tier_type = tier_type
        self._lookup_state: dict[OffloadKey, LookupState] = {}
        self._req_keys: dict[str, set[OffloadKey]] = {}  # req_id -> the keys it looked up
        self._next_generation = 0
        self._lookup_batch: _Batch = []
        # Scheduler -> thread: one step's batch per item; None stops the thread.
        self._lookup_queue: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        # Thread -> scheduler: (key, generation, found) per answered key, one item per batch.
        self._pending_results: queue.SimpleQueue[list[tuple[OffloadKey, int, bool]]] = queue.SimpleQueue()
        self._need_to_drain = False
        self._thread = threading.Thread(target=self._worker, name=f"kvref_offloading_lookup_{tier_type}", daemon=True)
        self._thread.start()

    @abstractmethod
    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        """Say whether each of `keys` is in the tier; may block.

        Called on the background thread, one request's keys at a time: it must not touch the
        primary or any scheduler state. A raised exception answers False for every key.

        Returns:
            One answer per key, in order.
        """

    # --- under the manager's lock ---

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Return whether `key` is in the tier, or None when that is not known yet."""
        if self._need_to_drain:
            self.drain_results()
            self._need_to_drain = False
        state = self._lookup_state.get(key)
        if state is None:
            state = self._lookup_state[key] = LookupState(generation=self._next_generation)
            self._next_generation += 1
            self._lookup_batch.append((key, req_context, state.generation))
        state.request_ids.add(req_context.req_id)
        self._req_keys.setdefault(req_context.req_id, set()).add(key)
        return state.result

    def flush(self) -> None:
        """Send the step's new keys to the thread as one batch (from the tier's `on_schedule_end`),
        so it works while the model runs; apply the answers already in first."""
        self.drain_results()
        self._need_to_drain = True
        batch, self._lookup_batch = self._lookup_batch, []
        in_flight: _Batch = []
        for key, req_context, generation in batch:
            state = self._lookup_state.get(key)
            if state is None or state.generation != generation:
                continue  # cleaned up since
            assert state.phase is LookupPhase.PENDING, f"lookup of {key!r} sent twice"
            state.phase = LookupPhase.IN_FLIGHT
            in_flight.append((key, req_context, generation))
        if in_flight:
            self._lookup_queue.put(in_flight)

    def drain_results(self) -> None:
        """Apply the answers the thread has posted."""
        while True:
            try:
                batch = self._pending_results.get_nowait()
            except queue.Empty:
                return
            for key, generation, found in batch:
                state = self._lookup_state.get(key)
                if state is None or state.generation != generation:
                    continue  # an answer to a check that was cleaned up
                if not state.request_ids:
                    del self._lookup_state[key]  # nobody asks any more
                    continue
                assert state.phase is LookupPhase.IN_FLIGHT
                # Each generation is sent once: a second answer would break the promise that a
                # verdict, once given, stays (and could reopen the failed-load livelock).
                assert state.result is None, "a resolved lookup received a second answer"
                state.result = found
                state.phase = LookupPhase.RESOLVED

    def mark_miss(self, keys: Collection[OffloadKey]) -> None:
        """Force the verdict of resolved `keys` to False after a failed load, so the chunk is not
        promoted again and again. Keys with a check still pending or in flight keep it."""
        for key in keys:
            state = self._lookup_state.get(key)
            if state is not None and state.phase is LookupPhase.RESOLVED:
                state.result = False

    def cleanup(self, req_id: str) -> None:
        """Drop a finished request's interest (from the tier's `on_request_finished`); a check
        still in flight is kept until its answer arrives, for a new request to share."""
        for key in self._req_keys.pop(req_id, ()):
            state = self._lookup_state[key]
            state.request_ids.discard(req_id)
            if not state.request_ids and state.phase is not LookupPhase.IN_FLIGHT:
                del self._lookup_state[key]

    def shutdown(self) -> None:
        """Stop the thread and apply its last answers."""
        self._lookup_queue.put(None)
        self._thread.join()
        self.drain_results()

    # --- the background thread ---

    def _worker(self) -> None:
        while (pending := self._lookup_queue.get()) is not None:
            by_request: dict[str, tuple[ReqContext, list[tuple[OffloadKey, int]]]] = {}
            for key, req_context, generation in pending:
                by_request.setdefault(req_context.req_id, (req_context, []))[1].append((key, generation))
            results: list[tuple[OffloadKey, int, bool]] = []
            for req_context, entries in by_request.values():
                keys = [key for key, _ in entries]
                try:
                    found: list[bool] = list(self.batch_lookup(keys, req_context))
                except Exception as error:
                    logger.warning("batch_lookup failed on tier %s for %d keys: %s", self._tier_type, len(keys), error)
                    found = [False] * len(keys)
                results.extend((key, generation, hit) for (key, generation), hit in zip(entries, found))
            if results:
                self._pending_results.put(results)
