"""What kvref's own secondary tiers report besides their jobs: KV events and metrics.

Events (`TierEvents`): a tier emits them only when its `enable_kv_events` option and the
engine's global KV-events flag are both on (as vLLM's fs tier does), each naming the tier's
medium, its configured locality and, as `ownership`, its tier type.

Metrics (`TierCounters`, `KvrefTierMetrics`): what only the tier knows, in the tier's own
words. The tiering manager already measures bytes, times and failed jobs per tier; a tier adds
the chunks it wrote and loaded, the chunks it evicted to make room, the chunks a load found
missing or damaged, and how full it is (bounded tiers). Every series is labelled by the tier
type.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvref.base import (
    Locality,
    Medium,
    OffloadingConnectorStats,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
)

if TYPE_CHECKING:
    from kvref.base import OffloadingSpec

__all__ = ["KvrefTierMetrics", "TierCounters", "TierEvents", "tier_metric_definitions"]

logger = logging.getLogger(__name__)

_METRIC_LABELS = ("tier_type",)


class KvrefTierMetrics:
    """Names of the metrics kvref's tiers report through `get_stats`."""

    CHUNKS_STORED = "vllm:kv_offload_kvref_tier_chunks_stored"
    CHUNKS_LOADED = "vllm:kv_offload_kvref_tier_chunks_loaded"
    CHUNKS_EVICTED = "vllm:kv_offload_kvref_tier_chunks_evicted"
    CHUNKS_LOST = "vllm:kv_offload_kvref_tier_chunks_lost"
    USAGE_PERC = "vllm:kv_offload_kvref_tier_usage_perc"


_COUNTERS = {
    KvrefTierMetrics.CHUNKS_STORED: "Chunks a kvref tier wrote (chunks it already held are not written again).",
    KvrefTierMetrics.CHUNKS_LOADED: "Chunks a kvref tier loaded into the primary, those of failed jobs included.",
    KvrefTierMetrics.CHUNKS_EVICTED: "Chunks a kvref tier evicted to make room.",
    KvrefTierMetrics.CHUNKS_LOST: "Chunks a kvref tier's load found missing, damaged or unreadable.",
}


def tier_metric_definitions() -> dict[str, OffloadingMetricMetadata]:
    """The metrics of kvref's tiers, by name (what their `build_metric_definitions` return)."""
    metrics: dict[str, OffloadingMetricMetadata] = {
        name: OffloadingCounterMetadata(documentation=text, labelnames=_METRIC_LABELS) for name, text in _COUNTERS.items()
    }
    metrics[KvrefTierMetrics.USAGE_PERC] = OffloadingGaugeMetadata(
        documentation="Fraction of a bounded kvref tier's capacity in use.", labelnames=_METRIC_LABELS
    )
    return metrics


@dataclass
class TierCounters:
    """A tier's observations since its last `get_stats` (scheduler thread only)."""

    chunks_stored: int = 0
    chunks_loaded: int = 0
    chunks_evicted: int = 0
    chunks_lost: int = 0

    def take_stats(self, tier_type: str, usage: float | None) -> OffloadingConnectorStats:
        """Return the observations (and `usage`, if the tier is bounded) and start afresh."""
        stats = OffloadingConnectorStats()
        labels = (tier_type,)
        for name, value in (
            (KvrefTierMetrics.CHUNKS_STORED, self.chunks_stored),
            (KvrefTierMetrics.CHUNKS_LOADED, self.chunks_loaded),
            (KvrefTierMetrics.CHUNKS_EVICTED, self.chunks_evicted),
            (KvrefTierMetrics.CHUNKS_LOST, self.chunks_lost),
        ):
            if value:
                stats.increase_counter(name, value, labels)
        if usage is not None:
            stats.set_gauge(KvrefTierMetrics.USAGE_PERC, usage, labels)
        self.chunks_stored = self.chunks_loaded = self.chunks_evicted = self.chunks_lost = 0
        return stats


class TierEvents:
    """The KV events of one tier, buffered for `take_events`.

    Args:
        enable_kv_events: the tier's option.
        offloading_spec: the engine's spec (its global KV-events flag).
        medium: the tier's medium.
        locality: the tier's configured locality.
        tier_type: the tier's registered type (the events' `ownership`).
    """

    def __init__(
        self,
        enable_kv_events: bool,
        offloading_spec: OffloadingSpec,
        medium: Medium,
        locality: Locality | None,
        tier_type: str,
    ) -> None:
        self.enabled = enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events
        if enable_kv_events and not self.enabled:
            logger.warning(
                "enable_kv_events is set on secondary tier %r but KV cache events are disabled "
                "globally; the tier will not emit events",
                tier_type,
            )
        self._medium = medium
        self._locality = locality
        self._ownership = tier_type
        self._events: list[OffloadingEvent] = []

    def announce(self, keys: Collection[OffloadKey], *, removed: bool) -> None:
        """Buffer one event for `keys` (nothing when events are off or `keys` is empty)."""
        if self.enabled and keys:
            self._events.append(
                OffloadingEvent(
                    keys=list(keys),
                    medium=self._medium,
                    removed=removed,
                    locality=self._locality,
                    ownership=self._ownership,
                )
            )

    def take(self) -> Iterable[OffloadingEvent]:
        """Return the buffered events, oldest first, and forget them."""
        events, self._events = self._events, []
        return events
