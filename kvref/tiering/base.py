"""Secondary tiers: the contract between the tiering manager and one non-primary tier (vLLM 0.33:
`tiering/base.py`).

Data flow:

    store:  GPU --store--> CPU primary --cascade (submit_store)--> every secondary tier
    load:   GPU <--load--- CPU primary <--promotion (submit_load)-- first secondary tier holding it

Vocabulary: load/store move chunks between the GPU and the primary; read/write are seen from
the primary and move chunks between it and a secondary tier. A tier addresses the primary
through a zero-copy memoryview whose first dimension is the chunk (`PrimaryBlocks` hands out
its rows).

Threads: every method runs in the scheduler process under the tiering manager's lock, so never
two at once, but not always on the same thread: a tier that sets `tolerates_off_thread_polling`
is also served from the manager's tier-poll thread, and any tier can be reached from there
through `ParentManager`. Methods return quickly and never block on I/O: `submit_*` start jobs,
`get_finished_jobs` reports them.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from kvref.base import (
    CacheHitSource,
    ConfigInfoMapping,
    Locality,
    LookupResult,
    Medium,
    OffloadingConnectorStats,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from kvref.tiering.backpressure import BackpressureDetector
from kvref.tiering.primary_blocks import PrimaryBlocks

if TYPE_CHECKING:
    from kvref.base import OffloadingSpec

__all__ = [
    "TIER_LABEL",
    "JobId",
    "JobResult",
    "ParentManager",
    "PrimaryBlocks",
    "SecondaryTierManager",
    "TieringOffloadingMetrics",
    "TransferJob",
]

JobId = int
"""A transfer job's id, unique per tiering manager."""

TIER_LABEL = "tier"
"""The label that tells the tiers' metric series apart (the manager adds it; tiers never do)."""


class TieringOffloadingMetrics:
    """Names of the metrics `TieringOffloadingManager` reports."""

    LOOKUP_SYNC_DELAY = "vllm:kv_offload_tiering_lookup_sync_delay_seconds"
    LOOKUP_ASYNC_DELAY = "vllm:kv_offload_tiering_lookup_async_delay_seconds"
    READ_BYTES = "vllm:kv_offload_tiering_read_bytes"
    READ_TIME = "vllm:kv_offload_tiering_read_time"
    WRITE_BYTES = "vllm:kv_offload_tiering_write_bytes"
    WRITE_TIME = "vllm:kv_offload_tiering_write_time"
    PROMOTION_JOB_FAILURES = "vllm:kv_offload_tiering_promotion_job_failures"
    CASCADE_JOB_FAILURES = "vllm:kv_offload_tiering_cascade_job_failures"
    CHUNK_QUERIES = "vllm:kv_offload_tiering_chunk_queries"
    CHUNK_HITS = "vllm:kv_offload_tiering_chunk_hits"
    PRIMARY_WRITE_USAGE_PERC = "vllm:kv_offload_tiering_primary_write_usage_perc"
    PRIMARY_READ_USAGE_PERC = "vllm:kv_offload_tiering_primary_read_usage_perc"
    PROMOTION_ALLOCATION_FAILURES = "vllm:kv_offload_tiering_promotion_allocation_failures"
    ACTIVE_PROMOTION_JOBS = "vllm:kv_offload_tiering_active_promotion_jobs"
    ACTIVE_CASCADE_JOBS = "vllm:kv_offload_tiering_active_cascade_jobs"
    BACKPRESSURE_STORE_LATENCY_EMA = "vllm:kv_offload_tiering_backpressure_store_latency_ema"
    BACKPRESSURE_STORES_DROPPED = "vllm:kv_offload_tiering_backpressure_stores_dropped"
    BACKPRESSURE_BLOCKS_DROPPED = "vllm:kv_offload_tiering_backpressure_blocks_dropped"
    PROMOTION_LATENCY = "vllm:kv_offload_tiering_promotion_latency_seconds"


