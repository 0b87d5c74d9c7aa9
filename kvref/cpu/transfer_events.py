"""When a transfer job is done, and how long it took: CUDA events on a GPU, host timestamps on
the CPU (the CPU<->GPU handlers of `kvref.cpu.gpu_worker` use one or the other, through the same
calls)."""

from __future__ import annotations

import time
import warnings
from typing import Protocol

with warnings.catch_warnings():
    # CPU wheels of torch warn on import when numpy is absent; kvref does not need numpy.
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

__all__ = ["CudaEvent", "HostEvent", "TransferEvent"]


class TransferEvent(Protocol):
    """What a handler needs of an event: `CudaEvent` on a GPU, `HostEvent` on the CPU."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_ms(self, end: TransferEvent) -> float: ...


class CudaEvent:
    """A timing-enabled CUDA event, recorded on its handler's stream."""

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self._event = torch.cuda.Event(enable_timing=True)
        self._stream = stream

    def record(self) -> None:
        self._event.record(self._stream)

    def query(self) -> bool:
        return bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()

    def elapsed_ms(self, end: TransferEvent) -> float:
        assert isinstance(end, CudaEvent), "a CUDA job's events are both CUDA events"
        return float(self._event.elapsed_time(end._event))


class HostEvent:
    """The CPU's event: its copies are synchronous, so it is complete once recorded."""

    def __init__(self) -> None:
        self._seconds = 0.0

    def record(self) -> None:
        self._seconds = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_ms(self, end: TransferEvent) -> float:
        assert isinstance(end, HostEvent), "a CPU job's events are both host events"
        return (end._seconds - self._seconds) * 1e3
