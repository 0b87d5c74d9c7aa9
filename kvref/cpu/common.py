"""Specs shared by the CPU manager and the CPU<->GPU transfer handlers."""

from __future__ import annotations

from typing_extensions import Self, override

from kvref.base import BlockIDsLoadStoreSpec

__all__ = ["CPULoadStoreSpec", "CPU_MEDIUM"]

CPU_MEDIUM = "CPU"


class CPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """CPU blocks addressed by slot index (one row of the CPU tier per block)."""

    @staticmethod
    @override
    def medium() -> str:
        return CPU_MEDIUM

    @classmethod
    def from_id_list(cls, block_ids: list[int]) -> Self:
        """Build a spec that keeps `block_ids` (it owns the list from now on) and packs it on
        the first read of `block_ids`: packing costs about 20 ns per id, and the scheduler side
        that builds a spec (the manager) never reads its ids; the worker does, once."""
        spec = cls.__new__(cls)
        spec._ids = block_ids
        return spec
