"""What `get_stats` returns: metric observations since the previous call (part of `kvref.base`).

vLLM: `OffloadingConnectorStats` in `vllm/distributed/kv_transfer/kv_connector/v1/offloading/
metrics.py`. The payload is self-describing so that it survives the trip from the scheduler
process to the metrics front end without the metric definitions:

    data = {
        "types": {name: "counter" | "gauge" | "histogram", ...},
        "data":  {name: {labelvalues: value, ...}, ...},   # a histogram's value: its samples
        "info":  [{labelname: labelvalue, ...}, ...] | None,  # config_info(), sent once
    }

Counters add up, gauges keep the latest value, histograms collect samples; an unlabelled
metric's label values are `()`. Names are declared with their help text and labels by
`build_metric_definitions` (`kvref.base.OffloadingMetricMetadata`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, cast

__all__ = [
    "ConfigInfo",
    "ConfigInfoMapping",
    "OffloadingConnectorStats",
    "OffloadingCounterMetadata",
    "OffloadingGaugeMetadata",
    "OffloadingHistogramMetadata",
    "OffloadingMetricMetadata",
]

_TYPES = "types"
_DATA = "data"
_INFO = "info"
_COUNTER = "counter"
_GAUGE = "gauge"
_HISTOGRAM = "histogram"

LabelValues = tuple[str, ...]


@dataclass(frozen=True)
class OffloadingMetricMetadata:
    """A metric's declaration: its help text and label names."""

    documentation: str
    labelnames: tuple[str, ...] = ()


@dataclass(frozen=True)
class OffloadingCounterMetadata(OffloadingMetricMetadata):
    """A counter's declaration."""


@dataclass(frozen=True)
class OffloadingGaugeMetadata(OffloadingMetricMetadata):
    """A gauge's declaration.

    Attributes:
        multiprocess_mode: how values written by several front-end processes merge; each
            stats payload is a complete snapshot, so the most recent one is right.
    """

    multiprocess_mode: str = "mostrecent"


@dataclass(frozen=True)
class OffloadingHistogramMetadata(OffloadingMetricMetadata):
    """A histogram's declaration, with its bucket bounds (None: the exporter's default)."""

    buckets: tuple[float, ...] | None = None


ConfigInfoMapping = Mapping[str, str | int | float | bool]
"""The labels of one info-metric series: label name -> value."""


@dataclass(frozen=True)
class ConfigInfo:
    """Static facts one component publishes on the `kv_offload_config_info` metric.

    Each field is one label. A spec declares the names (`config_info_keys`), the manager fills
    the values (`as_config_info`); the values never change while the process runs.
    """

    @classmethod
    def config_info_keys(cls) -> tuple[str, ...]:
        """Return one label name per field, in field order."""
        return tuple(info.name for info in fields(cls))

    def as_config_info(self) -> ConfigInfoMapping:
        """Return the label values; a None value becomes "None", not empty."""
        values: list[Any] = [getattr(self, info.name) for info in fields(self)]
        return {key: "None" if value is None else value for key, value in zip(self.config_info_keys(), values)}


@dataclass
class OffloadingConnectorStats:
    """Metric observations of one interval, keyed by flat metric name (see the module docstring).

    Attributes:
        data: the serializable payload.
    """

    data: dict[str, Any] = field(default_factory=dict[str, Any])

    def __post_init__(self) -> None:
        if _DATA not in self.data:
            self.reset()

    def reset(self) -> None:
        """Forget every observation and the config info."""
        self.data = {_TYPES: {}, _DATA: {}, _INFO: None}

    @property
    def _types(self) -> dict[str, str]:
        return cast("dict[str, str]", self.data[_TYPES])

    @property
    def _values(self) -> dict[str, dict[LabelValues, Any]]:
        return cast("dict[str, dict[LabelValues, Any]]", self.data[_DATA])

    def metric_sections(self) -> tuple[dict[str, str], dict[str, dict[LabelValues, Any]]]:
        """Return the type section and the value section (mutable references), in that order."""
        return (self._types, self._values)

    def to_dict(self) -> dict[str, Any]:
        """Return the serializable payload."""
        return self.data

    def aggregate(self, other: OffloadingConnectorStats) -> OffloadingConnectorStats:
        """Merge `other`'s observations into these (counters add, gauges and info take
        `other`'s, histogram samples are appended) and return self.

        Raises:
            ValueError: a metric of `other` has no or an unknown type.
        """
        if other.is_empty():
            return self
        other_info = other.data.get(_INFO)
        if other_info is not None:
            # Sent once: a later payload without info must not clear it.
            self.data[_INFO] = [dict(series) for series in cast("list[dict[str, Any]]", other_info)]
        for name, other_values in other._values.items():
            kind = other._types.get(name)
            if kind not in (_COUNTER, _GAUGE, _HISTOGRAM):
                raise ValueError(f"offloading stats: metric {name!r} has type {kind!r}")
            self._types.setdefault(name, kind)
            values = self._values.setdefault(name, {})
            for labels, value in other_values.items():
                if kind == _HISTOGRAM:
                    values.setdefault(labels, []).extend(value)
                elif kind == _COUNTER:
                    values[labels] = values.get(labels, 0) + value
                else:
                    values[labels] = value
        return self

    def reduce(self) -> dict[str, int | float]:
        """Summarise the interval for a log line: counters and gauges as they are, histograms
        as `<name>_count` and `<name>_sum`; a labelled metric's name is `<name>:<labelvalues>`."""
        summary: dict[str, int | float] = {}
        for name, values in self._values.items():
            kind = self._types.get(name)
            for labels, value in values.items():
                key = f"{name}:{labels}" if labels else name
                if kind == _HISTOGRAM:
                    samples = cast("list[int | float]", value)
                    summary[f"{key}_count"] = len(samples)
                    summary[f"{key}_sum"] = sum(samples)
                else:
                    summary[key] = cast("int | float", value)
        return summary

    def is_empty(self) -> bool:
        """Whether there is nothing to send: no observation and no config info."""
        return not self.data.get(_DATA) and self.data.get(_INFO) is None

    def increase_counter(
        self, counter_name: str, counter_increase_value: int | float = 1, labelvalues: LabelValues = ()
    ) -> None:
        """Add `counter_increase_value` to the counter `counter_name`."""
        self._types.setdefault(counter_name, _COUNTER)
        values = self._values.setdefault(counter_name, {})
        values[labelvalues] = values.get(labelvalues, 0) + counter_increase_value

    def set_gauge(self, gauge_name: str, gauge_value: int | float, labelvalues: LabelValues = ()) -> None:
        """Set the gauge `gauge_name` to `gauge_value`."""
        self._types.setdefault(gauge_name, _GAUGE)
        self._values.setdefault(gauge_name, {})[labelvalues] = gauge_value

    def observe_histogram(
        self, histogram_name: str, histogram_value: int | float, labelvalues: LabelValues = ()
    ) -> None:
        """Add one sample to the histogram `histogram_name`."""
        self._types.setdefault(histogram_name, _HISTOGRAM)
        self._values.setdefault(histogram_name, {}).setdefault(labelvalues, []).append(histogram_value)

    def set_info(self, info: Sequence[ConfigInfoMapping]) -> None:
        """Put the static config facts on the payload: one mapping per series, as
        `OffloadingManager.config_info()` returns them."""
        self.data[_INFO] = [dict(series) for series in info]
