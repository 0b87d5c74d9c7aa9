"""What the canonical mapping reads of a layer and of the parallel layout (vLLM 0.33: the fields
of `AttentionSpec`, `MLAAttentionSpec`, `MambaSpec` and `ParallelConfig` that
`canonical_mapping.py` uses)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AttentionLayerSpec", "LayerSpec", "OpaqueLayerSpec", "ParallelLayout"]


def _check_positive(owner: str, **fields: int) -> None:
    for name, value in fields.items():
        if value < 1:
            raise ValueError(f"{owner}.{name} must be >= 1, got {value}")


def _padded_page(owner: str, page_size_padded: int | None, real_page_size_bytes: int) -> int:
    """The page with its padding, checked to hold the page."""
    if page_size_padded is None:
        return real_page_size_bytes
    if page_size_padded < real_page_size_bytes:
        raise ValueError(
            f"{owner}.page_size_padded ({page_size_padded}) is smaller than the page "
            f"({real_page_size_bytes} bytes)"
        )
    return page_size_padded


@dataclass(frozen=True)
class AttentionLayerSpec:
    """One attention layer's page on this worker.

    A page holds `block_size` tokens of this worker's `num_kv_heads` heads: K and V of
    `head_size` elements each, or for MLA one latent of `head_size` elements per token (a
    latent every tensor-parallel rank holds whole).

    Attributes:
        block_size: tokens in one block of this worker's cache.
        num_kv_heads: KV heads this worker holds (1 for MLA).
        head_size: elements of one head's K (and of its V), or of MLA's latent.
        dtype_size: bytes per element.
        use_mla: the page holds MLA's latent (vLLM: `MLAAttentionSpec`).
        per_token_head_quant: per-(token, head) quantization scales ride in the page: no
            certified mapping (vLLM: `kv_quant_mode.is_per_token_head`).
        page_size_padded: the page's size with the backend's padding, if it pads.

    Raises:
        ValueError: a size is not positive, or the padding is smaller than the page.
    """

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype_size: int
    use_mla: bool = False
    per_token_head_quant: bool = False
    page_size_padded: int | None = None

    def __post_init__(self) -> None:
        _check_positive(
            "AttentionLayerSpec",
            block_size=self.block_size,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            dtype_size=self.dtype_size,
        )
        _padded_page("AttentionLayerSpec", self.page_size_padded, self.real_page_size_bytes)

    @property
    def real_page_size_bytes(self) -> int:
        """The page's bytes without padding."""
        values_per_head = 1 if self.use_mla else 2
        return self.block_size * self.num_kv_heads * values_per_head * self.head_size * self.dtype_size

    @property
    def page_size_bytes(self) -> int:
        """The page's bytes with padding: a block's row in the KV-cache tensor."""
        return _padded_page("AttentionLayerSpec", self.page_size_padded, self.real_page_size_bytes)


@dataclass(frozen=True)
class OpaqueLayerSpec:
    """A layer whose page kvref does not look into (a Mamba state, say; vLLM: `MambaSpec`).

    Its page is stored as this worker's bytes, at an offset of its own, so only the same
    parallel layout can load it.

    Attributes:
        real_page_size_bytes: the page's bytes without padding.
        page_size_padded: the page's size with padding, if padded.
    """

    real_page_size_bytes: int
    page_size_padded: int | None = None

    def __post_init__(self) -> None:
        _check_positive("OpaqueLayerSpec", real_page_size_bytes=self.real_page_size_bytes)
        _padded_page("OpaqueLayerSpec", self.page_size_padded, self.real_page_size_bytes)

    @property
    def page_size_bytes(self) -> int:
        """The page's bytes with padding."""
        return _padded_page("OpaqueLayerSpec", self.page_size_padded, self.real_page_size_bytes)


LayerSpec = AttentionLayerSpec | OpaqueLayerSpec
"""A layer as the canonical mapping sees it."""


@dataclass(frozen=True)
class ParallelLayout:
    """Where this worker sits among the ranks that share its blocks.

    The canonical mapping covers the tensor-parallel x prefill-context-parallel grid; with
    pipeline parallelism (`pp_size > 1`) there is none (vLLM: the world is not that grid).

    Attributes:
        rank: this worker's rank in the grid, `pcp_rank * tp_size + tp_rank`.
        tp_size: tensor-parallel size.
        total_kv_heads: the model's KV heads, over all ranks.
        pcp_size: prefill-context-parallel size.
        dcp_size: decode-context-parallel size (it shards tokens across ranks holding
            replicated KV heads).
        cp_kv_cache_interleave_size: tokens per run that context parallelism deals to a rank in
            turn.
        pp_size: pipeline-parallel size.

    Raises:
        ValueError: a size is not positive, or the rank is outside the grid.
    """

    rank: int
    tp_size: int
    total_kv_heads: int
    pcp_size: int = 1
    dcp_size: int = 1
    cp_kv_cache_interleave_size: int = 1
    pp_size: int = 1

    def __post_init__(self) -> None:
        _check_positive(
            "ParallelLayout",
            tp_size=self.tp_size,
            total_kv_heads=self.total_kv_heads,
            pcp_size=self.pcp_size,
            dcp_size=self.dcp_size,
            cp_kv_cache_interleave_size=self.cp_kv_cache_interleave_size,
            pp_size=self.pp_size,
        )
        if not 0 <= self.rank < self.tp_size * self.pcp_size:
            raise ValueError(
                f"ParallelLayout.rank must be in [0, tp_size * pcp_size = "
                f"{self.tp_size * self.pcp_size}), got {self.rank}"
            )

    @property
    def group_size(self) -> int:
        """The ranks of the grid: `tp_size * pcp_size`."""
        return self.tp_size * self.pcp_size

    @property
    def cp_size(self) -> int:
        """Ranks a block's tokens are spread over: `dcp_size * pcp_size`."""
        return self.dcp_size * self.pcp_size

    @property
    def tp_rank(self) -> int:
        """This worker's tensor-parallel rank."""
        return self.rank % self.tp_size

    @property
    def total_cp_rank(self) -> int:
        """This worker's context-parallel rank, prefill and decode together."""
        pcp_rank = self.rank // self.tp_size
        return pcp_rank * self.dcp_size + self.tp_rank % self.dcp_size
