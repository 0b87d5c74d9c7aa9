"""Keys and requests: what names an offloaded chunk, and the context every call carries.

Part of `kvref.base` (vLLM 0.33: `vllm/v1/kv_offload/base.py`), which exports every name here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, NamedTuple, NewType, TypeVar

__all__ = [
    "MAX_OFFLOAD_KEY_POSITION",
    "Locality",
    "Medium",
    "OffloadKey",
    "ReqContext",
    "TierFilter",
    "TierMatcher",
    "check_key_collection",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
]

OffloadKey = NewType("OffloadKey", bytes)
"""One offloaded chunk of one KV-cache group: the block hash followed by 4 bytes of group index.

Raw bytes rather than a tuple: bytes hash once (the hash is cached) and are not tracked by the
garbage collector.
"""

_GROUP_IDX_BYTES = 4
_GROUP_IDX_LIMIT = 1 << (8 * _GROUP_IDX_BYTES)
# Collections whose items are not keys, however they iterate.
_SINGLE_KEY_TYPES: tuple[type, ...] = (bytes, bytearray, memoryview, str)

MAX_OFFLOAD_KEY_POSITION = (1 << 40) - 1
"""The largest end-token position `ReqContext.set_offload_key_position` accepts."""

_T = TypeVar("_T")


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """Pack a block hash and a KV-cache group index into an `OffloadKey`.

    Raises:
        ValueError: `group_idx` is not in [0, 2**32).
    """
    if not 0 <= group_idx < _GROUP_IDX_LIMIT:
        raise ValueError(f"group_idx must be in [0, 2**32), got {group_idx}")
    return OffloadKey(bytes(block_hash) + group_idx.to_bytes(_GROUP_IDX_BYTES, "big"))


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """Return the block hash part of `key` (all but its last 4 bytes)."""
    return key[:-_GROUP_IDX_BYTES]


def get_offload_group_idx(key: OffloadKey) -> int:
    """Return the KV-cache group index of `key` (its last 4 bytes, big-endian)."""
    return int.from_bytes(key[-_GROUP_IDX_BYTES:], "big")


def check_key_collection(keys: object, operation: str) -> None:
    """Refuse a single key where a collection of keys is expected.

    `bytes` is itself a collection (of ints): without this check its bytes would be taken as
    keys, one chunk each.

    Raises:
        TypeError: `keys` is a bytes-like object or a str.
    """
    if isinstance(keys, _SINGLE_KEY_TYPES):
        raise TypeError(
            f"{operation}: keys must be a collection of OffloadKey, got a single "
            f"{type(keys).__name__} (wrap one key in a list)"
        )


# Dataclass factories: calling a parameterised builtin (`dict[type, Any]()`) is ten times slower
# than the builtin itself, and a context is made per request.
def _new_state() -> dict[type, Any]:
    return {}


def _new_positions() -> dict[OffloadKey, int]:
    return {}


class Medium(Enum):
    """The storage medium of an offloading tier."""

    CPU = "CPU"
    STORAGE = "STORAGE"


class Locality(Enum):
    """Where a tier's storage is, relative to the engine publishing it."""

    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


class TierMatcher(NamedTuple):
    """Matches tiers by medium and locality; None on either side matches anything."""

    medium: Medium | None = None
    locality: Locality | None = None

    def matches(self, medium: Medium | None, locality: Locality | None) -> bool:
        """Whether a tier of this medium and locality matches."""
        medium_matches = self.medium is None or medium is None or self.medium == medium
        locality_matches = self.locality is None or locality is None or self.locality == locality
        return medium_matches and locality_matches


@dataclass(frozen=True)
class TierFilter:
    """Which tiers a request may load from: those any of `matchers` matches."""

    matchers: tuple[TierMatcher, ...] = ()

    ALL: ClassVar[TierFilter]
    """Every tier (the default of `ReqContext.load_tier_filter`)."""

    def allows(self, medium: Medium | None, locality: Locality | None) -> bool:
        """Whether a tier of this medium and locality may serve the request."""
        if self is TierFilter.ALL:
            return True
        return any(matcher.matches(medium, locality) for matcher in self.matchers)


TierFilter.ALL = TierFilter(matchers=(TierMatcher(),))


@dataclass
class ReqContext:
    """Per-request context passed to every manager call: one object per request.

    Components keep per-request state in it by type (`set_state` / `get_state`), parsed once in
    `on_new_request`. The scheduler records where each key ends in the request's token sequence
    (`set_offload_key_position`), so managers recover prefix order even when stores arrive out
    of order (sliding-window backfills, say).

    Attributes:
        req_id: the engine's request id.
        kv_transfer_params: the request's free-form `kv_transfer_params`, if any.
        kv_hints: the request's KV hints envelope, if any (opaque to kvref; vLLM's
            `KvHintsEnvelope`).
        load_tier_filter: the tiers this request may load from.
    """

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    kv_hints: object | None = None
    load_tier_filter: TierFilter = TierFilter.ALL
    _state: dict[type, Any] = field(default_factory=_new_state, repr=False, init=False)
    _offload_key_positions: dict[OffloadKey, int] = field(
        default_factory=_new_positions, repr=False, init=False
    )

    def set_state(self, val: object) -> None:
        """Keep `val` as this request's record of type `type(val)`, replacing any."""
        self._state[type(val)] = val

    def get_state(self, cls: type[_T]) -> _T | None:
        """Return this request's record of type `cls`, or None."""
        return self._state.get(cls)

    def set_offload_key_position(self, key: OffloadKey, end_token: int) -> None:
        """Record that `key` covers this request's tokens up to `end_token` (exclusive).

        Raises:
            ValueError: `end_token` is not in [0, MAX_OFFLOAD_KEY_POSITION].
        """
        if not 0 <= end_token <= MAX_OFFLOAD_KEY_POSITION:
            raise ValueError(f"end_token must be in [0, {MAX_OFFLOAD_KEY_POSITION}], got {end_token!r}")
        self._offload_key_positions[key] = end_token

    def get_offload_key_position(self, key: OffloadKey) -> int | None:
        """Return the end-token position recorded for `key`, or None."""
        return self._offload_key_positions.get(key)

    @property
    def offload_key_positions(self) -> Mapping[OffloadKey, int]:
        """Every recorded position, read-only: for loops over many keys (no call per key)."""
        return self._offload_key_positions
