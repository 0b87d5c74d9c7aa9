"""The `OffloadingSpec` vLLM 0.33's own tier tests hand a secondary tier: a real config and
KV-events flag in a mock (a tier reads nothing else of the spec), for tests and benchmarks that
build tiers through vLLM's `SecondaryTierFactory` without an engine."""

from __future__ import annotations

from unittest.mock import MagicMock

from vllm.v1.kv_offload.base import OffloadingKVEventsConfig
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

__all__ = ["mock_offloading_spec"]


def mock_offloading_spec(
    *, kv_events: bool = False, model: str = "kvref-test/model", engine_id: str = "kvref-test"
) -> MagicMock:
    """A spec for one model on one rank, one block per chunk.

    Args:
        kv_events: the engine's global KV-events flag (a tier emits events only with it).
        model: the model's name (tiers that name their storage after the model read it).
        engine_id: the engine's id.

    Returns:
        The mock, with `config`, `blocks_per_chunk` and `kv_events_config` set.
    """
    spec = MagicMock()
    spec.config = OffloadingConfig(
        groups=(),
        worker_kv_bytes_per_block=0,
        enable_kv_cache_events=kv_events,
        extra_config={},
        engine_id=engine_id,
        model=OffloadingModelConfig(name=model, dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),  # fmt: skip
        replicated_layout=False,
    )
    spec.blocks_per_chunk = 1
    spec.kv_events_config = OffloadingKVEventsConfig(
        enable_kv_cache_events=kv_events, self_describing_kv_events=False
    )
    return spec
