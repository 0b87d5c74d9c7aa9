"""Cache policies of the CPU tier (LRU, ARC) behind one `CachePolicy` ABC, registered by name."""

from kvref.cpu.policies.arc import ARCCachePolicy
from kvref.cpu.policies.base import BlockStatus, CachePolicy
from kvref.cpu.policies.factory import (
    CachePolicyName,
    create_cache_policy,
    get_cache_policy_class,
    register_cache_policy,
    registered_cache_policies,
)
from kvref.cpu.policies.lru import LRUCachePolicy

__all__ = [
    "ARCCachePolicy",
    "BlockStatus",
    "CachePolicy",
    "CachePolicyName",
    "LRUCachePolicy",
    "create_cache_policy",
    "get_cache_policy_class",
    "register_cache_policy",
    "registered_cache_policies",
]
