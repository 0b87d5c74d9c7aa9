"""Back-pressure: skip cascades to a secondary tier that cannot keep up (vLLM 0.33:
`tiering/backpressure.py`).

A tier's `BackpressureDetector` watches its store jobs complete and says when the tier is under
pressure; its `BackpressurePolicy` decides which stores to drop meanwhile. The tiering manager
asks `should_store` before each cascade and reports each finished store with `update` or
`on_store_failed`. A dropped cascade loses nothing but a copy: the chunk stays in the primary.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any

from typing_extensions import override

__all__ = [
    "BackpressureDetector",
    "BackpressurePolicy",
    "DropAccountingPolicy",
    "DropStorePolicy",
    "EMABackpressureDetector",
    "ThrottledDropPolicy",
]


class BackpressurePolicy(ABC):
    """Decides which stores to drop when a detector signals pressure."""

    @abstractmethod
    def should_store(self, detector: BackpressureDetector) -> bool:
        """Whether to let the next store through."""

    @abstractmethod
    def on_store_skipped(self, num_blocks: int) -> None:
        """Count one dropped store of `num_blocks` chunks."""

    @abstractmethod
    def pop_stores_dropped(self) -> tuple[int, int]:
        """Return (stores dropped, chunks dropped) since the last call, and reset both."""

    @abstractmethod
    def reset(self) -> None:
        """Forget all state (after a cache reset)."""


class DropAccountingPolicy(BackpressurePolicy):
    """A policy base that counts the stores and chunks it drops."""

    def __init__(self) -> None:
        self._stores_dropped = 0
        self._blocks_dropped = 0

    @override
    def on_store_skipped(self, num_blocks: int) -> None:
        self._stores_dropped += 1
        self._blocks_dropped += num_blocks

    @override
    def pop_stores_dropped(self) -> tuple[int, int]:
        counts = (self._stores_dropped, self._blocks_dropped)
        self._stores_dropped = self._blocks_dropped = 0
        return counts

    @override
    def reset(self) -> None:
        self._stores_dropped = self._blocks_dropped = 0


class DropStorePolicy(DropAccountingPolicy):
    """Drop every store while the tier is under pressure."""

    @override
    def should_store(self, detector: BackpressureDetector) -> bool:
        return not detector.is_under_pressure()


class ThrottledDropPolicy(DropAccountingPolicy):
    """Drop stores in proportion to how far the latency is past the high water mark.

    drop_rate = min(1, ((ema - high) / high) / ramp_factor): with the default ramp factor of 2,
    from no drops at the high water mark to every store at three times it. The rate accumulates
    over decisions; each time the sum reaches one, a store is dropped. Moderate pressure thus
    keeps the tier populated, while severe pressure still protects the engine.

    Args:
        ramp_factor: how many high-water marks past the mark every store is dropped.
    """

    def __init__(self, ramp_factor: float = 2.0) -> None:
        super().__init__()
        self._drop_accumulator = 0.0
        self._ramp_factor = ramp_factor

    @override
    def should_store(self, detector: BackpressureDetector) -> bool:
        # The rate needs the EMA and its high water mark, which only the EMA detector has.
        if not isinstance(detector, EMABackpressureDetector):
            raise TypeError("ThrottledDropPolicy needs an EMABackpressureDetector")
        if not detector.is_under_pressure():
            return True
        high = detector.high_water_s
        if high <= 0:
            return False
        drop_rate = min(1.0, max(0.0, detector.store_latency_ema - high) / high / self._ramp_factor)
        if drop_rate <= 0:
            return True
        if drop_rate >= 1.0:
            return False
        self._drop_accumulator += drop_rate
        if self._drop_accumulator >= 1.0:
            self._drop_accumulator -= 1.0
            return False
        return True

    @override
    def reset(self) -> None:
        super().reset()
        self._drop_accumulator = 0.0


class BackpressureDetector(ABC):
    """Observes a tier's store completions and says whether it is under pressure.

    Args:
        policy: what to drop under pressure (default: `ThrottledDropPolicy`).
    """

    def __init__(self, policy: BackpressurePolicy | None = None) -> None:
        self._policy = policy or ThrottledDropPolicy()

    @property
    def policy(self) -> BackpressurePolicy:
        """The drop policy."""
        return self._policy

    @abstractmethod
    def on_store_completed(self, elapsed_s: float, num_bytes: int) -> None:
        """Observe a successful store of `num_bytes` that took `elapsed_s`."""

    def on_store_failed(self) -> None:
        """Observe a failed store (ignored by default; a detector may count it as pressure)."""
        return None

    @abstractmethod
    def is_under_pressure(self) -> bool:
        """Whether the tier is under pressure now."""

    @abstractmethod
    def reset(self) -> None:
        """Forget all state (after a cache reset)."""

    def update(self, submit_time: float, num_bytes: int) -> None:
        """Observe a successful store job submitted at `submit_time` (`time.monotonic()`)."""
        if num_bytes <= 0:
            return
        self.on_store_completed(time.monotonic() - submit_time, num_bytes)

    def should_store(self, num_blocks: int) -> bool:
        """Ask the policy whether to cascade a store of `num_blocks` chunks; count a drop."""
        if not self._policy.should_store(self):
            self._policy.on_store_skipped(num_blocks)
            return False
        return True

    @classmethod
    def default_config(cls, tier_type: str, *, locality: str | None = None) -> dict[str, Any] | None:
        """Return the constructor arguments to use for a tier of `tier_type`, or None."""
        return None

    @property
    def stats(self) -> dict[str, float]:
        """Figures to export as gauges (e.g. "store_latency_ema")."""
        return {}


class EMABackpressureDetector(BackpressureDetector):
    """Pressure from an exponential moving average of store latency per MiB.

    The EMA is seeded with the mean of the first `warmup_completions` stores (no pressure is
    signalled before), enters pressure above `high_water_s` per MiB and leaves it below
    `low_water_s`. While no store completes, it halves every `decay_half_life_s`, so a tier
    that stopped receiving stores can recover; after pressure clears, every other store is
    dropped for `cooldown_s`. `failure_threshold` consecutive failed stores (a full disk)
    count as pressure too. Defaults: local storage 10/2 ms per MiB, remote storage 50/10 ms.

    Raises:
        ValueError: `alpha` is not in (0, 1], `low_water_s` > `high_water_s`, or
            `failure_threshold` < 1.
    """

    _MIB = 1 << 20
    DEFAULT_ALPHA = 0.15
    DEFAULT_WARMUP_COMPLETIONS = 10
    DEFAULT_DECAY_HALF_LIFE_S = 2.0
    DEFAULT_COOLDOWN_S = 1.0
    DEFAULT_FAILURE_THRESHOLD = 3
    # Completions below the low water mark in a row after which stores skip the policy.
    _HEALTHY_THRESHOLD = 10
    # A failure-induced EMA: enough for ThrottledDropPolicy to drop every store until it decays.
    _FAILURE_EMA_FACTOR = 4.0
    LOCAL_HIGH_WATER_S = 0.010
    LOCAL_LOW_WATER_S = 0.002
    NETWORK_HIGH_WATER_S = 0.050
    NETWORK_LOW_WATER_S = 0.010
    _NETWORK_TIER_TYPES = frozenset({"obj"})
    _STORAGE_TIER_TYPES = frozenset({"fs", "obj"})

    @classmethod
    @override
    def default_config(cls, tier_type: str, *, locality: str | None = None) -> dict[str, Any]:
        remote = locality is not None and locality.upper() == "REMOTE"
        config: dict[str, Any]
        if remote or tier_type in cls._NETWORK_TIER_TYPES:
            config = {"high_water_s": cls.NETWORK_HIGH_WATER_S, "low_water_s": cls.NETWORK_LOW_WATER_S}
        else:
            config = {"high_water_s": cls.LOCAL_HIGH_WATER_S, "low_water_s": cls.LOCAL_LOW_WATER_S}
        if tier_type in cls._STORAGE_TIER_TYPES:
            config["failure_threshold"] = cls.DEFAULT_FAILURE_THRESHOLD
        return config

    def __init__(
        self,
        high_water_s: float,
        low_water_s: float,
        alpha: float = DEFAULT_ALPHA,
        warmup_completions: int = DEFAULT_WARMUP_COMPLETIONS,
        decay_half_life_s: float = DEFAULT_DECAY_HALF_LIFE_S,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        failure_threshold: int | None = None,
        policy: BackpressurePolicy | None = None,
    ) -> None:
        super().__init__(policy=policy)
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if low_water_s > high_water_s:
            raise ValueError(f"low_water_s ({low_water_s}) must be <= high_water_s ({high_water_s})")
        if failure_threshold is not None and failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        self._alpha = alpha
        self.high_water_s = high_water_s
        self._low = low_water_s
        self._warmup_completions = warmup_completions
        self._decay_half_life_s = decay_half_life_s
        self._cooldown_s = cooldown_s
        self._failure_threshold = failure_threshold
        self.reset()

    def _apply_idle_decay(self) -> None:
        now = time.monotonic()
        elapsed = now - self._last_update
        if elapsed <= 0 or self._decay_half_life_s <= 0:
            return
        self._ema *= 0.5 ** (elapsed / self._decay_half_life_s)
        self._last_update = now

    @override
    def on_store_completed(self, elapsed_s: float, num_bytes: int) -> None:
        now = time.monotonic()
        seconds_per_mib = elapsed_s / (num_bytes / self._MIB)
        self._consecutive_failures = 0
        self._completions += 1
        if self._completions <= self._warmup_completions:
            self._warmup_samples.append(seconds_per_mib)
            if self._completions == self._warmup_completions:
                self._ema = sum(self._warmup_samples) / len(self._warmup_samples)
                self._last_update = now
            return
        self._ema = self._alpha * seconds_per_mib + (1 - self._alpha) * self._ema
        self._last_update = now
        if self._ema > self.high_water_s:
            self._under_pressure = True
            self._pressure_cleared_at = 0.0
            self._healthy_streak = 0
        elif self._ema < self._low:
            if self._under_pressure:
                self._pressure_cleared_at = now
                self._cooldown_count = 0
            self._under_pressure = self._failure_tripped = False
            self._healthy_streak += 1
        else:
            self._healthy_streak = 0

    @override
    def on_store_failed(self) -> None:
        if self._failure_threshold is None:
            return
        self._consecutive_failures += 1
        self._healthy_streak = 0
        if self._consecutive_failures < self._failure_threshold:
            return
        self._ema = max(self._ema, self.high_water_s * self._FAILURE_EMA_FACTOR)
        self._last_update = time.monotonic()
        self._under_pressure = self._failure_tripped = True
        self._pressure_cleared_at = 0.0

    @override
    def is_under_pressure(self) -> bool:
        if self._under_pressure and (self._completions >= self._warmup_completions or self._failure_tripped):
            self._apply_idle_decay()
            if self._ema < self._low:
                self._under_pressure = self._failure_tripped = False
                self._pressure_cleared_at = time.monotonic()
                self._cooldown_count = 0
        return self._under_pressure

    def is_healthy(self) -> bool:
        """Consistently fast: stores then skip the policy altogether."""
        return not self._under_pressure and self._healthy_streak >= self._HEALTHY_THRESHOLD

    @override
    def should_store(self, num_blocks: int) -> bool:
        under_pressure = self.is_under_pressure()
        if self.is_healthy():
            return True
        cooling_down = 0 < self._pressure_cleared_at and time.monotonic() - self._pressure_cleared_at < self._cooldown_s
        if not under_pressure and cooling_down:
            self._cooldown_count += 1
            if self._cooldown_count % 2 == 0:
                self._policy.on_store_skipped(num_blocks)
                return False
        return super().should_store(num_blocks)

    @override
    def reset(self) -> None:
        self._ema = 0.0
        self._under_pressure = False
        self._completions = 0
        self._warmup_samples: list[float] = []
        self._last_update = 0.0
        self._healthy_streak = 0
        self._pressure_cleared_at = 0.0
        self._cooldown_count = 0
        self._consecutive_failures = 0
        self._failure_tripped = False
        self._policy.reset()

    @property
    def store_latency_ema(self) -> float:
        """The EMA, in seconds per MiB."""
        return self._ema

    @store_latency_ema.setter
    def store_latency_ema(self, value: float) -> None:
        self._ema = value

    @property
    @override
    def stats(self) -> dict[str, float]:
        return {"store_latency_ema": self._ema, "consecutive_store_failures": self._consecutive_failures}
