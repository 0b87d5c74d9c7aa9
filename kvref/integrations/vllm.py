"""kvref's secondary tiers inside vLLM 0.33's tiering manager, through vLLM's own plug-in point.

vLLM 0.33 builds out-of-tree secondary tiers by module path (`SecondaryTierFactory`), so these
need no fork and patch nothing of vLLM's:

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
      "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 17179869184,
        "secondary_tiers": [{"type": "RedisTier", "module_path": "kvref.integrations.vllm",
                             "url": "redis://cache.internal:6379/0"}]}}'

`RedisTier` (kvref's `RedisSecondaryTier`: engines on many machines share blocks through one
Redis server or cluster) and `FileSystemTier` (kvref's `FileSystemSecondaryTier`: checksummed
segment files under `root_dir`) are `SecondaryTierManager`s of vLLM's. Each translates vLLM's
calls to its kvref tier, which does the work (I/O threads, value format, checksums, routing,
fault handling): jobs keep their ids, `chunk_ids` become block ids, results keep vLLM's partial
success (`successful_keys`), and the tier's removal events come out as vLLM's. Besides the
translation, an adapter owns only what vLLM's contract asks of a tier and kvref's tiers leave to
kvref's tiering manager:

* lookups: vLLM's own `AsyncLookupManager` answers RETRY until the existence check it sends at
  `on_schedule_end` is answered (on its thread, through the kvref tier's blocking `contains`),
  then the same answer for the key for the rest of the request; a failed load marks its lost
  blocks a miss;
* stored events: one per successful store job, with vLLM's medium and the configured locality,
  only when the tier's `enable_kv_events` and vLLM's global KV-events flag are both on;
* guards: a job is reported to vLLM exactly once and only if it was submitted (vLLM's manager
  asserts otherwise, which would stop its scheduler), and a tier that raises while submitting
  reports a failed job instead;
* statistics for `get_stats`, declared by `build_metric_definitions`.

Both also take vLLM's common tier keys as its own fs tier does: `locality` ("LOCAL" or
"REMOTE"), `enable_kv_events`, and `backpressure` (vLLM's factory builds the detector and hands it
to the base class, where vLLM's manager applies it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

from typing_extensions import override

from kvref.base import OffloadKey as KvrefKey
from kvref.base import ReqContext as KvrefContext
from kvref.tiering.base import JobMetadata
from kvref.tiering.base import JobResult as KvrefJobResult
from kvref.tiering.base import SecondaryTierManager as KvrefTier
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.redis import RedisSecondaryTier

_EXTRA_HINT = "pip install 'kvref[vllm]'"
try:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.v1.kv_offload.base import (
        ConfigInfo,
        ConfigInfoMapping,
        Locality,
        LookupResult,
        Medium,
        OffloadingCounterMetadata,
        OffloadingEvent,
        OffloadingGaugeMetadata,
        OffloadingMetricMetadata,
        OffloadKey,
        ReqContext,
        RequestOffloadingContext,
        ScheduleEndContext,
    )
    from vllm.v1.kv_offload.file_mapper import FileMapper
    from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError as _exc:  # vLLM missing, too old or too new, or one of its dependencies broken
    _missing = getattr(_exc, "name", None) or ""
    _what = (
        "vLLM is not installed"
        if _missing == "vllm"
        else f"vLLM's tiering API did not import ({_exc})"
    )
    raise ImportError(
        f"kvref.integrations.vllm needs vLLM 0.33 ({_what}): {_EXTRA_HINT}"
    ) from _exc

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

__all__ = ["RedisTier", "FileSystemTier", "RedisTierInfo", "FileSystemTierInfo", "KvrefTierMetrics"]

logger = logging.getLogger(__name__)


class KvrefTierMetrics:
    """Names of the metrics the tiers report through `get_stats` (labelled by `tier_type`)."""

    BLOCKS_STORED = "vllm:kv_offload_kvref_tier_blocks_stored"
    BLOCKS_LOADED = "vllm:kv_offload_kvref_tier_blocks_loaded"
    BLOCKS_EVICTED = "vllm:kv_offload_kvref_tier_blocks_evicted"
    FAILED_STORES = "vllm:kv_offload_kvref_tier_failed_stores"
    FAILED_LOADS = "vllm:kv_offload_kvref_tier_failed_loads"
    USAGE_PERC = "vllm:kv_offload_kvref_tier_usage_perc"


_METRIC_LABELS = ("tier_type",)
_COUNTERS = {
    KvrefTierMetrics.BLOCKS_STORED: "Blocks a kvref tier stored (of successful store jobs).",
    KvrefTierMetrics.BLOCKS_LOADED: "Blocks a kvref tier loaded into the CPU tier, failed jobs' good ones included.",
    KvrefTierMetrics.BLOCKS_EVICTED: "Blocks a kvref tier evicted to make room.",
    KvrefTierMetrics.FAILED_STORES: "Store jobs of a kvref tier that failed (some block was not stored).",
    KvrefTierMetrics.FAILED_LOADS: "Load jobs of a kvref tier that failed (some block missing or damaged).",
}


def _kvref_keys(keys: Iterable[OffloadKey]) -> tuple[KvrefKey, ...]:
    # Both are NewTypes of the same bytes (block hash + group index): only the names differ.
    return cast("tuple[KvrefKey, ...]", tuple(keys))


def _kvref_context(req_context: ReqContext) -> KvrefContext:
    return KvrefContext(req_id=req_context.req_id, kv_transfer_params=req_context.kv_transfer_params)


def _check_bool(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{field} must be true or false, got {value!r}")
    return value


def _refuse_unknown(tier: str, unknown: dict[str, object]) -> None:
    # vLLM passes every key of the tier's config as a keyword: a misspelt option would
    # otherwise be a TypeError about __init__, not a configuration error naming the key.
    if unknown:
        names = ", ".join(repr(name) for name in sorted(unknown))
        raise ValueError(f"{tier}: unknown option {names} (docs/LIBRARY.md lists the options)")


def _run_identity(offloading_spec: OffloadingSpec) -> str:
    """`<model>_<digest>_r<rank>`: what vLLM's own fs tier names a run's directory after.

    The digest covers the model, dtype, KV-cache groups, tokens per hash, chunk size and (unless
    the layout is parallelism-agnostic) the parallel layout: engines share blocks exactly when
    it is equal, as they do through vLLM's fs tier.
    """
    mapper = FileMapper.from_offloading_spec(
        root_dir="",
        offloading_spec=offloading_spec,
        blocks_per_file=offloading_spec.blocks_per_chunk,
        parallel_agnostic=True,
    )
    return f"{os.path.basename(mapper.base_path)}_r{mapper.rank}"


class _TierLookups(AsyncLookupManager):
    """vLLM's asynchronous lookups, asking a kvref tier's blocking `contains` on vLLM's thread."""

    def __init__(self, tier: KvrefTier, tier_type: str) -> None:
        self._tier = tier  # before the base class starts its thread
        super().__init__(tier_type=tier_type)

    @override
    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier.contains(_kvref_keys(keys))


