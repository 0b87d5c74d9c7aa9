"""Scenario tests of `TieringOffloadingManager`: one rule of kv-offload.md section 5 per test.

Keys are small integers; "step" comments mark where the connector would end a scheduler step.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest

from kvref.base import OffloadingEvent, OffloadKey, ReqContext
from kvref.cpu.common import CPULoadStoreSpec
from kvref.errors import KVRefError, OffloadProtocolError
from kvref.tiering.base import JobMetadata
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.manager import (
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
    create_tiering_manager,
)
from tests.tiering.helpers import (
    BLOCK_BYTES,
    ScriptedTier,
    content,
    make_region,
    make_tiering,
    to_key,
    to_keys,
)

R1 = ReqContext(req_id="r1")
R2 = ReqContext(req_id="r2")


def store(manager: TieringOffloadingManager, keys: list[OffloadKey], ctx: ReqContext = R1) -> None:
    """GPU -> primary: prepare, write each key's content into its slot, complete."""
    output = manager.prepare_store(keys, ctx)
    assert output is not None, f"no room to store {keys}"
    assert isinstance(output.store_spec, CPULoadStoreSpec)
    rows = manager.primary.get_kv_memoryview().cast("B")
    for key, block_id in zip(output.keys_to_store, output.store_spec.block_ids):
        rows[block_id * BLOCK_BYTES : (block_id + 1) * BLOCK_BYTES] = content(key)
    manager.complete_store(keys, ctx)


def load(manager: TieringOffloadingManager, key: OffloadKey, ctx: ReqContext = R1) -> bytes:
    """Primary -> GPU: the bytes the worker would copy for `key`."""
    spec = manager.prepare_load([key], ctx)
    block_id = spec.block_ids[0]
    data = bytes(manager.primary.get_kv_memoryview().cast("B")[block_id * BLOCK_BYTES :][:BLOCK_BYTES])
    manager.complete_load([key], ctx)
    return data


def ref_cnt(manager: TieringOffloadingManager, key: OffloadKey) -> int | None:
    block = manager.primary.policy.get(key)
    return None if block is None else block.ref_cnt


def evict_from_primary(manager: TieringOffloadingManager, keys: list[OffloadKey], fillers: list[OffloadKey]) -> None:
    """Store `fillers` so that `keys` are evicted from a full primary (cascades settled first)."""
    manager.end_step()
    store(manager, fillers)
    manager.end_step()
    for key in keys:
        assert manager.primary.lookup(key, R1) is False


# --- cascade ---


def test_store_cascades_to_every_tier_with_one_reference_per_tier(tmp_path: Path) -> None:
    manager, (t0, t1) = make_tiering(tmp_path, num_blocks=4)
    k1, k2 = to_keys([1, 2])
    store(manager, [k1, k2])
    # complete_store -> one submit_store per tier, each holding a read ref: ref_cnt 2
    assert t0.kinds("store") == [("store", "r1", (k1, k2))]
    assert t1.kinds("store") == [("store", "r1", (k1, k2))]
    assert ref_cnt(manager, k1) == ref_cnt(manager, k2) == 2
    assert manager.num_inflight_jobs == 2

    t1.hold = True
    manager.end_step()
    assert manager.lookup(k1, R1) is True  # polls: t0 finished, t1 still copying
    assert ref_cnt(manager, k1) == 1
    assert t0.lookup(k1, R1) is True and t1.lookup(k1, R1) is None

    t1.hold = False
    manager.end_step()
    manager.lookup(k1, R1)
    assert ref_cnt(manager, k1) == ref_cnt(manager, k2) == 0
    assert manager.num_inflight_jobs == 0
    assert t1.lookup(k2, R1) is True
    assert load(manager, k2) == content(k2)


def test_failed_store_cascades_nothing(tmp_path: Path) -> None:
    manager, (t0, t1) = make_tiering(tmp_path, num_blocks=4)
    k1 = to_key(1)
    assert manager.prepare_store([k1], R1) is not None
    manager.complete_store([k1], R1, success=False)
    assert t0.calls == t1.calls == []
    assert manager.lookup(k1, R1) is False
    assert manager.primary.num_free_blocks == 4


