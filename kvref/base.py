"""Core types and the offloading contracts (vLLM 0.33: `vllm/v1/kv_offload/base.py`).

An `OffloadingManager` runs in the scheduler. It tracks which KV blocks are offloaded, and where,
and hands the worker side what it needs to move them; it never copies data itself. Its
primitives:

* `lookup` - is one block offloaded and readable (HIT), absent (MISS), present but not yet
  readable (HIT_PENDING), or unknown for now (RETRY: ask again next step)?
* `prepare_load` / `complete_load` - protect blocks from eviction while the worker reads them.
* `touch` - mark blocks recently used (also blocks hit in the GPU prefix cache, never loaded).
* `prepare_store` / `complete_store` - reserve room for blocks the worker is about to write,
  evicting if needed, then make them loadable (or drop them if the write failed).
* `on_new_request` / `on_request_finished` / `on_schedule_end` - the request and step lifecycle.
* `take_events`, `get_stats`, `config_info` - what the engine publishes.
* `reset_cache` then `on_reset_flushed`, `shutdown`.

Exclusion: `lock` guards a manager's whole state (the manager, every tier it composes and their
front ends). Callers hold it around every call but `shutdown`, and across calls that depend on
each other - a `lookup` HIT and the `prepare_load` that pins it must not be separated by another
thread's eviction. Managers never take it themselves. The default is a no-op context manager;
a manager entered from a second thread of its own returns a real lock.

Keys: every `keys` parameter is a `Collection[OffloadKey]`. Callers pass a list, tuple, set or
dict view; implementations may iterate it more than once and take its `len`, never index it.

The worker side (`OffloadingWorker`) runs in each worker process and moves the bytes of one
offloaded medium, over the canonical KV caches of `kvref.canonical`. An `OffloadingSpec` builds
the two sides of one offloading configuration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, NamedTuple

from kvref.cache_hit_source import CacheHitSource
from kvref.config import OffloadingConfig
from kvref.request import (
    MAX_OFFLOAD_KEY_POSITION,
    Locality,
    Medium,
    OffloadKey,
    ReqContext,
    TierFilter,
    TierMatcher,
    check_key_collection,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from kvref.specs import BlockIDsLoadStoreSpec, GPULoadStoreSpec, LoadStoreSpec
from kvref.stats import (
    ConfigInfo,
    ConfigInfoMapping,
    OffloadingConnectorStats,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
    OffloadingMetricMetadata,
)
from kvref.transfer import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    CanonicalPageMapping,
    CopyRun,
    OffloadingWorker,
    TransferResult,
)

__all__ = [
    "OffloadKey",
    "make_offload_key",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "check_key_collection",
    "MAX_OFFLOAD_KEY_POSITION",
    "Medium",
    "Locality",
    "TierMatcher",
    "TierFilter",
    "ReqContext",
    "LookupResult",
    "OffloadPolicy",
    "RequestOffloadingContext",
    "ScheduleEndContext",
    "LoadStoreSpec",
    "PrepareStoreOutput",
    "OffloadingEvent",
    "OffloadingMetricMetadata",
    "OffloadingCounterMetadata",
    "OffloadingGaugeMetadata",
    "OffloadingHistogramMetadata",
    "OffloadingKVEventsConfig",
    "ConfigInfoMapping",
    "ConfigInfo",
    "CacheHitSource",
    "OffloadingConnectorStats",
    "OffloadingManager",
    "BlockIDsLoadStoreSpec",
    "GPULoadStoreSpec",
    "CanonicalKVCacheTensor",
    "CopyRun",
    "CanonicalPageMapping",
    "CanonicalKVCacheRef",
    "CanonicalKVCaches",
    "TransferResult",
    "OffloadingWorker",
    "OffloadingSpec",
]

class LookupResult(Enum):
    """What `OffloadingManager.lookup` says of one block."""

    MISS = auto()
    """Not offloaded (or not servable: the request recomputes it)."""
    HIT = auto()
    """Offloaded and readable now: `prepare_load` may pin it."""
    HIT_PENDING = auto()
    """Offloaded, not yet readable (its store or promotion is in flight): ask again later."""
    RETRY = auto()
    """Not known yet (an asynchronous lookup is pending, a tier is busy): ask again later."""


class OffloadPolicy(Enum):
    """Which chunks of a request the connector offers to `prepare_store`."""

    CHUNK_LEVEL = "chunk_level"
    """Only newly computed chunks; prefix hits were offloaded by an earlier request."""
    REQUEST_LEVEL = "request_level"
    """Every chunk of the request, prefix hits included (tiers that keep whole requests)."""


@dataclass
class RequestOffloadingContext:
    """A manager's answer to `on_new_request`."""

    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


