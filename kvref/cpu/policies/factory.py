"""Cache policies by name (vLLM 0.33: `cpu/policies/factory.py`).

The built-in names are "lru" and "arc". An out-of-tree policy either registers a short name up
front (`register_cache_policy`) or needs no registration at all: the manager is given the
class name and the module to import it from (`cache_policy_module_path`), so a configuration
can name it without a fork of kvref.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

from kvref.cpu.policies.base import CachePolicy

__all__ = ["CachePolicyFactory"]

logger = logging.getLogger(__name__)


class CachePolicyFactory:
    """Registry of `CachePolicy` classes, resolved by name and imported on first use."""

    _registry: dict[str, Callable[[], type[CachePolicy]]] = {}

    @classmethod
    def register_cache_policy(cls, name: str, module_path: str, class_name: str) -> None:
        """Register the policy class `class_name` of `module_path` as `name`, imported lazily.

        Raises:
            ValueError: `name` is already registered.
        """
        if name in cls._registry:
            raise ValueError(f"Cache policy '{name}' is already registered.")

        def loader() -> type[CachePolicy]:
            return _policy_class(module_path, class_name)

        cls._registry[name] = loader

    @classmethod
    def get_cache_policy_cls(cls, name: str, module_path: str | None = None) -> type[CachePolicy]:
        """Return the policy class registered as `name`, or else the class `name` of
        `module_path`.

        Raises:
            ValueError: `name` is not registered and no `module_path` is given.
            ImportError: `module_path` does not import.
            TypeError: what `module_path` holds under `name` is not a `CachePolicy` subclass.
        """
        if name in cls._registry:
            return cls._registry[name]()
        if module_path is None:
            raise ValueError(
                f"Unknown cache policy: {name!r}. Supported: {list(cls._registry)}. "
                "For an out-of-tree policy, also set cache_policy_module_path."
            )
        logger.info("Loading out-of-tree cache policy %r from %r.", name, module_path)
        return _policy_class(module_path, name)


def _policy_class(module_path: str, class_name: str) -> type[CachePolicy]:
    # Checked rather than asserted (vLLM asserts): a configuration names it, and a wrong name
    # should say which class it found.
    found: object = getattr(importlib.import_module(module_path), class_name)
    if not isinstance(found, type) or not issubclass(found, CachePolicy):
        raise TypeError(f"{module_path}.{class_name} is not a CachePolicy subclass: {found!r}")
    return found


CachePolicyFactory.register_cache_policy("lru", "kvref.cpu.policies.lru", "LRUCachePolicy")
CachePolicyFactory.register_cache_policy("arc", "kvref.cpu.policies.arc", "ARCCachePolicy")
