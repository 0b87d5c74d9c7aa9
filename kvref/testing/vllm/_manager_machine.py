"""Random programs against an offloading manager: a Hypothesis state machine of vLLM's calls.

Each example builds a fresh manager (with events, and the reference policy when the contract
has one) and interleaves what vLLM's scheduler does from three requests at a time: lookups,
loads of blocks that answered HIT (completed later), stores (completed later, or failed),
touches, finished requests, ended steps (events taken and replayed) and resets with nothing in
flight. The harness checks every answer; after every step every block's lookup is checked
against the model. A failure shows the rule, the shrunk program as code, and expected against
got.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from vllm.v1.kv_offload.base import OffloadKey, ReqContext

from kvref.testing.vllm._common import run_settings
from kvref.testing.vllm._manager_harness import ManagerHarness

__all__ = ["run_manager_programs"]

_BLOCKS = 8
_REQUESTS = 3
_picks = st.lists(st.integers(0, _BLOCKS - 1), min_size=1, max_size=4, unique=True)


def run_manager_programs(make: Callable[[], ManagerHarness], request: pytest.FixtureRequest, quick_examples: int) -> None:
    """Run the kit's random programs against managers built by `make`."""

    class ManagerProgram(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.h = make()
            self.keys = [self.h.key(n) for n in range(_BLOCKS)]
            self.ids = itertools.count()
            self.contexts = [self._new(slot) for slot in range(_REQUESTS)]
            self.loads: list[tuple[ReqContext, list[OffloadKey]]] = []
            self.stores: list[tuple[ReqContext, list[OffloadKey]]] = []

        def _new(self, slot: int) -> ReqContext:
            return self.h.new_request(f"req{slot}-{next(self.ids)}", self.keys)

        @rule(slot=st.integers(0, _REQUESTS - 1), picks=_picks)
        def load(self, slot: int, picks: list[int]) -> None:
            blocks = [self.keys[i] for i in picks if self.keys[i] in self.h.ready]
            if blocks:
                self.h.prepare_load(blocks, self.contexts[slot])
                self.loads.append((self.contexts[slot], blocks))

        @precondition(lambda self: bool(self.loads))
        @rule(data=st.data())
        def complete_load(self, data: st.DataObject) -> None:
            ctx, blocks = self.loads.pop(data.draw(st.integers(0, len(self.loads) - 1)))
            self.h.complete_load(blocks, ctx)

        @rule(slot=st.integers(0, _REQUESTS - 1), picks=_picks)
        def store(self, slot: int, picks: list[int]) -> None:
            ctx = self.contexts[slot]
            output = self.h.prepare_store([self.keys[i] for i in picks], ctx)
            if output is not None and output.keys_to_store:
                self.stores.append((ctx, list(output.keys_to_store)))

        @precondition(lambda self: bool(self.stores))
        @rule(data=st.data(), success=st.booleans())
        def complete_store(self, data: st.DataObject, success: bool) -> None:
            ctx, blocks = self.stores.pop(data.draw(st.integers(0, len(self.stores) - 1)))
            self.h.complete_store(blocks, ctx, success)

        @rule(slot=st.integers(0, _REQUESTS - 1), picks=_picks)
        def touch(self, slot: int, picks: list[int]) -> None:
            self.h.touch([self.keys[i] for i in picks], self.contexts[slot])

        @rule(slot=st.integers(0, _REQUESTS - 1))
        def finish_request(self, slot: int) -> None:
            self.h.finish_request(self.contexts[slot])
            self.contexts[slot] = self._new(slot)

        @rule()
        def end_step(self) -> None:
            self.h.end_step()

        @precondition(lambda self: not self.loads and not self.stores)
        @rule()
        def reset(self) -> None:
            self.h.reset()

        @invariant()
        def lookups_agree(self) -> None:
            self.h.check_lookups(self.keys, self.contexts[0])

    ManagerProgram.__name__ = "ManagerProgram"
    run_state_machine_as_test(ManagerProgram, settings=run_settings(request, quick_examples))
