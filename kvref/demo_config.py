"""`kvref demo`'s settings, apart from the demo so the command line reads their defaults
without loading the offloading library."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NUM_GROUPS", "DemoConfig"]

NUM_GROUPS = 2


@dataclass(frozen=True)
class DemoConfig:
    """The demo's model shape and script (defaults finish in seconds on 2 CPU cores).

    Attributes:
        layers: transformer layers (each has its own KV tensor); split between two KV groups.
        kv_heads: KV heads per layer.
        head_dim: head dimension.
        block_tokens: tokens per GPU block.
        block_size_factor: GPU blocks per offloaded (CPU) block.
        num_gpu_blocks: GPU blocks per KV tensor.
        num_cpu_blocks: CPU (offloaded) blocks; smaller than the working set, so it evicts.
        requests: requests served.
        documents: shared prompt prefixes the requests draw from (the hits).
        doc_blocks: offloaded blocks per document prefix.
        suffix_blocks: offloaded blocks of each request's own suffix.
        device: "auto" (CUDA when available), "cuda" or "cpu".
        seed: the script's random seed.
        tiering: also run the script through the tiering manager (CPU primary over a shared
            region, plus a filesystem tier in a temporary directory).
    """

    layers: int = 4
    kv_heads: int = 4
    head_dim: int = 64
    block_tokens: int = 16
    block_size_factor: int = 2
    num_gpu_blocks: int = 256
    num_cpu_blocks: int = 40
    requests: int = 32
    documents: int = 5
    doc_blocks: int = 6
    suffix_blocks: int = 2
    device: str = "auto"
    seed: int = 0
    tiering: bool = True

    def validate(self) -> None:
        """Raise ValueError naming the first argument out of range."""
        minimums = {
            "layers": NUM_GROUPS,
            "kv_heads": 1,
            "head_dim": 1,
            "block_tokens": 1,
            "block_size_factor": 1,
            "num_cpu_blocks": 1,
            "requests": 1,
            "documents": 1,
            "doc_blocks": 1,
            "suffix_blocks": 0,
        }
        for name, minimum in minimums.items():
            if getattr(self, name) < minimum:
                raise ValueError(f"{name} must be >= {minimum}, got {getattr(self, name)}")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"device must be one of auto, cuda, cpu; got {self.device!r}")
        keys_per_request = NUM_GROUPS * (self.doc_blocks + self.suffix_blocks)
        if self.num_cpu_blocks < keys_per_request:
            raise ValueError(
                f"num_cpu_blocks must be >= {keys_per_request} (one request's offloaded blocks "
                f"in {NUM_GROUPS} groups), got {self.num_cpu_blocks}"
            )
        blocks_per_request = (self.doc_blocks + self.suffix_blocks) * self.block_size_factor
        # Room for one request's blocks plus the final sweep's reload target.
        if self.num_gpu_blocks < 2 * blocks_per_request:
            raise ValueError(
                f"num_gpu_blocks must be >= {2 * blocks_per_request} (two requests' GPU blocks), "
                f"got {self.num_gpu_blocks}"
            )
