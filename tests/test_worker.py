"""`OffloadingWorker`: routing by media, failures as results, fan-out of wait and shutdown.

Handlers here are scripted fakes (no torch): the worker's guarantees do not depend on how a
handler copies.
"""

from __future__ import annotations

from collections.abc import Collection

import pytest
from typing_extensions import override

from kvref.base import GPULoadStoreSpec, LoadStoreSpec
from kvref.cpu.common import CPULoadStoreSpec
from kvref.worker import (
    OffloadingHandler,
    OffloadingWorker,
    TransferProtocolError,
    TransferResult,
    TransferSpec,
)


class DiskSpec(LoadStoreSpec):
    @staticmethod
    @override
    def medium() -> str:
        return "DISK"


class FakeHandler(OffloadingHandler):
    """Finishes jobs when told to; can be scripted to raise or decline."""

    def __init__(self, name: str, *, raises: Exception | None = None, declines: bool = False):
        self.name = name
        self.raises = raises
        self.declines = declines
        self.submitted: list[int] = []
        self.finishable: list[TransferResult] = []
        self.waited: list[list[int]] = []
        self.shutdowns = 0

    @override
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        if self.raises is not None:
            raise self.raises
        if self.declines:
            return False
        self.submitted.append(job_id)
        src, dst = spec
        self.finishable.append(TransferResult(job_id, True, 64, 0.5, (src.medium(), dst.medium())))
        return True

    @override
    def get_finished(self) -> list[TransferResult]:
        done, self.finishable = self.finishable, []
        return done

    @override
    def wait(self, job_ids: Collection[int]) -> None:
        self.waited.append(sorted(job_ids))

    @override
    def shutdown(self) -> None:
        self.shutdowns += 1


def gpu() -> GPULoadStoreSpec:
    return GPULoadStoreSpec([0], [1], [0])


def cpu() -> CPULoadStoreSpec:
    return CPULoadStoreSpec([0])


def make_worker() -> tuple[OffloadingWorker, FakeHandler, FakeHandler]:
    worker = OffloadingWorker()
    store, load = FakeHandler("store"), FakeHandler("load")
    worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, store)
    worker.register_handler(CPULoadStoreSpec, GPULoadStoreSpec, load)
    return worker, store, load


def test_jobs_are_routed_by_source_and_destination_medium() -> None:
    worker, store, load = make_worker()
    assert worker.transfer_async(1, (gpu(), cpu()))
    assert worker.transfer_async(2, (cpu(), gpu()))
    assert worker.transfer_async(3, (gpu(), cpu()))
    assert store.submitted == [1, 3]
    assert load.submitted == [2]
    assert worker.transfer_types == [("GPU", "CPU"), ("CPU", "GPU")]


def test_get_finished_concatenates_every_handler() -> None:
    worker, _, _ = make_worker()
    worker.transfer_async(1, (gpu(), cpu()))
    worker.transfer_async(2, (cpu(), gpu()))
    results = worker.get_finished()
    assert [(r.job_id, r.transfer_type) for r in results] == [(1, ("GPU", "CPU")), (2, ("CPU", "GPU"))]
    assert results[0].throughput == 128.0
    assert worker.get_finished() == []


def test_registering_a_pair_twice_is_an_error() -> None:
    worker, _, _ = make_worker()
    with pytest.raises(ValueError, match="GPU->CPU is already registered"):
        worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, FakeHandler("again"))


def test_a_pair_without_handler_is_rejected_before_anything_runs() -> None:
    worker, store, load = make_worker()
    with pytest.raises(ValueError, match=r"no handler registered for CPU->DISK \(registered: GPU->CPU, CPU->GPU\)"):
        worker.transfer_async(1, (cpu(), DiskSpec()))
    assert store.submitted == load.submitted == []
    assert worker.get_finished() == []


def test_a_raising_handler_fails_the_submission_and_is_reported_once() -> None:
    worker = OffloadingWorker()
    broken = FakeHandler("broken", raises=RuntimeError("DMA engine on fire"))
    healthy = FakeHandler("healthy")
    worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, broken)
    worker.register_handler(CPULoadStoreSpec, GPULoadStoreSpec, healthy)

    # The False is the failed job's one and only report: get_finished never mentions it, so a
    # scheduler that releases on False and on a failed result releases once (vLLM's contract).
    assert worker.transfer_async(7, (gpu(), cpu())) is False
    assert worker.transfer_async(8, (cpu(), gpu())) is True
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(8, True)]
    assert worker.get_finished() == []
    # Nothing of job 7 is in flight: wait ignores it and its id is free again.
    worker.wait([7])
    assert broken.waited == []


def test_a_declined_job_fails_the_submission_and_is_never_reported() -> None:
    worker = OffloadingWorker()
    busy = FakeHandler("busy", declines=True)
    worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, busy)
    assert worker.transfer_async(3, (gpu(), cpu())) is False
    assert worker.get_finished() == []
    assert worker.get_finished() == []


def test_a_job_id_cannot_be_reused_until_reported() -> None:
    worker, store, _ = make_worker()
    worker.transfer_async(1, (gpu(), cpu()))
    with pytest.raises(TransferProtocolError, match="job 1 is still in flight"):
        worker.transfer_async(1, (cpu(), gpu()))
    worker.get_finished()
    assert worker.transfer_async(1, (gpu(), cpu()))
    assert store.submitted == [1, 1]


def test_a_failed_job_id_can_be_submitted_again_at_once() -> None:
    worker = OffloadingWorker()
    flaky = FakeHandler("x", raises=OSError("transient"))
    worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, flaky)
    assert worker.transfer_async(4, (gpu(), cpu())) is False
    flaky.raises = None
    assert worker.transfer_async(4, (gpu(), cpu())) is True
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(4, True)]


def test_wait_goes_to_the_handler_of_each_job() -> None:
    worker, store, load = make_worker()
    worker.transfer_async(1, (gpu(), cpu()))
    worker.transfer_async(2, (cpu(), gpu()))
    worker.transfer_async(3, (gpu(), cpu()))
    worker.wait({3, 1, 2, 99})
    assert store.waited == [[1, 3]]
    assert load.waited == [[2]]
    # Reported jobs are no longer waited on.
    worker.get_finished()
    worker.wait([1, 2])
    assert store.waited == [[1, 3]]


def test_shutdown_reaches_each_handler_once() -> None:
    worker = OffloadingWorker()
    both = FakeHandler("both")
    worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, both)
    worker.register_handler(CPULoadStoreSpec, GPULoadStoreSpec, both)
    worker.register_handler(CPULoadStoreSpec, DiskSpec, FakeHandler("disk"))
    worker.shutdown()
    assert both.shutdowns == 1


def test_transfer_result_is_immutable() -> None:
    result = TransferResult(1, True, 10, 1.0, ("GPU", "CPU"))
    with pytest.raises(AttributeError):
        result.success = False  # type: ignore[misc]
