"""The canonical KV-cache model in use: from a worker's KV caches and its parallel layout to the
`CanonicalKVCaches` an `OffloadingWorker` runs over (vLLM 0.33: `offloading/canonical_mapping.py`
and `offloading/worker.py`'s `register_kv_caches`).

* `kvref.canonical.layers` - what is read of a layer (`AttentionLayerSpec`, `OpaqueLayerSpec`)
  and of the parallel layout (`ParallelLayout`).
* `kvref.canonical.mapping` - each layer's `CanonicalPageMapping`: the `CopyRun`s from this
  worker's page into the canonical page, the writer rotation among ranks holding identical
  bytes, and whether the page is `parallelism_agnostic`.
* `kvref.canonical.caches` - the per-group references over the unique block tensors.

The types themselves (`CanonicalKVCaches`, `CanonicalPageMapping`, ...) are `kvref.base`'s.
"""

from __future__ import annotations

from kvref.canonical.caches import canonical_kv_caches, layer_block_rows
from kvref.canonical.layers import AttentionLayerSpec, LayerSpec, OpaqueLayerSpec, ParallelLayout
from kvref.canonical.mapping import derive_canonical_mappings, layer_mapping, opaque_fallback_mapping

__all__ = [
    "AttentionLayerSpec",
    "LayerSpec",
    "OpaqueLayerSpec",
    "ParallelLayout",
    "canonical_kv_caches",
    "derive_canonical_mappings",
    "layer_block_rows",
    "layer_mapping",
    "opaque_fallback_mapping",
]
