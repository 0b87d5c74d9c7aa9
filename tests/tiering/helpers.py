"""Shared helpers of the tiering tests: keys, block contents, small regions, a scripted tier."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable
from pathlib import Path

from typing_extensions import override

from kvref.base import OffloadKey, ReqContext, make_offload_key
from kvref.cpu.policies.factory import CachePolicyName
from kvref.cpu.shared_region import SharedOffloadRegion
from kvref.tiering.base import JobMetadata, JobResult
from kvref.tiering.manager import CPUPrimaryTierOffloadingManager, TieringOffloadingManager
from kvref.tiering.memory import InMemorySecondaryTier

__all__ = [
    "BLOCK_BYTES",
    "to_key",
    "to_keys",
    "content",
    "make_region",
    "make_view",
    "ScriptedTier",
    "make_tiering",
]

BLOCK_BYTES = 64
_region_ids = itertools.count()


def to_key(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def to_keys(ints: Iterable[int]) -> list[OffloadKey]:
    return [to_key(i) for i in ints]


def content(key: bytes, size: int = BLOCK_BYTES) -> bytes:
    """Deterministic block bytes of `key` (the same key always holds the same KV data)."""
    pattern = (key * (size // len(key) + 1))[:size]
    return bytes((b + i) % 256 for i, b in enumerate(pattern))


def make_region(tmp_path: Path, num_blocks: int, block_bytes: int = BLOCK_BYTES) -> SharedOffloadRegion:
    return SharedOffloadRegion(
        f"test{next(_region_ids)}", num_blocks, block_bytes, directory=tmp_path, prefault=False
    )


def make_view(num_blocks: int, block_bytes: int = BLOCK_BYTES) -> memoryview:
    """A stand-in for the primary's memory: a bytearray viewed as (num_blocks, block_bytes)."""
    return memoryview(bytearray(num_blocks * block_bytes)).cast("B", (num_blocks, block_bytes))


class ScriptedTier(InMemorySecondaryTier):
    """An in-memory tier that records calls, can hold its jobs, and can fail chosen loads.

    Attributes:
        calls: ("store" | "load" | "touch" | "finished", request id, keys) in call order.
        hold: while True, `get_finished_jobs` reports nothing (jobs stay in flight).
        failing_loads: loads naming any of these keys fail, although `lookup` still says True.
        report_successful: the `successful_keys` such a failed load reports (default: none).
        polls: how many times `get_finished_jobs` was called.
    """

    def __init__(self, primary_kv_view: memoryview, **kwargs: object) -> None:
        super().__init__(primary_kv_view, **kwargs)  # type: ignore[arg-type]
        self.calls: list[tuple[str, str, tuple[OffloadKey, ...]]] = []
        self.hold = False
        self.failing_loads: set[OffloadKey] = set()
        self.report_successful: tuple[OffloadKey, ...] | None = None
        self.polls = 0
        self.shutdown_called = False
        self._forced_failures: list[JobResult] = []

    @override
    def submit_store(self, job: JobMetadata) -> None:
        self.calls.append(("store", job.req_context.req_id, tuple(job.keys)))
        super().submit_store(job)

    @override
    def submit_load(self, job: JobMetadata) -> None:
        self.calls.append(("load", job.req_context.req_id, tuple(job.keys)))
        if self.failing_loads.intersection(job.keys):
            self._forced_failures.append(JobResult(job.job_id, False, self.report_successful))
        else:
            super().submit_load(job)

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        self.polls += 1
        if self.hold:
            return []
        results = [*self._forced_failures, *super().get_finished_jobs()]
        self._forced_failures.clear()
        return results

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.calls.append(("touch", req_context.req_id, tuple(keys)))
        super().touch(keys, req_context)

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        self.calls.append(("finished", req_context.req_id, ()))

    @override
    def shutdown(self) -> None:
        self.shutdown_called = True
        super().shutdown()

    def kinds(self, *kinds: str) -> list[tuple[str, str, tuple[OffloadKey, ...]]]:
        return [call for call in self.calls if call[0] in kinds]

    def lose(self, key: OffloadKey) -> None:
        """Drop a block silently, as a server evicting it would (lookups asked before still hit)."""
        self._blocks.pop(key, None)


def make_tiering(
    tmp_path: Path,
    num_blocks: int,
    num_tiers: int = 2,
    *,
    cache_policy: CachePolicyName = "lru",
    enable_events: bool = False,
    tier_capacity: int | None = None,
) -> tuple[TieringOffloadingManager, list[ScriptedTier]]:
    primary = CPUPrimaryTierOffloadingManager(
        make_region(tmp_path, num_blocks), cache_policy, enable_events
    )
    tiers = [
        ScriptedTier(
            primary.get_kv_memoryview(),
            name=f"t{i}",
            enable_events=enable_events,
            capacity_blocks=tier_capacity,
        )
        for i in range(num_tiers)
    ]
    return TieringOffloadingManager(primary, tiers), tiers