class ScheduleEndContext(NamedTuple):
    """What one scheduler step did, passed to `on_schedule_end`.

    Attributes:
        new_req_ids: requests scheduled for the first time this step.
        preempted_req_ids: requests preempted this step.
    """

    new_req_ids: Collection[str]
    preempted_req_ids: Collection[str]


@dataclass
class PrepareStoreOutput:
    """What `prepare_store` decided.

    Attributes:
        keys_to_store: the keys the worker must write, in the order of `store_spec`'s blocks.
        store_spec: where to write them.
        evicted_keys: keys evicted to make room (already gone from the manager).
    """

    keys_to_store: list[OffloadKey]
    store_spec: LoadStoreSpec
    evicted_keys: list[OffloadKey]


@dataclass
class OffloadingEvent:
    """Chunks stored on, or removed from, a medium (for KV-aware routing).

    Attributes:
        keys: the chunks.
        medium: the medium that owns them.
        removed: True for a removal, False for a completed store.
        locality: where the storage is, if the tier says.
        ownership: the secondary tier that emitted the event; None for the primary.
        removal_expected: the removal was announced in advance.
        metadata_only: a failed allocation released the keys; no stored chunk was removed.
    """

    keys: list[OffloadKey]
    medium: Medium
    removed: bool
    locality: Locality | None = None
    ownership: str | None = None
    removal_expected: bool = False
    metadata_only: bool = False


@dataclass(frozen=True)
class OffloadingKVEventsConfig:
    """Whether offloading publishes KV events.

    Attributes:
        enable_kv_cache_events: the engine publishes KV events at all (otherwise
            `take_events` is never drained, and tiers should capture nothing).
        self_describing_kv_events: stored events carry what a consumer needs without the
            engine's configuration (only with `enable_kv_cache_events`).
    """

    enable_kv_cache_events: bool
    self_describing_kv_events: bool


