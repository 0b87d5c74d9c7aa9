"""Cache policies by name (vLLM: `cpu/policies/factory.py`).

The built-in names are "lru" and "arc". Out-of-tree policies register a `CachePolicy` subclass
under a new name with `register_cache_policy`. The registry behaves like the tier registry
(`kvref.tiering.factory`): `register_X(name, factory, *, replace=False)`, `registered_X()`
returning sorted names, and unknown names failing with a ValueError that lists the registered ones.
"""

from __future__ import annotations

from typing import TypeAlias, cast

from kvref.cpu.policies.arc import ARCCachePolicy
from kvref.cpu.policies.base import CachePolicy
from kvref.cpu.policies.lru import LRUCachePolicy

__all__ = [
    "CachePolicyName",
    "registered_cache_policies",
    "get_cache_policy_class",
    "create_cache_policy",
    "register_cache_policy",
]

CachePolicyName: TypeAlias = str
"""A name registered with `register_cache_policy` (a str, not a Literal, so that registered
policies type-check too; names are validated against the registry when used)."""

_POLICIES: dict[str, type[CachePolicy]] = {}


def registered_cache_policies() -> list[str]:
    """Return the registered policy names, sorted."""
    return sorted(_POLICIES)


def get_cache_policy_class(cache_policy: str) -> type[CachePolicy]:
    """Return the policy class registered as `cache_policy`.

    Raises:
        ValueError: no policy has that name (the message lists the registered names).
    """
    try:
        return _POLICIES[cache_policy]
    except (KeyError, TypeError):
        raise ValueError(
            f"cache_policy {cache_policy!r} is not registered; registered cache policies: "
            f"{', '.join(registered_cache_policies())}"
        ) from None


def create_cache_policy(cache_policy: str, cache_capacity: int) -> CachePolicy:
    """Build an empty policy of the registered name for `cache_capacity` blocks."""
    return get_cache_policy_class(cache_policy)(cache_capacity)


def register_cache_policy(
    name: str, policy_class: type[CachePolicy], *, replace: bool = False
) -> None:
    """Make `policy_class` available as `name`.

    Args:
        name: the name managers are built with (`cache_policy=`).
        policy_class: a `CachePolicy` subclass, called as `policy_class(cache_capacity)`.
        replace: allow replacing an existing registration.

    Raises:
        TypeError: `name` is not a str, or `policy_class` is not a `CachePolicy` subclass.
        ValueError: `name` is empty, or already registered and `replace` is False.
    """
    # Callers without a type checker pass anything: check what arrives, not what is declared.
    given_name = cast(object, name)
    given_class = cast(object, policy_class)
    if not isinstance(given_name, str):
        raise TypeError(f"name must be a str, got {given_name!r}")
    if not isinstance(given_class, type) or not issubclass(given_class, CachePolicy):
        raise TypeError(f"policy_class must be a CachePolicy subclass, got {given_class!r}")
    if not name:
        raise ValueError("name must be a non-empty str")
    if name in _POLICIES and not replace:
        raise ValueError(
            f"cache policy {name!r} is already registered; pass replace=True to replace it"
        )
    _POLICIES[name] = policy_class


register_cache_policy("lru", LRUCachePolicy)
register_cache_policy("arc", ARCCachePolicy)
