"""`kvref.integrations.vllm` as vLLM 0.33 sees it: built by its factory, held to its tier contract.

Tiers are built by vLLM's own `SecondaryTierFactory` (or its `TieringOffloadingSpec`) from the
dicts an operator writes; the calls are vLLM's `SecondaryTierManager` API as its manager makes
them. Each test names the point of the contract it checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import numpy as np
import pytest
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.tiering.backpressure import EMABackpressureDetector
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from examples.vllm_engine import Engine, prompt_keys
from kvref.base import OffloadKey as KvrefKey
from kvref.integrations.vllm import FileSystemTier, RedisTier, VllmTier
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.fs.format import file_bytes
from kvref.tiering.memory import InMemorySecondaryTier
from kvref.tiering.redis import RedisSecondaryTier
from kvref.tiering.redis.local import LocalRedisCluster, LocalRedisServer
from kvref.tiering.tier_reporting import KvrefTierMetrics
from tools._vllm_spec import mock_offloading_spec

_ROOT = Path(__file__).resolve().parents[2]
_BLOCKS = 8
_ROW = 4096
_END = ScheduleEndContext(new_req_ids=[], preempted_req_ids=())
_MODULE = "kvref.integrations.vllm"


def offloading_spec(*, kv_events: bool = False, model: str = "plugin-test/model") -> MagicMock:
    """vLLM's tests' spec: a mock around a real OffloadingConfig and KV-events flag."""
    return mock_offloading_spec(kv_events=kv_events, model=model, engine_id="plugin-test")


def key(n: int) -> OffloadKey:
    return make_offload_key(n.to_bytes(8, "big"), 0)


def content(k: OffloadKey) -> bytes:
    return (k * (_ROW // len(k) + 1))[:_ROW]


class Primary:
    """A primary tier's memory: `_BLOCKS` rows of `_ROW` bytes, as a (rows, bytes) numpy view."""

    def __init__(self) -> None:
        self.array = np.zeros((_BLOCKS, _ROW), dtype=np.uint8)
        self.view = self.array.data

    def fill(self, chunk_id: int, k: OffloadKey) -> None:
        self.array[chunk_id] = np.frombuffer(content(k), dtype=np.uint8)

    def holds(self, chunk_id: int, k: OffloadKey) -> bool:
        return self.array[chunk_id].tobytes() == content(k)


_job_ids = iter(range(1, 1 << 30))


def job(keys: list[OffloadKey], chunk_ids: list[int], *, load: bool, req: str = "r") -> TransferJob:
    return TransferJob(
        job_id=next(_job_ids),
        keys=keys,
        chunk_ids=np.array(chunk_ids, dtype=np.int32),
        is_promotion=load,
        req_context=ReqContext(req_id=req),
    )


def finish(tier: SecondaryTierManager) -> list[JobResult]:
    tier.drain_jobs()
    return list(tier.get_finished_jobs())


def settled_lookup(tier: SecondaryTierManager, k: OffloadKey, ctx: ReqContext) -> LookupResult:
    """Ask as vLLM's manager does: RETRY means ask again after the step ends."""
    deadline = time.monotonic() + 5.0
    while (answer := tier.lookup(k, ctx)) is LookupResult.RETRY:
        assert time.monotonic() < deadline, "lookup stayed RETRY"
        tier.on_schedule_end(_END)
        time.sleep(0.005)
    return answer


TierFactory = Callable[..., SecondaryTierManager]


def build_tier(config: dict[str, Any], primary: Primary, spec: Any) -> SecondaryTierManager:
    """vLLM's factory (its `tier_config` is an unparameterised dict)."""
    return SecondaryTierFactory.create_secondary_tier(config, primary.view, spec)  # pyright: ignore[reportUnknownMemberType]


@pytest.fixture(params=["FileSystemTier", "RedisTier"])
def make_tier(
    request: pytest.FixtureRequest, tmp_path: Path, redis_server: LocalRedisServer
) -> Iterator[TierFactory]:
    """Build the tier by vLLM's factory from an operator's dict (plus `options`)."""
    built: list[SecondaryTierManager] = []
    namespace = f"plugin-{uuid.uuid4().hex}"

    def make(primary: Primary, spec: Any = None, **options: Any) -> SecondaryTierManager:
        config: dict[str, Any] = {"type": request.param, "module_path": _MODULE}
        if request.param == "RedisTier":
            config |= {"url": redis_server.url, "namespace": namespace}
        else:
            config |= {"root_dir": str(tmp_path / "fs")}
        tier = build_tier(config | options, primary, spec if spec is not None else offloading_spec())
        built.append(tier)
        return tier

    yield make
    for tier in built:
        tier.shutdown()


