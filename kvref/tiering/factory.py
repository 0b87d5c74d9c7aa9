"""`SecondaryTierFactory`: secondary tiers built from configuration dicts, by type (vLLM 0.33:
`tiering/factory.py`); `create_tiering_manager` builds a whole tiering manager from them.

    SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root_dir": "/mnt/nvme/kv"}, primary_kv_view, offloading_spec)

"type" names a registered tier ("memory", "fs" and "redis" are kvref's own), or the class name
of an out-of-tree tier found in the module "module_path" names: no registration needed. An
optional "backpressure" dict builds the tier's `BackpressureDetector` ("backpressure_cls", an
optional "policy_cls", both short names in `kvref.tiering.backpressure` or dotted paths, and the
detector's options). Every other entry is one of the tier's keyword options.

kvref is stricter than vLLM about mistakes in a configuration: each is a `ValueError` naming the
entry (vLLM lets an unknown option through as a `TypeError` from the tier's constructor, and
checks an out-of-tree class with an assertion).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from kvref.tiering.backpressure import BackpressureDetector
from kvref.tiering.base import SecondaryTierManager
from kvref.tiering.manager import TieringOffloadingManager
from kvref.tiering.poll_thread import DEFAULT_TIER_POLL_INTERVAL_S
from kvref.tiering.primary import CPUPrimaryTierOffloadingManager

if TYPE_CHECKING:
    from kvref.base import OffloadingSpec

__all__ = ["SecondaryTierFactory", "build_tier", "create_tiering_manager"]

logger = logging.getLogger(__name__)

_DEFAULT_BACKPRESSURE_MODULE = "kvref.tiering.backpressure"


def _import_class(name: str, entry: str) -> type:
    """Import `name`: a dotted path, or a short name in `kvref.tiering.backpressure`.

    Raises:
        ValueError: it does not name an importable class (the message names `entry`).
    """
    module_path, _, class_name = name.rpartition(".")
    try:
        found: object = getattr(importlib.import_module(module_path or _DEFAULT_BACKPRESSURE_MODULE), class_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{entry}: {name!r} is not an importable class ({error})") from None
    if not isinstance(found, type):
        raise ValueError(f"{entry}: {name!r} is not a class")
    return found


def build_tier(
    tier_cls: type[SecondaryTierManager],
    offloading_spec: OffloadingSpec,
    primary_kv_view: memoryview,
    tier_type: str,
    backpressure_detector: BackpressureDetector | None,
    options: dict[str, Any],
) -> SecondaryTierManager:
    """Construct `tier_cls` with its four common arguments and its keyword `options`.

    Raises:
        ValueError: `options` has an entry the tier does not take, or lacks one it needs.
    """
    common = {
        "offloading_spec": offloading_spec,
        "primary_kv_view": primary_kv_view,
        "tier_type": tier_type,
        "backpressure_detector": backpressure_detector,
    }
    try:
        inspect.signature(tier_cls).bind(**common, **options)
    except TypeError as error:
        raise ValueError(f"secondary tier {tier_type!r}: invalid options: {error}") from None
    return tier_cls(**common, **options)


class SecondaryTierFactory:
    """The registry of secondary tier classes, resolved by type (see the module docstring)."""

    _registry: ClassVar[dict[str, Callable[[], type[SecondaryTierManager]]]] = {}

    @classmethod
    def register_tier(cls, tier_type: str, module_path: str, class_name: str) -> None:
        """Make `tier_type` name the class `class_name` of `module_path`, imported on first use.

        Raises:
            ValueError: `tier_type` is already registered.
        """
        if tier_type in cls._registry:
            raise ValueError(f"Tier '{tier_type}' is already registered.")

        def loader() -> type[SecondaryTierManager]:
            return _tier_class(getattr(importlib.import_module(module_path), class_name), "type")

        cls._registry[tier_type] = loader

    @classmethod
    def get_tier_class(cls, tier_config: dict[str, Any]) -> type[SecondaryTierManager]:
        """Return the class of the tier `tier_config` describes.

        Args:
            tier_config: "type", a registered type or the class name of an out-of-tree tier,
                then found in the module named by "module_path".

        Raises:
            ValueError: "type" is missing, neither registered nor found through "module_path",
                or not a `SecondaryTierManager` subclass.
        """
        tier_type = tier_config.get("type")
        if not tier_type or not isinstance(tier_type, str):
            raise ValueError(f"Secondary tier configuration must include 'type' (a string), got {tier_type!r}")
        if tier_type in cls._registry:
            return cls._registry[tier_type]()
        module_path = tier_config.get("module_path")
        if module_path is None:
            raise ValueError(
                f"Unknown secondary tier type: {tier_type!r}. Supported types: {sorted(cls._registry)}. "
                "For an out-of-tree tier, also set 'module_path'."
            )
        try:
            found: object = getattr(importlib.import_module(module_path), tier_type)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"type: {tier_type!r} is not a class of module_path {module_path!r} ({error})") from None
        return _tier_class(found, "type")

    @classmethod
    def create_secondary_tier(
        cls,
        tier_config: dict[str, Any],
        primary_kv_view: memoryview,
        offloading_spec: OffloadingSpec,
    ) -> SecondaryTierManager:
        """Build the tier `tier_config` describes over the primary's memory.

        Raises:
            ValueError: the configuration is invalid (the message names the entry).
            OSError: the tier's storage is unusable.
        """
        tier_cls = cls.get_tier_class(tier_config)
        options = dict(tier_config)
        tier_type: str = options.pop("type")
        options.pop("module_path", None)
        bp_config = options.pop("backpressure", None)
        detector = None if bp_config is None else _backpressure_detector(bp_config, tier_type, options.get("locality"))
        return build_tier(tier_cls, offloading_spec, primary_kv_view, tier_type, detector, options)


def _tier_class(found: object, entry: str) -> type[SecondaryTierManager]:
    if not isinstance(found, type) or not issubclass(found, SecondaryTierManager):
        raise ValueError(f"{entry}: {found!r} is not a SecondaryTierManager subclass")
    return found


def _backpressure_detector(bp_config: object, tier_type: str, locality: object) -> BackpressureDetector:
    if not isinstance(bp_config, dict):
        raise ValueError(f"backpressure must be a dict, got {bp_config!r}")
    options: dict[str, Any] = dict(bp_config)  # pyright: ignore[reportUnknownArgumentType]
    detector_name = options.pop("backpressure_cls", None)
    if not isinstance(detector_name, str):
        raise ValueError("backpressure config must include 'backpressure_cls' (e.g. 'EMABackpressureDetector')")
    policy_name = options.pop("policy_cls", None)
    policy = None if policy_name is None else _import_class(str(policy_name), "backpressure.policy_cls")()
    detector_cls = _import_class(detector_name, "backpressure.backpressure_cls")
    if not issubclass(detector_cls, BackpressureDetector):
        raise ValueError(f"backpressure.backpressure_cls: {detector_name!r} is not a BackpressureDetector")
    defaults = detector_cls.default_config(tier_type, locality=locality if isinstance(locality, str) else None)
    for name, value in (defaults or {}).items():
        options.setdefault(name, value)
    try:
        return detector_cls(policy=policy, **options)
    except TypeError as error:
        raise ValueError(f"backpressure: invalid options: {error}") from None


SecondaryTierFactory.register_tier("memory", "kvref.tiering.memory", "InMemorySecondaryTier")
SecondaryTierFactory.register_tier("fs", "kvref.tiering.fs", "FileSystemSecondaryTier")
SecondaryTierFactory.register_tier("redis", "kvref.tiering.redis", "RedisSecondaryTier")


def create_tiering_manager(
    primary_tier: CPUPrimaryTierOffloadingManager,
    tier_configs: Sequence[dict[str, Any]],
    offloading_spec: OffloadingSpec,
    tier_poll_interval_s: float = DEFAULT_TIER_POLL_INTERVAL_S,
) -> TieringOffloadingManager:
    """Build each configured tier over the primary's memory, and the tiering manager over all
    (what vLLM's `TieringOffloadingSpec.get_manager` does once it has the primary).

    Args:
        primary_tier: the CPU tier; the manager owns it from now on.
        tier_configs: one dict per secondary tier, in lookup order (`secondary_tiers`).
        offloading_spec: the engine's spec, handed to every tier.
        tier_poll_interval_s: as `TieringOffloadingManager`.

    Raises:
        ValueError: `tier_configs` is not a list of dicts, or a config is invalid. The tiers
            built so far and the primary are shut down first, as on any other error.
    """
    tiers: list[SecondaryTierManager] = []
    try:
        if not isinstance(tier_configs, list | tuple) or not all(isinstance(c, dict) for c in tier_configs):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"secondary_tiers must be a list of tier configurations (dicts), got {tier_configs!r}")
        primary_kv_view = primary_tier.get_kv_memoryview()
        for tier_config in tier_configs:
            tiers.append(SecondaryTierFactory.create_secondary_tier(tier_config, primary_kv_view, offloading_spec))
        return TieringOffloadingManager(primary_tier, tiers, tier_poll_interval_s)
    except BaseException:
        for tier in reversed(tiers):
            try:
                tier.shutdown()
            except Exception:
                logger.exception("Failed to shut down secondary tier %r during initialization cleanup", tier.tier_type)
        primary_tier.shutdown()
        raise
