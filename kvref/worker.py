"""Worker-side transfer contract: handlers that move blocks, and the worker that routes to them
(vLLM: `vllm/v1/kv_offload/worker/worker.py`).

The scheduler-side `OffloadingManager` decides *what* moves; the worker side moves the bytes.
A transfer is a `(src_spec, dst_spec)` pair of `LoadStoreSpec`s, and an `OffloadingHandler`
moves blocks between one pair of media (GPU->CPU, CPU->GPU, ...). Its primitives:

* `transfer_async` — start a job; never blocks on the copy itself.
* `get_finished` — poll: the jobs that finished since the last call, as `TransferResult`s.
* `wait` — block until given jobs have finished (their results still come from `get_finished`).
* `shutdown` — finish or drop in-flight work and release resources.

`OffloadingWorker` holds one handler per `(src medium, dst medium)` pair and adds one guarantee
on top of its handlers: every job is reported exactly once. A job its handler accepted yields
exactly one `TransferResult` from `get_finished`; a job whose handler raised (or declined it)
makes `transfer_async` return False and is never reported again, so the scheduler releases what
it reserved for it once, on that False (as vLLM's worker does).

This module does not import torch.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass

from kvref.base import LoadStoreSpec
from kvref.errors import KVRefError

__all__ = [
    "TransferSpec",
    "TransferType",
    "TransferResult",
    "TransferProtocolError",
    "OffloadingHandler",
    "OffloadingWorker",
]

logger = logging.getLogger(__name__)

TransferSpec = tuple[LoadStoreSpec, LoadStoreSpec]
"""A job's (source, destination) specs."""

TransferType = tuple[str, str]
"""A job's (source medium, destination medium), e.g. ("GPU", "CPU")."""


@dataclass(frozen=True, slots=True)
class TransferResult:
    """The outcome of one finished job.

    Attributes:
        job_id: the id given to `transfer_async`.
        success: whether every block of the job was moved.
        transfer_size: bytes moved, or None when unknown (a failed job).
        transfer_time: seconds the copies took on the device (CUDA events) or on the host
            (the CPU fallback), or None when unknown.
        transfer_type: (source medium, destination medium).
        error: why the job failed, for logs; None on success.
    """

    job_id: int
    success: bool
    transfer_size: int | None
    transfer_time: float | None
    transfer_type: TransferType
    error: str | None = None

    @property
    def throughput(self) -> float | None:
        """Bytes per second, or None when size or time is unknown (or the time is zero)."""
        if self.transfer_size is None or not self.transfer_time:
            return None
        return self.transfer_size / self.transfer_time


class TransferProtocolError(KVRefError):
    """A handler or worker was misused: a job id reused while in flight, use after shutdown."""