@dataclass
class TransferJob:
    """One transfer between the primary and a secondary tier.

    Attributes:
        job_id: reported back in the job's `JobResult`.
        keys: the chunks, co-indexed with `chunk_ids`.
        chunk_ids: the primary slots: read by a cascade, written by a promotion. They stay
            pinned until the job is reported finished.
        is_promotion: True for a load into the primary, False for a cascade out of it.
        req_context: the request the job serves.
        submit_time: `time.monotonic()` when the job was made (for back-pressure).
    """

    job_id: JobId
    keys: Collection[OffloadKey]
    chunk_ids: Sequence[int]
    is_promotion: bool
    req_context: ReqContext
    submit_time: float = field(default_factory=time.monotonic)


@dataclass
class JobResult:
    """The outcome of one job.

    Attributes:
        job_id: the job's id.
        success: True if every chunk of the job was moved.
        successful_keys: for a failed promotion, the chunks that were nevertheless written
            completely (the manager keeps them and releases the others); None when every chunk
            shares the fate `success` says. Always a subset of the job's keys.
        transfer_time: seconds the tier spent, if measured.
        transfer_bytes: bytes the tier moved, if measured.
    """

    job_id: JobId
    success: bool
    successful_keys: Collection[OffloadKey] | None = None
    transfer_time: float | None = None
    transfer_bytes: int | None = None