def test_complete_store_only_finishes_keys_it_prepared(tmp_path: Path) -> None:
    manager, (t0,) = make_tiering(tmp_path, num_blocks=2, num_tiers=1)
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])
    evict_from_primary(manager, [k1], [k2, k3])
    assert manager.lookup(k1, R2) is None  # promotion staged: k1's slot is pending
    # A caller passing a superset must not mark the promotion's slot as written.
    manager.complete_store([k1, to_key(9)], R1)
    assert manager.primary.lookup(k1, R1) is None
    assert t0.kinds("store") == [("store", "r1", (k1,)), ("store", "r1", (k2, k3))]


def test_eviction_in_primary_waits_for_cascades(tmp_path: Path) -> None:
    manager, tiers = make_tiering(tmp_path, num_blocks=2)
    k1, k2, k3 = to_keys([1, 2, 3])
    for tier in tiers:
        tier.hold = True
    store(manager, [k1, k2])
    manager.end_step()
    # Both blocks are pinned by cascades in flight: nothing can be evicted.
    assert manager.prepare_store([k3], R1) is None
    for tier in tiers:
        tier.hold = False
    manager.end_step()
    # The step's first call collects the finished cascades before deciding evictions.
    output = manager.prepare_store([k3], R1)
    assert output is not None and output.evicted_keys == [k1]


def test_submit_that_raises_is_a_failed_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2)

    def explode(job: JobMetadata) -> None:
        raise RuntimeError("tier bug")

    monkeypatch.setattr(t0, "submit_store", explode)
    k1 = to_key(1)
    with caplog.at_level(logging.ERROR):
        store(manager, [k1])
    assert "raised from submit" in caplog.text
    assert ref_cnt(manager, k1) == 1  # only t1's reference remains
    assert manager.num_inflight_jobs == 1


# --- lookup and promotion ---


def test_lookup_order_primary_then_tiers(tmp_path: Path) -> None:
    manager, (t0, t1) = make_tiering(tmp_path, num_blocks=2)
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])
    assert manager.lookup(k1, R1) is True  # primary hit: no tier asked
    evict_from_primary(manager, [k1], [k2, k3])
    assert manager.lookup(k1, R1) is None
    manager.end_step()
    # Both tiers hold k1; the first in order serves it.
    assert t0.kinds("load") == [("load", "r1", (k1,))]
    assert t1.kinds("load") == []
    assert manager.lookup(to_key(42), R1) is False


def test_pending_write_in_a_tier_answers_retry(tmp_path: Path) -> None:
    manager, (t0,) = make_tiering(tmp_path, num_blocks=2, num_tiers=1)
    k1 = to_key(1)
    t0.hold = True
    t0.submit_store(JobMetadata(100, (k1,), (0,), False, R1))
    assert manager.lookup(k1, R1) is None  # the tier's write is in flight
    assert t0.kinds("load") == []


def test_promotion_is_staged_then_batched_per_tier_and_request(tmp_path: Path) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=4)
    keys = to_keys(range(1, 5))
    store(manager, keys)
    fillers = to_keys(range(10, 14))
    evict_from_primary(manager, keys, fillers)
    free_before = manager.primary.num_free_blocks

    # Step 1: lookups reserve primary slots at once and answer "retry"; nothing submitted yet.
    assert manager.lookup(keys[0], R1) is None
    assert manager.lookup(keys[1], R1) is None
    assert manager.lookup(keys[2], R2) is None
    assert manager.primary.lookup(keys[0], R1) is None
    assert manager.primary.num_free_blocks == free_before  # (evictions made room, 0 free)
    assert t0.kinds("load") == []
    manager.end_step()
    # One submit_load per (tier, request), keys in lookup order.
    assert t0.kinds("load") == [("load", "r1", (keys[0], keys[1])), ("load", "r2", (keys[2],))]

    # Step 2: the promotions finished; the blocks load from the primary with their bytes.
    assert manager.lookup(keys[0], R1) is True
    assert load(manager, keys[0]) == content(keys[0])
    assert load(manager, keys[2], R2) == content(keys[2])