class OffloadingHandler(ABC):
    """Moves blocks between one (source medium, destination medium) pair.

    Implementations run on the worker's thread; `transfer_async`, `get_finished` and `wait`
    are never called concurrently.
    """

    @abstractmethod
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Start moving the blocks of `spec`; return without waiting for the copy.

        Args:
            job_id: a caller-chosen id, unique among this handler's unfinished jobs.
            spec: (source spec, destination spec), co-indexed block by block.

        Returns:
            True if the job was submitted: exactly one result for it will come from
            `get_finished`. False if the handler declined it (nothing was started and no
            result will be reported).

        Raises:
            ValueError: the specs do not fit the handler (wrong media, block counts or ids);
                nothing was started.
            TransferProtocolError: `job_id` is still in flight, or the handler is shut down.
        """

    @abstractmethod
    def get_finished(self) -> list[TransferResult]:
        """Return the results of the jobs that finished since the last call, without blocking.

        Returns:
            The results, in the order the jobs finished.
        """

    @abstractmethod
    def wait(self, job_ids: Collection[int]) -> None:
        """Block until the given jobs have finished.

        Their results are still reported by the next `get_finished`. Ids that are unknown or
        already reported are ignored.

        Args:
            job_ids: the jobs to wait for.
        """

    def shutdown(self) -> None:
        """Wait for in-flight jobs and release resources; the handler is unusable after."""
        return None


class OffloadingWorker:
    """Routes each job to the handler registered for its (source, destination) media.

    Every job is reported exactly once: `transfer_async` returns False for a job its handler
    raised on or declined (logged; nothing else is ever reported for it, so one bad job never
    brings the engine down and is never released twice), and every job it returned True for
    yields exactly one `TransferResult` from `get_finished`.
    """

    def __init__(self) -> None:
        self._handlers: dict[TransferType, OffloadingHandler] = {}
        # job id -> its handler, for jobs submitted and not yet reported (routes `wait`).
        self._in_flight: dict[int, OffloadingHandler] = {}

    def register_handler(
        self,
        src_cls: type[LoadStoreSpec],
        dst_cls: type[LoadStoreSpec],
        handler: OffloadingHandler,
    ) -> None:
        """Route jobs from `src_cls`'s medium to `dst_cls`'s medium to `handler`.

        Args:
            src_cls: the source spec class (its `medium()` is the key).
            dst_cls: the destination spec class.
            handler: the handler; one handler may serve several pairs.

        Raises:
            ValueError: a handler is already registered for this pair of media.
        """
        transfer_type = (src_cls.medium(), dst_cls.medium())
        if transfer_type in self._handlers:
            raise ValueError(
                f"a handler for {transfer_type[0]}->{transfer_type[1]} is already registered "
                f"({type(self._handlers[transfer_type]).__name__}); register each pair once"
            )
        self._handlers[transfer_type] = handler

    @property
    def transfer_types(self) -> list[TransferType]:
        """The (source medium, destination medium) pairs that have a handler."""
        return list(self._handlers)

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Submit a job to the handler of its media pair.

        Args:
            job_id: unique among this worker's unreported jobs.
            spec: (source spec, destination spec).

        Returns:
            True if the job is running: exactly one result for it will come from
            `get_finished`. False if it failed at submission (its handler raised or declined
            it): that is its only report, `get_finished` never mentions it.

        Raises:
            ValueError: no handler is registered for the spec pair's media (nothing changed).
            TransferProtocolError: `job_id` is already in flight (nothing changed).
        """
        src_spec, dst_spec = spec
        transfer_type = (src_spec.medium(), dst_spec.medium())
        handler = self._handlers.get(transfer_type)
        if handler is None:
            registered = ", ".join(f"{s}->{d}" for s, d in self._handlers) or "none"
            raise ValueError(
                f"no handler registered for {transfer_type[0]}->{transfer_type[1]} "
                f"(registered: {registered})"
            )
        if job_id in self._in_flight:
            raise TransferProtocolError(
                f"transfer_async: job {job_id} is still in flight; job ids must be unique "
                "until their result is reported"
            )
        try:
            submitted = handler.transfer_async(job_id, spec)
        except Exception as exc:  # a handler bug must fail the job, not the engine
            logger.warning("transfer job %d (%s->%s) failed: %r", job_id, *transfer_type, exc)
            return False
        if not submitted:
            logger.warning("transfer job %d (%s->%s) declined by its handler", job_id, *transfer_type)
            return False
        self._in_flight[job_id] = handler
        return True

    def get_finished(self) -> list[TransferResult]:
        """Collect the results of every handler since the last call.

        Returns:
            Each handler's results in its reporting order (never a job whose `transfer_async`
            returned False).
        """
        results: list[TransferResult] = []
        for handler in self._distinct_handlers():
            for result in handler.get_finished():
                self._in_flight.pop(result.job_id, None)
                results.append(result)
        return results

    def wait(self, job_ids: Collection[int]) -> None:
        """Block until the given jobs have finished (each handler waits for its own).

        Args:
            job_ids: jobs to wait for; unknown, failed or already reported ids are ignored.
        """
        by_handler: dict[int, tuple[OffloadingHandler, list[int]]] = {}
        for job_id in job_ids:
            handler = self._in_flight.get(job_id)
            if handler is not None:
                by_handler.setdefault(id(handler), (handler, []))[1].append(job_id)
        for handler, ids in by_handler.values():
            handler.wait(ids)

    def shutdown(self) -> None:
        """Shut every handler down once (a handler serving several pairs is shut down once)."""
        for handler in self._distinct_handlers():
            handler.shutdown()
        self._in_flight.clear()

    def _distinct_handlers(self) -> list[OffloadingHandler]:
        seen: dict[int, OffloadingHandler] = {}
        for handler in self._handlers.values():
            seen.setdefault(id(handler), handler)
        return list(seen.values())
