"""`SecondaryTierContract`: vLLM 0.33's promises for a secondary tier, one test per rule.

    class TestMyTier(SecondaryTierContract):
        @pytest.fixture
        def tier_config(self, tmp_path):
            return {"type": "MyTier", "module_path": "my_pkg.tiers", "root_dir": str(tmp_path / "t")}

The kit builds the tier itself, with vLLM's `SecondaryTierFactory`, from that dict (plus
`locality` or `enable_kv_events` where a rule needs them) over a primary view of 16 rows of
16 KiB and a `TieringOffloadingSpec`, with vLLM's global KV-events flag on or off, and drives it
as vLLM's tiering manager does (`kvref.testing.vllm._tier_harness`). Optional:

* `persistent = False` for a tier whose blocks die with it (the persistence rule then does not
  apply, nor, unless `shared = True`, the sharing rule);
* `shared = False` for a tier whose instances keep their blocks to themselves, even on the same
  storage (the sharing rule then does not apply);
* a `second_tier_config` fixture giving the dict of a second engine on the same storage, where
  it is not `tier_config` itself (another mount of the same volume, say);
* a `damage_block` fixture returning `damage(tier, key)`, which corrupts a stored block in place,
  for the damaged-load rule (which does not apply without it);
* `not_applicable = {"rule_id": "why"}` to opt out of a rule that cannot apply.

Rules that do not apply are deselected and listed with their reasons at the end of the run
(SKIPPED with them where the kit's pytest plugin is not loaded).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import pytest
from typing_extensions import override
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager

from kvref.testing.vllm._common import Contract
from kvref.testing.vllm._tier_event_rules import TierEventRules
from kvref.testing.vllm._tier_job_rules import TierJobRules
from kvref.testing.vllm._tier_harness import NUM_BLOCKS, TierHarness
from kvref.testing.vllm._tier_machine import run_tier_programs

__all__ = ["SecondaryTierContract", "DamageBlock"]

DamageBlock = Callable[[SecondaryTierManager, OffloadKey], None]

_SHARING_RULE = "a_block_stored_by_one_instance_is_a_hit_in_another"
_SHARED_WITHIN_S = 1.0


class SecondaryTierContract(TierJobRules, TierEventRules, Contract):
    """Subclass it and give a `tier_config` fixture: every rule below runs against your tier.

    Attributes:
        persistent: blocks outlive the tier instance (a new one on the same config finds them).
        shared: instances on the same storage share their blocks (any number of engines may use
            it at once); None (the default) for the same as `persistent`.
        quick_examples: random programs per run at `--kvref-conformance=quick` (deep: 20x).
    """

    persistent: ClassVar[bool] = True
    shared: ClassVar[bool | None] = None
    quick_examples: ClassVar[int] = 25

    @pytest.fixture
    def tier_config(self) -> dict[str, Any]:
        pytest.fail(f"{type(self).__name__} must define a `tier_config` fixture: the dict of `secondary_tiers`")

    @pytest.fixture
    def second_tier_config(self, tier_config: dict[str, Any]) -> dict[str, Any]:
        """The dict of a second engine on the same storage, beside the first: by default the same."""
        return tier_config

    @pytest.fixture
    def damage_block(self) -> DamageBlock | None:
        return None

    @classmethod
    @override
    def inapplicable_rules(cls) -> dict[str, str]:
        inapplicable = super().inapplicable_rules()
        if not cls.persistent:
            inapplicable.setdefault("blocks_survive_a_new_instance", "persistent = False: the tier's blocks die with it")
        if cls.shared is False:
            inapplicable.setdefault(_SHARING_RULE, "shared = False: each instance keeps its blocks to itself")
        elif cls.shared is None and not cls.persistent:
            inapplicable.setdefault(
                _SHARING_RULE, "persistent = False: blocks live in their instance (set shared = True if others see them)"
            )
        # A damage_block fixture is given by overriding this one in the subclass (a class's own
        # fixture hides any in conftest), so the class attribute says whether there is one.
        if next(k for k in cls.__mro__ if "damage_block" in vars(k)) is SecondaryTierContract:
            inapplicable.setdefault(
                "a_damaged_block_fails_its_load", "no damage_block fixture: give one to check loads of damaged blocks"
            )
        return inapplicable

    @pytest.fixture
    def harness(self, tier_config: dict[str, Any]) -> Iterator[TierHarness]:
        harness = TierHarness(tier_config, self.rule)
        yield harness
        harness.shutdown_all()

    # --- building ---

    def test_factory_builds_the_configured_tier(self, harness: TierHarness) -> None:
        """vLLM's factory builds the tier from the operator's dict, with the configured
        `tier_type`, and `block_size_bytes` equal to a primary row; its `medium` is a Medium.

        In vLLM: the tiering manager labels metrics by `tier_type`, sizes transfers and
        backpressure by `block_size_bytes`, and files the tier's events under its medium."""
        tier = harness.build()
        rule = self.rule("factory_builds_the_configured_tier")
        if tier.tier_type != harness.tier_config["type"]:
            raise rule.violation("wrong tier_type", expected=harness.tier_config["type"], got=tier.tier_type)
        if tier.block_size_bytes != harness.rows.strides[0]:
            raise rule.violation("wrong block_size_bytes", expected=harness.rows.strides[0], got=tier.block_size_bytes)
        if not isinstance(type(tier).medium, Medium):
            raise rule.violation("no medium", expected="Medium.CPU or Medium.STORAGE", got=type(tier).medium)

    def test_locality_is_the_configured_one(self, harness: TierHarness) -> None:
        """`locality` is the configured one ("LOCAL" or "REMOTE") as a `Locality`, and None
        when the dict has none.

        In vLLM: requests filter the tiers they load from by medium and locality, and KV
        events carry it to routers; a wrong locality sends loads to the wrong tier."""
        rule = self.rule("locality_is_the_configured_one")
        configured = harness.tier_config.get("locality")
        tier = harness.build()
        expected = None if configured is None else Locality(configured)
        if tier.locality is not expected:
            raise rule.violation("as configured", expected=expected, got=tier.locality)
        for value in ("LOCAL", "REMOTE"):
            tier = harness.build(locality=value)
            if tier.locality is not Locality(value):
                raise rule.violation(f"configured locality={value!r}", expected=Locality(value), got=tier.locality)

    def test_answers_have_vllm_types(self, harness: TierHarness) -> None:
        """Every answer has the type vLLM's manager reads: `on_new_request` a
        `RequestOffloadingContext`, `get_finished_jobs` `JobResult`s, `has_pending_work` a
        bool, `take_events` `OffloadingEvent`s, `config_info` a mapping, `get_stats` None or
        `OffloadingConnectorStats`, and the class's `config_info_keys` and
        `build_metric_definitions` a tuple of names and a dict of metric metadata.

        In vLLM: the tiering manager reads fields of these answers on the scheduler thread (a
        request's offload policy, a job's id); an answer of another type raises there and stops
        the engine."""
        tier = harness.build()
        rule = self.rule("answers_have_vllm_types")
        req = ReqContext(req_id="types")

        def expect(what: str, value: object, kind: type | tuple[type, ...]) -> None:
            if not isinstance(value, kind):
                raise rule.violation(what, expected=kind, got=value)

        expect("on_new_request", tier.on_new_request(req), RequestOffloadingContext)
        harness.submit(tier, harness.job([harness.key(1)], [0], load=False))
        tier.drain_jobs()
        for result in harness.poll(tier):
            expect("a get_finished_jobs item", result, JobResult)
        expect("has_pending_work", tier.has_pending_work(), bool)
        for event in tier.take_events():
            expect("a take_events item", event, OffloadingEvent)
        expect("config_info", tier.config_info(), Mapping)
        expect("get_stats", tier.get_stats(), (OffloadingConnectorStats, type(None)))
        keys = type(tier).config_info_keys(harness.tier_config)
        if not isinstance(keys, tuple) or not all(isinstance(key, str) for key in keys):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise rule.violation("config_info_keys", expected="a tuple of label names", got=keys)
        metrics = type(tier).build_metric_definitions(harness.tier_config)
        if not isinstance(metrics, dict) or not all(isinstance(m, OffloadingMetricMetadata) for m in metrics.values()):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise rule.violation("build_metric_definitions", expected="dict of OffloadingMetricMetadata", got=metrics)
        tier.on_request_finished(req)

    # --- lookups ---

    def test_lookup_answers_hit_miss_or_retry(self, harness: TierHarness) -> None:
        """A tier's `lookup` answers HIT, MISS or RETRY, nothing else (HIT_PENDING is the
        primary tier's answer).

        In vLLM: the tiering manager acts on HIT and RETRY only; any other answer is taken for a
        miss, so blocks the tier holds are recomputed."""
        tier = harness.build()
        harness.store(tier, [harness.key(1)], [0])
        req = ReqContext(req_id="lookups")
        harness.lookup(tier, harness.key(1), req)
        harness.lookup(tier, harness.key(2), req)

    def test_lookup_settles(self, harness: TierHarness) -> None:
        """RETRY is temporary: once steps end (vLLM's manager collects the tier's finished jobs,
        then calls `on_schedule_end`) and the tier's own check has run, `lookup` answers HIT or
        MISS.

        In vLLM: a request whose lookup answers RETRY waits for the next step; a RETRY that
        never settles stalls the request forever."""
        tier = harness.build()
        req = ReqContext(req_id="settle")
        for n in range(4):
            harness.lookup(tier, harness.key(n), req)

    def test_lookup_answers_miss_for_absent_keys(self, harness: TierHarness) -> None:
        """A block never stored answers MISS (after any RETRY), for every request.

        In vLLM: a HIT starts a promotion from the tier, which then fails; the request waited a
        step for nothing, and a tier answering HIT for everything makes every request wait."""
        tier = harness.build()
        harness.store(tier, [harness.key(100)], [0])
        for n in range(3):
            req = ReqContext(req_id=f"absent-{n}")
            answer = harness.lookup(tier, harness.key(n), req)
            if answer is not LookupResult.MISS:
                raise self.rule("lookup_answers_miss_for_absent_keys").violation(
                    f"lookup of a block never stored, request {req.req_id}", expected=LookupResult.MISS, got=answer
                )

    def test_lookup_is_a_hit_once_a_store_finished(self, harness: TierHarness) -> None:
        """Once a store job is reported successful, `lookup` of its blocks answers HIT (after
        any RETRY), for a request that asks afterwards.

        In vLLM: blocks the tier holds are never promoted; requests recompute KV that was
        offloaded, and the tier only costs bandwidth."""
        tier = harness.build()
        keys = [harness.key(n) for n in range(3)]
        result = harness.store(tier, keys, [0, 1, 2])
        if not result.success:
            raise self.rule("lookup_is_a_hit_once_a_store_finished").violation(
                "a plain store of three blocks failed", expected=True, got=result
            )
        req = ReqContext(req_id="after-store")
        answers = [harness.lookup(tier, k, req) for k in keys]
        if answers != [LookupResult.HIT] * 3:
            raise self.rule("lookup_is_a_hit_once_a_store_finished").violation(
                "lookups after the store finished", expected=[LookupResult.HIT] * 3, got=answers
            )

    # --- bytes ---

    def test_stored_bytes_load_back_exactly(self, harness: TierHarness) -> None:
        """A load writes exactly the bytes that were stored, into the rows it is given, whichever
        rows the blocks were stored from, for one block or many.

        In vLLM: the GPU attends over whatever the CPU tier holds: wrong bytes are wrong KV, and
        the model's output is silently corrupted."""
        tier = harness.build()
        keys = [harness.key(n) for n in range(8)]
        rule = self.rule("stored_bytes_load_back_exactly")
        phases = (([15], [0]), (list(range(8)), list(range(15, 7, -1))), (list(range(8, 16)), list(range(8))))
        for store_rows, load_rows in phases:
            blocks = keys[: len(store_rows)]
            stored = harness.store(tier, blocks, store_rows)
            if not stored.success:
                raise rule.violation(f"store into rows {store_rows} failed", expected=True, got=stored)
            loaded = harness.load(tier, blocks, load_rows)  # bytes checked by the harness
            if not loaded.success:
                raise rule.violation(f"load of stored blocks into rows {load_rows} failed", expected=True, got=loaded)

    def test_a_load_of_a_missing_block_fails_its_job(self, harness: TierHarness) -> None:
        """A load naming a block the tier does not hold is reported failed (success=False).

        In vLLM: a load reported good marks its CPU slots readable: the GPU then loads whatever
        those slots held, another request's KV."""
        tier = harness.build()
        harness.store(tier, [harness.key(1)], [0])
        result = harness.load(tier, [harness.key(1), harness.key(2)], [8, 9])
        if result.success:
            raise self.rule("a_load_of_a_missing_block_fails_its_job").violation(
                "load of one stored and one never-stored block", expected="success=False", got=result
            )

    def test_a_failed_load_lists_only_blocks_written_right(self, harness: TierHarness) -> None:
        """A failed load's `successful_keys` names only blocks of the job whose rows hold the
        right bytes (None when none does), never the missing ones.

        In vLLM: the manager keeps the blocks in `successful_keys` as readable CPU blocks; one
        listed without its bytes is wrong KV served to every request that hits it."""
        tier = harness.build()
        stored, missing = [harness.key(1), harness.key(3)], [harness.key(2), harness.key(4)]
        harness.store(tier, stored, [0, 1])
        result = harness.load(tier, [stored[0], missing[0], stored[1], missing[1]], [8, 9, 10, 11])
        listed = set(result.successful_keys or ())
        if listed & set(missing):
            raise self.rule("a_failed_load_lists_only_blocks_written_right").violation(
                "successful_keys names a block the tier never held", expected=f"a subset of {stored}", got=result.successful_keys
            )

    def test_a_damaged_block_fails_its_load(self, harness: TierHarness, damage_block: DamageBlock | None) -> None:
        """A load of a block damaged in storage fails its job, and lists only the undamaged
        blocks in `successful_keys`.

        In vLLM: a damaged block reported loaded is wrong KV; one never reported failed is
        promoted again and again."""
        if damage_block is None:  # deselected as not applicable, unless the fixture gives None
            pytest.skip("the damage_block fixture gave None")
        tier = harness.build()
        keys = [harness.key(n) for n in range(3)]
        harness.store(tier, keys, [0, 1, 2])
        damage_block(tier, keys[1])
        result = harness.load(tier, keys, [8, 9, 10])
        rule = self.rule("a_damaged_block_fails_its_load")
        if result.success or keys[1] in set(result.successful_keys or ()):
            raise rule.violation("load of a damaged block", expected="failed, damaged block not listed", got=result)

    def test_a_store_that_cannot_be_done_fails_its_job(self, harness: TierHarness) -> None:
        """A store the tier cannot carry out (here: a chunk id beyond the primary) is reported
        failed, without raising.

        In vLLM: an exception on the scheduler thread stops the engine; a failed store reported
        good makes the tier answer HIT for a block it never got."""
        tier = harness.build()
        rule = self.rule("a_store_that_cannot_be_done_fails_its_job")
        job = harness.job([harness.key(1)], [NUM_BLOCKS + 3], load=False)
        try:
            harness.submit(tier, job)
        except Exception as exc:
            raise rule.violation("submit_store raised", expected="a failed JobResult", got=exc) from exc
        (result,) = harness.finish(tier, [job])
        if result.success:
            raise rule.violation("store from a chunk id beyond the primary", expected="success=False", got=result)

    # --- lifetime, concurrency ---

    def test_blocks_survive_a_new_instance(self, harness: TierHarness) -> None:
        """A tier built anew on the same configuration (an engine restart) finds the blocks the
        last one stored, with their bytes.

        In vLLM: a persistent tier that forgets on restart makes every restart recompute its
        whole cache, and answers HIT for nothing it can load."""
        keys = [harness.key(n) for n in range(4)]
        first = harness.build()
        harness.store(first, keys, list(range(4)))
        first.shutdown()
        second = harness.build()
        req = ReqContext(req_id="after-restart")
        rule = self.rule("blocks_survive_a_new_instance")
        answers = [harness.lookup(second, k, req) for k in keys]
        if answers != [LookupResult.HIT] * 4:
            raise rule.violation("lookups on a new instance", expected=[LookupResult.HIT] * 4, got=answers)
        loaded = harness.load(second, keys, list(range(8, 12)))
        if not loaded.success:
            raise rule.violation("load on a new instance", expected=True, got=loaded)

    def test_a_block_stored_by_one_instance_is_a_hit_in_another(
        self, harness: TierHarness, second_tier_config: dict[str, Any]
    ) -> None:
        """A block whose store one instance reported successful is a HIT (after any RETRY)
        within 1 s in a second instance on the same storage, alive beside it, for a request
        that asks afterwards (even where that instance answered MISS for it just before), and
        loads there with the bytes stored; either instance may be the one that stored it.

        In vLLM: replicas of a model, data-parallel ranks and hosts on a shared volume each
        run a tier of their own over one store; a block that only the engine that stored it
        finds is recomputed by every other, so the shared tier saves them nothing."""
        rule = self.rule(_SHARING_RULE)
        first = harness.build()
        other = harness.peer(second_tier_config)
        second = other.build()
        roles = ((harness, first, other, second, "the first", "the second"),
                 (other, second, harness, first, "the second", "the first"))  # fmt: skip
        for batch, (writer, stores, reader, finds, stored_by, found_by) in enumerate(roles, start=1):
            keys = [harness.key(n, batch) for n in range(3)]
            before = ReqContext(req_id=f"before-store-{batch}")
            for key in keys:  # a MISS it must not keep once the block is stored
                reader.lookup(finds, key, before)
            finds.on_request_finished(before)
            stored = writer.store(stores, keys, [0, 1, 2])
            if not stored.success:
                raise rule.violation(f"a store of three blocks in {stored_by} instance failed", expected=True, got=stored)
            reported = time.monotonic()
            for key in keys:
                answer, answered = reader.lookup_until_hit(finds, key, reported + _SHARED_WITHIN_S)
                if answer is not LookupResult.HIT:
                    raise rule.violation(
                        f"{found_by} instance asked for a block {stored_by} stored, for {answered - reported:.2f} s",
                        expected=f"HIT within {_SHARED_WITHIN_S:.0f} s", got=answer,
                    )  # fmt: skip
            loaded = reader.load(finds, keys, [8, 9, 10])  # bytes checked by the harness
            if not loaded.success:
                raise rule.violation(
                    f"{found_by} instance loaded blocks {stored_by} stored", expected="success=True", got=loaded
                )

    def test_overlapping_jobs_from_several_requests(self, harness: TierHarness) -> None:
        """Many jobs of several requests in flight at once, sharing blocks, each end as if
        alone: stores succeed, loads get their bytes, each job is reported once.

        In vLLM: every running request cascades and promotes at the same time; a tier that
        mixes jobs up serves one request's KV to another."""
        tier = harness.build()
        keys = [harness.key(n) for n in range(5)]
        # Request i stores blocks i and i+1 from rows 2i and 2i+1: neighbours share a block,
        # each job reads rows of its own, all in flight at once.
        stores = [
            harness.submit(tier, harness.job(keys[req : req + 2], [2 * req, 2 * req + 1], load=False, req=f"r{req}"))
            for req in range(4)
        ]
        harness.finish(tier, stores)
        rule = self.rule("overlapping_jobs_from_several_requests")
        failed = [r for r in (harness.reported[tier][j.job_id] for j in stores) if not r.success]
        if failed:
            raise rule.violation("overlapping stores failed", expected=[], got=failed)
        harness.clear(range(8, 16))
        loads = [
            harness.submit(tier, harness.job(keys[req : req + 2], [8 + 2 * req, 9 + 2 * req], load=True, req=f"r{req}"))
            for req in range(4)
        ]
        for result in harness.finish(tier, loads):  # the harness checks every loaded row
            if not result.success:
                raise rule.violation("overlapping loads of stored blocks failed", expected=True, got=result)

    def test_random_programs_keep_every_rule(self, harness: TierHarness, request: pytest.FixtureRequest) -> None:
        """Random interleavings of stores, loads, lookups, ended steps, finished requests and
        drains from several requests keep the rules above after every step.

        In vLLM: the scheduler interleaves all of these; a rule that holds only in tidy
        sequences breaks under load."""
        run_tier_programs(harness, request, self.quick_examples)
