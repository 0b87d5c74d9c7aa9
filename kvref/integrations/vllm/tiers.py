"""`RedisTier` and `FileSystemTier`: kvref's Redis and filesystem tiers as vLLM 0.33 secondary tiers
(see the package docstring, `kvref.integrations.vllm`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import override
from vllm.v1.kv_offload.base import ConfigInfo, ConfigInfoMapping, Medium
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvref.integrations.vllm._adapter import KvrefSecondaryTier, check_bool, refuse_unknown, run_identity
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.redis import RedisSecondaryTier

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

__all__ = ["RedisTier", "RedisTierInfo", "FileSystemTier", "FileSystemTierInfo"]


@dataclass(frozen=True)
class RedisTierInfo(ConfigInfo):
    """What a `RedisTier` publishes on vLLM's config-info metric (never the url: it may hold a
    password)."""

    redis_namespace: str
    redis_cluster: bool
    redis_num_connections: int


class RedisTier(KvrefSecondaryTier):
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
        refuse_unknown("RedisTier", unknown)
        events = check_bool("enable_kv_events", enable_kv_events)
        namespace = namespace if namespace is not None else f"vllm/{run_identity(offloading_spec)}"
        tier = RedisSecondaryTier(
            primary_kv_view,
            url,
            cluster=check_bool("cluster", cluster),
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


class FileSystemTier(KvrefSecondaryTier):
    """kvref's filesystem tier (`kvref.tiering.fs.FileSystemSecondaryTier`) as a vLLM tier.

    Configured as `{"type": "FileSystemTier", "module_path": "kvref.integrations.vllm",
    "root_dir": ...}`; the options are the kvref tier's (docs/LIBRARY.md), plus vLLM's
    `locality`, `enable_kv_events` and `backpressure`. Blocks go under
    `root_dir/<model>_<digest>_r<rank>`, the identity vLLM's own fs tier uses, so engines of
    other models or layouts never read them, and any number of engines of the same one (replicas,
    data-parallel ranks, hosts on a shared volume) share them. Blocks survive restarts.
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
        n_read_threads: int | None = None,
        n_write_threads: int | None = None,
        fsync: bool = False,
        page_cache: bool = False,
        huge_page_staging: bool | None = None,
        stale_tmp_s: float = 900.0,
        enable_kv_events: bool = False,
        locality: str | None = None,
        backpressure_detector: BackpressureDetector | None = None,
        **unknown: object,
    ) -> None:
        refuse_unknown("FileSystemTier", unknown)
        events = check_bool("enable_kv_events", enable_kv_events)
        if not isinstance(root_dir, str) or not root_dir:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"root_dir must be a non-empty path, got {root_dir!r}")
        tier = FileSystemSecondaryTier(
            primary_kv_view,
            os.path.join(root_dir, run_identity(offloading_spec)),
            capacity_bytes=capacity_bytes,
            n_read_threads=n_read_threads,
            n_write_threads=n_write_threads,
            fsync=fsync,
            page_cache=page_cache,
            huge_page_staging=huge_page_staging,
            stale_tmp_s=stale_tmp_s,
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
