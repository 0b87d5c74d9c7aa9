"""kvref's secondary tiers inside vLLM 0.33's tiering manager, through vLLM's own plug-in point.

vLLM 0.33 builds out-of-tree secondary tiers by module path (`SecondaryTierFactory`), so these
need no fork and patch nothing of vLLM's:

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
      "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 17179869184,
        "secondary_tiers": [{"type": "RedisTier", "module_path": "kvref.integrations.vllm",
                             "url": "redis://cache.internal:6379/0"}]}}'

`RedisTier` (kvref's `RedisSecondaryTier`: engines on many machines share blocks through one
Redis server or cluster) and `FileSystemTier` (kvref's `FileSystemSecondaryTier`: a checksummed
file per block under `root_dir`, shared by every engine on it, bounded across it) are `SecondaryTierManager`s of vLLM's. Each translates vLLM's
calls to its kvref tier, which does the work (I/O threads, value format, checksums, routing,
fault handling): jobs keep their ids, `chunk_ids` become block ids, results keep vLLM's partial
success (`successful_keys`), and the tier's removal events come out as vLLM's. Besides the
translation, an adapter owns only what vLLM's contract asks of a tier and kvref's tiers leave to
kvref's tiering manager:

* lookups: vLLM's own `AsyncLookupManager` answers RETRY until the existence check it sends at
  `on_schedule_end` is answered (on its thread, through the kvref tier's blocking `contains`),
  then the same answer for the key for the rest of the request; a failed load marks its lost
  blocks a miss;
* stored events: one per successful store job, with vLLM's medium and the configured locality,
  only when the tier's `enable_kv_events` and vLLM's global KV-events flag are both on;
* guards: a job is reported to vLLM exactly once and only if it was submitted (vLLM's manager
  asserts otherwise, which would stop its scheduler), and a tier that raises while submitting
  reports a failed job instead;
* statistics for `get_stats`, declared by `build_metric_definitions`.

Both also take vLLM's common tier keys as its own fs tier does: `locality` ("LOCAL" or
"REMOTE"), `enable_kv_events`, and `backpressure` (vLLM's factory builds the detector and hands it
to the base class, where vLLM's manager applies it).
"""

from __future__ import annotations

_EXTRA_HINT = "pip install 'kvref[vllm]'"
try:
    import vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics as _metrics
    import vllm.v1.kv_offload.file_mapper as _file_mapper
    import vllm.v1.kv_offload.tiering.async_lookup as _async_lookup
    import vllm.v1.kv_offload.tiering.base as _tiering_base
except ImportError as _exc:  # vLLM missing, too old or too new, or one of its dependencies broken
    _missing = getattr(_exc, "name", None) or ""
    _what = "vLLM is not installed" if _missing == "vllm" else f"vLLM's tiering API did not import ({_exc})"
    raise ImportError(f"kvref.integrations.vllm needs vLLM 0.33 ({_what}): {_EXTRA_HINT}") from _exc
del _metrics, _file_mapper, _async_lookup, _tiering_base

from kvref.integrations.vllm._adapter import KvrefSecondaryTier, KvrefTierMetrics
from kvref.integrations.vllm.tiers import FileSystemTier, FileSystemTierInfo, RedisTier, RedisTierInfo

__all__ = [
    "RedisTier",
    "FileSystemTier",
    "RedisTierInfo",
    "FileSystemTierInfo",
    "KvrefTierMetrics",
    "KvrefSecondaryTier",
]
