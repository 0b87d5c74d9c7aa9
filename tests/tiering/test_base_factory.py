"""Tiering base types (JobMetadata, PrimaryBlocks) and the secondary-tier factory."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

from kvref.base import ReqContext
from kvref.tiering.base import JobMetadata, PrimaryBlocks, SecondaryTierManager
from kvref.tiering.factory import create_secondary_tier, register_tier, registered_tier_types
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.memory import InMemorySecondaryTier
from tests.tiering.helpers import make_view, to_keys

CTX = ReqContext(req_id="r1")


def test_job_metadata_keys_and_block_ids_are_co_indexed() -> None:
    with pytest.raises(ValueError, match=r"keys \(2\) and block_ids \(1\) must be co-indexed"):
        JobMetadata(1, tuple(to_keys([1, 2])), (0,), False, CTX)


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


def test_builtin_tier_types(tmp_path: Path) -> None:
    assert {"fs", "memory"} <= set(registered_tier_types())
    memory = create_secondary_tier({"type": "memory", "capacity_blocks": 2}, make_view(2))
    assert isinstance(memory, InMemorySecondaryTier)
    disk = create_secondary_tier(
        {"type": "fs", "root_dir": str(tmp_path)}, make_view(2), enable_events=True
    )
    assert isinstance(disk, FileSystemSecondaryTier) and disk.medium == "fs"
    disk.shutdown()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, r"'type' is missing; registered types: .*fs, memory"),
        ({"type": "tape"}, r"'type' is 'tape', which is not registered; registered types:"),
        ({"type": "memory", "size": 3}, r"invalid options for secondary tier type 'memory'"),
    ],
)
def test_bad_configs(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_secondary_tier(config, make_view(1))


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test vanish with it."""
    from kvref.tiering import factory

    registry = dict(factory._registry)  # pyright: ignore[reportPrivateUsage]
    monkeypatch.setattr(factory, "_registry", registry)


# The registry behaves as the cache-policy registry does (tests/cpu/test_policies.py asserts the
# same behaviours of register_cache_policy).


@pytest.mark.usefixtures("fresh_registry")
def test_register_lists_sorted_names_and_builds_them() -> None:
    def build(primary_kv_view: memoryview, *, label: str) -> SecondaryTierManager:
        return InMemorySecondaryTier(primary_kv_view, name=label)

    before = registered_tier_types()
    assert before == sorted(before)
    register_tier("a-custom", build)
    assert registered_tier_types() == sorted([*before, "a-custom"])
    tier = create_secondary_tier({"type": "a-custom", "label": "x"}, make_view(1))
    assert tier.medium == "x"


@pytest.mark.parametrize("unknown", ["tape", "", "MEMORY"])
def test_unknown_names_fail_listing_the_registered_ones(unknown: str) -> None:
    listed = ", ".join(registered_tier_types())
    with pytest.raises(ValueError, match=rf"{unknown!r}, which is not registered; .*: {listed}$"):
        create_secondary_tier({"type": unknown}, make_view(1))


@pytest.mark.usefixtures("fresh_registry")
def test_register_refuses_duplicates_unless_replacing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'memory' is already registered; pass replace=True"):
        register_tier("memory", FileSystemSecondaryTier)
    register_tier("memory", FileSystemSecondaryTier, replace=True)
    disk = create_secondary_tier({"type": "memory", "root_dir": str(tmp_path)}, make_view(1))
    try:
        assert isinstance(disk, FileSystemSecondaryTier)
    finally:
        disk.shutdown()


@pytest.mark.usefixtures("fresh_registry")
def test_register_refuses_an_empty_name() -> None:
    before = registered_tier_types()
    with pytest.raises(ValueError, match="tier_type must be a non-empty str"):
        register_tier("", InMemorySecondaryTier)
    assert registered_tier_types() == before


@pytest.mark.usefixtures("fresh_registry")
@pytest.mark.parametrize("not_a_name", [None, 3, b"memory"])
def test_register_refuses_a_name_that_is_not_a_str(not_a_name: Any) -> None:
    before = registered_tier_types()
    with pytest.raises(TypeError, match="tier_type must be a str"):
        register_tier(not_a_name, InMemorySecondaryTier)
    assert registered_tier_types() == before


@pytest.mark.usefixtures("fresh_registry")
@pytest.mark.parametrize("not_a_tier", [dict, object(), "memory", None])
def test_register_rejects_what_is_not_a_tier_factory(not_a_tier: Any) -> None:
    with pytest.raises(TypeError, match="factory must be a SecondaryTierManager subclass"):
        register_tier("not-a-tier", not_a_tier)
    assert "not-a-tier" not in registered_tier_types()