def test_shared_block_is_promoted_once(tmp_path: Path) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2)
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])
    evict_from_primary(manager, [k1], [k2, k3])
    assert manager.lookup(k1, R1) is None
    assert manager.lookup(k1, R2) is None  # sees the reserved slot: no second promotion
    assert manager.lookup(k1, R1) is None
    manager.end_step()
    assert t0.kinds("load") == [("load", "r1", (k1,))]
    assert manager.lookup(k1, R2) is True


def test_failed_promotion_frees_the_slot_and_then_misses(tmp_path: Path) -> None:
    manager, (t0, t1) = make_tiering(tmp_path, num_blocks=2)
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])
    evict_from_primary(manager, [k1], [k2, k3])
    t0.failing_loads.add(k1)
    t1.failing_loads.add(k1)

    assert manager.lookup(k1, R1) is None
    manager.end_step()
    # The load failed: the slot is freed and t0 is not asked for k1 again, so t1 is tried
    # (reserving a slot again).
    assert manager.lookup(k1, R1) is None
    assert manager.primary.num_free_blocks == 0
    manager.end_step()
    assert manager.lookup(k1, R1) is False  # both failed: a miss, not "retry" forever
    assert manager.lookup(k1, R1) is False
    manager.end_step()
    assert t0.kinds("load") == [("load", "r1", (k1,))]
    assert t1.kinds("load") == [("load", "r1", (k1,))]
    assert manager.primary.num_free_blocks == 1
    assert manager.primary.num_idle_blocks == 1  # the other slot went to the promotion

    # Storing k1 again (GPU -> primary -> tiers) makes the tiers eligible again.
    t0.failing_loads.clear()
    store(manager, [k1])
    manager.end_step()
    evict_from_primary(manager, [k1], [k2, k3])
    assert manager.lookup(k1, R1) is None
    manager.end_step()
    assert manager.lookup(k1, R1) is True


def test_failed_promotion_keeps_the_blocks_the_tier_loaded(tmp_path: Path) -> None:
    # As vLLM's manager: a failed job's `successful_keys` are complete in their slots and stay;
    # only the others are freed (and that tier is not asked for them again).
    manager, (t0, t1) = make_tiering(tmp_path, num_blocks=2)
    k1, k2, k3, k4 = to_keys([1, 2, 3, 4])
    store(manager, [k1, k2])
    evict_from_primary(manager, [k1, k2], [k3, k4])
    assert manager.lookup(k1, R1) is None
    assert manager.lookup(k2, R1) is None
    t0.lose(k2)  # gone from the first tier between the lookup and the load
    manager.end_step()
    assert t0.kinds("load") == [("load", "r1", (k1, k2))]
    assert manager.lookup(k1, R1) is True
    assert load(manager, k1) == content(k1)
    assert manager.lookup(k2, R1) is None  # t0 failed it; t1 still has it
    manager.end_step()
    assert t1.kinds("load") == [("load", "r1", (k2,))]
    assert manager.lookup(k2, R1) is True and load(manager, k2) == content(k2)
    stats = manager.tier_stats()
    assert (stats[t0.medium].failed_jobs, stats[t0.medium].blocks_loaded) == (1, 1)


def test_unknown_successful_keys_fail_the_whole_promotion(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A tier naming a key its job does not have is not trusted with any: nothing is kept.
    manager, (t0,) = make_tiering(tmp_path, num_blocks=2, num_tiers=1)
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])
    evict_from_primary(manager, [k1], [k2, k3])
    t0.failing_loads.add(k1)
    t0.report_successful = (k1, k3)
    assert manager.lookup(k1, R1) is None
    with caplog.at_level(logging.WARNING):
        manager.end_step()
        assert manager.lookup(k1, R1) is False
    assert "reported successful keys that job" in caplog.text
    assert manager.primary.lookup(k3, R1) is True  # untouched by the bogus report
    assert manager.primary.num_free_blocks == 1  # k1's reserved slot was freed