# --- the plug-in ---


def test_built_by_vllms_factory_from_the_operators_dict(make_tier: TierFactory) -> None:
    primary = Primary()
    tier = make_tier(primary, locality="REMOTE")
    assert isinstance(tier, RedisTier | FileSystemTier)
    assert isinstance(tier, SecondaryTierManager)
    assert tier.tier_type == type(tier).__name__
    assert tier.block_size_bytes == _ROW
    assert tier.locality is Locality.REMOTE
    assert tier.medium is Medium.STORAGE


def test_redis_tier_reports_hits_as_a_remote_store() -> None:
    # STORAGE would make vLLM's metrics call Redis hits "disk" hits.
    assert RedisTier.cache_hit_source is CacheHitSource.EXTERNAL_UNSPECIFIED
    assert FileSystemTier.cache_hit_source is CacheHitSource.DISK


def test_redis_tier_reaches_a_cluster(redis_cluster: LocalRedisCluster) -> None:
    primary = Primary()
    config = {"type": "RedisTier", "module_path": _MODULE, "url": redis_cluster.url, "cluster": True}
    tier = build_tier(config, primary, offloading_spec())
    try:
        keys = [key(i) for i in range(_BLOCKS)]
        for i, k in enumerate(keys):
            primary.fill(i, k)
        assert [r.success for r in (tier.submit_store(job(keys, list(range(_BLOCKS)), load=False)), *finish(tier))[1:]] == [True]
        assert sum(node.command("DBSIZE") != 0 for node in redis_cluster.nodes) >= 2
    finally:
        tier.shutdown()


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("locality", "local", "locality"),
        ("enable_kv_events", "yes", "enable_kv_events"),
        ("capacity_bytes", -5, "capacity_bytes"),
        ("num_connections", 0, "num_connections"),
        ("root_dir", "", "root_dir"),
        ("url", "http://cache:6379", "url"),
        ("capacity_byte", 10, "capacity_byte"),  # misspelt: unknown to the tier
    ],
)
def test_bad_options_raise_value_error_naming_them(
    make_tier: TierFactory, request: pytest.FixtureRequest, option: str, value: object, named: str
) -> None:
    tier_type = request.node.callspec.params["make_tier"]
    applies = {
        "capacity_bytes": "FileSystemTier",
        "root_dir": "FileSystemTier",
        "num_connections": "RedisTier",
        "url": "RedisTier",
    }
    if applies.get(option, tier_type) != tier_type:
        value, named = 10, option  # the other tier does not know it: also refused by name
    with pytest.raises(ValueError, match=named):
        make_tier(Primary(), **{option: value})


def test_backpressure_detector_reaches_the_base_class_and_vllms_manager(tmp_path: Path) -> None:
    tier = {
        "type": "FileSystemTier",
        "module_path": _MODULE,
        "root_dir": str(tmp_path),
        "backpressure": {"backpressure_cls": "EMABackpressureDetector"},
    }
    engine = Engine([tier], num_chunks=8, block_bytes=_ROW)
    try:
        (secondary,) = engine.manager.secondary_tiers
        detector = secondary.bp_detector
        assert isinstance(detector, EMABackpressureDetector)
        engine.serve("r", prompt_keys("backpressure", 4))
        engine.settle()
        assert detector.stats.get("store_latency_ema") is not None  # vLLM fed it our job
    finally:
        engine.close()


def test_importing_it_without_vllm_is_one_clear_import_error() -> None:
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'vllm' or name.startswith('vllm.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import kvref, kvref.tiering, kvref.cli, kvref.demo, kvref.audit\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'vllm']\n"
        "try:\n"
        "    import kvref.integrations.vllm\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocker], capture_output=True, text=True, cwd=_ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(_ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "ImportError kvref.integrations.vllm needs vLLM 0.33 (vLLM is not installed): "
        "pip install 'kvref[vllm]'"
    )


# --- the contract: lookups ---