class ParentManager(ABC):
    """How a secondary tier calls back into the tiering manager (`serve_external_requests`).

    The calls leave the calling tier out of every fan-out. For each request a tier serves for
    someone else (a peer engine):

        1. on_new_request(req_context)
        2. lookup(key, req_context), per chunk
        3. create_store_job(keys, req_context): pin the chunks and get a job to copy them out
        4. on_request_finished(req_context), even if nothing was found

    Steps 2 and 3 may interleave.
    """

    @abstractmethod
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Start serving a request."""

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """Look a chunk up in the primary and the other tiers (a promotion may start)."""

    @abstractmethod
    def create_store_job(self, keys: Collection[OffloadKey], req_context: ReqContext) -> TransferJob:
        """Pin HIT chunks in the primary and return a tracked job that reads them.

        The caller copies them and reports the job through `get_finished_jobs`.
        """

    @abstractmethod
    def on_request_finished(self, req_context: ReqContext) -> None:
        """Stop serving a request."""


class SecondaryTierManager(ABC):
    """One non-primary offloading tier (see the module docstring).

    Class attributes:
        medium: the tier's storage medium, if it has one.
        cache_hit_source: what a hit served from this tier counts as (derived from `medium`
            unless a subclass sets it).
        tolerates_off_thread_polling: the tiering manager may also call `get_finished_jobs`
            and `serve_external_requests` from its tier-poll thread, between steps (a tier that
            answers a remote peer). Overriding `serve_external_requests` alone does not opt in.

    Args:
        offloading_spec: the offloading configuration.
        primary_kv_view: the primary's memory, one row per chunk.
        tier_type: the tier's registered type.
        backpressure_detector: watches the tier's stores, if any.

    Raises:
        ValueError: `primary_kv_view` has no strides.
    """

    medium: ClassVar[Medium | None] = None
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED
    tolerates_off_thread_polling: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "cache_hit_source" not in cls.__dict__ and cls.medium is not None:
            cls.cache_hit_source = {Medium.CPU: CacheHitSource.HOST, Medium.STORAGE: CacheHitSource.DISK}[cls.medium]

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
    ) -> None:
        if primary_kv_view.strides is None:
            raise ValueError("primary_kv_view has no strides: it must be (num_chunks, ...) memory")
        self._offloading_spec = offloading_spec
        self._primary_kv_view: memoryview = primary_kv_view
        self._block_size_bytes: int = primary_kv_view.strides[0]
        self.tier_type = tier_type
        self.locality: Locality | None = None
        self._bp_detector = backpressure_detector

    @property
    def block_size_bytes(self) -> int:
        """The bytes of one primary chunk (one row of the primary's view)."""
        return self._block_size_bytes

    @property
    def bp_detector(self) -> BackpressureDetector | None:
        """The tier's back-pressure detector, if it has one."""
        return self._bp_detector

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """Say whether the tier holds a chunk, without blocking.

        Args:
            key: the chunk.
            req_context: the request asking.

        Returns:
            HIT if the chunk can be promoted now, MISS if the tier does not hold it (or knows it
            cannot serve it), RETRY if that is not known yet (its write is in flight, or an
            asynchronous lookup is pending).
        """

    @abstractmethod
    def submit_store(self, job_metadata: TransferJob) -> None:
        """Start copying primary chunks into the tier (a cascade); do not copy on this thread.

        The primary slots `job_metadata.chunk_ids` stay pinned and unchanged until the job is
        reported. The tier skips chunks it already holds, evicts to make room and allocates
        space itself.

        Args:
            job_metadata: the chunks to copy (`is_promotion` is False).
        """

    @abstractmethod
    def submit_load(self, job_metadata: TransferJob) -> None:
        """Start copying chunks from the tier into reserved primary slots (a promotion).

        The job fails if any chunk is missing or unreadable; the chunks that were nevertheless
        written completely are its result's `successful_keys`, and no other slot is ever
        reported as loaded.

        Args:
            job_metadata: the chunks to copy (`is_promotion` is True).
        """

    @abstractmethod
    def get_finished_jobs(self) -> Iterable[JobResult]:
        """Return every job (cascade or promotion) that finished since the last call, once."""

    def has_pending_work(self) -> bool:
        """Whether the engine must keep stepping for this tier (work beyond its reported jobs).

        Returns:
            False by default.
        """
        return False

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Return the events of storage this tier owns, collected since the last call."""
        return ()

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark chunks recently used (the tiering manager forwards every `touch`).

        Args:
            keys: the chunks, in request order; absent keys are ignored.
            req_context: the request using them.
        """
        return None

    @abstractmethod
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Called when the scheduler first sees a request.

        Returns:
            How this tier wants the request's chunks offered (REQUEST_LEVEL for tiers that keep
            whole requests).
        """

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Called once no `submit_*` or `touch` will name the request again.

        Jobs already submitted for it may still be running: release per-request bookkeeping.
        """
        return None

    def serve_external_requests(self, parent: ParentManager) -> None:
        """Serve requests that originate elsewhere (a peer), through `parent`.

        Called once per step before the step's promotions are submitted, and once per tier-poll
        round for a tier that sets `tolerates_off_thread_polling` (a promotion started from a
        round is then submitted at the next step's end). `parent` is valid only during the call,
        and the manager's lock is held throughout, so a `lookup` HIT stays valid until this call
        pins it; never release the lock part-way. The default serves nothing.
        """
        return None

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """Called once at the end of each scheduler step."""
        return None

    @abstractmethod
    def drain_jobs(self) -> None:
        """Block until every submitted job has finished or failed.

        Afterwards no tier I/O touches the primary's memory, and every job's result is available
        from `get_finished_jobs`. Used by `reset_cache`. A copy in progress is never aborted (it
        would corrupt one side); queued jobs may be cancelled, their failure still reported.
        """

    def shutdown(self) -> None:
        """Release the tier's resources (threads, connections, files)."""
        return None

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        """Return the metrics this tier emits, by name."""
        return {}

    def get_stats(self) -> OffloadingConnectorStats | None:
        """Return the tier's metric observations since the last call, or None."""
        return None

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        """Return the tier's info-metric label names (never `TIER_LABEL`, which the spec adds)."""
        return ()

    def config_info(self) -> ConfigInfoMapping:
        """Return the tier's info-metric labels, for its one series (the manager adds `TIER_LABEL`)."""
        return {}
