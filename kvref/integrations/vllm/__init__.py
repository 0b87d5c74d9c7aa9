"""kvref's secondary tiers inside vLLM 0.33's tiering manager, through vLLM's own plug-in point.

vLLM 0.33 builds out-of-tree secondary tiers by module path (`SecondaryTierFactory`), so these
need no fork and patch nothing of vLLM's:

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
      "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 17179869184,
        "secondary_tiers": [{"type": "RedisTier", "module_path": "kvref.integrations.vllm",
                             "url": "redis://cache.internal:6379/0"}]}}'

`FileSystemTier` is kvref's `FileSystemSecondaryTier` (a checksummed file per chunk under
`root_dir/<run identity>`, shared by every engine on it, bounded across it) and `RedisTier` is
`RedisSecondaryTier` (engines on many machines share chunks through one Redis server or
cluster). kvref's tiers implement vLLM 0.33's secondary-tier contract in kvref's own types, so
each is vLLM's through `VllmTier`, which translates types and nothing else: the options are the
kvref tier's (docs/LIBRARY.md), vLLM's common `locality`, `enable_kv_events` and `backpressure`
included.
"""

from __future__ import annotations

try:
    import vllm.v1.kv_offload.tiering.base as _tiering_base
except ImportError as _exc:  # vLLM missing, too old or too new, or one of its dependencies broken
    _what = "vLLM is not installed" if getattr(_exc, "name", None) == "vllm" else f"vLLM's tiering API did not import ({_exc})"
    raise ImportError(f"kvref.integrations.vllm needs vLLM 0.33 ({_what}): pip install 'kvref[vllm]'") from _exc
del _tiering_base

from kvref.integrations.vllm._adapter import FileSystemTier, RedisTier, VllmTier

__all__ = ["FileSystemTier", "RedisTier", "VllmTier"]
