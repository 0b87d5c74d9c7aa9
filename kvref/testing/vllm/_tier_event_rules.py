"""Rules of `SecondaryTierContract` about KV events: one stored event per successful store, none
for loads or failed stores, none at all when vLLM's global flag is off.

A mixin of the contract (the rules reach every subclass through it); see `kvref.testing.vllm.tier`.
"""

from __future__ import annotations

from typing import Any

import pytest
from vllm.v1.kv_offload.base import Locality
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager

from kvref.testing.vllm._common import Contract
from kvref.testing.vllm._tier_harness import NUM_BLOCKS, TierHarness

__all__ = ["TierEventRules"]


class TierEventRules(Contract):
    """The event rules (tests need the contract's `harness` fixture)."""

    def _events_tier(self, harness: TierHarness, *, kv_events: bool, **options: Any) -> SecondaryTierManager:
        try:
            return harness.build(kv_events=kv_events, enable_kv_events=True, **options)
        except (TypeError, ValueError) as exc:
            if "enable_kv_events" in str(exc):
                pytest.skip(f"the tier takes no enable_kv_events option ({exc})")
            raise

    def test_one_stored_event_per_successful_store(self, harness: TierHarness) -> None:
        """With KV events on (the tier's `enable_kv_events` and vLLM's global flag), each
        successful store job yields one stored event naming its blocks, with the tier's medium
        and configured locality.

        In vLLM: routers learn from these events which engine holds which blocks; a lost event
        hides blocks, a doubled or wrong one sends requests where the blocks are not."""
        tier = self._events_tier(harness, kv_events=True, locality="REMOTE")
        jobs = [harness.job([harness.key(2 * n), harness.key(2 * n + 1)], [2 * n, 2 * n + 1], load=False) for n in range(3)]
        for job in jobs:
            harness.submit(tier, job)
        results = harness.finish(tier, jobs)
        expected = sorted(sorted(job.keys) for job, result in zip(jobs, results) if result.success)
        events = list(tier.take_events())
        rule = self.rule("one_stored_event_per_successful_store")
        got = sorted(sorted(event.keys) for event in events if not event.removed)
        if got != expected:
            raise rule.violation("stored events after three store jobs", expected=expected, got=got)
        for event in events:
            if (event.medium, event.locality) != (type(tier).medium, Locality.REMOTE):
                raise rule.violation(
                    "event medium and locality", expected=(type(tier).medium, Locality.REMOTE), got=(event.medium, event.locality)
                )
        if list(tier.take_events()):
            raise rule.violation("take_events gave the same events twice", expected=[], got="more events")

    def test_no_event_for_loads_or_failed_stores(self, harness: TierHarness) -> None:
        """Loads and failed stores yield no stored event.

        In vLLM: a stored event for a store that failed tells routers the tier holds blocks it
        does not; one for a load announces blocks twice."""
        tier = self._events_tier(harness, kv_events=True)
        keys = [harness.key(n) for n in range(4)]
        harness.store(tier, keys, list(range(4)))
        list(tier.take_events())
        harness.load(tier, keys, list(range(8, 12)))
        failing = harness.job([harness.key(9)], [NUM_BLOCKS + 3], load=False)
        try:
            harness.submit(tier, failing)
            harness.finish(tier, [failing])
        except Exception:  # the store rule reports a tier that raises here
            pass
        stored = [event.keys for event in tier.take_events() if not event.removed]
        if stored:
            raise self.rule("no_event_for_loads_or_failed_stores").violation(
                "stored events after a load and a failed store", expected=[], got=stored
            )

    def test_no_events_when_kv_events_are_off_globally(self, harness: TierHarness) -> None:
        """With vLLM's global KV-events flag off, the tier emits no event at all, even with its
        own `enable_kv_events` on.

        In vLLM: nobody drains the events then; a tier that buffers them grows without bound."""
        tier = self._events_tier(harness, kv_events=False)
        keys = [harness.key(n) for n in range(4)]
        harness.store(tier, keys, list(range(4)))
        harness.load(tier, keys, list(range(8, 12)))
        events = list(tier.take_events())
        if events:
            raise self.rule("no_events_when_kv_events_are_off_globally").violation(
                "events with the global flag off", expected=[], got=events
            )
