"""A transfer handler decorator that counts bytes and time per direction, for dashboards."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

from typing_extensions import override

from kvref.worker import OffloadingHandler, TransferResult, TransferSpec

__all__ = ["StatsHandler"]


class StatsHandler(OffloadingHandler):
    """Wraps another handler and accumulates what its finished jobs moved."""

    def __init__(self, inner: OffloadingHandler) -> None:
        self.inner = inner
        self.bytes_moved: Counter[str] = Counter()
        self.seconds: dict[str, float] = {}
        self.failures = 0

    @override
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        return self.inner.transfer_async(job_id, spec)

    def get_finished(self) -> list[TransferResult]:
        results = self.inner.get_finished()
        for result in results:
            direction = "->".join(result.transfer_type)
            if not result.success:
                self.failures += 1
            self.bytes_moved[direction] += result.transfer_size or 0
            self.seconds[direction] = self.seconds.get(direction, 0.0) + (result.transfer_time or 0.0)
        return results

    @override
    def wait(self, job_ids: Collection[int]) -> None:
        self.inner.wait(job_ids)

    def shutdown(self) -> None:
        self.inner.shutdown()
