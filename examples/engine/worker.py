"""A worker decorator that counts bytes and time per direction, for dashboards."""

from __future__ import annotations

from collections import Counter

from typing_extensions import override

from kvref.base import GPULoadStoreSpec, LoadStoreSpec, OffloadingWorker, TransferResult

__all__ = ["StatsWorker"]


class StatsWorker(OffloadingWorker):
    """Wraps another worker and accumulates what its finished jobs moved, per direction."""

    def __init__(self, inner: OffloadingWorker) -> None:
        self.inner = inner
        self.bytes_moved: Counter[str] = Counter()
        self.seconds: dict[str, float] = {}
        self.failures = 0
        self._direction: dict[int, str] = {}

    @override
    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        self._direction[job_id] = "store"
        return self.inner.submit_store(job_id, src_spec, dst_spec)

    @override
    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec, expedited: bool = False
    ) -> bool:
        self._direction[job_id] = "load"
        return self.inner.submit_load(job_id, src_spec, dst_spec, expedited)

    def get_finished(self) -> list[TransferResult]:
        results = self.inner.get_finished()
        for result in results:
            direction = self._direction.pop(result.job_id, "unknown")
            if not result.success:
                self.failures += 1
            self.bytes_moved[direction] += result.transfer_size or 0
            self.seconds[direction] = self.seconds.get(direction, 0.0) + (result.transfer_time or 0.0)
        return results

    @override
    def wait(self, job_ids: set[int]) -> None:
        self.inner.wait(job_ids)

    def shutdown(self) -> None:
        self.inner.shutdown()
