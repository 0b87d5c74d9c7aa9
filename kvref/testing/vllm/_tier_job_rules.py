"""Rules of `SecondaryTierContract` about jobs: each reported once, all by the first poll after
a drain, nothing touching the primary after a drain or a shutdown, quick calls, work that ends.

A mixin of the contract (the rules reach every subclass through it); see `kvref.testing.vllm.tier`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from vllm.v1.kv_offload.base import ReqContext

from kvref.testing.vllm._common import Contract
from kvref.testing.vllm._tier_harness import END_OF_STEP, TierHarness

__all__ = ["TierJobRules"]

_QUICK_CALL_S = 0.1
_SHUTDOWN_S = 10.0


class TierJobRules(Contract):
    """The job rules (tests need the contract's `harness` fixture)."""

    def test_every_job_is_reported_exactly_once(self, harness: TierHarness) -> None:
        """`get_finished_jobs` reports every submitted job exactly once, and no other job.

        In vLLM: the tiering manager asserts on a job it does not know, which stops the
        scheduler; a job never reported pins its CPU slots forever."""
        tier = harness.build()
        jobs = [harness.submit(tier, harness.job([harness.key(n)], [n], load=False, req=f"r{n % 3}")) for n in range(8)]
        deadline = time.monotonic() + 10.0
        while len(harness.reported[tier]) < len(jobs) and time.monotonic() < deadline:
            harness.poll(tier)
            tier.on_schedule_end(END_OF_STEP)
            time.sleep(0.002)
        missing = [j.job_id for j in jobs if j.job_id not in harness.reported[tier]]
        if missing:
            raise self.rule("every_job_is_reported_exactly_once").violation(
                "jobs never reported after 10 s of polls", expected=[], got=missing
            )
        for _ in range(5):
            harness.poll(tier)  # nothing more may come

    def test_every_job_is_reported_by_the_first_poll_after_drain(self, harness: TierHarness) -> None:
        """After `drain_jobs` returns, the next `get_finished_jobs` reports every job not
        reported before, stores and loads alike.

        In vLLM: `reset_cache` drains the tiers, polls once, then asserts no job is in flight
        and reuses the CPU slots; a late report stops the scheduler or releases reused slots."""
        tier = harness.build()
        keys = [harness.key(n) for n in range(8)]
        stores = [harness.submit(tier, harness.job([k], [n], load=False)) for n, k in enumerate(keys)]
        harness.finish(tier, stores)
        loads = [harness.submit(tier, harness.job([k], [8 + n], load=True)) for n, k in enumerate(keys)]
        harness.finish(tier, loads)

    def test_nothing_touches_the_primary_after_drain_jobs(self, harness: TierHarness) -> None:
        """Once `drain_jobs` returns, no transfer reads or writes the primary any more.

        In vLLM: `reset_cache` hands the CPU slots to new blocks right after draining; a late
        write lands in another request's KV."""
        tier = harness.build()
        keys = [harness.key(n) for n in range(8)]
        harness.store(tier, keys, list(range(8)))
        for n, k in enumerate(keys):
            harness.submit(tier, harness.job([k], [8 + n], load=True))
        tier.drain_jobs()
        snapshot = harness.rows.copy()
        time.sleep(0.2)
        changed = sorted({int(row) for row in (harness.rows != snapshot).any(axis=1).nonzero()[0]})
        if changed:
            raise self.rule("nothing_touches_the_primary_after_drain_jobs").violation(
                "rows changed after drain_jobs returned", expected=[], got=changed
            )
        harness.poll(tier)

    def test_shutdown_returns_promptly_and_leaves_no_thread(self, harness: TierHarness) -> None:
        """`shutdown` returns within seconds, jobs in flight or not, and no thread the tier
        started is left running.

        In vLLM: the engine's shutdown waits on it; a thread left behind keeps the process
        alive or touches freed memory."""
        tier = harness.build()
        keys = [harness.key(n) for n in range(8)]
        harness.store(tier, keys, list(range(8)))
        for n, k in enumerate(keys):
            harness.submit(tier, harness.job([k], [8 + n], load=True))
        started = time.monotonic()
        tier.shutdown()
        took = time.monotonic() - started
        rule = self.rule("shutdown_returns_promptly_and_leaves_no_thread")
        if took > _SHUTDOWN_S:
            raise rule.violation(f"shutdown took {took:.1f} s", expected=f"< {_SHUTDOWN_S:.0f} s", got=took)
        time.sleep(0.05)
        left = [thread.name for thread in harness.new_threads()]
        if left:
            raise rule.violation("threads still running after shutdown returned", expected=[], got=left)

    def test_nothing_touches_the_primary_after_shutdown(self, harness: TierHarness) -> None:
        """Once `shutdown` returns, nothing reads or writes the primary any more.

        In vLLM: the tiering manager frees the CPU region right after shutting the tiers down;
        a late write corrupts memory reused by something else."""
        tier = harness.build()
        keys = [harness.key(n) for n in range(8)]
        harness.store(tier, keys, list(range(8)))
        for n, k in enumerate(keys):
            harness.submit(tier, harness.job([k], [8 + n], load=True))
        tier.shutdown()
        snapshot = harness.rows.copy()
        time.sleep(0.2)
        changed = sorted({int(row) for row in (harness.rows != snapshot).any(axis=1).nonzero()[0]})
        if changed:
            raise self.rule("nothing_touches_the_primary_after_shutdown").violation(
                "rows changed after shutdown returned", expected=[], got=changed
            )

    def test_calls_return_without_waiting_for_io(self, harness: TierHarness) -> None:
        """`lookup`, `submit_store`, `submit_load`, `get_finished_jobs` and `on_schedule_end`
        each return within 100 ms: the copying happens elsewhere.

        In vLLM: they run on the scheduler thread under the manager's lock; time spent there is
        time every request waits for its next token."""
        tier = harness.build()
        keys = [harness.key(n) for n in range(8)]
        req = ReqContext(req_id="quick")
        calls: list[tuple[str, Callable[[], object]]] = [
            ("submit_store", lambda: harness.submit(tier, harness.job(keys, list(range(8)), load=False))),
            ("get_finished_jobs", lambda: harness.poll(tier)),
            ("lookup", lambda: tier.lookup(keys[0], req)),
            ("on_schedule_end", lambda: tier.on_schedule_end(END_OF_STEP)),
        ]
        for name, call in calls:
            self._timed(name, call)
        tier.drain_jobs()
        harness.poll(tier)
        self._timed("submit_load", lambda: harness.submit(tier, harness.job(keys, list(range(8, 16)), load=True)))
        tier.drain_jobs()
        harness.poll(tier)

    def _timed(self, name: str, call: Callable[[], object]) -> None:
        started = time.perf_counter()
        call()
        took = time.perf_counter() - started
        if took > _QUICK_CALL_S:
            raise self.rule("calls_return_without_waiting_for_io").violation(
                f"{name} took {took * 1000:.0f} ms", expected=f"< {_QUICK_CALL_S * 1000:.0f} ms", got=took
            )

    def test_has_pending_work_ends(self, harness: TierHarness) -> None:
        """Once every job is reported, `has_pending_work` turns False within a few steps.

        In vLLM: while it is True the engine keeps stepping with nothing to do, and never
        idles."""
        tier = harness.build()
        harness.store(tier, [harness.key(1)], [0])
        for _ in range(50):
            tier.on_schedule_end(END_OF_STEP)
            harness.poll(tier)
            if not tier.has_pending_work():
                return
            time.sleep(0.02)
        raise self.rule("has_pending_work_ends").violation("still True after 50 ended steps", expected=False, got=True)