@dataclass
class _Counters:
    """What `get_stats` reports next (vLLM's stats are increments since the last call)."""

    blocks_stored: int = 0
    blocks_loaded: int = 0
    failed_stores: int = 0
    failed_loads: int = 0


class _KvrefSecondaryTier(SecondaryTierManager):
    """A kvref tier behind vLLM's `SecondaryTierManager` API (see the module docstring).

    Args:
        offloading_spec, primary_kv_view, tier_type, backpressure_detector: as vLLM's factory
            passes them.
        tier: the kvref tier, built over `primary_kv_view` by the subclass.
        enable_kv_events: emit KV events (also needs the spec's global KV-events flag).
        locality: "LOCAL" or "REMOTE" (where the tier's storage is), or None.

    Raises:
        ValueError: `locality` or `enable_kv_events` is invalid (the message names it).
    """

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None,
        *,
        tier: KvrefTier,
        enable_kv_events: bool,
        locality: str | None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        try:
            self.locality = None if locality is None else Locality(locality)
        except ValueError as exc:
            tier.shutdown()
            raise ValueError(f"locality: {exc} (use 'LOCAL' or 'REMOTE')") from None
        self._tier = tier
        self._events_on = enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events
        if enable_kv_events and not self._events_on:
            logger.warning(
                "enable_kv_events is set on secondary tier %r but KV cache events are disabled "
                "globally; the tier will not emit events",
                tier_type,
            )
        self._events: list[OffloadingEvent] = []
        self._jobs: dict[int, TransferJob] = {}  # submitted, not yet reported to vLLM
        self._refused: list[KvrefJobResult] = []  # submissions the kvref tier raised on
        self._counters = _Counters()
        self._evicted_reported = 0
        self._closed = False
        # Named as vLLM's own tiers name theirs (its fs and obj tiers, and its tests, use it).
        self._lookup_manager = _TierLookups(tier, tier_type)

    @property
    def kvref_tier(self) -> KvrefTier:
        """The kvref tier doing the work (for diagnostics: its repr, `location`, `redis_key`)."""
        return self._tier

    # --- lookups ---

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookup_manager.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    @override
    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookup_manager.flush()

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookup_manager.cleanup(req_context.req_id)
        self._tier.on_request_finished(_kvref_context(req_context))

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._tier.touch(_kvref_keys(keys), _kvref_context(req_context))

    # --- jobs ---

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata)

    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata)

    def _submit(self, job: TransferJob) -> None:
        if job.job_id in self._jobs:
            logger.error("secondary tier %r: job %d submitted twice; ignored", self.tier_type, job.job_id)
            return
        self._jobs[job.job_id] = job
        keys = _kvref_keys(job.keys)
        try:
            meta = JobMetadata(
                job.job_id,
                keys,
                job.chunk_ids.tolist(),
                job.is_promotion,
                _kvref_context(job.req_context),
            )
            if job.is_promotion:
                self._tier.submit_load(meta)
            else:
                self._tier.submit_store(meta)
        except Exception:
            # A tier reports failures as failed jobs; one that raises must not stop vLLM.
            logger.exception("secondary tier %r: job %d could not be submitted", self.tier_type, job.job_id)
            self._refused.append(KvrefJobResult(job.job_id, False))

    @override
    def get_finished_jobs(self) -> list[JobResult]:
        done = list(self._tier.get_finished_jobs())
        if self._refused:
            done.extend(self._refused)
            self._refused.clear()
        results: list[JobResult] = []
        for result in done:
            job = self._jobs.pop(result.job_id, None)
            if job is None:
                # Reporting it would trip vLLM's assertion and stop the scheduler.
                logger.error(
                    "secondary tier %r reported job %d, which is not running; dropped",
                    self.tier_type,
                    result.job_id,
                )
                continue
            results.append(self._finish(job, result))
        return results

    def _finish(self, job: TransferJob, result: KvrefJobResult) -> JobResult:
        counters = self._counters
        kept: tuple[OffloadKey, ...] | None = None
        if job.is_promotion:
            if result.success:
                counters.blocks_loaded += len(job.keys)
            else:
                counters.failed_loads += 1
                job_keys = set(job.keys)
                kept = cast("tuple[OffloadKey, ...]", result.successful_keys or ())
                if not job_keys.issuperset(kept):
                    logger.error("secondary tier %r: job %d kept unknown keys", self.tier_type, job.job_id)
                    kept = ()
                counters.blocks_loaded += len(kept)
                # As vLLM's fs tier: the lost blocks answer MISS from now on, so the scheduler
                # does not promote them again and again.
                self._lookup_manager.mark_miss(job_keys.difference(kept))
                kept = kept or None
        elif result.success:
            counters.blocks_stored += len(job.keys)
            if self._events_on:
                self._events.append(
                    OffloadingEvent(keys=list(job.keys), medium=self._medium(), removed=False, locality=self.locality)
                )
        else:
            counters.failed_stores += 1
        return JobResult(
            job_id=job.job_id,
            success=result.success,
            successful_keys=kept,
            transfer_time=result.transfer_time,
            transfer_bytes=result.transfer_bytes,
        )

    def _medium(self) -> Medium:
        medium = type(self).medium
        assert medium is not None
        return medium

    @override
    def drain_jobs(self) -> None:
        self._tier.drain_jobs()

    @override
    def has_pending_work(self) -> bool:
        return self._tier.has_pending_work()

    @override
    def take_events(self) -> list[OffloadingEvent]:
        # The kvref tier's removals (evictions, damaged blocks); its stored events are replaced
        # by the one-per-job events above. Nothing is buffered unless events are on.
        events, self._events = self._events, []
        for event in self._tier.take_events():
            if event.removed:
                events.append(
                    OffloadingEvent(
                        keys=cast("list[OffloadKey]", list(event.keys)),
                        medium=self._medium(),
                        removed=True,
                        locality=self.locality,
                    )
                )
        return events

    @override
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._lookup_manager.shutdown()
        self._tier.shutdown()

    # --- statistics ---

    @classmethod
    @override
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        metrics: dict[str, OffloadingMetricMetadata] = {
            name: OffloadingCounterMetadata(documentation=text, labelnames=_METRIC_LABELS)
            for name, text in _COUNTERS.items()
        }
        metrics[KvrefTierMetrics.USAGE_PERC] = OffloadingGaugeMetadata(
            documentation="Fraction of a kvref tier's capacity in use (bounded tiers only).",
            labelnames=_METRIC_LABELS,
        )
        return metrics

    @override
    def get_stats(self) -> OffloadingConnectorStats:
        stats = OffloadingConnectorStats()
        labels = (self.tier_type,)
        counters, self._counters = self._counters, _Counters()
        evicted = self._tier.num_evicted_blocks()
        for name, value in (
            (KvrefTierMetrics.BLOCKS_STORED, counters.blocks_stored),
            (KvrefTierMetrics.BLOCKS_LOADED, counters.blocks_loaded),
            (KvrefTierMetrics.BLOCKS_EVICTED, evicted - self._evicted_reported),
            (KvrefTierMetrics.FAILED_STORES, counters.failed_stores),
            (KvrefTierMetrics.FAILED_LOADS, counters.failed_loads),
        ):
            if value:
                stats.increase_counter(name, value, labels)
        self._evicted_reported = evicted
        usage = self._tier.usage()
        if usage is not None:
            stats.set_gauge(KvrefTierMetrics.USAGE_PERC, usage, labels)
        return stats