def test_promotion_without_room_in_primary_is_a_miss(tmp_path: Path) -> None:
    manager, tiers = make_tiering(tmp_path, num_blocks=1, num_tiers=1)
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])
    evict_from_primary(manager, [k1], [k2])
    store(manager, [k3])  # k2 evicted; k3 pinned by its cascade
    tiers[0].hold = True
    manager.end_step()
    assert manager.lookup(k1, R1) is False
    assert tiers[0].kinds("load") == []


# --- touch, request lifecycle, events ---


def test_touch_is_forwarded_to_primary_and_every_tier(tmp_path: Path) -> None:
    manager, (t0, t1) = make_tiering(tmp_path, num_blocks=2)
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1, k2])
    manager.end_step()
    manager.lookup(k3, R1)  # collects the cascades: k1, k2 idle (k2 most recent)
    manager.touch([k1], R1)  # k1 becomes most recent in the primary
    assert t0.kinds("touch") == t1.kinds("touch") == [("touch", "r1", (k1,))]
    output = manager.prepare_store([k3], R1)
    assert output is not None and output.evicted_keys == [k2]


def test_request_finish_reaches_tiers_after_its_cascades(tmp_path: Path) -> None:
    manager, (t0, t1) = make_tiering(tmp_path, num_blocks=4)
    k1 = to_key(1)
    assert manager.prepare_store([k1], R1) is not None
    manager.on_request_finished(R1)
    assert t0.kinds("finished") == []  # a store of r1 is still pending
    manager.complete_store([k1], R1)
    assert t0.kinds("store", "finished") == [("store", "r1", (k1,)), ("finished", "r1", ())]
    assert t1.kinds("store", "finished") == [("store", "r1", (k1,)), ("finished", "r1", ())]


def test_request_finish_reaches_tiers_after_its_promotions(tmp_path: Path) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2)
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])
    evict_from_primary(manager, [k1], [k2, k3])
    assert manager.lookup(k1, R2) is None
    manager.on_request_finished(R2)
    assert t0.kinds("finished") == []  # r2's promotion is staged, not yet submitted
    manager.end_step()
    assert t0.kinds("load", "finished") == [("load", "r2", (k1,)), ("finished", "r2", ())]


def test_request_without_pending_work_finishes_at_once(tmp_path: Path) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2)
    manager.on_request_finished(R2)
    assert t0.kinds("finished") == [("finished", "r2", ())]


def test_take_events_ends_the_step_and_aggregates(tmp_path: Path) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2, enable_events=True)
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])
    assert manager.take_events() == [OffloadingEvent([k1], "CPU", removed=False)]
    manager.lookup(k1, R1)  # collects the cascades
    assert manager.take_events() == [
        OffloadingEvent([k1], "t0", removed=False),
        OffloadingEvent([k1], "t1", removed=False),
    ]
    evict_from_primary(manager, [k1], [k2, k3])
    manager.take_events()
    assert manager.lookup(k1, R1) is None
    manager.take_events()  # ends the step: the staged promotion is submitted
    assert t0.kinds("load") == [("load", "r1", (k1,))]


def test_finished_jobs_are_polled_once_per_step(tmp_path: Path) -> None:
    manager, (t0, t1) = make_tiering(tmp_path, num_blocks=4)
    k1, k2 = to_keys([1, 2])
    for key in (k1, k2):
        manager.lookup(key, R1)
    manager.prepare_store([k1], R1)
    assert (t0.polls, t1.polls) == (1, 1)
    manager.end_step()
    manager.lookup(k2, R1)
    manager.lookup(k2, R1)
    assert (t0.polls, t1.polls) == (2, 2)


def test_unknown_job_ids_are_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2)
    t0.submit_store(JobMetadata(999, (), (), False, R1))
    with caplog.at_level(logging.WARNING):
        assert manager.lookup(to_key(1), R1) is False
    assert "job 999, which it was not running" in caplog.text


