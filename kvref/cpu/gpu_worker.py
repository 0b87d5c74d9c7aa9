"""GPU<->CPU block transfer with torch: CUDA streams and events, pinned memory, and a CPU fallback
(vLLM: `vllm/v1/kv_offload/cpu/gpu_worker.py`, `worker/cpu_gpu.py`).

`SingleDirectionOffloadingHandler` moves blocks one way (GPU->CPU stores or CPU->GPU loads);
`CpuGpuOffloadingHandlers` builds the pair over one set of KV-cache tensors and CPU rows.

How a job runs, on CUDA:

* `plan_transfer` (pure Python, `kvref.cpu.transfer_plan`) turns the specs into byte-range
  copies per tensor, merging blocks that are consecutive on both sides.
* Each direction owns one `torch.cuda.Stream`. Work on one stream runs in submission order,
  so jobs of a direction finish strictly first-in first-out and `get_finished` can report
  them in submission order by polling only the oldest job's end event.
* GPU->CPU first makes its stream wait for the current (compute) stream, so an offload never
  reads KV the model is still writing. CPU->GPU does not: the scheduler only loads into GPU
  blocks it has just allocated, which no queued kernel uses.
* Each copy is `dst[a:b].copy_(src[c:d], non_blocking=True)` between a 1-D byte view of a GPU
  tensor and one of pinned host memory: torch issues that as one `cudaMemcpyAsync`, which the
  GPU's copy engines (DMA) carry out without using SMs, so offloading does not slow the model's
  kernels. Each call costs host time, so consecutive blocks are merged into runs to keep the
  number of calls small (the cost per call is measured in BENCHMARKS.md, "Transfer").
* Start and end `torch.cuda.Event`s (timing-enabled, pooled and reused) bracket the job:
  `end.query()` polls completion, `start.elapsed_time(end)` is the measured transfer time.

Without CUDA, the GPU tensors are CPU tensors and the same handler runs the same code: the
copies are synchronous `copy_`s, the "events" are host timestamps (`time.perf_counter`), and
every job has finished when `transfer_async` returns. Results, ordering and errors are the same.

Pinned host memory: the CPU rows are page-locked in place with `cudaHostRegister`, in bounded,
page-aligned chunks (`kvref.cpu.pinned_memory`), and unregistered on `shutdown`. Copies are split
where they would cross a chunk boundary, so every DMA stays within one registration. If
registration fails, transfers still work, unpinned and slower (a warning says so).

Where the parts live: this module holds the handlers and their streams and events; the byte views
of the KV caches and CPU rows are in `kvref.cpu.kv_views`, the pinning in
`kvref.cpu.pinned_memory`, the copy plan in `kvref.cpu.transfer_plan`. These three torch modules
(not the plan) are the only kvref modules that import torch at module level.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

with warnings.catch_warnings():
    # CPU wheels of torch warn on import when numpy is absent; kvref never uses numpy.
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

from typing_extensions import override

from kvref.base import BlockIDsLoadStoreSpec, GPULoadStoreSpec, LoadStoreSpec
from kvref.cpu.common import CPU_MEDIUM, CPULoadStoreSpec
from kvref.cpu.kv_views import CPUViewSource, as_block_rows, byte_span, cpu_views, span_end, validate_tensors
from kvref.cpu.pinned_memory import DEFAULT_PIN_CHUNK_BYTES, HostMemoryPin, split_at_cuts
from kvref.cpu.transfer_plan import ByteCopy, TensorGeometry, TransferPlan, plan_transfer
from kvref.worker import (
    OffloadingHandler,
    OffloadingWorker,
    TransferProtocolError,
    TransferResult,
    TransferSpec,
    TransferType,
)

__all__ = [
    "CPUViewSource",
    "HostMemoryPin",
    "SingleDirectionOffloadingHandler",
    "CpuGpuOffloadingHandlers",
    "DEFAULT_PIN_CHUNK_BYTES",
]

GPU_MEDIUM = GPULoadStoreSpec.medium()


class _Event(Protocol):
    """What the handler needs of an event: `torch.cuda.Event`, or `_HostEvent` on the CPU."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_ms(self, end: _Event) -> float: ...