@dataclass(frozen=True)
class RedisTierInfo(ConfigInfo):
    """What a `RedisTier` publishes on vLLM's config-info metric (never the url: it may hold a
    password)."""

    redis_namespace: str
    redis_cluster: bool
    redis_num_connections: int


class RedisTier(_KvrefSecondaryTier):
    """kvref's Redis tier (`kvref.tiering.redis.RedisSecondaryTier`) as a vLLM secondary tier.

    Configured as `{"type": "RedisTier", "module_path": "kvref.integrations.vllm", "url": ...}`;
    the options are the kvref tier's (docs/LIBRARY.md, "Redis tier"), plus vLLM's `locality`,
    `enable_kv_events` and `backpressure`. `namespace` defaults to the identity vLLM's own fs
    tier names its directories after (model, dtype, KV-cache groups, chunk size, parallel
    layout, rank), so engines share blocks exactly when their KV layouts agree.

    A server that is down fails jobs (vLLM recomputes) and answers lookups MISS; nothing raises
    in the scheduler.
    """

    medium: ClassVar[Medium | None] = Medium.STORAGE
    # A remote store: vLLM's fallback source, not "disk" (what STORAGE would give).
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        url: str,
        *,
        cluster: bool = False,
        namespace: str | None = None,
        num_connections: int = 4,
        connect_timeout_s: float = 1.0,
        socket_timeout_s: float = 1.0,
        lookup_cache_s: float = 1.0,
        ttl_s: float | None = None,
        tls_ca_file: str | None = None,
        enable_kv_events: bool = False,
        locality: str | None = None,
        backpressure_detector: BackpressureDetector | None = None,
        **unknown: object,
    ) -> None:
        _refuse_unknown("RedisTier", unknown)
        events = _check_bool("enable_kv_events", enable_kv_events)
        namespace = namespace if namespace is not None else f"vllm/{_run_identity(offloading_spec)}"
        tier = RedisSecondaryTier(
            primary_kv_view,
            url,
            cluster=_check_bool("cluster", cluster),
            namespace=namespace,
            num_connections=num_connections,
            connect_timeout_s=connect_timeout_s,
            socket_timeout_s=socket_timeout_s,
            lookup_cache_s=lookup_cache_s,
            ttl_s=ttl_s,
            tls_ca_file=tls_ca_file,
            enable_events=events,
        )
        self._info = RedisTierInfo(namespace, cluster, num_connections)
        super().__init__(
            offloading_spec,
            primary_kv_view,
            tier_type,
            backpressure_detector,
            tier=tier,
            enable_kv_events=events,
            locality=locality,
        )

    @classmethod
    @override
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return RedisTierInfo.config_info_keys()

    @override
    def config_info(self) -> ConfigInfoMapping:
        return self._info.as_config_info()


