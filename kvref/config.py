"""The normalized configuration an offloading spec is built from (vLLM: `kv_offload/config.py`).

vLLM derives it from its engine configuration; kvref's own tools and tests build it directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "OffloadingCacheConfig",
    "OffloadingConfig",
    "OffloadingGroupConfig",
    "OffloadingModelConfig",
    "OffloadingParallelConfig",
]


@dataclass(frozen=True)
class OffloadingGroupConfig:
    """One KV-cache group.

    Attributes:
        tokens_per_block: the tokens one block covers across all workers (context parallelism
            included).
        layer_names: the group's layers.
        group_id: the group's index in vLLM's KV-cache configuration.
        sliding_window_size_in_chunks: the chunks of this group a request keeps, or None when
            attention reaches back without a bound (a full-attention layer).
    """

    tokens_per_block: int
    layer_names: tuple[str, ...]
    group_id: int
    sliding_window_size_in_chunks: int | None = None


@dataclass(frozen=True)
class OffloadingModelConfig:
    """The model.

    Attributes:
        name: its identifier (e.g. a Hugging Face path).
        dtype: the KV cache's data type (e.g. "float16").
        max_model_len: the longest request the engine accepts, in tokens; 0 when not known.
    """

    name: str
    dtype: str
    max_model_len: int = 0


@dataclass(frozen=True)
class OffloadingCacheConfig:
    """The cache's granularity.

    Attributes:
        tokens_per_hash: tokens per block hash.
        blocks_per_chunk: GPU blocks coalesced into one offloaded chunk.
    """

    tokens_per_hash: int
    blocks_per_chunk: int


@dataclass(frozen=True)
class OffloadingParallelConfig:
    """Where this worker sits in the engine's parallel layout.

    Attributes:
        rank: the worker's index in [0, world_size); 0 on the scheduler side.
        world_size: the number of workers.
        tp_size, pp_size, pcp_size, dcp_size: tensor, pipeline, prefill-context and
            decode-context parallel sizes.
        data_parallel_index: this engine's data-parallel replica index.
        data_parallel_size: the number of data-parallel replicas.
        data_parallel_rank_local: the local rank of the data-parallel group (SPMD mode only).
        is_parallelism_agnostic: the bytes persisted for a block are the same under any
            parallel layout (see `kvref.canonical`).
    """

    rank: int
    world_size: int
    tp_size: int
    pp_size: int
    pcp_size: int
    dcp_size: int
    data_parallel_index: int
    data_parallel_size: int
    data_parallel_rank_local: int | None
    is_parallelism_agnostic: bool


@dataclass(frozen=True)
class OffloadingConfig:
    """Everything an offloading spec is built from.

    Attributes:
        groups: the KV-cache groups.
        worker_kv_bytes_per_block: the KV bytes one worker stores per block.
        enable_kv_cache_events: the scheduler emits KV-cache events, so offloading should too.
        extra_config: the offloading options (vLLM's `kv_connector_extra_config`).
        engine_id: this engine's identifier, distinct per data-parallel rank.
        model, cache, parallel: see their types.
        replicated_layout: every worker's offloaded bytes are identical per block, so a
            backend may keep one copy.
        canonical_layout: the canonical per-layer layout was asked for (certified per layer
            when the worker registers its caches).
        kv_cache_layout: the worker KV cache's layout name, if resolved.
    """

    groups: tuple[OffloadingGroupConfig, ...]
    worker_kv_bytes_per_block: int
    enable_kv_cache_events: bool
    extra_config: Mapping[str, Any]
    engine_id: str
    model: OffloadingModelConfig
    cache: OffloadingCacheConfig
    parallel: OffloadingParallelConfig
    replicated_layout: bool = False
    canonical_layout: bool = False
    kv_cache_layout: str | None = None
