"""Secondary tiers: the contract between the tiering manager and one non-primary medium.

Data flow (vLLM: `vllm/v1/kv_offload/tiering`):

    store:  GPU --store--> CPU primary --write (cascade)--> every secondary tier
    load:   GPU <--load--- CPU primary <--read (promotion)-- first secondary tier holding it

Design principles:

1. Always offload to all tiers: a block that completes its store into the primary is cascaded
   to every secondary tier.
2. The primary (CPU) tier is the only gateway to GPU memory.
3. Staged promotion: a block found only in a secondary tier is first copied into the primary;
   the GPU loads it from there.
4. Transparent retry: `lookup` answers None ("ask again") while a block is being promoted.
5. Reference counts protect primary blocks while a secondary tier copies from or into them.

Vocabulary: *load/store* move blocks between the GPU and the CPU primary; *read/write* are
seen from the primary and move blocks between it and a secondary tier. A cascade is a
secondary's `submit_store` (it reads the primary); a promotion is its `submit_load` (it writes
the primary).

A secondary tier addresses the primary through a zero-copy, C-contiguous memoryview whose first
dimension is the block, of any format (bytes, or e.g. a float16/uint16 view exported by torch or
numpy); `PrimaryBlocks` wraps it and hands out one row of `strides[0]` bytes per block id.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import override

from kvref.base import OffloadingEvent, OffloadKey, ReqContext, TierStats

__all__ = [
    "JobId",
    "JobMetadata",
    "JobResult",
    "PrimaryBlocks",
    "SecondaryTierManager",
    "TierStats",
]

JobId = int


@dataclass(frozen=True)
class JobMetadata:
    """One transfer between the primary and a secondary tier.

    Attributes:
        job_id: unique per tiering manager; reported back in the `JobResult`.
        keys: the blocks, co-indexed with `block_ids`.
        block_ids: the primary slots: read by a store, written by a load. The tiering manager
            keeps them pinned until the job is reported finished.
        is_promotion: True for a load (secondary -> primary), False for a store (cascade).
        req_context: the request the job serves.
    """

    job_id: JobId
    keys: Sequence[OffloadKey]
    block_ids: Sequence[int]
    is_promotion: bool
    req_context: ReqContext

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.block_ids):
            raise ValueError(
                f"job {self.job_id}: keys ({len(self.keys)}) and block_ids "
                f"({len(self.block_ids)}) must be co-indexed"
            )


@dataclass(frozen=True)
class JobResult:
    """The outcome of one job (vLLM: `tiering.base.JobResult`).

    Attributes:
        job_id: the job's id.
        success: True when every block of the job was moved; False when any failed.
        successful_keys: for a failed promotion, the blocks that were nevertheless written into
            their primary slots completely and verified (the manager keeps them and releases
            only the others); None when every block shares the fate `success` says. Always a
            subset of the job's keys.
        transfer_time: seconds the tier spent moving the job's blocks (None if not measured);
            a measurement, so results compare equal without it.
        transfer_bytes: bytes the tier moved for the job (None if not measured).
    """

    job_id: JobId
    success: bool
    successful_keys: tuple[OffloadKey, ...] | None = None
    transfer_time: float | None = field(default=None, compare=False)
    transfer_bytes: int | None = field(default=None, compare=False)


class PrimaryBlocks:
    """Rows of the primary tier's memory, as seen by a secondary tier.

    Args:
        primary_kv_view: a C-contiguous memoryview of at least two dimensions whose first one
            is the block (vLLM's `SharedOffloadRegion.create_kv_memoryview()` is
            `(num_blocks, row_bytes)` bytes; a float16 view of the same memory, or one shaped
            `(num_blocks, layers, items)`, serves as well). A row is `strides[0]` bytes.

    Raises:
        ValueError: the view has fewer than two dimensions or is not C-contiguous.
    """

    def __init__(self, primary_kv_view: memoryview[Any]) -> None:
        if primary_kv_view.ndim < 2 or not primary_kv_view.c_contiguous:
            raise ValueError(
                "primary_kv_view must be a C-contiguous memoryview (num_blocks, row_items, ...),"
                f" got ndim={primary_kv_view.ndim}, c_contiguous={primary_kv_view.c_contiguous}"
            )
        shape, strides = primary_kv_view.shape, primary_kv_view.strides
        assert shape is not None and strides is not None
        self.num_blocks: int = shape[0]
        self.block_bytes: int = strides[0]
        self._flat: memoryview = _flat_bytes(primary_kv_view)

    def row(self, block_id: int) -> memoryview:
        """Return the bytes of primary block `block_id` (zero-copy, writable when the view is).

        Raises:
            IndexError: `block_id` is out of range.
        """
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block id {block_id} not in [0, {self.num_blocks})")
        start = block_id * self.block_bytes
        return self._flat[start : start + self.block_bytes]

    def release(self) -> None:
        """Release this object's hold on the primary's memory (rows handed out stay valid)."""
        self._flat.release()

    @override
    def __repr__(self) -> str:
        return f"PrimaryBlocks(num_blocks={self.num_blocks}, block_bytes={self.block_bytes})"


def _flat_bytes(view: memoryview[Any]) -> memoryview:
    """A flat, zero-copy byte view of a C-contiguous view of any format."""
    try:
        # Shares the view's buffer without exporting it, so the owner can release it later.
        return view.cast("B")
    except (TypeError, ValueError):
        # cast refuses formats it does not know (numpy's float16 "e" on Python 3.11);
        # PickleBuffer.raw() takes any contiguous buffer, holding an export until released.
        return pickle.PickleBuffer(view).raw()


class SecondaryTierManager(ABC):
    """One non-primary tier, driven by the tiering manager.

    Every method runs on the scheduler's thread and must return quickly without blocking on I/O:
    copying happens elsewhere (I/O threads, a DMA engine, ...) or, for a trivial tier, when the
    results are collected in `get_finished_jobs`. Every submitted job is reported exactly once
    by `get_finished_jobs`, successful or not; a tier never raises to report a failed transfer.

    Attributes:
        medium: the name this tier uses in its `OffloadingEvent`s.
    """

    medium: str = "secondary"

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Say whether the tier holds a block, without blocking.

        Args:
            key: the block.
            req_context: the request asking.

        Returns:
            True if the block can be read (promoted) now, False if the tier does not hold it
            (or knows it cannot serve it), None if that is not known yet (its write is in
            flight, or an asynchronous lookup is pending): ask again in a later step.
        """

    def contains(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """Say whether the tier holds each block now, asking the medium itself; may block.

        For callers off the scheduler thread (vLLM's asynchronous lookups run it on a thread of
        their own while the scheduler thread keeps using the tier): one such caller at a time
        is safe. A block whose store is still in flight is not held yet.

        Args:
            keys: the blocks.

        Returns:
            One answer per key, in order. A tier that cannot reach its medium answers False.

        Raises:
            NotImplementedError: the tier does not offer blocking existence checks (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} offers no blocking existence check")

    @abstractmethod
    def submit_store(self, job: JobMetadata) -> None:
        """Start copying primary blocks into the tier (a cascade).

        The primary slots `job.block_ids` stay pinned and unchanged until the job is reported
        finished. The tier itself skips blocks it already holds, evicts to make room and
        allocates space.

        Args:
            job: the blocks to copy (`job.is_promotion` is False).
        """

    @abstractmethod
    def submit_load(self, job: JobMetadata) -> None:
        """Start copying blocks from the tier into already reserved primary slots (a promotion).

        If any block is missing or unreadable the job fails; a block that failed this way must
        answer False to later lookups, so it is not promoted again and again. The blocks of a
        failed job that were written completely and verified are listed in its result's
        `successful_keys`; no other slot is ever reported as loaded.

        Args:
            job: the blocks to copy (`job.is_promotion` is True).
        """

    @abstractmethod
    def get_finished_jobs(self) -> Iterable[JobResult]:
        """Return the jobs that finished since the last call, and forget them.

        Returns:
            One result per finished job.
        """

    def has_pending_work(self) -> bool:
        """Whether the tier has work of its own in flight (beyond the jobs the manager tracks).

        While True the engine keeps stepping, so `get_finished_jobs` keeps being called.

        Returns:
            False by default: a tier whose only work is its submitted jobs needs nothing more.
        """
        return False

    def num_evicted_blocks(self) -> int:
        """Return how many blocks the tier evicted since it started (for `TierStats`).

        Returns:
            0 by default (a tier that never evicts, or does not count).
        """
        return 0

    def usage(self) -> float | None:
        """Return the fraction of the tier's capacity in use (for `TierStats`).

        Returns:
            None by default (unbounded, or unknown).
        """
        return None

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark blocks recently used (the tiering manager forwards every `touch`).

        Args:
            keys: the blocks, in request order; absent keys are ignored.
            req_context: the request using them.
        """
        return None

    def on_request_finished(self, req_context: ReqContext) -> None:
        """The request is done and no job will be submitted for it any more.

        Jobs already submitted for it may still be running.

        Args:
            req_context: the finished request.
        """
        return None

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Return the events of storage this tier owns, buffered since the last call.

        Returns:
            The events, oldest first (none unless the tier was built with events enabled).
        """
        return ()

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished (its result is then ready).

        Used by `reset_cache`, never on a hot path. A copy is never aborted midway. Tiers whose
        jobs complete inside `get_finished_jobs` have nothing to wait for (the default).
        """
        return None

    def shutdown(self) -> None:
        """Stop the tier: wait for copies in progress, fail queued jobs, release resources.

        The tiering manager calls it before the primary's memory is released.
        """
        return None
