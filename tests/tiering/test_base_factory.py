"""Tiering base types (PrimaryBlocks, the tier base class) and `SecondaryTierFactory`, vLLM 0.33's
factory: registered types, out-of-tree tiers by module path, back-pressure, and configuration
mistakes as ValueErrors naming the entry."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

from kvref.base import CacheHitSource, Medium
from kvref.tiering.backpressure import DropStorePolicy, EMABackpressureDetector
from kvref.tiering.base import PrimaryBlocks, SecondaryTierManager
from kvref.tiering.factory import SecondaryTierFactory
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.memory import InMemorySecondaryTier
from kvref.tiering.redis import RedisSecondaryTier
from kvref.tiering.tier_reporting import KvrefTierMetrics
from tests.tiering.helpers import make_spec, make_view

SPEC = make_spec()

def test_primary_blocks_rows() -> None:
    view = make_view(3, 8)
    blocks = PrimaryBlocks(view)
    assert (blocks.num_blocks, blocks.block_bytes) == (3, 8)
    blocks.row(2)[:] = b"abcdefgh"
    assert view[2, 7] == ord("h")
    with pytest.raises(IndexError, match=r"block id 3 not in \[0, 3\)"):
        blocks.row(3)
    assert repr(blocks) == "PrimaryBlocks(num_blocks=3, block_bytes=8)"
    blocks.release()


@pytest.mark.parametrize(
    ("view", "message"),
    [
        (memoryview(bytearray(8)), r"C-contiguous memoryview \(num_blocks, row_items, ...\).*ndim=1"),
        (memoryview(bytearray(16)).cast("B", (4, 4))[::2], "c_contiguous=False"),
        (memoryview(bytearray(16)).cast("i"), "ndim=1"),
    ],
)
def test_primary_blocks_rejects_unusable_views(view: memoryview, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrimaryBlocks(view)


def test_primary_blocks_rows_are_the_first_dimension_of_any_view() -> None:
    # vLLM hands tiers a (num_chunks, row_bytes) view; a (blocks, layers, items) one works too.
    view = memoryview(bytearray(3 * 2 * 4 * 4)).cast("f", (3, 2, 4))
    blocks = PrimaryBlocks(view)
    assert (blocks.num_blocks, blocks.block_bytes) == (3, 32)
    blocks.row(2)[:] = bytes(range(32))
    assert bytes(view[2:3]) == bytes(range(32))
    blocks.release()


def uint16_view(num_blocks: int, items: int) -> memoryview[Any]:
    """A (num_blocks, items) view of uint16 with a non-native format ("<H"), as ctypes exports."""
    return memoryview((ctypes.c_uint16 * items * num_blocks)())


def float32_view(num_blocks: int, items: int) -> memoryview[Any]:
    return memoryview(bytearray(num_blocks * items * 4)).cast("f", (num_blocks, items))


@pytest.mark.parametrize("make", [uint16_view, float32_view])
def test_primary_blocks_accept_views_of_any_item_format(make: Any) -> None:
    view = make(3, 4)
    blocks = PrimaryBlocks(view)
    item = view.itemsize
    assert (blocks.num_blocks, blocks.block_bytes) == (3, 4 * item)
    row = blocks.row(1)
    assert (row.format, row.nbytes) == ("B", 4 * item)
    row[:] = bytes(range(4 * item))
    # Zero-copy: the bytes land in row 1 of the typed view itself.
    assert bytes(view[1:2]) == bytes(range(4 * item))
    assert bytes(view[0:1]) == bytes(view[2:3]) == bytes(4 * item)
    blocks.release()


class OutOfTreeTier(InMemorySecondaryTier):
    """A tier no registry knows: found by its class name in this module."""


NOT_A_TIER = 42


def create(config: dict[str, Any]) -> SecondaryTierManager:
    return SecondaryTierFactory.create_secondary_tier(config, make_view(2), SPEC)


def test_builtin_tier_types(tmp_path: Path) -> None:
    memory = create({"type": "memory", "capacity_chunks": 2})
    assert isinstance(memory, InMemorySecondaryTier) and memory.tier_type == "memory"
    assert (memory.medium, memory.cache_hit_source) == (Medium.CPU, CacheHitSource.HOST)
    disk = create({"type": "fs", "root_dir": str(tmp_path), "locality": "LOCAL"})
    try:
        assert isinstance(disk, FileSystemSecondaryTier) and disk.tier_type == "fs"
        assert (disk.medium, disk.cache_hit_source, disk.locality.value if disk.locality else None) == (
            Medium.STORAGE,
            CacheHitSource.DISK,
            "LOCAL",
        )
    finally:
        disk.shutdown()
    assert SecondaryTierFactory.get_tier_class({"type": "redis"}) is RedisSecondaryTier
    # A remote store: not "disk" (what its medium would give).
    assert RedisSecondaryTier.cache_hit_source is CacheHitSource.EXTERNAL_UNSPECIFIED


def test_an_out_of_tree_tier_needs_only_its_module_path() -> None:
    tier = create({"type": "OutOfTreeTier", "module_path": __name__, "capacity_chunks": 1})
    assert type(tier) is OutOfTreeTier and tier.tier_type == "OutOfTreeTier"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, r"must include 'type'"),
        ({"type": 3}, r"must include 'type' \(a string\), got 3"),
        ({"type": "tape"}, r"Unknown secondary tier type: 'tape'. Supported types: \[.*'fs', 'memory', 'redis'.*module_path"),
        ({"type": "Missing", "module_path": __name__}, r"type: 'Missing' is not a class of module_path"),
        ({"type": "Tier", "module_path": "no.such.module"}, r"type: 'Tier' is not a class of module_path 'no.such.module'"),
        ({"type": "NOT_A_TIER", "module_path": __name__}, r"type: 42 is not a SecondaryTierManager subclass"),
        ({"type": "memory", "size": 3}, r"secondary tier 'memory': invalid options: .*'size'"),
        ({"type": "fs"}, r"secondary tier 'fs': invalid options: missing a required argument: 'root_dir'"),
        ({"type": "memory", "capacity_chunks": "2"}, r"capacity_chunks must be None or an integer >= 1, got '2'"),
        ({"type": "memory", "enable_kv_events": "yes"}, r"enable_kv_events must be true or false, got 'yes'"),
        ({"type": "memory", "locality": "NEAR"}, r"locality must be None or a Locality \('LOCAL' or 'REMOTE'\), got 'NEAR'"),
        ({"type": "memory", "backpressure": {}}, r"must include 'backpressure_cls'"),
        ({"type": "memory", "backpressure": "EMA"}, r"backpressure must be a dict, got 'EMA'"),
        (
            {"type": "memory", "backpressure": {"backpressure_cls": "NoSuchDetector"}},
            r"backpressure.backpressure_cls: 'NoSuchDetector' is not an importable class",
        ),
        (
            {"type": "memory", "backpressure": {"backpressure_cls": "DropStorePolicy"}},
            r"backpressure.backpressure_cls: 'DropStorePolicy' is not a BackpressureDetector",
        ),
        (
            {"type": "memory", "backpressure": {"backpressure_cls": "EMABackpressureDetector", "speed": 1}},
            r"backpressure: invalid options: .*'speed'",
        ),
    ],
)
def test_bad_configs_are_value_errors_naming_the_entry(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create(config)


def test_backpressure_builds_the_detector_with_its_defaults_for_the_tier() -> None:
    config = {"backpressure_cls": "EMABackpressureDetector", "policy_cls": "DropStorePolicy", "warmup_completions": 2}
    tier = create({"type": "memory", "locality": "REMOTE", "backpressure": config})
    detector = tier.bp_detector
    assert isinstance(detector, EMABackpressureDetector) and isinstance(detector.policy, DropStorePolicy)
    remote = EMABackpressureDetector.default_config("memory", locality="REMOTE")
    assert detector.high_water_s == remote["high_water_s"]  # the remote defaults, for a REMOTE tier
    dotted = {"backpressure_cls": "kvref.tiering.backpressure.EMABackpressureDetector"}
    assert isinstance(create({"type": "memory", "backpressure": dotted}).bp_detector, EMABackpressureDetector)
    assert create({"type": "memory"}).bp_detector is None


def test_the_registry_resolves_lazily_and_refuses_duplicates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SecondaryTierFactory, "_registry", dict(SecondaryTierFactory._registry))  # pyright: ignore[reportPrivateUsage]
    SecondaryTierFactory.register_tier("later", "no.such.module", "Tier")  # imported on first use only
    with pytest.raises(ModuleNotFoundError):
        SecondaryTierFactory.get_tier_class({"type": "later"})
    with pytest.raises(ValueError, match="Tier 'memory' is already registered"):
        SecondaryTierFactory.register_tier("memory", __name__, "OutOfTreeTier")
    SecondaryTierFactory.register_tier("oot", __name__, "OutOfTreeTier")
    assert SecondaryTierFactory.get_tier_class({"type": "oot"}) is OutOfTreeTier


@pytest.mark.parametrize("tier_type", ["memory", "fs", "redis"])
def test_every_tier_declares_its_metrics_and_info_labels(tier_type: str) -> None:
    tier_cls = SecondaryTierFactory.get_tier_class({"type": tier_type})
    metrics = tier_cls.build_metric_definitions({})
    assert set(metrics) == {
        KvrefTierMetrics.CHUNKS_STORED,
        KvrefTierMetrics.CHUNKS_LOADED,
        KvrefTierMetrics.CHUNKS_EVICTED,
        KvrefTierMetrics.CHUNKS_LOST,
        KvrefTierMetrics.USAGE_PERC,
    }
    assert all(metadata.labelnames == ("tier_type",) for metadata in metrics.values())
    keys = tier_cls.config_info_keys({"type": tier_type})
    assert keys and "tier" not in keys and all(key.startswith(f"{tier_type}_") for key in keys)


def test_the_tier_base_class_refuses_a_view_without_strides() -> None:
    class NoStrides:
        strides = None

    with pytest.raises(ValueError, match="primary_kv_view has no strides"):
        InMemorySecondaryTier(SPEC, NoStrides(), "memory")  # type: ignore[arg-type]
