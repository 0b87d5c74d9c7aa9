"""The manager contract's harness: vLLM's scheduler around a manager, with a model of its cache.

`ManagerHarness` makes only the calls vLLM's scheduler makes, in its order and under the
manager's lock: `prepare_load` only for blocks that answered HIT, `complete_load`/`complete_store`
only for what was prepared, `reset_cache` only with nothing in flight. It keeps what the answers
so far imply (blocks readable, pending, being loaded, the chunk each got), checks every answer
against it, and replays the manager's events as the truth a router would believe. With a
`policy`, kvref's reference manager of that name (which takes vLLM 0.33's decisions) receives
the same calls, and every `prepare_store` must evict what it evicts.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal, cast

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    make_offload_key,
)

from kvref.base import OffloadKey as KvrefKey
from kvref.base import ReqContext as KvrefContext
from kvref.cpu.manager import CPUOffloadingManager as ReferenceManager
from kvref.testing.vllm._common import Rule

__all__ = ["ManagerHarness", "MakeManager", "ReferencePolicy"]

MakeManager = Callable[[int, bool], OffloadingManager]
ReferencePolicy = Literal["lru", "arc"]
"""The policies kvref's reference manager takes vLLM 0.33's decisions for."""
_END_OF_STEP = ScheduleEndContext(new_req_ids=[], preempted_req_ids=())


class ManagerHarness:
    """A manager under test, the model of its cache, and (with a policy) the reference.

    Args:
        make_manager: `(num_chunks, enable_events) -> OffloadingManager`.
        rule: the contract's rule lookup.
        num_chunks: the cache's capacity in chunks.
        enable_events: build it with events, and replay them.
        policy: "lru" or "arc" to check evictions against kvref's reference, or None.
    """

    def __init__(
        self,
        make_manager: MakeManager,
        rule: Callable[[str], Rule],
        *,
        num_chunks: int,
        enable_events: bool,
        policy: ReferencePolicy | None,
    ) -> None:
        self.rule = rule
        self.num_chunks = num_chunks
        self.events_on = enable_events
        self.manager = make_manager(num_chunks, enable_events)
        self.reference = ReferenceManager(num_chunks, policy) if policy is not None else None
        self.policy = policy
        self._salt = os.urandom(8)
        self.ready: dict[OffloadKey, int] = {}  # stored and not evicted: key -> chunk id
        self.pending: dict[OffloadKey, int] = {}  # prepared, store not completed
        self.loading: Counter[OffloadKey] = Counter()  # prepared loads not completed
        self.failed: set[OffloadKey] = set()  # last store failed, not stored since
        self.evicted: set[OffloadKey] = set()  # evicted, not stored since
        self.reset_away: set[OffloadKey] = set()  # cleared by reset_cache, not stored since
        self.announced: set[OffloadKey] = set()  # what the events so far say is stored
        self.unreleased: set[OffloadKey] = set()  # failed since the events were last taken
        self.contexts: dict[str, tuple[ReqContext, KvrefContext]] = {}

    def key(self, n: int) -> OffloadKey:
        """This harness's `n`-th block (16-byte hash, KV-cache group 0)."""
        return make_offload_key(hashlib.blake2b(self._salt + n.to_bytes(8, "big"), digest_size=16).digest(), 0)

    # --- requests ---

    def new_request(self, req_id: str, keys: Sequence[OffloadKey] = ()) -> ReqContext:
        """A request whose blocks are `keys`, in token order (positions as vLLM records them)."""
        ctx, ref_ctx = ReqContext(req_id=req_id), KvrefContext(req_id=req_id)
        for index, block in enumerate(keys):
            ctx.set_offload_key_position(block, 16 * (index + 1))
            ref_ctx.set_offload_key_position(KvrefKey(block), 16 * (index + 1))
        self.contexts[req_id] = (ctx, ref_ctx)
        with self.manager.lock:
            answer = self.manager.on_new_request(ctx)
        self.expect_type("on_new_request", answer, RequestOffloadingContext)
        if self.reference is not None:
            self.reference.on_new_request(ref_ctx)
        return ctx

    def finish_request(self, ctx: ReqContext) -> None:
        with self.manager.lock:
            self.manager.on_request_finished(ctx)
        if self.reference is not None:
            self.reference.on_request_finished(self._ref(ctx))

    def _ref(self, ctx: ReqContext) -> KvrefContext:
        return self.contexts[ctx.req_id][1]

    # --- the calls ---

    def expected_lookup(self, block: OffloadKey) -> tuple[LookupResult, str]:
        if block in self.ready:
            return LookupResult.HIT, "lookup_is_a_hit_after_a_successful_complete_store"
        if block in self.pending:
            return LookupResult.HIT_PENDING, "lookup_is_hit_pending_while_a_store_is_in_flight"
        if block in self.reset_away:
            return LookupResult.MISS, "reset_cache_empties"
        if block in self.evicted:
            return LookupResult.MISS, "evicted_keys_name_exactly_the_keys_that_went"
        if block in self.failed:
            return LookupResult.MISS, "lookup_is_a_miss_after_a_failed_complete_store"
        return LookupResult.MISS, "lookup_of_an_unknown_key_is_a_miss"

    def lookup(self, block: OffloadKey, ctx: ReqContext) -> LookupResult:
        with self.manager.lock:
            answer = self.manager.lookup(block, ctx)
        expected, rule_id = self.expected_lookup(block)
        if answer is not expected:
            raise self.rule(rule_id).violation(f"lookup({block.hex()})", expected=expected, got=answer)
        return answer

    def check_lookups(self, blocks: Sequence[OffloadKey], ctx: ReqContext) -> None:
        for block in blocks:
            self.lookup(block, ctx)

    def prepare_load(self, blocks: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """Pin blocks that answered HIT, as the scheduler does before the worker reads them."""
        for block in blocks:
            self.lookup(block, ctx)  # HIT, or the lookup rules report what went wrong
        with self.manager.lock:
            spec = self.manager.prepare_load(list(blocks), ctx)
        self.expect_type("prepare_load", spec, LoadStoreSpec)
        chunk_ids = _chunk_ids(spec)
        expected = [self.ready[block] for block in blocks]
        if chunk_ids != expected:
            raise self.rule("loads_read_the_chunks_given_at_store_time").violation(
                f"prepare_load({len(blocks)} blocks) chunk ids", expected=expected, got=chunk_ids
            )
        self.loading.update(blocks)
        if self.reference is not None:
            self.reference.prepare_load(cast("list[KvrefKey]", list(blocks)), self._ref(ctx))

    def complete_load(self, blocks: Sequence[OffloadKey], ctx: ReqContext) -> None:
        with self.manager.lock:
            self.manager.complete_load(list(blocks), ctx)
        self.loading.subtract(blocks)
        self.loading = +self.loading
        if self.reference is not None:
            self.reference.complete_load(cast("list[KvrefKey]", list(blocks)), self._ref(ctx))

    def touch(self, blocks: Sequence[OffloadKey], ctx: ReqContext) -> None:
        with self.manager.lock:
            self.manager.touch(list(blocks), ctx)
        if self.reference is not None:
            self.reference.touch(cast("list[KvrefKey]", list(blocks)), self._ref(ctx))

    def prepare_store(
        self, blocks: Sequence[OffloadKey], ctx: ReqContext, *, may_refuse: bool = False
    ) -> PrepareStoreOutput | None:
        """Offer blocks for storing; check the answer against the model (and the reference).

        `may_refuse`: a refusal is left to the caller to judge (a rule more precise than "no
        refusal with room left" is being checked).
        """
        held = set(self.ready) | set(self.pending)
        new = [block for block in blocks if block not in held]
        room = self.num_chunks - len(self.ready) - len(self.pending)
        offered = set(blocks)
        evictable = [b for b in self.ready if self.loading[b] == 0 and b not in offered]
        with self.manager.lock:
            output = self.manager.prepare_store(list(blocks), ctx)
        self.expect_type("prepare_store", output, (PrepareStoreOutput, type(None)))
        # The rules any manager keeps first (their messages are the more precise), then the
        # reference's decision.
        if output is None:
            if len(new) <= room + len(evictable) and not may_refuse:
                raise self.rule("prepare_store_does_not_refuse_when_there_is_room").violation(
                    f"refused {len(new)} new blocks with {room} free and {len(evictable)} evictable chunks",
                    expected="a PrepareStoreOutput", got=None,
                )  # fmt: skip
        else:
            self._check_store_output(blocks, output)
        if output is not None or not may_refuse:
            self._compare_with_reference(blocks, ctx, output)
        return output

    def _check_store_output(self, blocks: Sequence[OffloadKey], output: PrepareStoreOutput) -> None:
        to_store, evicted = list(output.keys_to_store), list(output.evicted_keys)
        again = [b for b in to_store if b in self.ready or b in self.pending]
        if again or len(set(to_store)) != len(to_store) or not set(to_store) <= set(blocks):
            raise self.rule("keys_already_stored_are_never_offered_again").violation(
                "keys_to_store names blocks held already, twice, or not offered", expected="new offered blocks", got=to_store
            )
        for block in evicted:
            if block in set(blocks) and block in self.ready:
                raise self.rule("keys_offered_again_stay_stored").violation(
                    f"prepare_store evicted {block.hex()}, which it was offered", expected="kept", got="evicted"
                )
            if self.loading[block]:
                raise self.rule("a_chunk_being_loaded_is_never_evicted").violation(
                    f"evicted {block.hex()} while {self.loading[block]} load(s) of it were in flight", expected="kept", got="evicted"
                )
            if block not in self.ready:
                raise self.rule("evicted_keys_name_exactly_the_keys_that_went").violation(
                    f"evicted_keys names {block.hex()}, which was not stored", expected=sorted(self.ready), got=evicted
                )
        for block in evicted:
            del self.ready[block]
            self.evicted.add(block)
        chunk_ids = _chunk_ids(output.store_spec)
        owners = {chunk: block for block, chunk in self.ready.items()}
        taken = [owners[c] for c in chunk_ids if c in owners]
        if taken:
            raise self.rule("evicted_keys_name_exactly_the_keys_that_went").violation(
                f"new blocks got the chunks of stored blocks not in evicted_keys", expected=evicted, got=evicted + taken
            )
        in_use = set(self.pending.values())
        bad = [c for c in chunk_ids if not 0 <= c < self.num_chunks or c in in_use]
        if len(chunk_ids) != len(to_store) or bad or len(set(chunk_ids)) != len(chunk_ids):
            raise self.rule("chunk_ids_are_distinct_and_in_range").violation(
                f"store chunk ids for {len(to_store)} blocks, {self.num_chunks} chunks, in use {sorted(in_use)}",
                expected="distinct free ids in range", got=chunk_ids,
            )  # fmt: skip
        for block, chunk in zip(to_store, chunk_ids):
            self.pending[block] = chunk
            self.unreleased.discard(block)  # a retry holds it: its release must not come
            self.failed.discard(block)
            self.evicted.discard(block)
            self.reset_away.discard(block)

    def _compare_with_reference(
        self, blocks: Sequence[OffloadKey], ctx: ReqContext, output: PrepareStoreOutput | None
    ) -> None:
        if self.reference is None:
            return
        ref = self.reference.prepare_store(cast("list[KvrefKey]", list(blocks)), self._ref(ctx))
        theirs = None if ref is None else sorted(ref.evicted_keys)
        ours = None if output is None else sorted(output.evicted_keys)
        if theirs != ours:
            raise self.rule("evictions_follow_the_reference_policy").violation(
                f"prepare_store of {len(blocks)} blocks ({self.policy}): evicted", expected=theirs, got=ours
            )

    def complete_store(self, blocks: Sequence[OffloadKey], ctx: ReqContext, success: bool = True) -> None:
        with self.manager.lock:
            if success:  # as vLLM's scheduler calls it
                self.manager.complete_store(list(blocks), ctx)
            else:
                self.manager.complete_store(list(blocks), ctx, success=False)
        for block in blocks:
            chunk = self.pending.pop(block)
            if success:
                self.ready[block] = chunk
            else:
                self.failed.add(block)
                self.unreleased.add(block)
        if self.reference is not None:
            self.reference.complete_store(cast("list[KvrefKey]", list(blocks)), self._ref(ctx), success)

    def reset(self) -> None:
        """`reset_cache`, with nothing in flight (as vLLM's scheduler guarantees).

        The step's events are taken first, as the scheduler takes them every step.
        """
        assert not self.pending and not self.loading
        self.end_step()
        with self.manager.lock:
            self.manager.reset_cache()
        self.reset_away.update(self.ready)
        self.ready.clear()
        self.announced.clear()  # vLLM's connector tells routers "all blocks cleared" itself
        if self.reference is not None:
            self.reference.reset_cache()
        self.check_stats()  # an empty cache: every share is 0

    def end_step(self) -> None:
        """End a scheduler step: `on_schedule_end`, then take the events and replay them."""
        with self.manager.lock:
            self.manager.on_schedule_end(_END_OF_STEP)
            events = list(self.manager.take_events())
        for event in events:
            self.expect_type("a take_events item", event, OffloadingEvent)
        self.replay(events)
        self.check_stats()

    def check_stats(self) -> None:
        """`get_stats`, as the connector calls it every step, read as vLLM's metrics logger does.

        Counters are summed into Prometheus counters (an increment below 0 raises there),
        histogram samples are observed, and `*_perc` gauges are shares of the cache.
        """
        with self.manager.lock:
            stats = self.manager.get_stats()
        if stats is None:
            return
        self.expect_type("get_stats", stats, OffloadingConnectorStats)
        rule = self.rule("stats_are_well_formed")
        types, values = stats.metric_sections()
        empty = not self.ready and not self.pending
        for name, by_labels in cast("dict[str, dict[tuple[str, ...], object]]", values).items():
            kind = types.get(name)
            for labels, value in by_labels.items():
                where = f"{kind} {name}{list(labels) if labels else ''}"
                samples = _numbers(value)
                if kind not in ("counter", "gauge", "histogram") or samples is None:
                    raise rule.violation(where, expected="a counter, gauge or histogram of numbers", got=value)
                if kind in ("counter", "histogram") and min(samples, default=0.0) < 0:
                    raise rule.violation(f"{where} (the step's increment or samples)", expected=">= 0", got=value)
                if kind == "gauge" and name.endswith("_perc") and samples:
                    share = samples[0]
                    if not 0.0 <= share <= 1.0 or (empty and share != 0.0):
                        raise rule.violation(
                            f"{where} with {len(self.ready)} blocks stored and {len(self.pending)} in flight"
                            f" of {self.num_chunks} chunks",
                            expected="0.0 (nothing held)" if empty else "a share in [0, 1]", got=value,
                        )  # fmt: skip

    def expect_type(self, what: str, value: object, kind: type | tuple[type, ...]) -> None:
        """Check an answer's type (vLLM reads its fields on the scheduler thread)."""
        if not isinstance(value, kind):
            raise self.rule("answers_have_vllm_types").violation(what, expected=kind, got=value)

    def replay(self, events: Sequence[OffloadingEvent]) -> None:
        released, self.unreleased = self.unreleased, set()
        if not self.events_on:
            if events:
                raise self.rule("no_events_unless_enabled").violation(
                    "events from a manager built with enable_events=False", expected=[], got=events
                )
            return
        self._check_releases(events, released)
        rule = self.rule("events_replay_to_what_lookups_report")
        # Events are history: each is checked against the events before it, and only the end
        # result against what the blocks are now.
        for event in events:
            keys = set(event.keys)
            if event.removed:
                never = keys - self.announced
                if never and not event.metadata_only:
                    raise rule.violation("a removal event names blocks never announced stored", expected=[], got=sorted(never))
                self.announced -= keys
            else:
                twice = keys & self.announced
                if twice:
                    raise rule.violation("a stored event names blocks announced already", expected=[], got=sorted(twice))
                self.announced |= keys
        unannounced_evictions = (self.announced - set(self.ready)) & self.evicted
        if unannounced_evictions:
            raise self.rule("removal_events_name_exactly_the_evicted_keys").violation(
                "evicted blocks never announced removed", expected=[], got=sorted(unannounced_evictions)
            )
        if self.announced != set(self.ready):
            raise rule.violation(
                "after replaying the events, the blocks they say are stored",
                expected=sorted(self.ready), got=sorted(self.announced),
            )  # fmt: skip

    def _check_releases(self, events: Sequence[OffloadingEvent], released: set[OffloadKey]) -> None:
        """Failed stores come back as metadata-only removals, and only for blocks nobody holds."""
        rule = self.rule("a_failed_store_is_released_in_the_events")
        held = set(self.ready) | set(self.pending)
        for event in events:
            if event.removed and event.metadata_only:
                if keys_held := set(event.keys) & held:
                    raise rule.violation(
                        "a metadata-only removal names blocks the manager holds (stored or being stored)",
                        expected=[], got=sorted(keys_held),
                    )  # fmt: skip
                released -= set(event.keys)
        if released:
            raise rule.violation(
                "blocks of failed stores, in no metadata-only removal event", expected=[], got=sorted(released)
            )


def _numbers(value: object) -> list[float] | None:
    """A metric's value as its samples (one for a counter or gauge), or None if one is no number."""
    samples = cast("list[object]", value) if isinstance(value, list) else [value]
    numbers = [float(v) for v in samples if isinstance(v, int | float) and not isinstance(v, bool)]
    return numbers if len(numbers) == len(samples) and all(map(math.isfinite, numbers)) else None


def _chunk_ids(spec: object) -> list[int]:
    chunk_ids = getattr(spec, "chunk_ids", None)
    if chunk_ids is None:
        chunk_ids = getattr(spec, "block_ids", ())
    return [int(c) for c in chunk_ids]
