"""`OffloadingManagerContract`: vLLM 0.33's promises for an offloading manager, one test per rule.

    class TestMyManager(OffloadingManagerContract):
        policy = "lru"                      # optional: "lru" | "arc" | None (the default)
        @pytest.fixture
        def make_manager(self):             # (num_chunks, enable_events) -> vLLM OffloadingManager
            return lambda num_chunks, enable_events: MyManager(num_chunks, enable_events=enable_events)

The kit drives managers only the way vLLM's scheduler does (`_manager_harness`), so a correct
manager never fails. With `policy` set, every eviction must match kvref's reference policy of
that name, which takes vLLM 0.33's decisions; with None, only the policy-independent rules run.
The rules are those of a manager that owns one store of chunks (vLLM's `CPUOffloadingManager`
and the like): lookups answer from it at once, never RETRY.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, cast

import pytest
from typing_extensions import override
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvref.testing.vllm._common import Contract
from kvref.testing.vllm._manager_harness import MakeManager, ManagerHarness, ReferencePolicy
from kvref.testing.vllm._manager_machine import run_manager_programs

__all__ = ["OffloadingManagerContract"]

_CHUNKS = 4


class OffloadingManagerContract(Contract):
    """Subclass it and give a `make_manager` fixture: every rule below runs against your manager.

    Attributes:
        policy: "lru" or "arc" to hold every eviction to kvref's reference policy of that name
            (vLLM 0.33's decisions); None (the default) for policy-independent rules only.
        quick_examples: random programs per run at `--kvref-conformance=quick` (deep: 20x).
    """

    policy: ClassVar[ReferencePolicy | None] = None
    quick_examples: ClassVar[int] = 150

    @classmethod
    @override
    def inapplicable_rules(cls) -> dict[str, str]:
        inapplicable = super().inapplicable_rules()
        if cls.policy is None:
            inapplicable.setdefault("evictions_follow_the_reference_policy", "policy = None: evictions are the manager's own choice")
        return inapplicable

    @pytest.fixture
    def make_manager(self) -> MakeManager:
        pytest.fail(f"{type(self).__name__} must define a `make_manager` fixture: (num_chunks, enable_events) -> manager")

    @pytest.fixture
    def harness(self, make_manager: MakeManager) -> Callable[..., ManagerHarness]:
        def make(*, num_chunks: int = _CHUNKS, enable_events: bool = False, policy: bool = True) -> ManagerHarness:
            return ManagerHarness(
                make_manager, self.rule, num_chunks=num_chunks, enable_events=enable_events,
                policy=self.policy if policy else None,
            )  # fmt: skip

        return make

    def test_answers_have_vllm_types(self, harness: Callable[..., ManagerHarness]) -> None:
        """Every answer has the type vLLM's scheduler and connector read: `on_new_request` a
        `RequestOffloadingContext`, `prepare_load` a `LoadStoreSpec`, `prepare_store` a
        `PrepareStoreOutput` or None, `take_events` `OffloadingEvent`s, `get_load_source` (after
        a HIT) a `CacheHitSource`, `has_pending_work` a bool, `config_info` a sequence of
        mappings, `get_stats` None or `OffloadingConnectorStats`.

        In vLLM: the connector reads fields of these answers on the scheduler thread (the
        request's offload policy, the spec's chunk ids); an answer of another type raises there
        and stops the engine."""
        h = harness(enable_events=True)
        blocks = [h.key(n) for n in range(2)]
        ctx = h.new_request("types", blocks)  # the harness checks each answer's type
        out = h.prepare_store(blocks, ctx)
        if out is not None:
            h.complete_store(out.keys_to_store, ctx)
        h.end_step()
        h.prepare_load(blocks[:1], ctx)
        h.complete_load(blocks[:1], ctx)
        manager = h.manager
        with manager.lock:
            h.expect_type("get_load_source", manager.get_load_source(blocks[0], ctx), CacheHitSource)
            h.expect_type("has_pending_work", manager.has_pending_work(), bool)
            info = manager.config_info()
            h.expect_type("get_stats", manager.get_stats(), (OffloadingConnectorStats, type(None)))
        series = cast(object, info)  # whatever the manager returned, whatever it declares
        if not isinstance(series, Sequence) or not series or not all(isinstance(m, Mapping) for m in cast("Sequence[object]", series)):
            raise self.rule("answers_have_vllm_types").violation(
                "config_info", expected="a sequence of one mapping per series", got=info
            )

    # --- lookups ---

    def test_lookup_of_an_unknown_key_is_a_miss(self, harness: Callable[..., ManagerHarness]) -> None:
        """A block never offered answers MISS.

        In vLLM: a HIT makes the scheduler load the block from the manager's chunks: the GPU
        gets whatever another block left there."""
        h = harness()
        ctx = h.new_request("r")
        h.check_lookups([h.key(n) for n in range(3)], ctx)

    def test_lookup_is_hit_pending_while_a_store_is_in_flight(self, harness: Callable[..., ManagerHarness]) -> None:
        """Between `prepare_store` and `complete_store`, its blocks answer HIT_PENDING.

        In vLLM: a HIT for a block still being written lets a request load half-written KV; a
        MISS makes it store the block a second time."""
        h = harness()
        blocks = [h.key(n) for n in range(2)]
        ctx = h.new_request("r", blocks)
        h.prepare_store(blocks, ctx)
        h.check_lookups(blocks, ctx)
        h.complete_store(blocks, ctx)
        h.check_lookups(blocks, ctx)

    def test_lookup_is_a_hit_after_a_successful_complete_store(self, harness: Callable[..., ManagerHarness]) -> None:
        """After `complete_store(success=True)`, its blocks answer HIT until evicted.

        In vLLM: offloaded blocks that never answer HIT are never reused: the CPU tier costs
        bandwidth and saves nothing."""
        h = harness()
        blocks = [h.key(n) for n in range(3)]
        ctx = h.new_request("r", blocks)
        h.prepare_store(blocks, ctx)
        h.complete_store(blocks, ctx)
        h.end_step()
        h.check_lookups(blocks, h.new_request("later"))

    def test_lookup_is_a_miss_after_a_failed_complete_store(self, harness: Callable[..., ManagerHarness]) -> None:
        """After `complete_store(success=False)`, its blocks answer MISS.

        In vLLM: a failed GPU->CPU copy left garbage in the chunks; a HIT serves it as KV."""
        h = harness()
        blocks = [h.key(n) for n in range(2)]
        ctx = h.new_request("r", blocks)
        h.prepare_store(blocks, ctx)
        h.complete_store(blocks, ctx, success=False)
        h.check_lookups(blocks, ctx)

    # --- stores ---

    def test_keys_already_stored_are_never_offered_again(self, harness: Callable[..., ManagerHarness]) -> None:
        """`prepare_store` returns in `keys_to_store` only offered blocks it does not hold yet
        (stored or being stored), each once.

        In vLLM: the worker copies every block in `keys_to_store` from the GPU: a block held
        already is copied again, into a second chunk, wasting both."""
        h = harness()
        blocks = [h.key(n) for n in range(3)]
        ctx = h.new_request("r", blocks)
        h.prepare_store(blocks[:2], ctx)
        h.prepare_store(blocks[:3], ctx)  # one pending, one new
        h.complete_store(blocks[:2], ctx)
        h.complete_store(blocks[2:3], ctx)
        h.prepare_store(blocks, ctx)  # all held

    def test_keys_offered_again_stay_stored(self, harness: Callable[..., ManagerHarness]) -> None:
        """A stored block offered to `prepare_store` again is not evicted by that call, even
        when the cache is full.

        In vLLM: the scheduler offers a request's whole prefix and skips the blocks the
        manager holds; evicting one of them loses it although the request just used it."""
        h = harness()
        old = [h.key(n) for n in range(4)]
        ctx = h.new_request("r", old + [h.key(9)])
        h.prepare_store(old, ctx)
        h.complete_store(old, ctx)
        h.end_step()
        # Full, and the only block not offered is the request's head (the most recent): a
        # manager that does not protect what it is offered evicts one of the others.
        out = h.prepare_store([*old[1:], h.key(9)], ctx)
        if out is not None:
            h.complete_store(out.keys_to_store, ctx)
        h.check_lookups(old + [h.key(9)], ctx)

    def test_chunk_ids_are_distinct_and_in_range(self, harness: Callable[..., ManagerHarness]) -> None:
        """Store specs name one chunk per block to store, in [0, num_chunks), none held by
        another block.

        In vLLM: the worker writes each block into its chunk: two blocks sharing one overwrite
        each other, and an id out of range writes past the CPU region."""
        h = harness()
        for round_ in range(3):
            blocks = [h.key(4 * round_ + n) for n in range(4)]
            ctx = h.new_request(f"r{round_}", blocks)
            out = h.prepare_store(blocks, ctx)
            if out is not None:
                h.complete_store(out.keys_to_store, ctx)
            h.end_step()

    def test_loads_read_the_chunks_given_at_store_time(self, harness: Callable[..., ManagerHarness]) -> None:
        """`prepare_load` names, for each block, the chunk its store was given.

        In vLLM: the worker copies those chunks to the GPU: any other chunk is another block's
        KV."""
        h = harness()
        blocks = [h.key(n) for n in range(4)]
        ctx = h.new_request("r", blocks)
        h.prepare_store(blocks[:2], ctx)
        h.prepare_store(blocks[2:], ctx)
        h.complete_store(blocks[2:], ctx)
        h.complete_store(blocks[:2], ctx)
        reader = h.new_request("reader", blocks)
        h.prepare_load([blocks[3], blocks[0], blocks[2]], reader)
        h.complete_load([blocks[3], blocks[0], blocks[2]], reader)

    def test_a_chunk_being_loaded_is_never_evicted(self, harness: Callable[..., ManagerHarness]) -> None:
        """A block between `prepare_load` and `complete_load` is never evicted, however full
        the cache.

        In vLLM: the worker is still copying the chunk to the GPU; a new block written into it
        meanwhile is served as the old one's KV."""
        h = harness()
        blocks = [h.key(n) for n in range(4)]
        ctx = h.new_request("r", blocks)
        h.prepare_store(blocks, ctx)
        h.complete_store(blocks, ctx)
        reader = h.new_request("reader", blocks)
        h.prepare_load(blocks[:3], reader)
        writer = h.new_request("writer")
        for n in range(4, 8):
            out = h.prepare_store([h.key(n)], writer)
            if out is not None:
                h.complete_store(out.keys_to_store, writer)
        h.complete_load(blocks[:3], reader)

    def test_prepare_store_does_not_refuse_when_there_is_room(self, harness: Callable[..., ManagerHarness]) -> None:
        """`prepare_store` returns None only when free chunks plus idle, unoffered ones cannot
        hold the new blocks.

        In vLLM: a refusal means the blocks are not offloaded; a manager that refuses with room
        left offloads nothing once it has filled up."""
        h = harness()
        for round_ in range(4):
            blocks = [h.key(3 * round_ + n) for n in range(3)]
            ctx = h.new_request(f"r{round_}", blocks)
            out = h.prepare_store(blocks, ctx)
            if out is not None:
                h.complete_store(out.keys_to_store, ctx)
            reader = h.new_request(f"reader{round_}", blocks)
            h.prepare_load(blocks[:1], reader)
            h.complete_load(blocks[:1], reader)
            h.end_step()

    def test_evicted_keys_name_exactly_the_keys_that_went(self, harness: Callable[..., ManagerHarness]) -> None:
        """`evicted_keys` names exactly the stored blocks a `prepare_store` evicted: they answer
        MISS afterwards, and every other stored block still answers HIT.

        In vLLM: the connector tells routers and lower tiers which blocks left the CPU tier
        from this list; a block gone but not listed is still routed to, one listed but kept is
        recomputed for nothing."""
        h = harness()
        for round_ in range(3):
            blocks = [h.key(2 * round_ + n) for n in range(3)]
            ctx = h.new_request(f"r{round_}", blocks)
            out = h.prepare_store(blocks, ctx)
            if out is not None:
                h.complete_store(out.keys_to_store, ctx)
            h.check_lookups([h.key(n) for n in range(8)], ctx)

    def test_a_failed_store_frees_its_chunks(self, harness: Callable[..., ManagerHarness]) -> None:
        """The chunks of a store completed with `success=False` are free again: the next
        stores use them without evicting.

        In vLLM: failed copies happen (a preempted request, a GPU error); a manager that leaks
        their chunks shrinks until it offloads nothing."""
        h = harness()
        for round_ in range(3):
            blocks = [h.key(4 * round_ + n) for n in range(4)]
            ctx = h.new_request(f"r{round_}", blocks)
            out = h.prepare_store(blocks, ctx, may_refuse=True)
            rule = self.rule("a_failed_store_frees_its_chunks")
            if out is None:
                raise rule.violation("a store into an empty cache was refused", expected="stored", got=None)
            if out.evicted_keys:
                raise rule.violation("a store into a cache holding nothing evicted", expected=[], got=out.evicted_keys)
            h.complete_store(out.keys_to_store, ctx, success=False)

    def test_reset_cache_empties(self, harness: Callable[..., ManagerHarness]) -> None:
        """After `reset_cache`, every block answers MISS and the whole capacity is free.

        In vLLM: `reset_cache` follows a weight update or a sleep: blocks kept across it are
        KV of the old weights, served as hits."""
        h = harness()
        blocks = [h.key(n) for n in range(4)]
        ctx = h.new_request("r", blocks)
        h.prepare_store(blocks, ctx)
        h.complete_store(blocks, ctx)
        h.end_step()
        h.reset()
        fresh = h.new_request("after-reset")
        h.check_lookups(blocks, fresh)
        others = [h.key(n) for n in range(10, 14)]
        out = h.prepare_store(others, fresh)
        if out is None or out.evicted_keys:
            raise self.rule("reset_cache_empties").violation(
                "a full store right after reset_cache", expected="all four stored, nothing evicted", got=out
            )

    # --- events ---

    def test_events_replay_to_what_lookups_report(self, harness: Callable[..., ManagerHarness]) -> None:
        """With events enabled, the stored and removed events taken so far name exactly the
        blocks that lookups answer HIT for: each stored once, each removal after its store.

        In vLLM: routers and KV-event consumers know the CPU tier only from these events; a
        lost event hides blocks, a doubled or stale one routes requests to blocks that are gone."""
        h = harness(enable_events=True)
        for round_ in range(4):
            blocks = [h.key(2 * round_ + n) for n in range(3)]
            ctx = h.new_request(f"r{round_}", blocks)
            out = h.prepare_store(blocks, ctx)
            h.end_step()
            if out is not None:
                h.complete_store(out.keys_to_store[:1], ctx, success=round_ != 2)
                h.complete_store(out.keys_to_store[1:], ctx)
            h.end_step()
            h.check_lookups([h.key(n) for n in range(10)], ctx)

    def test_removal_events_name_exactly_the_evicted_keys(self, harness: Callable[..., ManagerHarness]) -> None:
        """With events enabled, a `prepare_store` that evicts is followed by removal events for
        exactly its `evicted_keys`.

        In vLLM: a router keeps sending requests to an engine for blocks whose removal it never
        heard of; they all miss."""
        h = harness(enable_events=True)
        blocks = [h.key(n) for n in range(4)]
        ctx = h.new_request("r", blocks)
        h.prepare_store(blocks, ctx)
        h.complete_store(blocks, ctx)
        h.end_step()
        writer = h.new_request("writer")
        out = h.prepare_store([h.key(7), h.key(8)], writer)
        h.end_step()  # the replay holds removals to the evicted keys
        if out is not None:
            h.complete_store(out.keys_to_store, writer)
        h.end_step()

    def test_no_events_unless_enabled(self, harness: Callable[..., ManagerHarness]) -> None:
        """A manager built with `enable_events=False` emits no events.

        In vLLM: without KV events nobody drains them; a manager that buffers them anyway grows
        without bound."""
        h = harness(enable_events=False)
        blocks = [h.key(n) for n in range(6)]
        ctx = h.new_request("r", blocks)
        for part in (blocks[:4], blocks[4:]):
            out = h.prepare_store(part, ctx)
            h.end_step()
            if out is not None:
                h.complete_store(out.keys_to_store, ctx)
            h.end_step()

    def test_a_failed_store_is_released_in_the_events(self, harness: Callable[..., ManagerHarness]) -> None:
        """With events enabled, the blocks of a failed `complete_store` come back in a
        metadata-only removal event (`metadata_only=True`) by the next `take_events`, except
        those a retry has prepared again by then; a metadata-only removal never names a block
        the manager holds.

        In vLLM: the connector's events tracker keeps each block's KV-event payload from the
        store job until a removal names it: a failed store that is never released leaks its
        payload for the life of the engine, and a release of a block a retry holds drops the
        payload the retry's own stored event needs (routers get placeholder hashes)."""
        h = harness(enable_events=True)
        blocks = [h.key(n) for n in range(4)]
        ctx = h.new_request("r", blocks)
        out = h.prepare_store(blocks[:3], ctx)
        h.end_step()
        if out is not None:
            h.complete_store(out.keys_to_store[:1], ctx)
            h.complete_store(out.keys_to_store[1:], ctx, success=False)
        h.end_step()  # released: the two that failed
        out = h.prepare_store(blocks[1:], ctx)
        if out is not None:
            h.complete_store(out.keys_to_store, ctx, success=False)
        retry = h.new_request("retry", blocks)
        out = h.prepare_store(blocks[1:2], retry)  # prepared again before the events are taken
        h.end_step()  # released: the failed ones but the retried one
        if out is not None:
            h.complete_store(out.keys_to_store, retry)
        h.end_step()

    def test_stats_are_well_formed(self, harness: Callable[..., ManagerHarness]) -> None:
        """`get_stats`, read every step as vLLM's connector reads it, reports counters and
        histogram samples of at least 0 and `*_perc` gauges as shares in [0, 1], all 0 when the
        cache holds nothing (after `reset_cache`, or before any store).

        In vLLM: the metrics logger adds each counter to a Prometheus counter, which raises on a
        negative increment; a usage share outside 0-100%, or above 0 for an empty cache, tells
        the operator sizing the cache something false."""
        h = harness(enable_events=True)
        h.end_step()
        for round_ in range(3):
            blocks = [h.key(10 * round_ + n) for n in range(6)]
            ctx = h.new_request(f"r{round_}", blocks)
            for part in (blocks[:3], blocks[3:]):
                out = h.prepare_store(part, ctx)
                h.end_step()  # shares while the stores are in flight
                if out is not None:
                    h.complete_store(out.keys_to_store[:2], ctx)
                    h.complete_store(out.keys_to_store[2:], ctx, success=round_ != 1)
                h.end_step()
            hits = [b for b in blocks if b in h.ready][:2]
            if hits:
                h.prepare_load(hits, ctx)
                h.end_step()  # shares while loads pin chunks
                h.complete_load(hits, ctx)
            h.finish_request(ctx)
            h.end_step()
        h.reset()  # checks that an empty cache reports no usage

    # --- policy ---

    def test_evictions_follow_the_reference_policy(self, harness: Callable[..., ManagerHarness]) -> None:
        """With `policy` set, every `prepare_store` evicts the blocks kvref's reference policy of
        that name evicts (vLLM 0.33's decisions), touches and finished requests included.

        In vLLM: the policy decides the hit rate; an LRU that ignores recency, or an ARC that
        is an LRU, evicts the blocks requests come back for."""
        h = harness(num_chunks=8)
        rng = random.Random(0)
        documents = [[h.key(100 * doc + n) for n in range(6)] for doc in range(6)]
        loading: list[tuple[ReqContext, list[OffloadKey]]] = []
        for round_ in range(60):
            doc = min(int(rng.paretovariate(1.2)) - 1, len(documents) - 1)
            blocks = documents[doc][: rng.randint(1, 6)] + [h.key(10_000 + 2 * round_ + n) for n in range(rng.randint(0, 2))]
            ctx = h.new_request(f"r{round_}", blocks)
            hits = 0
            for block in blocks:
                if h.lookup(block, ctx) is not LookupResult.HIT:
                    break
                hits += 1
            if hits:
                h.prepare_load(blocks[:hits], ctx)
                loading.append((ctx, blocks[:hits]))
            # Some requests touch their blocks; all of them are accesses the request's finish
            # commits to the policy.
            if rng.random() < 0.5:
                h.touch(blocks, ctx)
            held = [b for b in h.ready if b not in blocks]
            if held and rng.random() < 0.5:  # blocks the GPU still holds (vLLM's prefix cache)
                h.touch(rng.sample(held, min(2, len(held))), ctx)
            out = h.prepare_store(blocks[hits:], ctx)
            if len(loading) > 1:  # a load finishes a request later: its chunks stay pinned meanwhile
                earlier, loaded = loading.pop(0)
                h.complete_load(loaded, earlier)
            if out is not None:
                h.complete_store(out.keys_to_store, ctx, success=rng.random() > 0.1)
            h.finish_request(ctx)
            h.end_step()

    def test_random_programs_keep_every_rule(
        self, harness: Callable[..., ManagerHarness], request: pytest.FixtureRequest
    ) -> None:
        """Random interleavings of lookups, loads, stores (completed or failed, now or later),
        touches, finished requests, ended steps and resets from several requests keep the rules
        above after every step, with events on.

        In vLLM: the scheduler interleaves all of these; a rule that holds only in tidy
        sequences breaks under load."""
        run_manager_programs(lambda: harness(enable_events=True), request, self.quick_examples)