class _CudaEvent:
    """A pooled, timing-enabled CUDA event, always recorded on its direction's stream."""

    __slots__ = ("_event", "_stream")

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self._event = torch.cuda.Event(enable_timing=True)
        self._stream = stream

    def record(self) -> None:
        self._event.record(self._stream)

    def query(self) -> bool:
        return bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()

    def elapsed_ms(self, end: _Event) -> float:
        assert isinstance(end, _CudaEvent), "a CUDA job's events are both CUDA events"
        return float(self._event.elapsed_time(end._event))


class _HostEvent:
    """The CPU fallback's event: host copies are synchronous, so it is complete once recorded."""

    __slots__ = ("_seconds",)

    def __init__(self) -> None:
        self._seconds = 0.0

    def record(self) -> None:
        self._seconds = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_ms(self, end: _Event) -> float:
        assert isinstance(end, _HostEvent), "a host job's events are both host events"
        return (end._seconds - self._seconds) * 1e3


@dataclass(slots=True)
class _Job:
    job_id: int
    num_bytes: int
    start: _Event
    end: _Event


class SingleDirectionOffloadingHandler(OffloadingHandler):
    """Moves blocks in one direction between GPU KV-cache tensors and CPU rows.

    Jobs finish and are reported strictly in submission order (one stream per direction on
    CUDA; synchronous copies on the CPU fallback). See the module docstring for the mechanics.

    Args:
        gpu_tensors: int8 `(num_gpu_blocks, page_bytes_t)` views of the KV caches, row
            stride >= page bytes, unit column stride; all on one device (CUDA, or CPU for
            the fallback) and with the same number of blocks.
        cpu_tensors: int8 CPU views `(num_cpu_blocks, page_bytes_t * block_size_factor)`,
            co-indexed with `gpu_tensors`; pinned memory on CUDA for asynchronous copies.
        block_size_factor: GPU blocks per CPU block.
        group_tensors: per KV-cache group, the indices of the tensors holding it.
        gpu_to_cpu: True for stores (GPU->CPU), False for loads (CPU->GPU).
        host_boundaries: addresses inside the CPU rows where one pinned registration ends
            and the next begins; copies are split there.

    Raises:
        ValueError: shapes, dtypes, devices or the page ratio are not as described.
    """

    def __init__(
        self,
        gpu_tensors: Sequence[torch.Tensor],
        cpu_tensors: Sequence[torch.Tensor],
        *,
        block_size_factor: int,
        group_tensors: Sequence[Sequence[int]],
        gpu_to_cpu: bool,
        host_boundaries: Sequence[int] = (),
    ) -> None:
        validate_tensors(gpu_tensors, cpu_tensors, block_size_factor)
        self.gpu_to_cpu = gpu_to_cpu
        self.block_size_factor = block_size_factor
        self.transfer_type: TransferType = (
            (GPU_MEDIUM, CPU_MEDIUM) if gpu_to_cpu else (CPU_MEDIUM, GPU_MEDIUM)
        )
        self.device = gpu_tensors[0].device
        self._group_tensors = tuple(tuple(g) for g in group_tensors)
        for group, indices in enumerate(self._group_tensors):
            if any(not 0 <= i < len(gpu_tensors) for i in indices):
                raise ValueError(
                    f"group_tensors[{group}] = {list(indices)} names tensors outside "
                    f"[0, {len(gpu_tensors)})"
                )
        src_tensors, dst_tensors = (
            (gpu_tensors, cpu_tensors) if gpu_to_cpu else (cpu_tensors, gpu_tensors)
        )
        self._src_factor, self._dst_factor = (
            (1, block_size_factor) if gpu_to_cpu else (block_size_factor, 1)
        )
        self._src_num_blocks = src_tensors[0].shape[0]
        self._dst_num_blocks = dst_tensors[0].shape[0]
        self._geometry = tuple(
            TensorGeometry(gpu.shape[1], src.stride(0), dst.stride(0))
            for gpu, src, dst in zip(gpu_tensors, src_tensors, dst_tensors, strict=True)
        )
        # 1-D byte views spanning each tensor's rows: plan offsets index them directly.
        self._src_spans = [byte_span(t) for t in src_tensors]
        self._dst_spans = [byte_span(t) for t in dst_tensors]
        # Per tensor, the chunk boundaries of pinned memory, as offsets into its CPU span.
        cpu_bases = [t.data_ptr() for t in cpu_tensors]
        sorted_boundaries = sorted(host_boundaries)
        self._host_cuts = [
            [b - base for b in sorted_boundaries if base < b < base + span.numel()]
            for base, span in zip(cpu_bases, self._src_spans if not gpu_to_cpu else self._dst_spans)
        ]
        self._on_cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self._on_cuda else None
        self._event_pool: list[_Event] = []
        self._jobs: deque[_Job] = deque()
        self._job_ids: set[int] = set()
        self._closed = False

    @override
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        if self._closed:
            raise TransferProtocolError(f"transfer_async: job {job_id} after shutdown")
        if job_id in self._job_ids:
            raise TransferProtocolError(
                f"transfer_async: job {job_id} is still in flight; job ids must be unique until "
                "their result is reported"
            )
        plan = self._plan(spec)
        start, end = self._acquire_event(), self._acquire_event()
        try:
            with self._on_direction_stream():
                start.record()
                self._copy(plan)
                end.record()
        except BaseException:
            # Nothing references the job, so its events can be reused; copies already
            # queued still run in order before any later job.
            self._event_pool += (start, end)
            raise
        self._jobs.append(_Job(job_id, plan.num_bytes, start, end))
        self._job_ids.add(job_id)
        return True

    @override
    def get_finished(self) -> list[TransferResult]:
        results: list[TransferResult] = []
        # FIFO: once the oldest job is still running, every later one is too.
        while self._jobs and self._jobs[0].end.query():
            job = self._jobs.popleft()
            self._job_ids.discard(job.job_id)
            seconds = job.start.elapsed_ms(job.end) / 1e3
            results.append(
                TransferResult(job.job_id, True, job.num_bytes, seconds, self.transfer_type)
            )
            self._event_pool += (job.start, job.end)
        return results

    @override
    def wait(self, job_ids: Collection[int]) -> None:
        wanted = set(job_ids)
        last = None
        for job in self._jobs:
            if job.job_id in wanted:
                last = job
        # Jobs finish in order, so the latest wanted job finishing implies the others did.
        if last is not None:
            last.end.synchronize()

    @override
    def shutdown(self) -> None:
        """Wait for in-flight jobs (their results are dropped) and release tensors and events."""
        if self._closed:
            return
        for job in self._jobs:
            job.end.synchronize()
        if self._stream is not None:
            # Also copies of a job whose submission failed half-way (it has no end event):
            # the caller may unpin or free the rows right after this returns.
            self._stream.synchronize()
        self._jobs.clear()
        self._job_ids.clear()
        self._event_pool.clear()
        self._src_spans.clear()
        self._dst_spans.clear()
        self._stream = None
        self._closed = True

    @property
    def num_in_flight(self) -> int:
        """Jobs submitted and not yet reported by `get_finished`."""
        return len(self._jobs)

    def _plan(self, spec: TransferSpec) -> TransferPlan:
        src_spec, dst_spec = spec
        gpu_spec, cpu_spec = (src_spec, dst_spec) if self.gpu_to_cpu else (dst_spec, src_spec)
        if (src_spec.medium(), dst_spec.medium()) != self.transfer_type:
            raise ValueError(
                f"this handler moves {self.transfer_type[0]}->{self.transfer_type[1]}, got a "
                f"{src_spec.medium()}->{dst_spec.medium()} spec pair"
            )
        if not isinstance(gpu_spec, GPULoadStoreSpec):
            raise ValueError(f"the GPU side must be a GPULoadStoreSpec, got {_spec_name(gpu_spec)}")
        if not isinstance(cpu_spec, BlockIDsLoadStoreSpec):
            raise ValueError(
                f"the CPU side must be a BlockIDsLoadStoreSpec, got {_spec_name(cpu_spec)}"
            )
        if len(gpu_spec.group_sizes) != len(self._group_tensors):
            raise ValueError(
                f"the GPU spec has {len(gpu_spec.group_sizes)} groups, the KV caches have "
                f"{len(self._group_tensors)}"
            )
        assert isinstance(src_spec, BlockIDsLoadStoreSpec)
        assert isinstance(dst_spec, BlockIDsLoadStoreSpec)
        return plan_transfer(
            src_spec.block_ids,
            dst_spec.block_ids,
            group_sizes=gpu_spec.group_sizes,
            block_indices=gpu_spec.block_indices,
            src_block_size_factor=self._src_factor,
            dst_block_size_factor=self._dst_factor,
            group_tensors=self._group_tensors,
            tensors=self._geometry,
            src_num_blocks=self._src_num_blocks,
            dst_num_blocks=self._dst_num_blocks,
        )

    def _copy(self, plan: TransferPlan) -> None:
        non_blocking = self._on_cuda
        tensor_copies: Sequence[ByteCopy]
        for tensor_copies, src, dst, cuts in zip(
            plan.copies, self._src_spans, self._dst_spans, self._host_cuts, strict=True
        ):
            if cuts:
                tensor_copies = split_at_cuts(tensor_copies, cuts, cpu_is_src=not self.gpu_to_cpu)
            for src_offset, dst_offset, nbytes in tensor_copies:
                dst[dst_offset : dst_offset + nbytes].copy_(
                    src[src_offset : src_offset + nbytes], non_blocking=non_blocking
                )

    def _on_direction_stream(self) -> contextlib.AbstractContextManager[object]:
        if self._stream is None:
            return contextlib.nullcontext()
        if self.gpu_to_cpu:
            # Offload only what the model has finished writing.
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self._stream)

    def _acquire_event(self) -> _Event:
        if self._event_pool:
            return self._event_pool.pop()
        return _HostEvent() if self._stream is None else _CudaEvent(self._stream)


