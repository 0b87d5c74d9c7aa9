"""InMemorySecondaryTier: the example tier's lookup states, copies, capacity and events."""

from __future__ import annotations

from kvref.base import OffloadingEvent, ReqContext
from kvref.tiering.base import JobMetadata, JobResult
from kvref.tiering.memory import InMemorySecondaryTier
from tests.tiering.helpers import BLOCK_BYTES, content, make_view, to_keys

CTX = ReqContext(req_id="r1")


def test_jobs_complete_when_collected_and_copy_bytes_both_ways() -> None:
    view = make_view(4)
    rows = view.cast("B")
    tier = InMemorySecondaryTier(view, enable_events=True)
    k1, k2 = to_keys([1, 2])
    rows[0:BLOCK_BYTES] = content(k1)
    rows[BLOCK_BYTES : 2 * BLOCK_BYTES] = content(k2)
    tier.submit_store(JobMetadata(1, (k1, k2), (0, 1), False, CTX))
    assert tier.lookup(k1, CTX) is None  # queued, not yet copied
    assert list(tier.get_finished_jobs()) == [JobResult(1, True)]
    assert tier.lookup(k1, CTX) is True and len(tier) == 2 and k2 in tier
    tier.submit_load(JobMetadata(2, (k2, k1), (2, 3), True, CTX))
    assert list(tier.get_finished_jobs()) == [JobResult(2, True)]
    assert bytes(rows[2 * BLOCK_BYTES : 3 * BLOCK_BYTES]) == content(k2)
    assert bytes(rows[3 * BLOCK_BYTES :]) == content(k1)
    assert tier.take_events() == [OffloadingEvent([k1, k2], "memory", removed=False)]
    assert tier.take_events() == []
    rows.release()
    tier.shutdown()


def test_load_of_an_absent_block_fails() -> None:
    tier = InMemorySecondaryTier(make_view(2))
    tier.submit_load(JobMetadata(7, tuple(to_keys([1])), (0,), True, CTX))
    assert list(tier.get_finished_jobs()) == [JobResult(7, False)]


def test_capacity_evicts_least_recently_used() -> None:
    tier = InMemorySecondaryTier(make_view(4), capacity_blocks=2, name="ram", enable_events=True)
    k1, k2, k3 = to_keys([1, 2, 3])
    tier.submit_store(JobMetadata(1, (k1, k2), (0, 1), False, CTX))
    tier.get_finished_jobs()
    tier.touch([k1], CTX)
    tier.submit_store(JobMetadata(2, (k3,), (2,), False, CTX))
    tier.get_finished_jobs()
    assert [tier.lookup(k, CTX) for k in (k1, k2, k3)] == [True, False, True]
    assert list(tier.take_events())[-1] == OffloadingEvent([k2], "ram", removed=True)


def test_events_are_off_by_default() -> None:
    tier = InMemorySecondaryTier(make_view(1))
    tier.submit_store(JobMetadata(1, tuple(to_keys([1])), (0,), False, CTX))
    tier.get_finished_jobs()
    assert list(tier.take_events()) == []
