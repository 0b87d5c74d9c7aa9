"""The CPU<->GPU offloading worker (vLLM 0.33: `vllm/v1/kv_offload/cpu/gpu_worker.py`).

`CPUOffloadingWorker` implements `OffloadingWorker` over a worker's `CanonicalKVCaches` and its
CPU rows: rows of its own, or views of the CPU tier's `SharedOffloadRegion` (per rank, or in the
canonical layout every rank shares). It composes three `SingleDirectionOffloadingHandler`s:
stores (GPU->CPU), loads (CPU->GPU), and expedited loads, which have a queue of their own so a
load the step waits for never waits behind regular loads.

How a job runs:

* `plan_transfer` (`kvref.cpu.transfer_plan`) turns the specs into byte-range copies per tensor.
* On CUDA each handler owns one stream. Work on a stream runs in submission order, so a
  handler's jobs finish first-in first-out and `get_finished` polls only its oldest job. Before
  its copies a job's stream waits for the current (compute) stream: a store must not read KV the
  model is still writing, and a load must land after pending writes (zeroing included) to its
  destination blocks.
* Each copy is `dst[a:b].copy_(src[c:d], non_blocking=True)` between 1-D byte views of the
  tensors: one `cudaMemcpyAsync`, carried out by the GPU's copy engines, not its SMs.
* Timing-enabled events bracket a job: the end event says when it is done, the pair how long it
  took.

Without CUDA, the "GPU" tensors are CPU tensors and the same handlers run the same plan and
copies: the copies are synchronous, the events are host timestamps, and a job has finished when
its submission returns. Results, ordering and errors are the same.

Pinned memory: on CUDA the CPU rows are page-locked in place (`kvref.cpu.host_register`): the
shared region by `pin_mmap_region`, private rows (an exact-size anonymous mapping) likewise in
row-aligned chunks; merged copies never run across two registrations.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

with warnings.catch_warnings():
    # CPU wheels of torch warn on import when numpy is absent; kvref does not need numpy.
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

from typing_extensions import override

from kvref.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from kvref.cpu.host_register import host_unregister, pin_mmap_region, pin_rows
from kvref.cpu.kv_views import as_block_rows, byte_span, check_tensors, private_rows, side_rows
from kvref.cpu.shared_region import SharedOffloadRegion
from kvref.cpu.transfer_events import CudaEvent, HostEvent, TransferEvent
from kvref.cpu.transfer_plan import (
    TransferPlan,
    build_copy_plan,
    canonical_block_sizes,
    canonical_page_ids,
    int_list,
    layer_copies,
    plan_transfer,
)
from kvref.errors import KVRefError

__all__ = [
    "CPUOffloadingWorker",
    "SingleDirectionOffloadingHandler",
    "TransferProtocolError",
    "pin_mmap_region",
]

logger = logging.getLogger(__name__)

# vLLM's private names for the planning helpers, which its own tests import from this module.
_build_copy_plan = build_copy_plan
_canonical_page_ids = canonical_page_ids
_canonical_block_sizes = canonical_block_sizes


class TransferProtocolError(KVRefError):
    """A worker was misused: a job id reused while in flight, or a job after shutdown.

    Raised before anything starts.
    """


@dataclass
class Transfer:
    """One submitted job of a handler."""

    job_id: int
    num_bytes: int
    start_event: TransferEvent
    end_event: TransferEvent


class SingleDirectionOffloadingHandler:
    """Moves blocks one way between GPU KV-cache rows and CPU rows, jobs in submission order.

    Args:
        gpu_tensors: int8 `(num_gpu_blocks, gpu_page_size)` rows of the KV caches, all on one
            device (CUDA, or the CPU).
        cpu_tensors: int8 CPU rows `(num_cpu_chunks, cpu_page_size)`, co-indexed with
            `gpu_tensors`: `gpu_page_size * blocks_per_chunk` bytes a row, or in the canonical
            layout the tensor's canonical page (`_canonical_block_sizes`) times that.
        blocks_per_chunk: GPU blocks per CPU chunk.
        layer_refs_per_group: per KV-cache group, its layers' references into the tensors.
        gpu_to_cpu: True for stores, False for loads.
        canonical_layout: the CPU rows use the canonical layout of the references' mappings.
        host_memory_is_pinned: the CPU rows are pinned, so CUDA copies may run asynchronously.
        host_boundaries: addresses where one pinned registration of the CPU rows ends and the
            next begins (kvref's addition: no merged copy runs across one).

    Raises:
        ValueError: tensors or references are not as described.
    """

    def __init__(
        self,
        gpu_tensors: list[torch.Tensor],
        cpu_tensors: list[torch.Tensor],
        blocks_per_chunk: int,
        layer_refs_per_group: list[list[CanonicalKVCacheRef]],
        gpu_to_cpu: bool,
        canonical_layout: bool = False,
        host_memory_is_pinned: bool = True,
        *,
        host_boundaries: Sequence[int] = (),
    ) -> None:
        if not gpu_tensors or len(gpu_tensors) != len(cpu_tensors):
            raise ValueError(
                f"gpu_tensors ({len(gpu_tensors)}) and cpu_tensors ({len(cpu_tensors)}) must be "
                "non-empty and co-indexed"
            )
        if blocks_per_chunk < 1:
            raise ValueError(f"blocks_per_chunk must be a positive integer, got {blocks_per_chunk}")
        canonical_sizes = (
            canonical_block_sizes(layer_refs_per_group, len(gpu_tensors)) if canonical_layout else None
        )
        check_tensors(gpu_tensors, cpu_tensors, blocks_per_chunk, canonical_sizes, layer_refs_per_group)
        self.gpu_to_cpu = gpu_to_cpu
        self.layer_refs_per_group = layer_refs_per_group
        self.src_tensors = gpu_tensors if gpu_to_cpu else cpu_tensors
        self.dst_tensors = cpu_tensors if gpu_to_cpu else gpu_tensors
        self.src_blocks_per_chunk = 1 if gpu_to_cpu else blocks_per_chunk
        self.dst_blocks_per_chunk = blocks_per_chunk if gpu_to_cpu else 1
        self._layers = layer_copies(layer_refs_per_group, gpu_to_cpu, canonical_layout)
        self._src_rows = [side_rows(t, self.src_blocks_per_chunk) for t in self.src_tensors]
        self._dst_rows = [side_rows(t, self.dst_blocks_per_chunk) for t in self.dst_tensors]
        # 1-D byte views spanning each tensor's rows: plan offsets index them directly.
        self._src_spans = [byte_span(t) for t in self.src_tensors]
        self._dst_spans = [byte_span(t) for t in self.dst_tensors]
        breaks = [
            torch.tensor([b - t.data_ptr() for b in host_boundaries], dtype=torch.int64) for t in cpu_tensors
        ]
        self._src_breaks, self._dst_breaks = ((), breaks) if gpu_to_cpu else (breaks, ())
        device = gpu_tensors[0].device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._device = device
        self._non_blocking = self._stream is not None and host_memory_is_pinned
        self._transfers: deque[Transfer] = deque()
        self._transfer_events: dict[int, TransferEvent] = {}
        self._event_pool: list[TransferEvent] = []

    def transfer_async(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        """Start one job; return True once its copies are queued (on the CPU: done).

        Raises:
            TypeError: a spec is not block ids, or the GPU side is not a `GPULoadStoreSpec`.
            ValueError: the specs do not fit the KV caches (nothing was started).
            TransferProtocolError: `job_id` is still in flight here.
        """
        if job_id in self._transfer_events:
            raise TransferProtocolError(
                f"job {job_id} is still in flight; job ids must be unique until reported"
            )
        plan = self._plan(src_spec, dst_spec)
        start, end = self._new_event(), self._new_event()
        with self._on_stream():
            start.record()
            self._copy(plan)
            end.record()
        self._transfers.append(Transfer(job_id, plan.num_bytes, start, end))
        self._transfer_events[job_id] = end
        return True

    def get_finished(self) -> list[TransferResult]:
        """The jobs finished since the last call, in submission order."""
        results: list[TransferResult] = []
        # First-in first-out: once the oldest job is still running, every later one is too.
        while self._transfers and self._transfers[0].end_event.query():
            transfer = self._transfers.popleft()
            seconds = transfer.start_event.elapsed_ms(transfer.end_event) / 1e3
            results.append(TransferResult(transfer.job_id, True, transfer.num_bytes, seconds))
            self._event_pool += (transfer.start_event, transfer.end_event)
            del self._transfer_events[transfer.job_id]
        return results

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until this handler's jobs among `job_ids` have finished (others are ignored)."""
        for job_id in job_ids:
            event = self._transfer_events.get(job_id)
            if event is not None:
                event.synchronize()

    def shutdown(self) -> None:
        """Drain this direction, then release its tensors and events.

        Raises:
            Exception: the first failure to wait for a job (later jobs are then dropped).
        """
        sync_error: Exception | None = None
        while self._transfers:
            try:
                self._transfers[0].end_event.synchronize()
            except Exception as exc:
                logger.exception("failed to wait for a transfer; dropping %d more", len(self._transfers) - 1)
                sync_error = exc
                break
            self._transfers.popleft()
        self._transfers.clear()
        self._transfer_events.clear()
        self._event_pool.clear()
        for tensors in (self.src_tensors, self.dst_tensors, self._src_spans, self._dst_spans):
            tensors.clear()
        self._stream = None
        if sync_error is not None:
            raise sync_error

    def _plan(self, src_spec: LoadStoreSpec, dst_spec: LoadStoreSpec) -> TransferPlan:
        gpu_spec = src_spec if self.gpu_to_cpu else dst_spec
        if not isinstance(gpu_spec, GPULoadStoreSpec):
            raise TypeError(f"the GPU side must be a GPULoadStoreSpec, got {type(gpu_spec).__name__}")
        for name, spec in (("src_spec", src_spec), ("dst_spec", dst_spec)):
            if not isinstance(spec, BlockIDsLoadStoreSpec):
                raise TypeError(f"{name} must be a BlockIDsLoadStoreSpec, got {type(spec).__name__}")
        assert isinstance(src_spec, BlockIDsLoadStoreSpec) and isinstance(dst_spec, BlockIDsLoadStoreSpec)
        if not self.src_tensors:
            raise TransferProtocolError("the handler was shut down")
        return plan_transfer(
            src_spec.block_ids,
            dst_spec.block_ids,
            group_sizes=gpu_spec.group_sizes,
            block_indices=gpu_spec.block_indices,
            src_blocks_per_chunk=self.src_blocks_per_chunk,
            dst_blocks_per_chunk=self.dst_blocks_per_chunk,
            layers=self._layers,
            src_rows=self._src_rows,
            dst_rows=self._dst_rows,
            src_breaks=self._src_breaks,
            dst_breaks=self._dst_breaks,
        )

    def _copy(self, plan: TransferPlan) -> None:
        for (src_offsets, dst_offsets, sizes), src, dst in zip(
            plan.copies, self._src_spans, self._dst_spans, strict=True
        ):
            for s, d, n in zip(int_list(src_offsets), int_list(dst_offsets), int_list(sizes), strict=True):
                dst[d : d + n].copy_(src[s : s + n], non_blocking=self._non_blocking)

    def _on_stream(self) -> contextlib.AbstractContextManager[object]:
        if self._stream is None:
            return contextlib.nullcontext()
        # Stores read KV the model may still be writing; loads overwrite blocks it may still
        # be zeroing: both wait for the compute stream.
        self._stream.wait_stream(torch.cuda.current_stream(self._device))
        return torch.cuda.stream(self._stream)

    def _new_event(self) -> TransferEvent:
        if self._event_pool:
            return self._event_pool.pop()
        return HostEvent() if self._stream is None else CudaEvent(self._stream)


class CPUOffloadingWorker(OffloadingWorker):
    """`OffloadingWorker` between a worker's KV caches and CPU rows: stores, loads and
    expedited loads, each a `SingleDirectionOffloadingHandler` of its own.

    Once constructed, the worker owns `mmap_region`: `shutdown` cleans it up after both
    directions have stopped.

    Args:
        kv_caches: the worker's KV caches (on CUDA, or on the CPU).
        blocks_per_chunk: GPU blocks per CPU chunk.
        num_cpu_chunks: CPU chunks; the rows are allocated here when there is no region.
        mmap_region: the CPU tier's shared region (this rank's), or None for rows of its own.
        canonical_layout: store canonical pages (every reference must carry a mapping), in
            views of the region every rank shares; needs `mmap_region`.

    Raises:
        ValueError: the arguments do not fit together (see the message).
    """

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        num_cpu_chunks: int,
        mmap_region: SharedOffloadRegion | None = None,
        canonical_layout: bool = False,
    ) -> None:
        if canonical_layout and mmap_region is None:
            raise ValueError("canonical_layout=True needs an mmap_region every rank shares")
        if not kv_caches.tensors:
            raise ValueError("kv_caches.tensors must hold at least one tensor")
        if blocks_per_chunk < 1 or num_cpu_chunks < 1:
            raise ValueError(
                f"blocks_per_chunk ({blocks_per_chunk}) and num_cpu_chunks ({num_cpu_chunks}) must be >= 1"
            )
        if mmap_region is not None and mmap_region.num_chunks != num_cpu_chunks:
            raise ValueError(
                f"num_cpu_chunks={num_cpu_chunks} but the region has {mmap_region.num_chunks} chunks"
            )
        on_cuda = kv_caches.tensors[0].tensor.device.type == "cuda"
        self._mmap_region = mmap_region
        self._private_pins: list[int] = []
        gpu_tensors = [as_block_rows(t.tensor, t.page_size_bytes, i) for i, t in enumerate(kv_caches.tensors)]
        canonical_sizes = (
            canonical_block_sizes(kv_caches.group_data_refs, len(gpu_tensors)) if canonical_layout else None
        )
        cpu_page_sizes = [
            (canonical_sizes[i] if canonical_sizes is not None else t.shape[1]) * blocks_per_chunk
            for i, t in enumerate(gpu_tensors)
        ]
        if mmap_region is None:
            cpu_tensors = [private_rows(num_cpu_chunks, page) for page in cpu_page_sizes]
            self._private_pins = (pin_rows(cpu_tensors) if on_cuda else None) or []
            pinned = bool(self._private_pins)
            boundaries = self._private_pins
        else:
            if on_cuda:
                pin_mmap_region(mmap_region, worker_slot_only=not canonical_layout)
            next_view = (
                mmap_region.create_next_canonical_view
                if canonical_layout
                else mmap_region.create_next_worker_view
            )
            cpu_tensors = [next_view(page) for page in cpu_page_sizes]
            pinned = mmap_region.is_pinned
            boundaries = mmap_region.pinned_addresses

        def handler(gpu_to_cpu: bool) -> SingleDirectionOffloadingHandler:
            return SingleDirectionOffloadingHandler(
                gpu_tensors=list(gpu_tensors),
                cpu_tensors=list(cpu_tensors),
                blocks_per_chunk=blocks_per_chunk,
                layer_refs_per_group=kv_caches.group_data_refs,
                gpu_to_cpu=gpu_to_cpu,
                canonical_layout=canonical_layout,
                host_memory_is_pinned=pinned,
                host_boundaries=boundaries,
            )

        self._store_handler = handler(gpu_to_cpu=True)
        self._load_handler = handler(gpu_to_cpu=False)
        # A queue of its own, so expedited loads do not wait behind regular loads.
        self._expedited_load_handler = handler(gpu_to_cpu=False)
        self._unreported: set[int] = set()
        self._closed = False

    @override
    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        """Start copying GPU blocks into CPU chunks.

        Raises:
            TypeError, ValueError: the specs do not fit the KV caches (nothing started).
            TransferProtocolError: `job_id` is still unreported, or the worker was shut down.
        """
        return self._submit(self._store_handler, job_id, src_spec, dst_spec)

    @override
    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec, expedited: bool = False
    ) -> bool:
        """Start copying CPU chunks into GPU blocks; an expedited load has a queue of its own.

        Raises:
            TypeError, ValueError: the specs do not fit the KV caches (nothing started).
            TransferProtocolError: `job_id` is still unreported, or the worker was shut down.
        """
        handler = self._expedited_load_handler if expedited else self._load_handler
        return self._submit(handler, job_id, src_spec, dst_spec)

    @override
    def get_finished(self) -> list[TransferResult]:
        results = (
            self._store_handler.get_finished()
            + self._load_handler.get_finished()
            + self._expedited_load_handler.get_finished()
        )
        self._unreported.difference_update(result.job_id for result in results)
        return results

    @override
    def wait(self, job_ids: set[int]) -> None:
        for handler in self._handlers():
            handler.wait(job_ids)

    @override
    def shutdown(self) -> None:
        """Drain every direction, then unpin and release the CPU rows (idempotent).

        A direction that fails to drain is logged; the device is then synchronized before the
        rows are released, since a copy may still be reading them.
        """
        if self._closed:
            return
        self._closed = True
        failed = False
        for name, handler in zip(("store", "load", "load"), self._handlers(), strict=True):
            try:
                handler.shutdown()
            except Exception:
                logger.exception("Failed to shut down %s offloading handler", name)
                failed = True
        if failed and torch.cuda.is_available():
            try:
                torch.cuda.synchronize()
            except Exception:
                logger.warning(
                    "Device sync before mmap cleanup failed; proceeding with cleanup anyway", exc_info=True
                )
        for address in reversed(self._private_pins):
            host_unregister(address)
        self._private_pins.clear()
        if self._mmap_region is not None:
            self._mmap_region.cleanup()
            self._mmap_region = None

    def _submit(
        self,
        handler: SingleDirectionOffloadingHandler,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: LoadStoreSpec,
    ) -> bool:
        if self._closed:
            raise TransferProtocolError(f"job {job_id}: the worker was shut down")
        if job_id in self._unreported:
            raise TransferProtocolError(
                f"job {job_id} is still in flight; job ids must be unique until reported"
            )
        submitted = handler.transfer_async(job_id, src_spec, dst_spec)
        self._unreported.add(job_id)
        return submitted

    def _handlers(self) -> tuple[SingleDirectionOffloadingHandler, ...]:
        return (self._store_handler, self._load_handler, self._expedited_load_handler)
