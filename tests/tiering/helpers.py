"""Shared helpers of the tiering tests: keys, chunk contents, specs, primary memory, jobs, lookups
answered by a tier's lookup thread, a scripted tier and a small tiering manager."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from typing_extensions import override

from kvref.base import LookupResult, OffloadingSpec, OffloadKey, ReqContext, ScheduleEndContext, make_offload_key
from kvref.cpu.common import CPULoadStoreSpec
from kvref.tiering.base import JobResult, PrimaryBlocks, SecondaryTierManager, TransferJob
from kvref.tiering.factory import create_tiering_manager
from kvref.tiering.manager import CPUPrimaryTierOffloadingManager, TieringOffloadingManager
from kvref.tiering.memory import InMemorySecondaryTier
from tools._tier_bench import PrimaryRegion, bench_spec

__all__ = [
    "BLOCK_BYTES",
    "CTX",
    "END_OF_STEP",
        "ScriptedTier",
    "content",
    "holds",
    "job",
    "load_chunks",
    "make_region",
    "make_spec",
    "make_tiering",
    "store_chunks",
    "tiering_from_configs",
    "wait_for_hits",
    "make_view",
    "resolve",
    "to_key",
    "to_keys",
]

BLOCK_BYTES = 64
CTX = ReqContext(req_id="r1")
END_OF_STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
_probe_ids = itertools.count()
_job_ids = itertools.count(1000)


def to_key(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def to_keys(ints: Iterable[int]) -> list[OffloadKey]:
    return [to_key(i) for i in ints]


def content(key: bytes, size: int = BLOCK_BYTES) -> bytes:
    """Deterministic chunk bytes of `key` (the same key always holds the same KV data)."""
    pattern = (key * (size // len(key) + 1))[:size]
    return bytes((b + i) % 256 for i, b in enumerate(pattern))


def make_spec(
    *, kv_events: bool = False, model: str = "kvref-tests/model", rank: int = 0, tp_size: int = 1
) -> OffloadingSpec:
    """The spec of one engine: one KV-cache group, one block per chunk."""
    return bench_spec(BLOCK_BYTES, model=model, rank=rank, tp_size=tp_size, kv_events=kv_events)


def make_view(num_blocks: int, block_bytes: int = BLOCK_BYTES) -> memoryview:
    """A stand-in for the primary's memory: a bytearray viewed as (num_blocks, block_bytes)."""
    return memoryview(bytearray(num_blocks * block_bytes)).cast("B", (num_blocks, block_bytes))


def make_region(num_chunks: int, chunk_bytes: int = BLOCK_BYTES) -> PrimaryRegion:
    """The primary's memory for a tiering manager: anonymous and page-aligned, as vLLM's region is."""
    return PrimaryRegion(num_chunks, chunk_bytes)


def job(keys: Sequence[OffloadKey], chunk_ids: Sequence[int], promotion: bool, ctx: ReqContext = CTX) -> TransferJob:
    """A transfer job with a fresh id."""
    return TransferJob(next(_job_ids), tuple(keys), tuple(chunk_ids), promotion, ctx)


def resolve(
    tier: SecondaryTierManager, key: OffloadKey, req_context: ReqContext | None = None, timeout_s: float = 10.0
) -> LookupResult:
    """The tier's answer for `key` once its asynchronous check came back: while it answers RETRY,
    end the step (which sends the check) and ask again. Without `req_context`, a request of its
    own asks, and finishes, so that the verdict is not kept for a later call."""
    context = req_context or ReqContext(req_id=f"probe-{next(_probe_ids)}")
    deadline = time.monotonic() + timeout_s
    result = tier.lookup(key, context)
    while result is LookupResult.RETRY and time.monotonic() < deadline:
        tier.on_schedule_end(END_OF_STEP)
        time.sleep(0.001)
        result = tier.lookup(key, context)
    if req_context is None:
        tier.on_request_finished(context)
    return result


def holds(tier: SecondaryTierManager, keys: Iterable[OffloadKey], timeout_s: float = 10.0) -> list[bool]:
    """Whether the tier answers HIT for each key, asked by one request of its own, which ends
    steps until no answer is RETRY (one round of the tier's checks for all of them)."""
    context = ReqContext(req_id=f"probe-{next(_probe_ids)}")
    keys = list(keys)
    deadline = time.monotonic() + timeout_s
    answers = [tier.lookup(key, context) for key in keys]
    while LookupResult.RETRY in answers and time.monotonic() < deadline:
        tier.on_schedule_end(END_OF_STEP)
        time.sleep(0.001)
        answers = [tier.lookup(key, context) for key in keys]
    tier.on_request_finished(context)
    assert LookupResult.RETRY not in answers, f"lookups still answer {answers}"
    return [answer is LookupResult.HIT for answer in answers]


