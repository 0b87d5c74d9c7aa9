"""Cache policies by name (vLLM: `cpu/policies/factory.py`).

The built-in names are "lru" and "arc". Out-of-tree policies register a `CachePolicy` subclass
under a new name with `register_cache_policy`; the typed manager constructor only admits the
built-in names, so a registered policy is reached through `create_cache_policy` or a subclass.
"""

from __future__ import annotations

from typing import Literal, cast

from kvref.cpu.policies.arc import ARCCachePolicy
from kvref.cpu.policies.base import CachePolicy
from kvref.cpu.policies.lru import LRUCachePolicy

__all__ = [
    "CachePolicyName",
    "cache_policy_names",
    "get_cache_policy_class",
    "create_cache_policy",
    "register_cache_policy",
]

CachePolicyName = Literal["lru", "arc"]
"""The names of the built-in policies."""

_POLICIES: dict[str, type[CachePolicy]] = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}


def cache_policy_names() -> tuple[str, ...]:
    """Return the registered policy names, built-in ones first."""
    return tuple(_POLICIES)


def get_cache_policy_class(cache_policy: str) -> type[CachePolicy]:
    """Return the policy class registered as `cache_policy`.

    Raises:
        ValueError: no policy has that name (the message lists the names that exist).
    """
    try:
        return _POLICIES[cache_policy]
    except KeyError:
        allowed = ", ".join(repr(name) for name in _POLICIES)
        raise ValueError(f"cache_policy must be one of {allowed}, got {cache_policy!r}") from None


def create_cache_policy(cache_policy: str, cache_capacity: int) -> CachePolicy:
    """Build an empty policy of the registered name for `cache_capacity` blocks."""
    return get_cache_policy_class(cache_policy)(cache_capacity)


def register_cache_policy(name: str, policy_class: type[CachePolicy]) -> None:
    """Make `policy_class` available as `name`.

    Raises:
        TypeError: `policy_class` is not a `CachePolicy` subclass, or `name` is not a str.
        ValueError: `name` is empty or already registered (names are never silently replaced).
    """
    # Callers without a type checker pass anything: check what arrives, not what is declared.
    given_class = cast(object, policy_class)
    given_name = cast(object, name)
    if not isinstance(given_class, type) or not issubclass(given_class, CachePolicy):
        raise TypeError(f"policy_class must be a CachePolicy subclass, got {policy_class!r}")
    if not isinstance(given_name, str):
        raise TypeError(f"name must be a str, got {name!r}")
    if not name:
        raise ValueError("name must be a non-empty str")
    if name in _POLICIES:
        raise ValueError(f"name {name!r} is already registered to {_POLICIES[name].__name__}")
    _POLICIES[name] = policy_class