# --- reset and shutdown ---


def test_reset_drains_jobs_drops_staged_promotions_and_keeps_tier_data(tmp_path: Path) -> None:
    manager, (t0, t1) = make_tiering(tmp_path, num_blocks=2)
    k1, k2, k3, k4 = to_keys([1, 2, 3, 4])
    store(manager, [k1])
    evict_from_primary(manager, [k1], [k2, k3])
    assert manager.lookup(k1, R2) is None  # staged
    manager.on_request_finished(R2)
    assert manager.prepare_store([k4], R1) is not None  # a GPU store in flight
    manager.reset_cache()

    assert manager.num_inflight_jobs == 0 and not manager.has_pending_work()
    assert manager.primary.num_free_blocks == 2
    assert t0.kinds("load") == []  # the staged promotion was never submitted
    assert t0.kinds("finished") == [("finished", "r2", ())]
    manager.complete_store([k4], R1)  # a stale completion after the reset is ignored
    assert t0.kinds("store")[-1] == ("store", "r1", (k2, k3))
    # The tiers kept their blocks: k1 is promoted again.
    assert manager.lookup(k1, R1) is None
    manager.end_step()
    assert load(manager, k1) == content(k1)
    assert t1.lookup(k3, R1) is True


def test_reset_gives_up_on_jobs_that_never_finish(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    primary = CPUPrimaryTierOffloadingManager(make_region(tmp_path, 2))
    tier = ScriptedTier(primary.get_kv_memoryview())
    manager = TieringOffloadingManager(primary, [tier], drain_timeout_s=0.01)
    tier.hold = True
    store(manager, [to_key(1)])
    with caplog.at_level(logging.ERROR):
        manager.reset_cache()
    assert "did not finish within" in caplog.text
    assert manager.num_inflight_jobs == 0


def test_shutdown_stops_tiers_before_the_primary(tmp_path: Path) -> None:
    manager, tiers = make_tiering(tmp_path, num_blocks=2)
    region = manager.primary.region
    store(manager, [to_key(1)])
    manager.shutdown()
    assert all(tier.shutdown_called for tier in tiers)
    assert region.closed and not region.path.exists()
    with pytest.raises(KVRefError, match="shut down"):
        manager.primary.get_kv_memoryview()
    manager.shutdown()  # idempotent


# --- primary tier and construction ---


def test_primary_read_write_aliases_and_view(tmp_path: Path) -> None:
    primary = CPUPrimaryTierOffloadingManager(make_region(tmp_path, 3), "arc")
    view = primary.get_kv_memoryview()
    assert view.shape == (3, BLOCK_BYTES)
    k1 = to_key(1)
    output = primary.prepare_write([k1], R1)
    assert output is not None and output.keys_to_store == [k1]
    assert primary.lookup(k1, R1) is None
    primary.complete_write([k1], R1)
    spec = primary.prepare_read([k1], R1)
    assert spec.block_ids.tolist() == [0]
    assert primary.policy.get(k1) is not None
    primary.complete_read([k1], R1)
    assert primary.num_idle_blocks == 1
    primary.shutdown()


def test_create_tiering_manager_from_configs(tmp_path: Path) -> None:
    manager = create_tiering_manager(
        make_region(tmp_path, 4),
        [{"type": "memory"}, {"type": "fs", "root_dir": tmp_path / "fs", "name": "disk"}],
        enable_events=True,
    )
    assert [tier.medium for tier in manager.secondary_tiers] == ["memory", "disk"]
    k1 = to_key(1)
    store(manager, [k1])
    manager.end_step()
    for tier in manager.secondary_tiers:
        tier.drain_jobs()
    manager.lookup(k1, R1)
    assert manager.secondary_tiers[1].lookup(k1, R1) is True
    manager.shutdown()


def test_create_tiering_manager_cleans_up_after_a_bad_config(tmp_path: Path) -> None:
    region = make_region(tmp_path, 4)
    with pytest.raises(ValueError, match="registered types: fs, memory"):
        create_tiering_manager(region, [{"type": "memory"}, {"type": "tape"}])
    assert region.closed and not region.path.exists()


def test_invalid_manager_arguments(tmp_path: Path) -> None:
    primary = CPUPrimaryTierOffloadingManager(make_region(tmp_path, 1))
    with pytest.raises(ValueError, match="failed_promotion_memory must be >= 0"):
        TieringOffloadingManager(primary, failed_promotion_memory=-1)
    with pytest.raises(ValueError, match="drain_timeout_s must be >= 0"):
        TieringOffloadingManager(primary, drain_timeout_s=-1)
    primary.shutdown()


def test_end_to_end_through_the_filesystem_tier(tmp_path: Path) -> None:
    primary = CPUPrimaryTierOffloadingManager(make_region(tmp_path, 2))
    disk = FileSystemSecondaryTier(primary.get_kv_memoryview(), tmp_path / "fs", n_read_threads=1, n_write_threads=1)
    manager = TieringOffloadingManager(primary, [disk])
    keys = to_keys([1, 2, 3, 4])
    store(manager, keys[:2])
    manager.end_step()
    disk.drain_jobs()
    store(manager, keys[2:])  # evicts 1 and 2 once their cascades were collected
    manager.end_step()
    disk.drain_jobs()
    assert manager.primary.lookup(keys[0], R1) is False
    assert manager.lookup(keys[0], R1) is None
    manager.end_step()
    disk.drain_jobs()
    assert manager.lookup(keys[0], R1) is True
    assert load(manager, keys[0]) == content(keys[0])
    manager.shutdown()


# --- idle steps (issue 13, point 1) ---


def test_idle_steps_release_cascades_and_finish_promotions(tmp_path: Path) -> None:
    manager, (t0, t1) = make_tiering(tmp_path, num_blocks=2)
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])  # prepare_store polled this step's finished jobs: none yet
    manager.end_step()
    assert ref_cnt(manager, k1) == 2  # one read reference per tier's cascade
    assert manager.has_pending_work()
    # An idle step: no lookup or prepare call, only the step end, which collects the cascades.
    manager.end_step()
    assert ref_cnt(manager, k1) == 0
    assert manager.num_inflight_jobs == 0 and not manager.has_pending_work()

    evict_from_primary(manager, [k1], [k2, k3])
    assert manager.lookup(k1, R1) is None  # staged
    manager.end_step()  # submitted
    assert manager.has_pending_work()
    # The engine is idle: it only keeps stepping while there is pending work.
    steps = 0
    while manager.has_pending_work():
        manager.end_step()
        steps += 1
        assert steps < 5, "an idle engine would step forever"
    assert steps == 1
    assert manager.primary.lookup(k1, R1) is True
    assert load(manager, k1) == content(k1)
    assert t0.kinds("load") == [("load", "r1", (k1,))] and t1.kinds("load") == []