def test_lookup_is_retry_until_the_step_ends_then_stable_for_the_request(
    make_tier: TierFactory,
) -> None:
    primary = Primary()
    tier = make_tier(primary)
    k = key(1)
    primary.fill(0, k)
    assert [r.success for r in (tier.submit_store(job([k], [0], load=False)), *finish(tier))[1:]] == [True]
    first, second = ReqContext(req_id="first"), ReqContext(req_id="second")
    assert tier.lookup(k, first) is LookupResult.RETRY  # nothing is asked before the step ends
    time.sleep(0.05)
    assert tier.lookup(k, first) is LookupResult.RETRY
    assert settled_lookup(tier, k, first) is LookupResult.HIT
    assert settled_lookup(tier, key(2), first) is LookupResult.MISS
    # The block vanishes (another engine's eviction, say): the running request keeps its answer,
    # a new request asks the medium again.
    tier.submit_load(job([k], [1], load=True))  # a load still finds it
    assert [r.success for r in finish(tier)] == [True]
    assert tier.lookup(k, first) is LookupResult.HIT
    tier.on_request_finished(first)
    assert settled_lookup(tier, k, second) is LookupResult.HIT


def lose(tier: SecondaryTierManager, k: OffloadKey, redis_server: LocalRedisServer) -> None:
    """Damage one stored block behind the tier's back (a bad disk, another engine's eviction)."""
    assert isinstance(tier, RedisTier | FileSystemTier)
    medium = tier.kvref_tier
    if isinstance(medium, RedisSecondaryTier):
        assert redis_server.command("DEL", medium.redis_key(KvrefKey(k))) == 1
    else:
        assert isinstance(medium, FileSystemSecondaryTier)
        location = medium.location(KvrefKey(k))
        assert location is not None
        path, payload_offset, _size = location
        with open(path, "r+b") as block_file:
            block_file.seek(payload_offset + 100)
            block_file.write(b"\xff" * 8)


def test_failed_load_keeps_good_blocks_and_turns_lost_ones_to_miss(
    make_tier: TierFactory, redis_server: LocalRedisServer
) -> None:
    primary = Primary()
    tier = make_tier(primary)
    good, bad = key(1), key(2)
    primary.fill(0, good)
    primary.fill(1, bad)
    tier.submit_store(job([good, bad], [0, 1], load=False))
    finish(tier)
    ctx = ReqContext(req_id="doomed")
    assert [settled_lookup(tier, k, ctx) for k in (good, bad)] == [LookupResult.HIT] * 2
    lose(tier, bad, redis_server)
    primary.array[:] = 0
    tier.submit_load(job([good, bad], [2, 3], load=True, req="doomed"))
    (result,) = finish(tier)
    assert not result.success and tuple(result.successful_keys or ()) == (good,)
    assert primary.holds(2, good)  # reported loaded: its bytes are right
    assert tier.lookup(bad, ctx) is LookupResult.MISS  # not promoted again and again
    assert tier.lookup(good, ctx) is LookupResult.HIT
    tier.submit_load(job([bad], [3], load=True, req="doomed"))
    (result,) = finish(tier)
    assert not result.success and result.successful_keys is None  # nothing of it loaded


# --- the contract: jobs ---


def test_every_job_once_and_all_by_the_first_poll_after_drain(make_tier: TierFactory) -> None:
    primary = Primary()
    tier = make_tier(primary)
    keys = [key(i) for i in range(_BLOCKS)]
    for i, k in enumerate(keys):
        primary.fill(i, k)
    stores = [job([k], [i], load=False, req=f"r{i % 3}") for i, k in enumerate(keys)]
    for j in stores:
        tier.submit_store(j)
    early = list(tier.get_finished_jobs())
    tier.drain_jobs()
    late = list(tier.get_finished_jobs())
    reported = [r.job_id for r in early + late]
    assert sorted(reported) == sorted(j.job_id for j in stores)  # each once, none missing
    assert list(tier.get_finished_jobs()) == []
    loads = [job([k], [(i + 3) % _BLOCKS], load=True) for i, k in enumerate(keys)]
    primary.array[:] = 0
    for j in loads:
        tier.submit_load(j)
    results = finish(tier)
    assert sorted(r.job_id for r in results) == sorted(j.job_id for j in loads)
    assert all(r.success and r.transfer_bytes == _ROW for r in results)
    assert all(primary.holds((i + 3) % _BLOCKS, k) for i, k in enumerate(keys))