@dataclass(frozen=True)
class FileSystemTierInfo(ConfigInfo):
    """What a `FileSystemTier` publishes on vLLM's config-info metric."""

    fs_capacity_bytes: int | None
    fs_fsync: bool


class FileSystemTier(_KvrefSecondaryTier):
    """kvref's filesystem tier (`kvref.tiering.fs.FileSystemSecondaryTier`) as a vLLM tier.

    Configured as `{"type": "FileSystemTier", "module_path": "kvref.integrations.vllm",
    "root_dir": ...}`; the options are the kvref tier's (docs/LIBRARY.md), plus vLLM's
    `locality`, `enable_kv_events` and `backpressure`. Blocks go under
    `root_dir/<model>_<digest>_r<rank>`, the identity vLLM's own fs tier uses, so engines of
    other models or layouts never read them; one engine at a time uses a directory (a second
    is refused with an `OSError` naming the holder's pid). Blocks survive restarts.
    """

    medium: ClassVar[Medium | None] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        root_dir: str,
        *,
        capacity_bytes: int | None = None,
        max_segment_bytes: int = 16 << 20,
        n_read_threads: int | None = None,
        n_write_threads: int | None = None,
        fsync: bool = False,
        enable_kv_events: bool = False,
        locality: str | None = None,
        backpressure_detector: BackpressureDetector | None = None,
        **unknown: object,
    ) -> None:
        _refuse_unknown("FileSystemTier", unknown)
        events = _check_bool("enable_kv_events", enable_kv_events)
        if not isinstance(root_dir, str) or not root_dir:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"root_dir must be a non-empty path, got {root_dir!r}")
        tier = FileSystemSecondaryTier(
            primary_kv_view,
            os.path.join(root_dir, _run_identity(offloading_spec)),
            capacity_bytes=capacity_bytes,
            max_segment_bytes=max_segment_bytes,
            n_read_threads=n_read_threads,
            n_write_threads=n_write_threads,
            fsync=fsync,
            enable_events=events,
        )
        self._info = FileSystemTierInfo(capacity_bytes, fsync)
        super().__init__(
            offloading_spec,
            primary_kv_view,
            tier_type,
            backpressure_detector,
            tier=tier,
            enable_kv_events=events,
            locality=locality,
        )

    @classmethod
    @override
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return FileSystemTierInfo.config_info_keys()

    @override
    def config_info(self) -> ConfigInfoMapping:
        return self._info.as_config_info()