class ScriptedTier(InMemorySecondaryTier):
    """An in-memory tier that records calls, can hold its jobs, and can fail chosen loads.

    Attributes:
        calls: ("store" | "load" | "touch" | "finished", request id, keys) in call order.
        hold: while True, `get_finished_jobs` reports nothing (jobs stay in flight).
        failing_loads: loads naming any of these keys fail, although `lookup` says HIT until
            one did (then, as the contract asks, MISS for the chunks it lost).
        report_successful: the `successful_keys` such a failed load reports (default: none).
        polls: how many times `get_finished_jobs` was called.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, str, tuple[OffloadKey, ...]]] = []
        self.hold = False
        self.failing_loads: set[OffloadKey] = set()
        self.report_successful: tuple[OffloadKey, ...] | None = None
        self.polls = 0
        self.shutdown_called = False
        self._forced_failures: list[JobResult] = []
        self._lost: set[OffloadKey] = set()  # lost by a failed load: MISS until stored again

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.MISS if key in self._lost else super().lookup(key, req_context)

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        self.calls.append(("store", job_metadata.req_context.req_id, tuple(job_metadata.keys)))
        self._lost.difference_update(job_metadata.keys)
        super().submit_store(job_metadata)

    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        self.calls.append(("load", job_metadata.req_context.req_id, tuple(job_metadata.keys)))
        if self.failing_loads.intersection(job_metadata.keys):
            self._forced_failures.append(JobResult(job_metadata.job_id, False, self.report_successful))
            self._lost.update(set(job_metadata.keys).difference(self.report_successful or ()))
        else:
            super().submit_load(job_metadata)

    def heal(self) -> None:
        """Loads stop failing, and the chunks failed loads lost are found again."""
        self.failing_loads.clear()
        self._lost.clear()

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
        """Drop a chunk silently, as a server evicting it would."""
        self._chunks.pop(key, None)


def make_tiering(
    num_blocks: int,
    num_tiers: int = 2,
    *,
    cache_policy: str = "lru",
    enable_events: bool = False,
    tier_capacity: int | None = None,
    tier_poll_interval_s: float = 0.0,
) -> tuple[TieringOffloadingManager, list[ScriptedTier]]:
    """A tiering manager over `num_blocks` primary chunks and `num_tiers` scripted tiers."""
    primary = CPUPrimaryTierOffloadingManager(num_blocks, make_region(num_blocks), cache_policy, enable_events=enable_events)
    spec = make_spec(kv_events=enable_events)
    tiers = [
        ScriptedTier(
            spec,
            primary.get_kv_memoryview(),
            f"t{i}",
            enable_kv_events=enable_events,
            capacity_chunks=tier_capacity,
        )
        for i in range(num_tiers)
    ]
    return TieringOffloadingManager(primary, list[SecondaryTierManager](tiers), tier_poll_interval_s), tiers


def tiering_from_configs(
    num_chunks: int, chunk_bytes: int, tier_configs: list[dict[str, Any]], spec: OffloadingSpec | None = None
) -> TieringOffloadingManager:
    """An engine's tiering manager: a primary of `num_chunks` rows and the configured tiers."""
    primary = CPUPrimaryTierOffloadingManager(num_chunks, make_region(num_chunks, chunk_bytes))
    return create_tiering_manager(primary, tier_configs, spec or make_spec(), tier_poll_interval_s=0.0)


def _rows(manager: TieringOffloadingManager) -> PrimaryBlocks:
    return PrimaryBlocks(manager.primary_tier.get_kv_memoryview())


def store_chunks(
    manager: TieringOffloadingManager, keys: list[OffloadKey], ctx: ReqContext, fill: Callable[[OffloadKey], bytes]
) -> None:
    """Store `keys` as the GPU would (their bytes: `fill(key)`), then step until every tier
    has its copy. `ctx` must be a request the manager knows (`on_new_request`)."""
    with manager.lock:
        output = manager.prepare_store(keys, ctx)
    assert output is not None and isinstance(output.store_spec, CPULoadStoreSpec)
    rows = _rows(manager)
    for key, chunk_id in zip(output.keys_to_store, output.store_spec.chunk_ids):
        rows.row(chunk_id)[:] = fill(key)
    rows.release()
    with manager.lock:
        manager.complete_store(output.keys_to_store, ctx)
    deadline = time.monotonic() + 30
    while manager.has_pending_work():
        assert time.monotonic() < deadline, "the cascades did not finish"
        with manager.lock:
            manager.on_schedule_end(END_OF_STEP)
        time.sleep(0.001)


def wait_for_hits(manager: TieringOffloadingManager, keys: list[OffloadKey], ctx: ReqContext, timeout_s: float = 10.0) -> None:
    """Look `keys` up, step after step, until each answers HIT (promotions included)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with manager.lock:
            answers = [manager.lookup(key, ctx) for key in keys]
            manager.on_schedule_end(END_OF_STEP)
        if all(answer is LookupResult.HIT for answer in answers):
            return
        assert time.monotonic() < deadline, f"lookups still answer {answers}"
        time.sleep(0.002)


def load_chunks(manager: TieringOffloadingManager, keys: list[OffloadKey], ctx: ReqContext) -> list[bytes]:
    """Load `keys`, which answered HIT, as the GPU would, and return their bytes."""
    with manager.lock:
        spec = manager.prepare_load(keys, ctx)
    rows = _rows(manager)
    loaded = [bytes(rows.row(chunk_id)) for chunk_id in spec.chunk_ids]
    rows.release()
    with manager.lock:
        manager.complete_load(keys, ctx)
    return loaded
