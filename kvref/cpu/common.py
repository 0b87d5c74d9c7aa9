"""What the CPU manager, the CPU tier's metrics and the CPU<->GPU worker share (vLLM:
`cpu/common.py`)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from kvref.base import BlockIDsLoadStoreSpec, ConfigInfo
from kvref.config import OffloadingConfig

__all__ = ["CPULoadStoreSpec", "CPUOffloadingInfo", "CPUOffloadingMetrics"]


class CPUOffloadingMetrics:
    """Names of the metrics the CPU manager reports through `get_stats`."""

    STORES_SKIPPED = "vllm:kv_offload_stores_skipped"
    CPU_CACHE_USAGE_PERC = "vllm:kv_offload_cpu_cache_usage_perc"
    CPU_ALLOCATION_SIZE = "vllm:kv_offload_cpu_allocation_size"
    CPU_CACHE_WRITE_USAGE_PERC = "vllm:kv_offload_cpu_cache_write_usage_perc"
    CPU_CACHE_READ_USAGE_PERC = "vllm:kv_offload_cpu_cache_read_usage_perc"


class CPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """CPU chunks, addressed by slot index in the CPU cache (not GPU block ids)."""

    @property
    def chunk_ids(self) -> array[int]:
        """The slot indices (the tiering layer's name for `block_ids`)."""
        return self.block_ids


@dataclass(frozen=True)
class CPUOffloadingInfo(ConfigInfo):
    """Static facts about the CPU tier, published as info-metric labels.

    Attributes:
        cpu_num_chunks: chunk slots in the tier (chunks, not GPU blocks).
        cpu_blocks_per_chunk: GPU blocks per chunk.
        cpu_kv_cache_size_bytes: the tier's size, chunk padding included.
        cpu_kv_cache_size_tokens: the KV tokens the tier holds for requests of `max_model_len`
            tokens; None when that length is not known.
    """

    cpu_num_chunks: int
    cpu_blocks_per_chunk: int
    cpu_kv_cache_size_bytes: int
    cpu_kv_cache_size_tokens: int | None

    @classmethod
    def from_config(cls, config: OffloadingConfig, num_chunks: int, kv_bytes_per_chunk: int) -> CPUOffloadingInfo:
        """Describe a tier of `num_chunks` chunks of `kv_bytes_per_chunk` bytes each."""
        return cls(
            cpu_num_chunks=num_chunks,
            cpu_blocks_per_chunk=config.cache.blocks_per_chunk,
            cpu_kv_cache_size_bytes=num_chunks * kv_bytes_per_chunk,
            cpu_kv_cache_size_tokens=_kv_cache_size_tokens(config, num_chunks),
        )


def _kv_cache_size_tokens(config: OffloadingConfig, num_chunks: int) -> int | None:
    """The KV tokens `num_chunks` hold at `max_model_len` (as the GPU's kv_cache_size_tokens)."""
    max_model_len = config.model.max_model_len
    if max_model_len <= 0 or not config.groups:
        return None
    chunks_per_request = 0
    for group in config.groups:
        tokens_per_chunk = group.tokens_per_block * config.cache.blocks_per_chunk
        group_chunks = -(-max_model_len // tokens_per_chunk)  # ceiling division
        if group.sliding_window_size_in_chunks is not None:
            group_chunks = min(group_chunks, group.sliding_window_size_in_chunks)
        chunks_per_request += group_chunks
    return num_chunks * max_model_len // chunks_per_request
