"""`VllmTier`: a kvref tier as vLLM's; it translates kvref's types to vLLM's and back, nothing else."""

from collections.abc import Collection
from dataclasses import is_dataclass
from enum import Enum
from typing import Any, ClassVar, cast

from typing_extensions import override
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload import base as v
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

import kvref.base as k
import kvref.tiering.base as kt
from kvref.tiering.factory import build_tier
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.redis import RedisSecondaryTier

__all__ = ["FileSystemTier", "RedisTier", "VllmTier"]


def _vllm(value: Any) -> Any:
    """vLLM's twin of a kvref enum member or record (`kvref.base` mirrors `vllm.v1.kv_offload.base`)."""
    if isinstance(value, Enum):
        return getattr(v, type(value).__name__)[value.name]
    if is_dataclass(value):
        return getattr(v, type(value).__name__)(**{name: _vllm(field) for name, field in vars(value).items()})
    return value


class VllmTier(SecondaryTierManager):
    """The kvref tier `kvref_tier_class` (the instance: `kvref_tier`), built from the same options.
    vLLM's contexts and spec pass as kvref's (the same fields and methods); kvref's tiers serve no
    external requests, so they are polled at steps only."""

    kvref_tier_class: ClassVar[type[kt.SecondaryTierManager]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.medium = _vllm(cls.kvref_tier_class.medium)
        cls.cache_hit_source = _vllm(cls.kvref_tier_class.cache_hit_source)

    def __init__(self, offloading_spec: v.OffloadingSpec, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: BackpressureDetector | None = None, **options: Any) -> None:  # fmt: skip
        spec = cast("k.OffloadingSpec", offloading_spec)  # vLLM's manager applies back-pressure: None
        self.kvref_tier = build_tier(self.kvref_tier_class, spec, primary_kv_view, tier_type, None, options)
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = _vllm(self.kvref_tier.locality)

    @override
    def lookup(self, key: v.OffloadKey, req_context: v.ReqContext) -> v.LookupResult:
        return _vllm(self.kvref_tier.lookup(k.OffloadKey(key), cast("k.ReqContext", req_context)))

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        # A job is the same record but for its chunk ids (a numpy array in vLLM, a list in kvref).
        self.kvref_tier.submit_store(kt.TransferJob(**{**vars(job_metadata), "chunk_ids": job_metadata.chunk_ids.tolist()}))

    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        self.kvref_tier.submit_load(kt.TransferJob(**{**vars(job_metadata), "chunk_ids": job_metadata.chunk_ids.tolist()}))

    @override
    def get_finished_jobs(self) -> list[JobResult]:
        return [JobResult(**vars(result)) for result in self.kvref_tier.get_finished_jobs()]

    @override
    def take_events(self) -> list[v.OffloadingEvent]:
        return [_vllm(event) for event in self.kvref_tier.take_events()]

    @override
    def touch(self, keys: Collection[v.OffloadKey], req_context: v.ReqContext) -> None:
        self.kvref_tier.touch(cast("Collection[k.OffloadKey]", keys), cast("k.ReqContext", req_context))

    @override
    def on_new_request(self, req_context: v.ReqContext) -> v.RequestOffloadingContext:
        return _vllm(self.kvref_tier.on_new_request(cast("k.ReqContext", req_context)))

    @override
    def on_request_finished(self, req_context: v.ReqContext) -> None:
        self.kvref_tier.on_request_finished(cast("k.ReqContext", req_context))

    @override
    def on_schedule_end(self, context: v.ScheduleEndContext) -> None:
        self.kvref_tier.on_schedule_end(k.ScheduleEndContext(*context))

    @override
    def drain_jobs(self) -> None:
        self.kvref_tier.drain_jobs()

    @override
    def shutdown(self) -> None:
        self.kvref_tier.shutdown()

    @classmethod
    @override
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, v.OffloadingMetricMetadata]:
        return {name: _vllm(meta) for name, meta in cls.kvref_tier_class.build_metric_definitions(extra_config).items()}

    @override
    def get_stats(self) -> OffloadingConnectorStats | None:
        return None if (stats := self.kvref_tier.get_stats()) is None else OffloadingConnectorStats(data=stats.data)

    @classmethod
    @override
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return cls.kvref_tier_class.config_info_keys(tier_config)

    @override
    def config_info(self) -> v.ConfigInfoMapping:
        return self.kvref_tier.config_info()


class FileSystemTier(VllmTier):
    kvref_tier_class = FileSystemSecondaryTier


class RedisTier(VllmTier):
    kvref_tier_class = RedisSecondaryTier
