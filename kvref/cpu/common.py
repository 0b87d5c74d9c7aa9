"""Specs shared by the CPU manager and the CPU<->GPU transfer handlers."""

from __future__ import annotations

from typing_extensions import override

from kvref.base import BlockIDsLoadStoreSpec

__all__ = ["CPULoadStoreSpec", "CPU_MEDIUM"]

CPU_MEDIUM = "CPU"


class CPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """CPU blocks addressed by slot index (one row of the CPU tier per block)."""

    @staticmethod
    @override
    def medium() -> str:
        return CPU_MEDIUM
