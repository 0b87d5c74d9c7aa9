"""Random programs against a secondary tier: a Hypothesis state machine of vLLM's calls.

Each example builds a fresh tier and interleaves what vLLM's tiering manager does, from three
requests at a time: store jobs (rows 0-7 hold what they store), loads of stored blocks (into
rows 8-15), lookups asked until they settle, polls, ended steps, finished requests and drains.
The harness checks every poll (each job once, loads right); the machine adds what it knows of
the blocks. A failure shows the rule, the shrunk program as code, and expected against got.
"""

from __future__ import annotations

import itertools

import pytest
from typing_extensions import override
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext
from vllm.v1.kv_offload.tiering.base import TransferJob

from kvref.testing.vllm._common import run_settings
from kvref.testing.vllm._tier_harness import END_OF_STEP, TierHarness

__all__ = ["run_tier_programs"]

_BLOCKS = 8
_STORE_ROWS = range(0, 8)
_LOAD_ROWS = range(8, 16)
_REQUESTS = 3


def run_tier_programs(harness: TierHarness, request: pytest.FixtureRequest, quick_examples: int) -> None:
    """Run the kit's random programs against tiers built by `harness`."""
    examples = itertools.count(1)

    class TierProgram(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            # Blocks of this example only: a persistent tier keeps the last example's.
            batch = next(examples)
            self.keys = [harness.key(n, batch) for n in range(_BLOCKS)]
            self.tier = harness.build()
            self.stored: set[OffloadKey] = set()  # a store job naming it succeeded
            self.ever_stored: set[OffloadKey] = set()  # a store job naming it was submitted
            self.in_flight: dict[int, TransferJob] = {}
            self.generations = itertools.count()
            self.contexts = [self._context(slot) for slot in range(_REQUESTS)]
            # Per block: the running requests that may share a verdict given before the block
            # was stored. vLLM's tiers keep a block's verdict, for every request asking, while
            # a request that asked is running (its AsyncLookupManager).
            self.stale_holders: dict[OffloadKey, set[int]] = {}

        def _context(self, slot: int) -> ReqContext:
            return ReqContext(req_id=f"req{slot}-{next(self.generations)}")

        def _busy_rows(self) -> set[int]:
            return {row for job in self.in_flight.values() for row in job.chunk_ids.tolist()}

        def _settle(self, results: list[object]) -> None:
            for job_id in [j for j in self.in_flight if j in harness.reported[self.tier]]:
                job = self.in_flight.pop(job_id)
                result = harness.reported[self.tier][job_id]
                if not job.is_promotion and result.success:
                    self.stored.update(job.keys)
                if job.is_promotion and not result.success:
                    raise harness.rule("stored_bytes_load_back_exactly").violation(
                        f"load of blocks whose stores had all succeeded failed (job {job_id})", expected=True, got=result
                    )

        @rule(slot=st.integers(0, _REQUESTS - 1), picks=st.lists(st.integers(0, _BLOCKS - 1), min_size=1, max_size=3, unique=True))
        def store(self, slot: int, picks: list[int]) -> None:
            rows = [row for row in _STORE_ROWS if row not in self._busy_rows()][: len(picks)]
            blocks = [self.keys[i] for i in picks][: len(rows)]
            if not blocks:
                return
            job = harness.submit(self.tier, harness.job(blocks, rows, load=False, req=self.contexts[slot].req_id))
            self.in_flight[job.job_id] = job
            self.ever_stored.update(blocks)

        @rule(slot=st.integers(0, _REQUESTS - 1), picks=st.lists(st.integers(0, _BLOCKS - 1), min_size=1, max_size=3, unique=True))
        def load(self, slot: int, picks: list[int]) -> None:
            # vLLM promotes only blocks a lookup answered HIT for: blocks stored, here.
            blocks = [self.keys[i] for i in picks if self.keys[i] in self.stored]
            rows = [row for row in _LOAD_ROWS if row not in self._busy_rows()][: len(blocks)]
            blocks = blocks[: len(rows)]
            if not blocks:
                return
            harness.clear(rows)
            job = harness.submit(self.tier, harness.job(blocks, rows, load=True, req=self.contexts[slot].req_id))
            self.in_flight[job.job_id] = job

        @rule()
        def poll(self) -> None:
            self._settle(harness.poll(self.tier))  # type: ignore[arg-type]

        @rule()
        def end_step(self) -> None:
            self.tier.on_schedule_end(END_OF_STEP)

        @rule()
        def drain(self) -> None:
            harness.finish(self.tier, list(self.in_flight.values()))
            self._settle([])

        @rule(slot=st.integers(0, _REQUESTS - 1), pick=st.integers(0, _BLOCKS - 1))
        def lookup(self, slot: int, pick: int) -> None:
            block = self.keys[pick]
            holders = self.stale_holders.setdefault(block, set())
            fresh = block in self.stored and not holders
            if not fresh:
                holders.add(slot)
            answer = harness.lookup(self.tier, block, self.contexts[slot])
            if fresh and answer is not LookupResult.HIT:
                raise harness.rule("lookup_is_a_hit_once_a_store_finished").violation(
                    f"{self.contexts[slot].req_id} asked for a stored block no running request had asked for before",
                    expected=LookupResult.HIT, got=answer,
                )  # fmt: skip
            if block not in self.ever_stored and answer is not LookupResult.MISS:
                raise harness.rule("lookup_answers_miss_for_absent_keys").violation(
                    f"{self.contexts[slot].req_id} asked for a block never stored", expected=LookupResult.MISS, got=answer
                )

        @rule(slot=st.integers(0, _REQUESTS - 1))
        def finish_request(self, slot: int) -> None:
            self.tier.on_request_finished(self.contexts[slot])
            self.contexts[slot] = self._context(slot)
            for holders in self.stale_holders.values():
                holders.discard(slot)

        @override
        def teardown(self) -> None:
            try:
                harness.finish(self.tier, list(self.in_flight.values()))
            finally:
                self.tier.shutdown()

    TierProgram.__name__ = "TierProgram"
    run_state_machine_as_test(TierProgram, settings=run_settings(request, quick_examples))
