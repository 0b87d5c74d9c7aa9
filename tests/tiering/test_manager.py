"""`TieringOffloadingManager` with kvref's own tiers, its misuse errors, its reset and shutdown
order, its lock and its tier-poll thread.

vLLM 0.33's own tests of the manager run against kvref separately (`tools/vllm_suite.py
--kvref`); these cover what they do not. Keys are small integers; `step` ends a scheduler step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typing_extensions import override

from kvref.base import CacheHitSource, LookupResult, OffloadKey, ReqContext
from kvref.cpu.common import CPULoadStoreSpec
from kvref.errors import OffloadProtocolError
from kvref.tiering.base import JobResult, ParentManager, PrimaryBlocks, TransferJob
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.manager import CPUPrimaryTierOffloadingManager, TieringOffloadingManager
from kvref.tiering.tier_reporting import KvrefTierMetrics
from tests.tiering.helpers import (
    BLOCK_BYTES,
    END_OF_STEP,
    ScriptedTier,
    content,
    load_chunks,
    make_region,
    make_spec,
    make_tiering,
    store_chunks,
    tiering_from_configs,
    to_key,
    to_keys,
    wait_for_hits,
)

R1 = ReqContext(req_id="r1")


def step(manager: TieringOffloadingManager) -> None:
    with manager.lock:
        manager.on_schedule_end(END_OF_STEP)


def request(manager: TieringOffloadingManager, req_id: str) -> ReqContext:
    ctx = ReqContext(req_id=req_id)
    with manager.lock:
        manager.on_new_request(ctx)
    return ctx


def settle(manager: TieringOffloadingManager) -> None:
    """End steps until no job is in flight."""
    deadline = time.monotonic() + 10
    while manager.has_pending_work():
        assert time.monotonic() < deadline, "jobs still in flight"
        step(manager)
        time.sleep(0.001)


def store(manager: TieringOffloadingManager, keys: list[OffloadKey], ctx: ReqContext) -> None:
    """GPU -> primary, without waiting for the cascades."""
    with manager.lock:
        output = manager.prepare_store(keys, ctx)
    assert output is not None and isinstance(output.store_spec, CPULoadStoreSpec)
    rows = PrimaryBlocks(manager.primary_tier.get_kv_memoryview())
    for key, chunk_id in zip(output.keys_to_store, output.store_spec.chunk_ids):
        rows.row(chunk_id)[:] = content(key)
    rows.release()
    with manager.lock:
        manager.complete_store(output.keys_to_store, ctx)


def evict_from_primary(manager: TieringOffloadingManager, fillers: list[OffloadKey]) -> None:
    """Fill the primary with `fillers`: every other chunk is evicted (cascades settled)."""
    filler = request(manager, "filler")
    store_chunks(manager, fillers, filler, content)
    with manager.lock:
        manager.on_request_finished(filler)


# --- kvref's tiers under the manager ---


def test_chunks_round_trip_through_the_memory_and_fs_tiers(tmp_path: Path) -> None:
    manager = tiering_from_configs(
        4,
        BLOCK_BYTES,
        [{"type": "memory", "capacity_chunks": 6}, {"type": "fs", "root_dir": str(tmp_path / "fs")}],
    )
    try:
        ctx = request(manager, "r1")
        keys = to_keys([1, 2, 3])
        store_chunks(manager, keys, ctx, content)  # cascaded to both tiers
        evict_from_primary(manager, to_keys([10, 11, 12, 13]))  # and these: memory drops k1
        reader = request(manager, "reader")
        wait_for_hits(manager, keys, reader)  # promoted: k1 from the disk, k2 and k3 from memory
        assert load_chunks(manager, keys, reader) == [content(key) for key in keys]
        sources = [manager.get_load_source(key, reader) for key in keys]
        assert sources == [CacheHitSource.DISK, CacheHitSource.HOST, CacheHitSource.HOST]
        with manager.lock:
            stats = manager.get_stats()
        assert stats is not None
        _, values = stats.metric_sections()
        assert values[KvrefTierMetrics.CHUNKS_EVICTED] == {("memory",): 1}
        assert values[KvrefTierMetrics.CHUNKS_LOADED] == {("memory",): 2, ("fs",): 1}
        info = manager.config_info()
        assert [series["tier"] for series in info] == ["0:primary", "1:memory", "2:fs"]
        assert info[1]["memory_capacity_chunks"] == 6 and info[2]["fs_fsync"] is False
    finally:
        manager.shutdown()


def test_an_fs_lookup_retries_until_the_lookup_thread_answers_then_promotes(tmp_path: Path) -> None:
    manager = tiering_from_configs(2, BLOCK_BYTES, [{"type": "fs", "root_dir": str(tmp_path / "fs")}])
    try:
        k1 = to_key(1)
        store_chunks(manager, [k1], request(manager, "writer"), content)
        evict_from_primary(manager, to_keys([10, 11]))
        reader = request(manager, "reader")
        with manager.lock:
            assert manager.lookup(k1, reader) is LookupResult.RETRY  # no disk access on this thread
        answers: list[LookupResult] = []
        while not answers or answers[-1] is not LookupResult.HIT:
            step(manager)
            time.sleep(0.002)
            with manager.lock:
                answers.append(manager.lookup(k1, reader))
        assert LookupResult.HIT_PENDING in answers  # its promotion, submitted at a step's end
        assert load_chunks(manager, [k1], reader) == [content(k1)]
    finally:
        manager.shutdown()


def test_a_damaged_chunk_fails_its_promotion_once_then_misses(tmp_path: Path) -> None:
    manager = tiering_from_configs(2, BLOCK_BYTES, [{"type": "fs", "root_dir": str(tmp_path / "fs")}])
    try:
        k1 = to_key(1)
        store_chunks(manager, [k1], request(manager, "writer"), content)
        evict_from_primary(manager, to_keys([10, 11]))
        (tier,) = manager.secondary_tiers
        assert isinstance(tier, FileSystemSecondaryTier)
        location = tier.location(k1)
        assert location is not None
        path, payload_offset, _size = location
        with open(path, "r+b") as file:  # bit rot in the payload: the checksum catches it
            file.seek(payload_offset + 1)
            byte = file.read(1)
            file.seek(payload_offset + 1)
            file.write(bytes([byte[0] ^ 1]))
        reader = request(manager, "reader")
        answers: list[LookupResult] = []
        deadline = time.monotonic() + 10
        while not answers or answers[-1] is not LookupResult.MISS:
            assert time.monotonic() < deadline, answers
            with manager.lock:
                answers.append(manager.lookup(k1, reader))
            step(manager)
            time.sleep(0.002)
        # Found (the file exists), promoted once, failed; never promoted again.
        assert answers.count(LookupResult.HIT_PENDING) >= 1 and LookupResult.HIT not in answers
        for _ in range(3):
            step(manager)
            with manager.lock:
                assert manager.lookup(k1, reader) is LookupResult.MISS
        assert not manager.has_pending_work()
    finally:
        manager.shutdown()


# --- misuse ---


def test_complete_load_of_a_chunk_only_a_cascade_reads_raises_and_changes_nothing() -> None:
    manager, (tier,) = make_tiering(4, num_tiers=1)
    ctx = request(manager, "r1")
    k1 = to_key(1)
    tier.hold = True  # the cascade stays in flight: the primary holds k1 for it
    store(manager, [k1], ctx)
    with manager.lock, pytest.raises(OffloadProtocolError, match="not loaded by the GPU"):
        manager.complete_load([k1], ctx)
    tier.hold = False
    settle(manager)  # the cascade ends and releases its pin, which the error left alone
    with manager.lock:
        spec = manager.prepare_load([k1], ctx)
        manager.complete_load([k1], ctx)
    assert list(spec.chunk_ids) != []
    manager.shutdown()


def test_complete_load_counts_repeated_keys_and_refuses_more_than_was_loaded() -> None:
    manager, _tiers = make_tiering(4, num_tiers=1)
    ctx = request(manager, "r1")
    k1, k2 = to_keys([1, 2])
    store_chunks(manager, [k1, k2], ctx, content)
    with manager.lock:
        manager.prepare_load([k1, k1, k2], ctx)
        with pytest.raises(OffloadProtocolError):
            manager.complete_load([k1, k1, k1], ctx)
        manager.complete_load([k1, k1, k2], ctx)  # the refused call released nothing
        with pytest.raises(OffloadProtocolError):
            manager.complete_load([k2], ctx)
    manager.shutdown()


# --- reset and shutdown order ---


class DrainCheckingTier(ScriptedTier):
    """Holds its jobs until drained; records what the primary held when the drain came."""

    manager: TieringOffloadingManager | None = None
    primary_at_drain: list[LookupResult] | None = None

    @override
    def drain_jobs(self) -> None:
        assert self.manager is not None
        self.primary_at_drain = [
            self.manager.primary_tier.lookup(key, R1) for key in to_keys([1, 2])
        ]
        self.hold = False


def test_reset_drains_every_tier_before_the_primary_then_holds_promotions_until_flushed() -> None:
    primary = CPUPrimaryTierOffloadingManager(4, make_region(4))
    tier = DrainCheckingTier(make_spec(), primary.get_kv_memoryview(), "drain")
    manager = TieringOffloadingManager(primary, [tier], tier_poll_interval_s=0)
    tier.manager = manager
    ctx = request(manager, "r1")
    k1, k2 = to_keys([1, 2])
    tier.hold = True
    store(manager, [k1, k2], ctx)
    assert manager.has_pending_work()
    with manager.lock:
        manager.reset_cache()
    # The tier drained while the primary still held the chunks its cascade reads.
    assert tier.primary_at_drain == [LookupResult.HIT, LookupResult.HIT]
    assert not manager.has_pending_work() and k1 in tier and k2 in tier  # the tier keeps its data
    reader = request(manager, "reader")
    with manager.lock:
        assert manager.lookup(k1, reader) is LookupResult.MISS  # a worker may still write freed slots
        manager.on_reset_flushed()
        assert manager.lookup(k1, reader) is LookupResult.HIT_PENDING
    step(manager)
    with manager.lock:
        assert manager.lookup(k1, reader) is LookupResult.HIT
    manager.shutdown()


class FailingShutdownTier(ScriptedTier):
    @override
    def shutdown(self) -> None:
        super().shutdown()
        raise OSError("the tier's storage went away")


def test_shutdown_stops_every_tier_before_the_primary_and_keeps_its_memory_if_one_fails() -> None:
    manager, tiers = make_tiering(4, num_tiers=2)
    view = manager.primary_tier.get_kv_memoryview()
    manager.shutdown()
    assert all(tier.shutdown_called for tier in tiers)
    with pytest.raises(ValueError):  # released with the primary
        view.cast("B")
    primary = CPUPrimaryTierOffloadingManager(4, make_region(4))
    good = ScriptedTier(make_spec(), primary.get_kv_memoryview(), "good")
    bad = FailingShutdownTier(make_spec(), primary.get_kv_memoryview(), "bad")
    manager = TieringOffloadingManager(primary, [bad, good], tier_poll_interval_s=0)
    with pytest.raises(OSError, match="storage went away"):
        manager.shutdown()
    assert good.shutdown_called  # the others still shut down
    assert primary.get_kv_memoryview().cast("B")[0] == 0  # the failed tier may still use it: kept


# --- the lock and the tier-poll thread ---


class PeerTier(ScriptedTier):
    """A tier answering a peer between steps: what the poll thread finds when it serves it."""

    tolerates_off_thread_polling: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.manager: TieringOffloadingManager | None = None
        self.served_from: list[str] = []
        self.lock_held: list[bool] = []
        self.peer_keys: list[OffloadKey] = []
        self.peer_results: list[list[LookupResult]] = []

    @override
    def serve_external_requests(self, parent: ParentManager) -> None:
        if self.manager is None:
            return  # the thread's first rounds may come before the test hands the manager over
        self.served_from.append(threading.current_thread().name)
        self.lock_held.append(self.manager.lock.locked())
        if not self.peer_keys:
            return
        keys, self.peer_keys = self.peer_keys, []
        peer = ReqContext(req_id=f"peer-{len(self.peer_results)}")
        parent.on_new_request(peer)
        results = [parent.lookup(key, peer) for key in keys]
        self.peer_results.append(results)
        hits = [key for key, result in zip(keys, results) if result is LookupResult.HIT]
        if hits:
            job = parent.create_store_job(hits, peer)  # pinned until this tier reports the job
            self.submit_store(job)
        parent.on_request_finished(peer)

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        # A peer's request never fans out back to the tier serving it.
        assert not req_context.req_id.startswith("peer-"), "the serving tier was asked"
        return super().lookup(key, req_context)


def make_peer_tiering(interval_s: float) -> tuple[TieringOffloadingManager, PeerTier, ScriptedTier]:
    primary = CPUPrimaryTierOffloadingManager(8, make_region(8))
    peer = PeerTier(make_spec(), primary.get_kv_memoryview(), "peer")
    other = ScriptedTier(make_spec(), primary.get_kv_memoryview(), "other")
    manager = TieringOffloadingManager(primary, [peer, other], tier_poll_interval_s=interval_s)
    peer.manager = manager
    return manager, peer, other


def wait_until(condition: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def test_the_poll_thread_serves_a_tolerant_tier_between_steps_under_the_lock() -> None:
    manager, peer, other = make_peer_tiering(interval_s=0.001)
    try:
        ctx = request(manager, "r1")
        keys = to_keys([1, 2])
        store(manager, keys, ctx)
        # No step ends: the thread alone collects the tolerant tier's finished cascade.
        wait_until(lambda: peer.polls > 0 and any(name != threading.current_thread().name for name in peer.served_from), "a round")
        assert all(peer.lock_held)
        peer.peer_keys = [keys[0], to_key(9)]
        wait_until(lambda: peer.peer_results, "the peer's request")
        assert peer.peer_results == [[LookupResult.HIT, LookupResult.MISS]]
        settle(manager)  # the other tier's cascade is collected at steps only
        assert other.polls > 0 and keys[0] in peer
    finally:
        manager.shutdown()


def test_the_poll_thread_waits_while_the_scheduler_holds_the_lock() -> None:
    manager, peer, _other = make_peer_tiering(interval_s=0.001)
    try:
        wait_until(lambda: len(peer.served_from) > 2, "rounds")
        with manager.lock:
            rounds = len(peer.served_from)
            time.sleep(0.05)
            assert len(peer.served_from) == rounds
        wait_until(lambda: len(peer.served_from) > rounds, "rounds after the release")
    finally:
        manager.shutdown()
    rounds = len(peer.served_from)
    time.sleep(0.02)
    assert len(peer.served_from) == rounds and peer.shutdown_called  # stopped before the tiers


def test_without_a_tolerant_tier_or_an_interval_tiers_are_served_at_steps_only() -> None:
    manager, peer, _other = make_peer_tiering(interval_s=0)
    try:
        time.sleep(0.02)
        assert peer.served_from == []
        step(manager)
        assert peer.served_from == [threading.current_thread().name]
    finally:
        manager.shutdown()
    manager, tiers = make_tiering(4, tier_poll_interval_s=0.001)  # no tier opts in: no thread
    assert not any(thread.name == "kvref_offload_tier_poll" for thread in threading.enumerate() if thread.is_alive())
    manager.shutdown()
    assert all(tier.shutdown_called for tier in tiers)


def test_shutdown_refuses_to_tear_tiers_down_under_a_live_round(monkeypatch: pytest.MonkeyPatch) -> None:
    manager, peer, _other = make_peer_tiering(interval_s=0.001)
    from kvref.tiering import manager as manager_module

    monkeypatch.setattr(manager_module, "JOIN_TIMEOUT_S", 0.05)
    stuck = threading.Event()
    release = threading.Event()

    def hang(parent: ParentManager) -> None:
        stuck.set()
        release.wait(10)

    peer.serve_external_requests = hang
    stuck.wait(10)
    poller = manager._tier_poll_thread  # pyright: ignore[reportPrivateUsage]
    assert poller is not None

    def ignore_stop(self: object) -> None:  # the thread will not stop
        return None

    monkeypatch.setattr(type(poller), "stop", ignore_stop)
    with pytest.raises(RuntimeError, match="tier-poll thread is still running"):
        manager.shutdown()
    assert not peer.shutdown_called  # not torn down under the round
    release.set()
    monkeypatch.undo()
    peer.serve_external_requests = lambda parent: None
    manager.shutdown()
    assert peer.shutdown_called


# --- requests reach the tiers in order ---


class RecordingTier(ScriptedTier):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order: list[str] = []

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        self.order.append(f"store:{job_metadata.req_context.req_id}")
        super().submit_store(job_metadata)

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        self.order.append(f"finished:{req_context.req_id}")

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        return super().get_finished_jobs()

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.order.append(f"touch:{len(keys)}")


def test_a_request_finishes_in_the_tiers_after_its_last_store_was_submitted() -> None:
    primary = CPUPrimaryTierOffloadingManager(4, make_region(4))
    tier = RecordingTier(make_spec(), primary.get_kv_memoryview(), "rec")
    manager = TieringOffloadingManager(primary, [tier], tier_poll_interval_s=0)
    ctx = request(manager, "r1")
    k1 = to_key(1)
    with manager.lock:
        output = manager.prepare_store([k1], ctx)
        manager.on_request_finished(ctx)  # the GPU store is still in flight
    assert tier.order == []
    assert output is not None
    with manager.lock:
        manager.complete_store(output.keys_to_store, ctx)
        manager.touch([k1], ctx)
    assert tier.order == ["store:r1", "finished:r1", "touch:1"]
    manager.shutdown()
