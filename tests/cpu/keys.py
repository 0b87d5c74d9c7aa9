"""Offload keys for the CPU tests: small integers, and the collections a keyed call accepts."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from kvref.base import OffloadKey, make_offload_key

__all__ = ["COLLECTIONS", "to_key", "to_keys"]


def to_key(i: int) -> OffloadKey:
    """The key of block hash `i` (8 bytes) in KV-cache group 0."""
    return make_offload_key(i.to_bytes(8, "big"), 0)


def to_keys(ints: Iterable[int]) -> list[OffloadKey]:
    return [to_key(i) for i in ints]


def _dict_keys(keys: list[OffloadKey]) -> Collection[OffloadKey]:
    return dict.fromkeys(keys).keys()


def _dict(keys: list[OffloadKey]) -> Collection[OffloadKey]:
    return dict.fromkeys(keys)


COLLECTIONS: dict[str, Callable[[list[OffloadKey]], Collection[OffloadKey]]] = {
    "list": list,
    "tuple": tuple,
    "set": set,
    "frozenset": frozenset,
    "dict_keys": _dict_keys,
    "dict": _dict,
}
"""Every kind of collection callers pass as `keys`, by name (sets iterate in hash order)."""