class CpuGpuOffloadingHandlers:
    """Both transfer directions over one set of KV-cache tensors and their CPU rows.

    Args:
        kv_caches: KV-cache tensors whose first dimension is the number of GPU blocks (any
            dtype; each block's bytes contiguous), all on one device: CUDA, or CPU for the
            fallback. Viewed as int8 `(num_blocks, page_bytes)`.
        block_size_factor: GPU blocks per CPU (offloaded) block.
        num_cpu_blocks: CPU blocks to allocate; required when `cpu_rows` is None, and must
            match it otherwise.
        group_tensors: per KV-cache group, the indices of its tensors in `kv_caches`;
            default: one group holding every tensor.
        cpu_rows: where the CPU blocks live. None: one exact-size allocation owned by the
            handlers (per tensor a dense `(num_cpu_blocks, page * factor)` block of rows). A 2-D
            int8 CPU tensor `(num_cpu_blocks, row_bytes)`: each row holds every tensor's CPU
            page back to back. A `CPUViewSource` (such as `SharedOffloadRegion`): asked for one
            view per tensor.
        pin_memory: page-lock the CPU rows with `cudaHostRegister`. None: when the KV caches
            are on CUDA. True: required (a failure raises). False: never.
        pin_chunk_bytes: the largest range one registration call covers.

    Raises:
        ValueError: inconsistent arguments (see the messages).
    """

    def __init__(
        self,
        kv_caches: Sequence[torch.Tensor],
        *,
        block_size_factor: int = 1,
        num_cpu_blocks: int | None = None,
        group_tensors: Sequence[Sequence[int]] | None = None,
        cpu_rows: torch.Tensor | CPUViewSource | None = None,
        pin_memory: bool | None = None,
        pin_chunk_bytes: int = DEFAULT_PIN_CHUNK_BYTES,
    ) -> None:
        if not kv_caches:
            raise ValueError("kv_caches must hold at least one tensor")
        if block_size_factor < 1:
            raise ValueError(f"block_size_factor must be a positive integer, got {block_size_factor}")
        self.block_size_factor = block_size_factor
        self.gpu_tensors = [as_block_rows(t, i) for i, t in enumerate(kv_caches)]
        self.device = self.gpu_tensors[0].device
        on_cuda = self.device.type == "cuda"
        if pin_memory and not on_cuda:
            raise ValueError(f"pin_memory=True needs CUDA KV caches; they are on {self.device}")
        cpu_page_bytes = [t.shape[1] * block_size_factor for t in self.gpu_tensors]
        self.cpu_tensors, self._owned_rows = cpu_views(cpu_rows, cpu_page_bytes, num_cpu_blocks)
        self.num_cpu_blocks = self.cpu_tensors[0].shape[0]
        if group_tensors is None:
            group_tensors = [list(range(len(self.gpu_tensors)))]

        self._pin: HostMemoryPin | None = None
        if pin_memory or (pin_memory is None and on_cuda):
            start = min(t.data_ptr() for t in self.cpu_tensors)
            end = max(span_end(t) for t in self.cpu_tensors)
            with torch.cuda.device(self.device):
                self._pin = HostMemoryPin(start, end - start, pin_chunk_bytes)
            if not self._pin.pinned:
                message = f"could not pin the CPU rows ({self._pin.error})"
                if pin_memory:
                    raise ValueError(f"pin_memory=True: {message}")
                warnings.warn(f"{message}; transfers will be synchronous and slower", stacklevel=2)

        boundaries = self._pin.boundaries if self._pin is not None else []
        self.gpu_to_cpu_handler = SingleDirectionOffloadingHandler(
            self.gpu_tensors,
            self.cpu_tensors,
            block_size_factor=block_size_factor,
            group_tensors=group_tensors,
            gpu_to_cpu=True,
            host_boundaries=boundaries,
        )
        self.cpu_to_gpu_handler = SingleDirectionOffloadingHandler(
            self.gpu_tensors,
            self.cpu_tensors,
            block_size_factor=block_size_factor,
            group_tensors=group_tensors,
            gpu_to_cpu=False,
            host_boundaries=boundaries,
        )

    @property
    def is_pinned(self) -> bool:
        """Whether the CPU rows are page-locked (asynchronous copies on CUDA)."""
        return self._pin is not None and self._pin.pinned

    def register_with(self, worker: OffloadingWorker) -> None:
        """Register both handlers with `worker` for GPU->CPU and CPU->GPU jobs."""
        worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, self.gpu_to_cpu_handler)
        worker.register_handler(CPULoadStoreSpec, GPULoadStoreSpec, self.cpu_to_gpu_handler)

    def shutdown(self) -> None:
        """Finish both directions, then unpin and drop the CPU and GPU views (idempotent)."""
        self.gpu_to_cpu_handler.shutdown()
        self.cpu_to_gpu_handler.shutdown()
        # Only after every copy finished: the DMA engines may still be reading pinned pages.
        if self._pin is not None:
            self._pin.close()
            self._pin = None
        # Drop every view of the rows: a shared region can only unmap once none is left.
        self.cpu_tensors = []
        self.gpu_tensors = []
        self._owned_rows = None


def _spec_name(spec: LoadStoreSpec) -> str:
    return type(spec).__name__