def test_idle_steps_through_take_events(tmp_path: Path) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2, enable_events=True)
    k1 = to_key(1)
    store(manager, [k1])
    assert manager.take_events() == [OffloadingEvent([k1], "CPU", removed=False)]
    assert manager.has_pending_work()
    # An idle step: take_events ends it, collecting the cascades, whose events it returns.
    events = manager.take_events()
    assert OffloadingEvent([k1], "t0", removed=False) in events
    assert ref_cnt(manager, k1) == 0 and not manager.has_pending_work()
    assert t0.polls == 2


def test_a_step_with_calls_polls_once_and_its_end_does_not_poll_again(tmp_path: Path) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2)
    manager.lookup(to_key(1), R1)
    manager.end_step()
    assert t0.polls == 1
    manager.end_step()  # an idle step
    assert t0.polls == 2


def test_held_jobs_keep_the_engine_stepping_until_they_finish(tmp_path: Path) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2)
    k1 = to_key(1)
    t0.hold = True
    store(manager, [k1])
    manager.end_step()
    for _ in range(3):
        manager.end_step()
        assert manager.has_pending_work() and ref_cnt(manager, k1) == 1
    t0.hold = False
    manager.end_step()
    assert not manager.has_pending_work() and ref_cnt(manager, k1) == 0