class OffloadingManager(ABC):
    """Scheduler-side bookkeeping of offloaded KV chunks (see the module docstring).

    Abstract: `lookup`, `prepare_load`, `prepare_store`, `on_new_request`; every other method has
    a no-op default.
    """

    @property
    def lock(self) -> AbstractContextManager[Any]:
        """The context manager that grants exclusive access to this manager's state.

        Every caller of a manager method but `shutdown` holds it, across as many calls as its
        reasoning needs (a `lookup` HIT and the `prepare_load` that pins it). Managers never
        enter it themselves, and callers never re-enter it: a real lock need not be reentrant.

        Returns:
            A no-op context manager by default (a manager only ever entered from one thread).
        """
        return nullcontext()

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """Say whether one chunk is offloaded and ready to be read.

        Does not change recency (that is `touch`) and does not protect the chunk.

        Args:
            key: the chunk.
            req_context: the request asking.

        Returns:
            HIT, MISS, HIT_PENDING or RETRY (see `LookupResult`).
        """

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        """Return the tier that supplied a chunk `lookup` answered HIT for.

        Composing managers keep the origin across a promotion into their primary tier, so a disk
        hit is not counted as a host hit.

        Returns:
            EXTERNAL_UNSPECIFIED by default (an uninstrumented manager).
        """
        return CacheHitSource.EXTERNAL_UNSPECIFIED

    @abstractmethod
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        """Protect chunks from eviction while the worker reads them.

        Each call is matched by one `complete_load` of the same keys; loads stack.

        Args:
            keys: chunks `lookup` answered HIT for.
            req_context: the loading request.

        Returns:
            A spec whose blocks are co-indexed with `keys` in iteration order.
        """

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark chunks as recently used (an LRU's move to the most recent end).

        Separate from `prepare_load` so that chunks hit in the GPU prefix cache, which are not
        loaded, still count as used.

        Args:
            keys: the chunks, in request order.
            req_context: the request using them.
        """
        return None

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Undo the protection of a matching `prepare_load`.

        Args:
            keys: the keys given to `prepare_load`.
            req_context: the loading request.
        """
        return None

    @abstractmethod
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Reserve room for chunks the worker is about to write.

        The reserved chunks are protected from eviction until `complete_store`.

        Args:
            keys: candidate chunks; those already present are skipped.
            req_context: the storing request.

        Returns:
            Which chunks to write, where, and what was evicted to make room; None when they
            cannot be stored (nothing was changed).
        """

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Finish the writes of chunks prepared by `prepare_store`; they become loadable.

        Args:
            keys: chunks whose write finished.
            req_context: the storing request.
            success: False if the write failed: chunks not yet stored are dropped.
        """
        return None

    @abstractmethod
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Called once, when the scheduler first sees a request.

        Args:
            req_context: the new request.

        Returns:
            How the connector should offer this request's chunks to `prepare_store`.
        """

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Called once a request is done: no `prepare_*` call will name it again.

        Completions (`complete_store`, `complete_load`) of its transfers may still arrive, and
        nothing is implied about persistence. A manager that cascades to lower tiers delays
        their `on_request_finished` until no more work can be submitted to them for it.

        Args:
            req_context: the finished request.
        """
        return None

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Return the events collected since the last call, and forget them.

        A manager reports only storage it owns; a composing manager aggregates its children's
        events and never makes one up for them.

        Returns:
            The events, oldest first.
        """
        return ()

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """Called once at the end of each scheduler step, as the step's last manager call.

        Managers flush here the work they deferred during the step (batched promotions, say).

        Args:
            context: what the step scheduled.
        """
        return None

    def has_pending_work(self) -> bool:
        """Whether the engine must keep stepping for this manager.

        Returns:
            True while work is in flight: `on_schedule_end` keeps being called even when no
            request is scheduled. False by default.
        """
        return False

    def reset_cache(self) -> None:
        """Evict every tracked chunk and reset internal state (sleep, weight update)."""
        return None

    def on_reset_flushed(self) -> None:
        """Called once the workers have reported every job in flight at the last `reset_cache`:
        the chunks it freed are no longer written by them."""
        return None

    def get_stats(self) -> OffloadingConnectorStats | None:
        """Return the metric observations since the last call, or None if the manager keeps none."""
        return None

    def config_info(self) -> Sequence[ConfigInfoMapping]:
        """Return the info-metric labels, one mapping per series (read once; see `ConfigInfo`).

        Returns:
            One empty mapping by default.
        """
        return [{}]

    def shutdown(self) -> None:
        """Release resources; the manager is unusable afterwards.

        The one call made without holding `lock`: a manager with a thread of its own may need
        the lock to stop it.
        """
        return None


class OffloadingSpec(ABC):
    """One offloading configuration: builds the scheduler's manager and each worker's worker.

    Args:
        config: the normalized configuration.
    """

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        """Return the metrics this spec's managers emit, by name."""
        return {}

    @classmethod
    def config_info_keys(cls, extra_config: dict[str, Any]) -> tuple[str, ...]:
        """Return the info-metric label names its manager fills (see `ConfigInfo`)."""
        return ()

    def __init__(self, config: OffloadingConfig) -> None:
        self.config = config
        self.extra_config = config.extra_config
        self.replicated_layout: bool = False
        self.kv_events_config = OffloadingKVEventsConfig(
            enable_kv_cache_events=config.enable_kv_cache_events,
            self_describing_kv_events=bool(self.extra_config.get("self_describing_kv_events", False)),
        )
        # Only prompt blocks are offloaded by default: generated tokens are often dropped before
        # a conversation's next turn (reasoning models strip their thinking).
        self.offload_prompt_only: bool = bool(self.extra_config.get("offload_prompt_only", True))
        self.tokens_per_block = tuple(group.tokens_per_block for group in config.groups)
        self.tokens_per_hash = config.cache.tokens_per_hash
        self.blocks_per_chunk = config.cache.blocks_per_chunk

    @abstractmethod
    def get_manager(self) -> OffloadingManager:
        """Return the manager the scheduler-side connector tracks offloaded chunks with."""

    @abstractmethod
    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        """Return the worker that moves this spec's blocks over `kv_caches`."""
