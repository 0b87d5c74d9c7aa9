"""`run_identity`: the name of the KV data one engine configuration writes (vLLM 0.33: the
directory `FileMapper` gives a run, in `vllm/v1/kv_offload/file_mapper.py`).

Engines share offloaded chunks exactly when their identities are equal: the same model, KV
dtype, KV-cache groups, tokens per hash, chunk size and byte format, and (unless the chunks'
bytes are the same under any parallel layout) the same parallel layout and rank. kvref's tiers
that outlive an engine name their storage after it (the fs tier's directory, the Redis tier's
default namespace), spelled as vLLM's own fs tier spells its directories:
`<model, '/' as '_'>_<12 hex digits of sha256>_r<rank>`.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvref.base import OffloadingSpec

__all__ = ["canonical_format_id", "run_identity"]

_DIGEST_HEX_DIGITS = 12
_CANONICAL_FORMAT_VERSION = 1
# Canonical pages keep the worker's KV layout family; these two keep their historical names.
_LEGACY_FAMILIES = {"LBNHC": "nhd", "LBHNC": "hnd"}
_KV_CACHE_LAYOUTS = frozenset({"LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"})


def canonical_format_id(kv_cache_layout: str) -> str:
    """The identity of the canonical byte format of a KV-cache layout (vLLM's
    `canonical_format_id`): chunks of another format are never read.

    Raises:
        ValueError: `kv_cache_layout` is not a layout name of vLLM's `KVCacheLayout`.
    """
    if kv_cache_layout not in _KV_CACHE_LAYOUTS:
        raise ValueError(f"kv_cache_layout must be one of {sorted(_KV_CACHE_LAYOUTS)}, got {kv_cache_layout!r}")
    family = _LEGACY_FAMILIES.get(kv_cache_layout, kv_cache_layout.lower())
    return f"v{_CANONICAL_FORMAT_VERSION}-{family}"


def run_identity(offloading_spec: OffloadingSpec) -> str:
    """Return `<model>_<digest>_r<rank>` for the spec's configuration (vLLM's fs tier: a
    `FileMapper` with `parallel_agnostic=True` and one chunk per file).

    Raises:
        ValueError: the configuration asks for the canonical layout without naming a valid
            `kv_cache_layout`.
    """
    config = offloading_spec.config
    parallel = config.parallel
    agnostic = parallel.is_parallelism_agnostic or config.replicated_layout
    fields: dict[str, Any] = {
        "model_name": config.model.name,
        "tokens_per_hash": config.cache.tokens_per_hash,
        "blocks_per_file": offloading_spec.blocks_per_chunk,
        "tp_size": 1 if agnostic else parallel.tp_size,
        "pp_size": 1 if agnostic else parallel.pp_size,
        "pcp_size": 1 if agnostic else parallel.pcp_size,
        "dcp_size": 1 if agnostic else parallel.dcp_size,
        "dtype": str(config.model.dtype),
        "kv_cache_groups": [
            {"tokens_per_block": group.tokens_per_block, "layer_names": list(group.layer_names)}
            for group in config.groups
        ],
        "inference_engine": "vllm",
    }
    # Written only when they differ from the historical defaults, as vLLM does, so that
    # existing deployments keep their names.
    if not agnostic:
        fields["parallel_agnostic"] = False
    if config.replicated_layout:
        fields["replicated_layout"] = True
    if config.canonical_layout:
        fields["canonical_format"] = canonical_format_id(str(config.kv_cache_layout))
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:_DIGEST_HEX_DIGITS]
    rank = 0 if agnostic else parallel.rank
    return f"{config.model.name.replace('/', '_')}_{digest}_r{rank}"
