"""The worker side's contract: the canonical KV caches it is given and `OffloadingWorker`.

Part of `kvref.base`, which exports every name here. The canonical KV-cache model:

vLLM hands the offloading worker its KV caches in one shape whatever the attention backend:
a list of unique tensors whose first dimension is the block (`CanonicalKVCacheTensor`), and,
per KV-cache group, one reference per layer (or group of layers) into that list
(`CanonicalKVCacheRef`). A reference may carry a `CanonicalPageMapping`: how this worker's page
of a block maps into a canonical page that is the same whatever the parallel layout. Ranks that
hold identical bytes (replicated heads, say) take turns writing them, one block each, so each
canonical byte is written once; a page marked `parallelism_agnostic` can be stored under one
tensor-parallel layout and loaded under another.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvref.specs import GPULoadStoreSpec, LoadStoreSpec

if TYPE_CHECKING:
    import torch

__all__ = [
    "CanonicalKVCacheRef",
    "CanonicalKVCacheTensor",
    "CanonicalKVCaches",
    "CanonicalPageMapping",
    "CopyRun",
    "OffloadingWorker",
    "TransferResult",
]


@dataclass
class CanonicalKVCacheTensor:
    """One KV-cache tensor whose leading dimension is the block.

    Attributes:
        tensor: shape (num_blocks, ...), any dtype; a block's page is its row.
        page_size_bytes: the bytes of one row, padding included.
    """

    tensor: torch.Tensor
    page_size_bytes: int


@dataclass(frozen=True)
class CopyRun:
    """A strided byte correspondence between this worker's page and a canonical page.

    Fragment i spans `[local_offset + i * local_stride, + fragment_size)` in the worker's page
    and `[canonical_offset + i * canonical_stride, + fragment_size)` in the canonical page, for
    i in `range(num_fragments)`.
    """

    local_offset: int
    canonical_offset: int
    fragment_size: int
    num_fragments: int
    local_stride: int
    canonical_stride: int


@dataclass(frozen=True)
class CanonicalPageMapping:
    """How this worker's page maps into a canonical (parallelism-free) page.

    In-process only, never serialized. The runs cover the whole local page in both directions.

    Attributes:
        canonical_page_size_bytes: the size of a canonical page.
        local_page_size_bytes: the size of this worker's page, without padding.
        runs: the byte correspondences.
        num_writers: how many ranks hold exactly these bytes.
        writer_index: this worker's index among them.
        parallelism_agnostic: the canonical bytes are the same under any parallel layout with
            this block span, so a page stored by one layout loads into another.
    """

    canonical_page_size_bytes: int
    local_page_size_bytes: int
    runs: tuple[CopyRun, ...]
    num_writers: int
    writer_index: int
    parallelism_agnostic: bool

    def is_writer(self, block_id: int) -> bool:
        """Whether this worker stores the canonical page of `block_id`.

        Rotating the writer by block spreads the writes over the ranks holding identical bytes.
        """
        return block_id % self.num_writers == self.writer_index


@dataclass
class CanonicalKVCacheRef:
    """One layer's (or group of layers') reference into the list of canonical tensors.

    Attributes:
        tensor_idx: the index of its `CanonicalKVCacheTensor`.
        page_size_bytes: the layer's page size, without padding.
        mapping: how this worker's page maps into a canonical page; None when uncertified
            (the page is then stored as this worker's bytes, which only this layout can load).
    """

    tensor_idx: int
    page_size_bytes: int
    mapping: CanonicalPageMapping | None = None


@dataclass
class CanonicalKVCaches:
    """The block-level representation of a worker's KV caches.

    Attributes:
        tensors: the unique block tensors, each shaped (num_blocks, ...).
        group_data_refs: per KV-cache group, the references that map each of its layers to
            `tensors`.
    """

    tensors: list[CanonicalKVCacheTensor]
    group_data_refs: list[list[CanonicalKVCacheRef]]


@dataclass
class TransferResult:
    """The outcome of one worker transfer job.

    Attributes:
        job_id: the job's id, as submitted.
        success: whether every block was transferred.
        transfer_size: bytes moved, if measured.
        transfer_time: seconds taken, if measured.
    """

    job_id: int
    success: bool
    transfer_size: int | None = None
    transfer_time: float | None = None


class OffloadingWorker(ABC):
    """Moves KV data between the GPU and one offloaded medium (e.g. CPU), asynchronously.

    Runs in the worker process. The direction is explicit (`submit_store`, `submit_load`);
    submission never blocks, completion is polled with `get_finished` or waited for with `wait`.
    """

    @abstractmethod
    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        """Start copying GPU blocks to the medium.

        Args:
            job_id: the job's id, reported back in its `TransferResult`.
            src_spec: the GPU blocks.
            dst_spec: where they go on the medium (e.g. a `CPULoadStoreSpec`).

        Returns:
            Whether the job was submitted.
        """

    @abstractmethod
    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec, expedited: bool = False
    ) -> bool:
        """Start copying blocks from the medium into GPU blocks.

        Args:
            job_id: the job's id.
            src_spec: the blocks on the medium.
            dst_spec: the GPU blocks to fill.
            expedited: the step waits for this load, so it must not queue behind regular loads
                (submission still does not block).

        Returns:
            Whether the job was submitted.
        """

    @abstractmethod
    def get_finished(self) -> list[TransferResult]:
        """Return the jobs that finished since the last call."""

    @abstractmethod
    def wait(self, job_ids: set[int]) -> None:
        """Block until every job of `job_ids` has finished (their results stay queued)."""

    def shutdown(self) -> None:
        """Release the worker's resources."""
        return None
