"""The tier contract's harness: a primary tier's memory, vLLM's spec and factory, jobs and polls.

`TierHarness` builds the tier under test exactly as vLLM does (`SecondaryTierFactory` from the
operator's dict, over a primary view and a `TieringOffloadingSpec` built from an
`OffloadingConfig`), submits `TransferJob`s as vLLM's tiering manager does and collects their
results, checking on every poll what every poll must satisfy: a job is reported once, only if it
was submitted, and a load reported good holds the right bytes. `TierHarness.peer` is a second
engine beside it (its own primary memory, the same blocks), for the rule that two instances on
one storage share their blocks.
"""

from __future__ import annotations

import hashlib
import itertools
import mmap
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvref.testing.vllm._common import Rule

__all__ = ["BLOCK_BYTES", "NUM_BLOCKS", "TierHarness", "END_OF_STEP", "content"]

BLOCK_BYTES = 16 << 10  # a primary row (one chunk): a multiple of the page size, as vLLM's are
NUM_BLOCKS = 16
END_OF_STEP = ScheduleEndContext(new_req_ids=[], preempted_req_ids=())
_SETTLE_S = 10.0  # how long a RETRY or an unreported job may last before it counts as stuck
_POLL_S = 0.002
_RETRY_ASK_S = 0.01  # between requests asking again for a block that answered MISS
_engine_ids = itertools.count()


def content(block: OffloadKey) -> bytes:
    """The bytes block `block` holds wherever it is (KV is content-addressed)."""
    seed = hashlib.blake2b(block, digest_size=64).digest()
    return (seed * (BLOCK_BYTES // len(seed)))[:BLOCK_BYTES]


def offloading_spec(tier_config: Mapping[str, Any], *, kv_events: bool) -> TieringOffloadingSpec:
    """The spec an engine with this tier would build (one KV-cache group, chunk = one block)."""
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(16, ("layer",), 0),),
        worker_kv_bytes_per_block=BLOCK_BYTES,
        enable_kv_cache_events=kv_events,
        extra_config={
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": NUM_BLOCKS * BLOCK_BYTES,
            "secondary_tiers": [dict(tier_config)],
        },
        engine_id=f"kvref-conformance-{next(_engine_ids)}",
        model=OffloadingModelConfig(name="kvref-conformance/model", dtype="float16", max_model_len=1 << 16),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),  # fmt: skip
        replicated_layout=False,
    )
    return TieringOffloadingSpec(config)


