"""Build secondary tiers from configuration mappings, by registered type name.

    create_secondary_tier({"type": "fs", "root_dir": "/mnt/nvme/kv"}, primary_kv_view)

`type` selects a factory registered with `register_tier`; every other entry is passed to it as
a keyword argument. Built-in types: "memory" (`InMemorySecondaryTier`), "fs"
(`FileSystemSecondaryTier`) and "redis" (`RedisSecondaryTier`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, cast

from kvref.tiering.base import SecondaryTierManager
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.memory import InMemorySecondaryTier
from kvref.tiering.redis import RedisSecondaryTier

__all__ = ["TierFactory", "register_tier", "registered_tier_types", "create_secondary_tier"]

TierFactory = Callable[..., SecondaryTierManager]
"""Called as `factory(primary_kv_view, **options)`; a tier class is a factory."""

_registry: dict[str, TierFactory] = {}


def register_tier(tier_type: str, factory: TierFactory, *, replace: bool = False) -> None:
    """Make `tier_type` available to `create_secondary_tier`.

    Args:
        tier_type: the name configurations use in their "type" entry.
        factory: builds the tier from the primary's memoryview and the remaining options (a
            `SecondaryTierManager` subclass or any callable returning one).
        replace: allow replacing an existing registration.

    Raises:
        TypeError: `tier_type` is not a str, or `factory` is not callable, or is a class that
            is not a `SecondaryTierManager` subclass.
        ValueError: `tier_type` is empty, or already registered and `replace` is False.
    """
    # Callers without a type checker pass anything: check what arrives, not what is declared.
    given_name = cast(object, tier_type)
    given_factory = cast(object, factory)
    if not isinstance(given_name, str):
        raise TypeError(f"tier_type must be a str, got {given_name!r}")
    if not callable(given_factory) or (
        isinstance(given_factory, type) and not issubclass(given_factory, SecondaryTierManager)
    ):
        raise TypeError(
            "factory must be a SecondaryTierManager subclass or a callable returning one, "
            f"got {given_factory!r}"
        )
    if not tier_type:
        raise ValueError("tier_type must be a non-empty str")
    if tier_type in _registry and not replace:
        raise ValueError(
            f"tier type {tier_type!r} is already registered; pass replace=True to replace it"
        )
    _registry[tier_type] = factory


def registered_tier_types() -> list[str]:
    """Return the registered tier types, sorted."""
    return sorted(_registry)


def create_secondary_tier(
    config: Mapping[str, Any], primary_kv_view: memoryview[Any], **overrides: Any
) -> SecondaryTierManager:
    """Build the secondary tier `config` describes.

    Args:
        config: a "type" entry naming a registered tier, plus that tier's options.
        primary_kv_view: the primary tier's `(num_blocks, block_bytes)` memoryview.
        overrides: options set by the caller rather than the user (e.g. `enable_events`);
            they win over `config`.

    Returns:
        The tier.

    Raises:
        ValueError: "type" is missing or not registered (the message lists the registered
            types), or the options do not match the tier's parameters.
    """
    options = dict(config)
    tier_type = options.pop("type", None)
    if not isinstance(tier_type, str) or tier_type not in _registry:
        what = "is missing" if tier_type is None else f"is {tier_type!r}, which is not registered"
        raise ValueError(
            f"secondary tier config 'type' {what}; registered types: "
            f"{', '.join(registered_tier_types())}"
        )
    options.update(overrides)
    factory = _registry[tier_type]
    try:
        inspect.signature(factory).bind(primary_kv_view, **options)
    except TypeError as exc:
        raise ValueError(f"invalid options for secondary tier type {tier_type!r}: {exc}") from exc
    return factory(primary_kv_view, **options)


register_tier("memory", InMemorySecondaryTier)
register_tier("fs", FileSystemSecondaryTier)
register_tier("redis", RedisSecondaryTier)
