"""Build a worker's `CanonicalKVCaches` from its per-layer KV caches (vLLM 0.33: the first half of
`OffloadingConnectorWorker.register_kv_caches`, `offloading/worker.py`).

Each layer's cache becomes int8 rows `(num_blocks, page_size_bytes)` over the same memory. Layers
whose rows alias the same bytes (KV-cache groups that overlay each other) share one
`CanonicalKVCacheTensor`; each layer keeps its own `CanonicalKVCacheRef` (its unpadded page, and
its `CanonicalPageMapping` when a parallel layout is given). A packed layout, whose layers
interleave inside each block (a layer's block stride exceeds its page), is offloaded as one
region: the whole block, one reference per group.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

with warnings.catch_warnings():
    # CPU wheels of torch warn on import when numpy is absent; kvref does not need numpy.
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

from kvref.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor
from kvref.canonical.layers import AttentionLayerSpec, LayerSpec, ParallelLayout
from kvref.canonical.mapping import derive_canonical_mappings

__all__ = ["canonical_kv_caches", "layer_block_rows"]


def layer_block_rows(cache: torch.Tensor, spec: LayerSpec, num_blocks: int) -> torch.Tensor:
    """View one layer's cache as int8 rows `(num_blocks, page_size_bytes)`, without copying.

    A cache split into kernel blocks (`num_blocks * k` of them) is regrouped into manager blocks
    first. An attention layer's rows keep its block stride (larger than its page in a packed
    layout); any other layer's rows are its pages back to back.

    Raises:
        ValueError: the cache's leading dimension is not a multiple of `num_blocks`.
    """
    if cache.dim() < 1 or cache.shape[0] % num_blocks:
        raise ValueError(
            f"a KV cache of shape {tuple(cache.shape)} does not hold {num_blocks} blocks (its first "
            "dimension must be num_blocks, or a multiple of it for kernel blocks)"
        )
    blocks = cache if cache.shape[0] == num_blocks else torch.unflatten(cache, 0, (num_blocks, -1))
    elem = blocks.element_size()
    page = spec.page_size_bytes
    block_stride = blocks.stride(0) * elem if isinstance(spec, AttentionLayerSpec) else page
    rows = torch.empty(0, dtype=torch.int8, device=blocks.device)
    return rows.set_(
        blocks.untyped_storage(), blocks.storage_offset() * elem, (num_blocks, page), (block_stride, 1)
    )


def canonical_kv_caches(
    groups: Sequence[Sequence[str]],
    layer_specs: Mapping[str, LayerSpec],
    kv_caches: Mapping[str, torch.Tensor],
    num_blocks: int,
    layout: ParallelLayout | None = None,
) -> CanonicalKVCaches:
    """The canonical KV caches of one worker.

    Args:
        groups: per KV-cache group that is offloaded, its layer names.
        layer_specs: each layer's page.
        kv_caches: each layer's KV cache, as the attention backend shaped it.
        num_blocks: blocks per KV cache.
        layout: this worker's parallel layout, to derive the references' mappings; None leaves
            them unmapped (stored as this worker's bytes).

    Raises:
        ValueError: a layer of `groups` lacks a spec or a cache, or a cache does not hold
            `num_blocks` blocks.
    """
    names = list(dict.fromkeys(name for group in groups for name in group))
    missing = [name for name in names if name not in layer_specs or name not in kv_caches]
    if missing:
        raise ValueError(f"layers {missing} need both a spec in layer_specs and a cache in kv_caches")
    specs = {name: layer_specs[name] for name in names}
    caches = {name: kv_caches[name] for name in names}
    mappings = derive_canonical_mappings(layout, specs, caches, num_blocks) if layout is not None else {}
    rows = {name: layer_block_rows(caches[name], specs[name], num_blocks) for name in names}

    packed = next((name for name, view in rows.items() if view.stride(0) != view.shape[1]), None)
    if packed is not None:
        block_stride = rows[packed].stride(0)
        whole = rows[packed].as_strided((num_blocks, block_stride), (block_stride, 1), storage_offset=0)
        return CanonicalKVCaches(
            [CanonicalKVCacheTensor(whole, block_stride)],
            [[CanonicalKVCacheRef(0, block_stride)] for _ in groups],
        )

    # Layers whose rows are the same bytes (same address and strides) share one tensor.
    aliases: dict[tuple[int, tuple[int, ...]], list[str]] = {}
    for name, view in rows.items():
        aliases.setdefault((view.data_ptr(), view.stride()), []).append(name)
    tensors: list[CanonicalKVCacheTensor] = []
    refs: dict[str, CanonicalKVCacheRef] = {}
    for aliased in aliases.values():
        first = aliased[0]
        tensors.append(CanonicalKVCacheTensor(rows[first], specs[first].page_size_bytes))
        for name in aliased:
            refs[name] = CanonicalKVCacheRef(
                len(tensors) - 1, specs[name].real_page_size_bytes, mappings.get(name)
            )
    return CanonicalKVCaches(tensors, [[refs[name] for name in group] for group in groups])
