"""Secondary tiers copy through typed views of the primary (float32, uint16, ...), not only bytes.

torch and numpy export KV memory with their element format (float16 is "e", uint16 "<H" from
ctypes); a tier must treat every row as its raw bytes and round-trip them exactly.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any
from pathlib import Path

import pytest

from kvref.tiering.base import SecondaryTierManager, TransferJob
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.memory import InMemorySecondaryTier
from tests.tiering.helpers import CTX, content, make_spec, to_keys
NUM_BLOCKS = 4
ITEMS = 24  # items per row


def uint16_ctypes(num_blocks: int) -> memoryview[Any]:
    return memoryview((ctypes.c_uint16 * ITEMS * num_blocks)())


def float32_cast(num_blocks: int) -> memoryview[Any]:
    return memoryview(bytearray(num_blocks * ITEMS * 4)).cast("f", (num_blocks, ITEMS))


def int64_cast(num_blocks: int) -> memoryview[Any]:
    return memoryview(bytearray(num_blocks * ITEMS * 8)).cast("q", (num_blocks, ITEMS))


def run(tier: SecondaryTierManager, job: TransferJob) -> bool:
    (tier.submit_load if job.is_promotion else tier.submit_store)(job)
    tier.drain_jobs()
    (result,) = list(tier.get_finished_jobs())
    return result.success


@pytest.mark.parametrize("make_view", [uint16_ctypes, float32_cast, int64_cast])
@pytest.mark.parametrize("tier_type", ["memory", "fs"])
def test_store_load_round_trip_through_a_typed_view(
    tmp_path: Path, make_view: Callable[[int], memoryview[Any]], tier_type: str
) -> None:
    view = make_view(NUM_BLOCKS)
    row_bytes = ITEMS * view.itemsize
    raw = memoryview(view.obj).cast("B") if isinstance(view.obj, bytearray) else view.cast("B")
    tier: SecondaryTierManager = (
        InMemorySecondaryTier(make_spec(), view, "memory")
        if tier_type == "memory"
        else FileSystemSecondaryTier(make_spec(), view, "fs", root_dir=tmp_path / "fs", n_read_threads=1, n_write_threads=1)
    )
    k1, k2 = to_keys([1, 2])
    # Arbitrary bytes, including ones that are NaN patterns as float32: copied as bytes.
    raw[0:row_bytes] = content(k1, row_bytes)
    raw[row_bytes : 2 * row_bytes] = b"\xff" * row_bytes
    assert run(tier, TransferJob(1, (k1, k2), (0, 1), False, CTX))
    raw[:] = bytes(len(raw))
    assert run(tier, TransferJob(2, (k2, k1), (2, 3), True, CTX))
    assert bytes(raw[2 * row_bytes : 3 * row_bytes]) == b"\xff" * row_bytes
    assert bytes(raw[3 * row_bytes :]) == content(k1, row_bytes)
    assert bytes(raw[: 2 * row_bytes]) == bytes(2 * row_bytes)
    tier.shutdown()
    raw.release()