class TierHarness:
    """The primary memory, the tiers built over it, and the jobs submitted to them.

    Args:
        tier_config: the operator's dict (`type`, `module_path`, the tier's options).
        rule: the contract's rule lookup, for violations found by the per-poll checks.
    """

    def __init__(self, tier_config: Mapping[str, Any], rule: Callable[[str], Rule]) -> None:
        self.tier_config = dict(tier_config)
        self.rule = rule
        # Blocks of this harness only: a persistent tier may hold other runs' blocks.
        self._salt = os.urandom(8)
        self._memory = mmap.mmap(-1, NUM_BLOCKS * BLOCK_BYTES)  # page-aligned, as vLLM's region
        self.rows = np.frombuffer(self._memory, dtype=np.uint8).reshape(NUM_BLOCKS, BLOCK_BYTES)
        self.threads_before = set(threading.enumerate())
        self.tiers: list[SecondaryTierManager] = []
        self._job_ids = itertools.count(1)
        self.submitted: dict[SecondaryTierManager, dict[int, TransferJob]] = {}
        self.reported: dict[SecondaryTierManager, dict[int, JobResult]] = {}
        self.stored_ok: set[OffloadKey] = set()  # blocks of store jobs reported successful
        self._peers: list[TierHarness] = []

    def key(self, n: int, batch: int = 0) -> OffloadKey:
        """This harness's `n`-th block of `batch` (a 16-byte hash, KV-cache group 0)."""
        digest = hashlib.blake2b(self._salt + batch.to_bytes(8, "big") + n.to_bytes(8, "big"), digest_size=16)
        return make_offload_key(digest.digest(), 0)

    # --- building ---

    def build(self, *, kv_events: bool = False, **options: Any) -> SecondaryTierManager:
        """Build a tier from the operator's dict (plus `options`) with vLLM's factory.

        The tier built before is shut down first: as in an engine, one tier per configuration
        is alive at a time (a tier may hold its storage exclusively). A peer's tiers are
        another engine's, and stay.
        """
        self._shutdown_own()
        config = {**self.tier_config, **options}
        tier = SecondaryTierFactory.create_secondary_tier(  # pyright: ignore[reportUnknownMemberType]
            config, self.rows.data, offloading_spec(config, kv_events=kv_events)
        )
        self.tiers.append(tier)
        self.submitted[tier] = {}
        self.reported[tier] = {}
        return tier

    def peer(self, tier_config: Mapping[str, Any]) -> TierHarness:
        """A second engine beside this one, whose tiers (built from `tier_config`, on the same
        storage) are alive at the same time as this one's.

        It has a primary memory of its own, as another engine has, and shares with this harness
        what is true of blocks wherever they are: their names and bytes, and which were stored.
        """
        peer = TierHarness(tier_config, self.rule)
        peer._salt = self._salt
        peer.stored_ok = self.stored_ok
        peer.threads_before = self.threads_before
        self._peers.append(peer)
        return peer

    def shutdown_all(self) -> None:
        """Shut down every tier built here and by the peers."""
        for peer in self._peers:
            peer.shutdown_all()
        self._shutdown_own()

    def _shutdown_own(self) -> None:
        while self.tiers:
            tier = self.tiers.pop()
            try:
                tier.shutdown()
            except Exception:  # the tier under test failing: the shutdown rule reports that
                pass

    # --- the primary's rows ---

    def fill(self, row: int, block: OffloadKey) -> None:
        self.rows[row] = np.frombuffer(content(block), dtype=np.uint8)

    def clear(self, rows: Collection[int]) -> None:
        for row in rows:
            self.rows[row] = 0

    def holds(self, row: int, block: OffloadKey) -> bool:
        return self.rows[row].tobytes() == content(block)

    # --- jobs ---

    def job(self, keys: Sequence[OffloadKey], rows: Sequence[int], *, load: bool, req: str = "kit") -> TransferJob:
        return TransferJob(
            job_id=next(self._job_ids),
            keys=list(keys),
            chunk_ids=np.array(rows, dtype=np.int64),
            is_promotion=load,
            req_context=ReqContext(req_id=req),
        )

    def submit(self, tier: SecondaryTierManager, job: TransferJob) -> TransferJob:
        if not job.is_promotion:
            for block, row in zip(job.keys, job.chunk_ids.tolist()):
                if 0 <= row < NUM_BLOCKS:
                    self.fill(row, block)
        self.submitted[tier][job.job_id] = job
        (tier.submit_load if job.is_promotion else tier.submit_store)(job)
        return job

    def poll(self, tier: SecondaryTierManager) -> list[JobResult]:
        """One `get_finished_jobs`, checked: each job once, submitted, and loads right."""
        results = list(tier.get_finished_jobs())
        submitted, reported = self.submitted[tier], self.reported[tier]
        for result in results:
            job = submitted.get(result.job_id)
            if job is None:
                raise self.rule("every_job_is_reported_exactly_once").violation(
                    f"get_finished_jobs reported job {result.job_id}, which was never submitted"
                )
            if result.job_id in reported:
                raise self.rule("every_job_is_reported_exactly_once").violation(
                    f"job {result.job_id} was reported twice", expected="one JobResult", got=[reported[result.job_id], result]
                )
            reported[result.job_id] = result
            if job.is_promotion:
                self._check_load(job, result)
            elif result.success:
                self.stored_ok.update(job.keys)
        return results

    def _check_load(self, job: TransferJob, result: JobResult) -> None:
        keys = list(job.keys)
        never = [k for k in keys if k not in self.stored_ok]
        if result.success and never:
            raise self.rule("a_load_of_a_missing_block_fails_its_job").violation(
                f"job {job.job_id} reported successful with {len(never)} block(s) never stored", expected=False, got=result
            )
        good = list(keys) if result.success else list(result.successful_keys or ())
        unknown = [k for k in good if k not in keys]
        if unknown:
            raise self.rule("a_failed_load_lists_only_blocks_written_right").violation(
                f"job {job.job_id} reports successful_keys it does not have", expected=keys, got=good
            )
        rows = dict(zip(keys, job.chunk_ids.tolist()))
        wrong = [k for k in good if not self.holds(rows[k], k)]
        if wrong:
            rule = "stored_bytes_load_back_exactly" if result.success else "a_failed_load_lists_only_blocks_written_right"
            raise self.rule(rule).violation(
                f"job {job.job_id} reported {len(wrong)} block(s) loaded whose rows hold other bytes",
                expected="the bytes stored", got=f"other bytes in rows {[rows[k] for k in wrong]}",
            )  # fmt: skip

    def finish(self, tier: SecondaryTierManager, jobs: Sequence[TransferJob]) -> list[JobResult]:
        """Drain, then poll once: every job must be reported by now (vLLM's reset relies on it)."""
        tier.drain_jobs()
        self.poll(tier)
        missing = [j.job_id for j in jobs if j.job_id not in self.reported[tier]]
        if missing:
            raise self.rule("every_job_is_reported_by_the_first_poll_after_drain").violation(
                "drain_jobs returned, then get_finished_jobs left jobs out", expected=[j.job_id for j in jobs], got=missing
            )
        return [self.reported[tier][j.job_id] for j in jobs]

    def store(self, tier: SecondaryTierManager, keys: Sequence[OffloadKey], rows: Sequence[int]) -> JobResult:
        return self.finish(tier, [self.submit(tier, self.job(keys, rows, load=False))])[0]

    def load(self, tier: SecondaryTierManager, keys: Sequence[OffloadKey], rows: Sequence[int]) -> JobResult:
        self.clear(rows)
        return self.finish(tier, [self.submit(tier, self.job(keys, rows, load=True))])[0]

    # --- lookups ---

    def lookup(self, tier: SecondaryTierManager, block: OffloadKey, req: ReqContext) -> LookupResult:
        """Ask as vLLM's manager does: after RETRY, end the step (collect the tier's finished
        jobs, then `on_schedule_end`) and ask again."""
        deadline = time.monotonic() + _SETTLE_S
        while True:
            answer = tier.lookup(block, req)
            if answer not in (LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY):
                raise self.rule("lookup_answers_hit_miss_or_retry").violation(
                    f"lookup({block.hex()}) answered {answer!r}", expected="HIT, MISS or RETRY", got=answer
                )
            if answer is not LookupResult.RETRY:
                return answer
            if time.monotonic() > deadline:
                raise self.rule("lookup_settles").violation(
                    f"lookup({block.hex()}) still answers RETRY after {_SETTLE_S:.0f} s of ended steps"
                )
            self.poll(tier)
            tier.on_schedule_end(END_OF_STEP)
            time.sleep(_POLL_S)

    def lookup_until_hit(self, tier: SecondaryTierManager, block: OffloadKey, deadline: float) -> tuple[LookupResult, float]:
        """Ask for `block` as requests arriving one after another do (each a new request,
        finished once answered) until it answers HIT or `deadline` (`time.monotonic()`) passes.

        Returns:
            The last answer and when it came (`time.monotonic()`).
        """
        asked = 0
        while True:
            req = ReqContext(req_id=f"kit-until-hit-{asked}")
            answer = self.lookup(tier, block, req)
            answered = time.monotonic()
            tier.on_request_finished(req)
            if answer is LookupResult.HIT or answered > deadline:
                return answer, answered
            asked += 1
            time.sleep(_RETRY_ASK_S)

    def new_threads(self) -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t not in self.threads_before and t.is_alive()]