def test_nothing_touches_the_primary_after_drain_or_shutdown(make_tier: TierFactory) -> None:
    primary = Primary()
    tier = make_tier(primary)
    keys = [key(i) for i in range(_BLOCKS)]
    for i, k in enumerate(keys):
        primary.fill(i, k)
    tier.submit_store(job(keys, list(range(_BLOCKS)), load=False))
    tier.drain_jobs()
    tier.submit_load(job(keys, list(range(_BLOCKS)), load=True))
    tier.drain_jobs()
    snapshot = primary.array.copy()
    time.sleep(0.1)
    assert (primary.array == snapshot).all()
    before = set(threading.enumerate())
    tier.submit_load(job(keys, list(range(_BLOCKS)), load=True))
    tier.shutdown()
    snapshot = primary.array.copy()
    time.sleep(0.1)
    assert (primary.array == snapshot).all()
    assert not [t for t in threading.enumerate() if t not in before or t.name.startswith(("kvref-", "kvref_offloading_lookup"))]


class MemoryTier(VllmTier):
    """Any kvref tier is a vLLM tier through `VllmTier`: here kvref's memory tier, built by
    vLLM's factory from this module's path."""

    kvref_tier_class = InMemorySecondaryTier


def test_any_kvref_tier_serves_vllms_manager_through_vllm_tier() -> None:
    config = {"type": "MemoryTier", "module_path": __name__, "capacity_chunks": 64, "locality": "LOCAL"}
    engine = Engine([config], num_chunks=4, block_bytes=_ROW)
    try:
        (secondary,) = engine.manager.secondary_tiers
        assert isinstance(secondary, MemoryTier) and isinstance(secondary.kvref_tier, InMemorySecondaryTier)
        assert (secondary.medium, secondary.cache_hit_source, secondary.locality) == (
            Medium.CPU,
            CacheHitSource.HOST,
            Locality.LOCAL,
        )
        first = prompt_keys("memory", 4)
        engine.serve("a", first)
        engine.settle()
        engine.serve("b", prompt_keys("memory-evicts", 4))  # the primary holds 4 chunks
        engine.settle()
        assert engine.serve("c", first) == len(first)  # every chunk promoted back from memory
        assert secondary.config_info() == {"memory_capacity_chunks": 64}
    finally:
        engine.close()


# --- the contract: events, statistics, config info ---


@pytest.mark.parametrize("global_flag", [True, False])
def test_stored_events_name_the_tier_and_none_come_from_loads(
    make_tier: TierFactory, global_flag: bool
) -> None:
    primary = Primary()
    tier = make_tier(primary, offloading_spec(kv_events=global_flag), enable_kv_events=True, locality="LOCAL")
    keys = [key(1), key(2)]
    primary.fill(0, keys[0])
    primary.fill(1, keys[1])
    tier.submit_store(job(keys, [0, 1], load=False))
    tier.submit_store(job([keys[0]], [0], load=False))
    finish(tier)
    tier.submit_load(job(keys, [2, 3], load=True))
    finish(tier)
    events = list(tier.take_events())
    if not global_flag:
        assert events == []
        return
    assert all(
        (e.medium, e.locality, e.removed, e.ownership) == (Medium.STORAGE, Locality.LOCAL, False, tier.tier_type)
        for e in events
    )
    # The fs tier announces a block once (it knows what it announced); the Redis tier once
    # per store job (the server may have evicted it meanwhile).
    expected = keys if isinstance(tier, FileSystemTier) else [keys[0], *keys]
    assert sorted(k for e in events for k in e.keys) == sorted(expected)
    assert list(tier.take_events()) == []


def test_failed_store_emits_no_event(redis_server: LocalRedisServer) -> None:
    primary = Primary()
    with LocalRedisServer() as doomed:
        url = doomed.url
    config = {"type": "RedisTier", "module_path": _MODULE, "url": url, "enable_kv_events": True, "connect_timeout_s": 0.2}
    tier = build_tier(config, primary, offloading_spec(kv_events=True))
    try:
        tier.submit_store(job([key(1)], [0], load=False))
        assert [r.success for r in finish(tier)] == [False]
        assert list(tier.take_events()) == []
    finally:
        tier.shutdown()