def test_a_tier_with_work_of_its_own_keeps_the_engine_stepping(tmp_path: Path) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2)
    busy = [True]
    t0.has_pending_work = lambda: busy[0]
    assert manager.has_pending_work()
    busy[0] = False
    assert not manager.has_pending_work()


def test_idle_steps_with_the_filesystem_tier(tmp_path: Path) -> None:
    manager = create_tiering_manager(
        make_region(tmp_path, 2),
        [{"type": "fs", "root_dir": str(tmp_path / "fs"), "n_read_threads": 1, "n_write_threads": 1}],
    )
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])
    steps = 0
    while manager.has_pending_work():
        manager.end_step()
        steps += 1
        assert steps < 10_000
        time.sleep(0.001)
    assert ref_cnt(manager, k1) == 0
    store(manager, [k2, k3])  # evicts k1 from the primary
    while manager.has_pending_work():
        manager.end_step()
        time.sleep(0.001)
    assert manager.primary.lookup(k1, R1) is False
    assert manager.lookup(k1, R1) is None
    manager.end_step()
    while manager.has_pending_work():
        manager.end_step()
        time.sleep(0.001)
    assert load(manager, k1) == content(k1)
    manager.shutdown()


# --- complete_load checks the caller's own loads (point 8) ---


def test_complete_load_of_a_block_only_a_cascade_reads_is_refused(tmp_path: Path) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2)
    k1 = to_key(1)
    t0.hold = True
    store(manager, [k1])
    manager.end_step()
    manager.end_step()
    assert ref_cnt(manager, k1) == 1  # t0's cascade still reads it
    with pytest.raises(OffloadProtocolError, match=r"complete_load: key .* is reading\(1\) \(0 GPU loads"):
        manager.complete_load([k1], R1)
    assert ref_cnt(manager, k1) == 1  # nothing changed
    t0.hold = False
    manager.end_step()
    assert ref_cnt(manager, k1) == 0 and not manager.has_pending_work()


def test_complete_load_counts_repeated_keys_and_changes_nothing_on_error(tmp_path: Path) -> None:
    manager, _ = make_tiering(tmp_path, num_blocks=4)
    k1, k2 = to_keys([1, 2])
    store(manager, [k1, k2])
    manager.end_step()
    manager.prepare_load([k1, k2], R1)
    with pytest.raises(OffloadProtocolError, match="1 GPU loads of it in progress, 2 released"):
        manager.complete_load([k2, k1, k1], R1)
    assert (ref_cnt(manager, k1), ref_cnt(manager, k2)) == (1, 1)
    manager.complete_load([k1, k2], R1)
    assert (ref_cnt(manager, k1), ref_cnt(manager, k2)) == (0, 0)
    with pytest.raises(OffloadProtocolError, match="is idle"):
        manager.complete_load([k1], R1)
    with pytest.raises(OffloadProtocolError, match="is absent"):
        manager.complete_load([to_key(9)], R1)


# --- statistics (point 6) ---


