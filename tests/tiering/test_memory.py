"""InMemorySecondaryTier: the example tier's lookup answers, copies, capacity, events, metrics."""

from __future__ import annotations

from kvref.base import Locality, LookupResult, Medium, OffloadingEvent
from kvref.tiering.memory import InMemorySecondaryTier
from kvref.tiering.tier_reporting import KvrefTierMetrics
from tests.tiering.helpers import BLOCK_BYTES, CTX, content, job, make_spec, make_view, to_keys


def make_tier(num_chunks: int, **options: object) -> InMemorySecondaryTier:
    spec = make_spec(kv_events=bool(options.get("enable_kv_events")))
    return InMemorySecondaryTier(spec, make_view(num_chunks), "memory", **options)  # type: ignore[arg-type]


def test_jobs_complete_when_collected_and_copy_bytes_both_ways() -> None:
    tier = make_tier(4, enable_kv_events=True, locality="LOCAL")
    rows = tier._primary  # pyright: ignore[reportPrivateUsage]
    k1, k2 = to_keys([1, 2])
    rows.row(0)[:] = content(k1)
    rows.row(1)[:] = content(k2)
    store = job([k1, k2], [0, 1], promotion=False)
    tier.submit_store(store)
    assert tier.lookup(k1, CTX) is LookupResult.RETRY  # queued, not yet copied
    [stored] = tier.get_finished_jobs()
    assert (stored.job_id, stored.success, stored.transfer_bytes) == (store.job_id, True, 2 * BLOCK_BYTES)
    assert tier.lookup(k1, CTX) is LookupResult.HIT and len(tier) == 2 and k2 in tier
    load = job([k2, k1], [2, 3], promotion=True)
    tier.submit_load(load)
    [loaded] = tier.get_finished_jobs()
    assert (loaded.job_id, loaded.success, loaded.successful_keys) == (load.job_id, True, None)
    assert bytes(rows.row(2)) == content(k2) and bytes(rows.row(3)) == content(k1)
    assert tier.take_events() == [
        OffloadingEvent([k1, k2], Medium.CPU, removed=False, locality=Locality.LOCAL, ownership="memory")
    ]
    assert tier.take_events() == []
    tier.shutdown()


def test_a_partly_absent_load_fails_keeping_the_chunks_it_loaded() -> None:
    tier = make_tier(3)
    k1, k2 = to_keys([1, 2])
    tier.submit_store(job([k1], [0], promotion=False))
    tier.get_finished_jobs()
    load = job([k1, k2], [1, 2], promotion=True)
    tier.submit_load(load)
    [result] = tier.get_finished_jobs()
    assert (result.job_id, result.success, result.successful_keys) == (load.job_id, False, (k1,))
    assert result.transfer_bytes == BLOCK_BYTES
    assert tier.lookup(k2, CTX) is LookupResult.MISS
    _, values = tier.get_stats().metric_sections()
    assert values[KvrefTierMetrics.CHUNKS_LOADED] == {("memory",): 1}
    assert values[KvrefTierMetrics.CHUNKS_LOST] == {("memory",): 1}


def test_capacity_evicts_least_recently_used_and_reports_it() -> None:
    tier = make_tier(4, capacity_chunks=2, enable_kv_events=True)
    k1, k2, k3 = to_keys([1, 2, 3])
    tier.submit_store(job([k1, k2], [0, 1], promotion=False))
    tier.get_finished_jobs()
    tier.touch([k1], CTX)
    tier.submit_store(job([k3], [2], promotion=False))
    tier.get_finished_jobs()
    assert [tier.lookup(k, CTX) for k in (k1, k2, k3)] == [LookupResult.HIT, LookupResult.MISS, LookupResult.HIT]
    assert list(tier.take_events())[-1] == OffloadingEvent([k2], Medium.CPU, removed=True, ownership="memory")
    stats = tier.get_stats()
    _, values = stats.metric_sections()
    assert values[KvrefTierMetrics.CHUNKS_STORED] == {("memory",): 3}
    assert values[KvrefTierMetrics.CHUNKS_EVICTED] == {("memory",): 1}
    assert values[KvrefTierMetrics.USAGE_PERC] == {("memory",): 1.0}
    assert KvrefTierMetrics.CHUNKS_STORED not in tier.get_stats().metric_sections()[1]  # taken once
    assert tier.config_info() == {"memory_capacity_chunks": 2}


def test_events_need_the_option_and_the_engine_flag() -> None:
    quiet = make_tier(1)
    flag_off = InMemorySecondaryTier(make_spec(kv_events=False), make_view(1), "memory", enable_kv_events=True)
    for tier in (quiet, flag_off):
        tier.submit_store(job(to_keys([1]), [0], promotion=False))
        tier.get_finished_jobs()
        assert list(tier.take_events()) == []