def test_stats_and_config_info_reach_vllms_metrics(tmp_path: Path, redis_server: LocalRedisServer) -> None:
    # Six block files: each request's four fit, the twelve of three requests do not.
    capacity = 6 * file_bytes(len(prompt_keys("stats", 1)[0]), _ROW)
    tiers = [
        {"type": "FileSystemTier", "module_path": _MODULE, "root_dir": str(tmp_path), "capacity_bytes": capacity},
        {"type": "RedisTier", "module_path": _MODULE, "url": redis_server.url, "namespace": uuid.uuid4().hex},
    ]
    definitions = TieringOffloadingSpec.build_metric_definitions({"secondary_tiers": tiers})
    assert {KvrefTierMetrics.CHUNKS_STORED, KvrefTierMetrics.USAGE_PERC} <= set(definitions)
    info_keys = TieringOffloadingSpec.config_info_keys({"secondary_tiers": tiers})
    assert {"fs_capacity_bytes", "redis_namespace", "redis_cluster"} <= set(info_keys)
    engine = Engine(tiers, num_chunks=8, block_bytes=_ROW)
    try:
        for index in range(3):
            engine.serve(f"r{index}", prompt_keys(f"stats-{index}", 4))
            engine.settle()
        stats = engine.manager.get_stats()
        assert stats is not None
        types, values = stats.metric_sections()
        ours = {name for name in values if "kvref" in name}
        assert ours and ours <= set(definitions) and all(types[name] for name in ours)
        stored = values[KvrefTierMetrics.CHUNKS_STORED]
        assert stored == {("FileSystemTier",): 12, ("RedisTier",): 12}
        assert values[KvrefTierMetrics.CHUNKS_EVICTED][("FileSystemTier",)] >= 6
        assert ("FileSystemTier",) in values[KvrefTierMetrics.USAGE_PERC]
        again = engine.manager.get_stats()  # increments since the last call, as vLLM's
        assert again is None or KvrefTierMetrics.CHUNKS_STORED not in again.metric_sections()[1]
        info = engine.manager.config_info()
        assert [series["tier"] for series in info] == ["0:primary", "1:FileSystemTier", "2:RedisTier"]
        assert info[1]["fs_capacity_bytes"] == capacity and "url" not in info[2]
    finally:
        engine.close()


def test_kvref_keys_and_vllms_are_the_same_bytes() -> None:
    # The adapter passes vLLM's keys to kvref's tiers unchanged: both are bytes of a block hash
    # followed by the KV-cache group index, 4 bytes big-endian.
    from kvref.base import make_offload_key as kvref_key

    raw: KvrefKey = kvref_key(b"\x01" * 8, 3)
    assert raw == make_offload_key(b"\x01" * 8, 3)


@pytest.mark.parametrize(
    ("changes", "rank"),
    [
        ({}, 0),
        ({"tp_size": 2, "world_size": 2, "rank": 1}, 1),
        ({"tp_size": 2, "world_size": 2, "rank": 1, "is_parallelism_agnostic": True}, 1),
        ({"replicated_layout": True, "tp_size": 4, "world_size": 4, "rank": 3}, 3),
        ({"canonical_layout": True, "kv_cache_layout": "LBNHC"}, 0),
        ({"canonical_layout": True, "kv_cache_layout": "BLHNC"}, 0),
    ],
)
def test_the_run_identity_is_the_directory_vllms_fs_tier_names(changes: dict[str, Any], rank: int) -> None:
    # kvref's tiers name their storage as vLLM's fs tier names its directories, from the same
    # spec: engines share chunks exactly when vLLM's would.
    import dataclasses

    from vllm.v1.kv_offload.file_mapper import FileMapper

    from kvref.tiering.run_identity import run_identity

    spec = offloading_spec()
    parallel = {k: v for k, v in changes.items() if k in {f.name for f in dataclasses.fields(spec.config.parallel)}}
    top = {k: v for k, v in changes.items() if k not in parallel}
    spec.config = dataclasses.replace(spec.config, parallel=dataclasses.replace(spec.config.parallel, **parallel), **top)
    mapper = FileMapper.from_offloading_spec(
        root_dir="", offloading_spec=spec, blocks_per_file=spec.blocks_per_chunk, parallel_agnostic=True
    )
    assert run_identity(spec) == f"{os.path.basename(mapper.base_path)}_r{mapper.rank}"
    assert mapper.rank == (0 if changes.get("is_parallelism_agnostic") or changes.get("replicated_layout") else rank)