def test_tier_stats_count_what_each_tier_did(tmp_path: Path) -> None:
    manager, (t0, t1) = make_tiering(tmp_path, num_blocks=2, tier_capacity=None)
    t1._capacity = 1  # pyright: ignore[reportPrivateUsage]
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])
    manager.end_step()
    assert load(manager, k1) == content(k1)
    evict_from_primary(manager, [k1], [k2, k3])  # t1 keeps only one block: it evicts
    assert manager.lookup(k1, R1) is None  # primary miss, t0 hit: staged
    manager.end_step()
    manager.end_step()
    assert manager.lookup(to_key(9), R1) is False
    t0.failing_loads.add(k2)
    store(manager, [k1])  # already there
    stats = manager.tier_stats()
    assert list(stats) == ["CPU", "t0", "t1"]
    cpu, s0, s1 = stats.values()
    assert (cpu.lookups, cpu.hits, cpu.misses) == (2, 0, 2)
    assert (cpu.blocks_stored, cpu.blocks_loaded, cpu.blocks_evicted) == (3, 1, 1)
    assert cpu.usage == 1.0 and cpu.failed_jobs == 0
    assert (s0.lookups, s0.hits, s0.misses) == (2, 1, 1)
    assert (s0.blocks_stored, s0.blocks_loaded, s0.blocks_evicted, s0.failed_jobs) == (3, 1, 0, 0)
    assert s0.usage is None
    assert (s1.lookups, s1.hits, s1.misses) == (1, 0, 1)
    assert (s1.blocks_stored, s1.blocks_evicted) == (3, 2)
    assert s1.usage == 1.0
    # A snapshot: later activity does not change it.
    manager.lookup(k1, R1)
    assert cpu.lookups == 2
    # get_stats: the primary manager's counters on top, every tier's in `tiers`.
    scraped = manager.get_stats()
    assert list(scraped.tiers) == ["CPU", "t0", "t1"]
    assert scraped.tiers["t1"].blocks_evicted == 2 and scraped.tiers["t0"].hits == 1
    assert (scraped.num_blocks, scraped.used_blocks) == (2, 2)
    assert scraped.blocks_stored >= 3 and scraped.lookups >= 1


def test_tier_stats_count_failed_jobs(tmp_path: Path) -> None:
    manager, (t0, _) = make_tiering(tmp_path, num_blocks=2)
    k1, k2, k3 = to_keys([1, 2, 3])
    store(manager, [k1])
    evict_from_primary(manager, [k1], [k2, k3])
    t0.failing_loads.add(k1)
    assert manager.lookup(k1, R1) is None
    manager.end_step()
    manager.end_step()
    assert manager.tier_stats()["t0"].failed_jobs == 1
    output = manager.prepare_store([to_key(4)], R1)
    assert output is not None
    manager.complete_store([to_key(4)], R1, success=False)
    assert manager.tier_stats()["CPU"].failed_jobs == 1


# --- configuration errors (point 4) ---


@pytest.mark.parametrize(
    ("tiers", "kwargs", "message"),
    [
        ({"type": "memory"}, {}, "secondary_tiers must be a list of tier configs (mappings), got dict"),
        ("memory", {}, "secondary_tiers must be a list of tier configs (mappings), got str"),
        (["memory"], {}, "secondary_tiers[0] must be a mapping with a 'type', got 'memory'"),
        ([{"type": "memory", "capacity_blocks": 0}], {}, "capacity_blocks must be None or an integer >= 1, got 0"),
        ([{"type": "memory", "capacity_blocks": "2"}], {}, "capacity_blocks must be None or an integer >= 1"),
        ([{"type": "memory", "name": ""}], {}, "name must be a non-empty string"),
        ([{"type": "fs"}], {}, "invalid options for secondary tier type 'fs'"),
        ([{"type": "fs", "root_dir": 3}], {}, "root_dir must be a non-empty path, got 3"),
        ([{"type": 3}], {}, "secondary tier config 'type' is 3, which is not registered"),
        ([], {"enable_events": "yes"}, "enable_events must be true or false, got 'yes'"),
    ],
)
def test_invalid_tiering_configs_name_the_field(
    tmp_path: Path, tiers: Any, kwargs: dict[str, Any], message: str
) -> None:
    region = make_region(tmp_path, 2)
    with pytest.raises(ValueError, match=re.escape(message)):
        create_tiering_manager(region, tiers, **kwargs)
    region.cleanup()


def test_an_unusable_fs_root_is_an_os_error_and_cleans_up(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    region = make_region(tmp_path, 2)
    config = {"type": "fs", "root_dir": str(tmp_path / "file" / "fs")}
    with pytest.raises(OSError, match=r"root_dir '.*file/fs' is not usable"):
        create_tiering_manager(region, [{"type": "memory"}, config])
    with pytest.raises(KVRefError):
        region.create_kv_memoryview()  # the region was cleaned up
