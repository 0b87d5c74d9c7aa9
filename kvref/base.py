"""Core types and the `OffloadingManager` contract (vLLM: `vllm/v1/kv_offload/base.py`).

An `OffloadingManager` runs on the scheduler's thread. It tracks which KV blocks are offloaded
to a medium (CPU memory, a filesystem, ...) and hands the worker side the metadata it needs to
move them. It never copies data itself. Its primitives:

* `lookup` — is one block offloaded and readable (True), absent (False), or not yet readable
  (None: a store or promotion is in flight, ask again next step)?
* `prepare_load` / `complete_load` — pin blocks while the worker reads them, then release them.
* `touch` — mark blocks recently used (also for blocks hit in the GPU prefix cache).
* `prepare_store` / `complete_store` — reserve room (evicting if needed) for blocks the worker is
  about to write, then make them readable (or drop them if the write failed).
* `on_new_request` / `on_request_finished` — request lifecycle hooks.
* `take_events` — stored/removed notifications for KV-aware routing.
* `reset_cache` / `shutdown` — drop everything / release resources.

Every `keys` parameter is a `Collection[OffloadKey]`: callers may pass a list, a tuple, a set or
a dict view, and implementations may iterate it more than once and take its `len`, but must not
index it.

Where the parts live: this module holds the keys, the request context and the manager contract;
the load/store specs are in `kvref.specs` and the statistics in `kvref.stats`, and are exported
from here too.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NewType, TypeVar

from kvref.specs import BlockIDsLoadStoreSpec, GPULoadStoreSpec, LoadStoreSpec
from kvref.stats import OffloadingStats, TierStats

__all__ = [
    "OffloadKey",
    "make_offload_key",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "MAX_OFFLOAD_KEY_POSITION",
    "ReqContext",
    "check_key_collection",
    "LoadStoreSpec",
    "BlockIDsLoadStoreSpec",
    "GPULoadStoreSpec",
    "PrepareStoreOutput",
    "OffloadingEvent",
    "OffloadPolicy",
    "RequestOffloadingContext",
    "OffloadingStats",
    "TierStats",
    "OffloadingManager",
]

OffloadKey = NewType("OffloadKey", bytes)
"""One offloaded block of one KV-cache group: the block hash followed by 4 bytes of group index.

Raw bytes rather than a tuple: bytes are hashed once and cached, and are not tracked by the GC.
"""

_GROUP_IDX_BYTES = 4
_GROUP_IDX_LIMIT = 1 << (8 * _GROUP_IDX_BYTES)


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """Build the key of `block_hash` in KV-cache group `group_idx`.

    Args:
        block_hash: the (chained) prefix hash of the last hash block the offloaded block covers.
        group_idx: the KV-cache group, 0 <= group_idx < 2**32.

    Returns:
        `block_hash` followed by `group_idx` as 4 big-endian unsigned bytes.
    """
    if not 0 <= group_idx < _GROUP_IDX_LIMIT:
        raise ValueError(f"group_idx must be in [0, 2**32), got {group_idx}")
    return OffloadKey(bytes(block_hash) + group_idx.to_bytes(_GROUP_IDX_BYTES, "big"))


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """Return the block hash part of `key` (all but its last 4 bytes)."""
    return key[:-_GROUP_IDX_BYTES]


def get_offload_group_idx(key: OffloadKey) -> int:
    """Return the KV-cache group index encoded in the last 4 bytes of `key`."""
    return int.from_bytes(key[-_GROUP_IDX_BYTES:], "big")


_T = TypeVar("_T")

MAX_OFFLOAD_KEY_POSITION = (1 << 40) - 1
"""The largest end-token position `ReqContext.set_offload_key_position` accepts (about 10**12)."""


@dataclass
class ReqContext:
    """Per-request context passed to every manager call: one object per request.

    Managers and policies keep per-request state in it (`set_state`/`get_state`), and the
    scheduler records where each of the request's keys ends in its token sequence
    (`set_offload_key_position`), so that a policy can order a request's blocks head to tail
    even when they are stored out of order. Reusing one context for several requests merges
    them into one as far as recency goes.

    Attributes:
        req_id: the engine's request id.
        kv_transfer_params: the request's free-form `kv_transfer_params`, if any.
    """

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    # Scratch space keyed by the value's type, so each component keeps one record per request.
    _state: dict[type, Any] = field(default_factory=dict[type, Any], repr=False, init=False, compare=False)
    _offload_key_positions: dict[OffloadKey, int] = field(
        default_factory=dict[OffloadKey, int], repr=False, init=False, compare=False
    )

    def set_state(self, value: object) -> None:
        """Keep `value` as this request's record of type `type(value)` (replacing any)."""
        self._state[type(value)] = value

    def get_state(self, cls: type[_T]) -> _T | None:
        """Return this request's record of type `cls`, or None."""
        return self._state.get(cls)

    def set_offload_key_position(self, key: OffloadKey, end_token: int) -> None:
        """Record that `key` covers this request's tokens up to `end_token` (exclusive).

        Args:
            key: one of the request's offload keys.
            end_token: the number of tokens up to and including the key's block, in
                [0, MAX_OFFLOAD_KEY_POSITION].

        Raises:
            ValueError: `end_token` is out of range.
        """
        if not 0 <= end_token <= MAX_OFFLOAD_KEY_POSITION:
            raise ValueError(
                f"end_token must be in [0, {MAX_OFFLOAD_KEY_POSITION}], got {end_token!r}"
            )
        self._offload_key_positions[key] = end_token

    def get_offload_key_position(self, key: OffloadKey) -> int | None:
        """Return the end-token position recorded for `key`, or None."""
        return self._offload_key_positions.get(key)

    @property
    def offload_key_positions(self) -> Mapping[OffloadKey, int]:
        """Every recorded key position (read-only use; for loops that look up many keys)."""
        return self._offload_key_positions


def check_key_collection(keys: object, operation: str) -> None:
    """Refuse a single key where a collection of keys is expected.

    `bytes` is itself a collection (of ints): without this check its bytes would be taken as
    keys, one slot each.

    Args:
        keys: the argument given as `keys`.
        operation: the manager method, named in the error.

    Raises:
        TypeError: `keys` is a bytes-like object or a str.
    """
    if isinstance(keys, _SINGLE_KEY_TYPES):
        raise TypeError(
            f"{operation}: keys must be a collection of OffloadKey, got a single "
            f"{type(keys).__name__} (wrap one key in a list)"
        )


# Collections whose items are not keys, however they iterate.
_SINGLE_KEY_TYPES: tuple[type, ...] = (bytes, bytearray, memoryview, str)


@dataclass
class PrepareStoreOutput:
    """What `prepare_store` decided.

    Attributes:
        keys_to_store: the keys the worker must write, in the order of `store_spec`'s blocks.
        store_spec: where to write them.
        evicted_keys: keys evicted to make room (already gone from the manager).
    """

    keys_to_store: list[OffloadKey]
    store_spec: LoadStoreSpec
    evicted_keys: list[OffloadKey]


@dataclass
class OffloadingEvent:
    """Blocks stored on, or removed from, a medium.

    Attributes:
        keys: the blocks concerned.
        medium: the medium that owns them ("CPU", or a secondary tier's name).
        removed: True for a removal, False for a completed store.
    """

    keys: list[OffloadKey]
    medium: str
    removed: bool


class OffloadPolicy(enum.Enum):
    """Which blocks of a request a manager wants offered to `prepare_store`."""

    BLOCK_LEVEL = "block_level"
    """Only newly computed blocks; blocks that were prefix hits are already offloaded."""
    REQUEST_LEVEL = "request_level"
    """Every block of the request, prefix hits included (tiers that need whole requests)."""


@dataclass(frozen=True)
class RequestOffloadingContext:
    """A manager's answer to `on_new_request`."""

    policy: OffloadPolicy = field(default=OffloadPolicy.BLOCK_LEVEL)


class OffloadingManager(ABC):
    """Scheduler-side bookkeeping of offloaded KV blocks (see the module docstring).

    Abstract: `lookup`, `prepare_load`, `prepare_store`, `on_new_request`. Every other method has
    a no-op default, so a minimal manager overrides four methods.
    """

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Say whether one block is offloaded and ready to be loaded.

        Lookup does not change recency (use `touch`) and does not protect the block.

        Args:
            key: the block.
            req_context: the request asking.

        Returns:
            True if the block can be loaded now, False if it is not offloaded, and None if it
            is present but not yet readable (its store or promotion is in flight): the caller
            should ask again later rather than treat it as a miss.
        """

    @abstractmethod
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        """Protect blocks from eviction while the worker reads them.

        Each call must be matched by one `complete_load` of the same keys. Loads stack: a block
        prepared twice needs two completions before it can be evicted again.

        Args:
            keys: blocks that `lookup` reported as ready.
            req_context: the loading request.

        Returns:
            A spec whose blocks are co-indexed with `keys` in iteration order.

        Raises:
            OffloadProtocolError: a key is absent or not ready; nothing was changed.
        """

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark blocks as recently used; absent keys are ignored.

        Separate from `prepare_load` so that blocks hit in the GPU prefix cache, which are not
        loaded, still refresh their recency here. Keys come in prefix order; the first key of a
        request should end up the most recently used. Recency is logical: a touch counts even
        for a block whose store is pending or that is being read, and finishing a store or a
        load never counts as a use.

        Args:
            keys: the blocks, in request order.
            req_context: the request using them.
        """
        return None

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Undo the protection of a matching `prepare_load`.

        Args:
            keys: the keys given to `prepare_load`.
            req_context: the loading request.

        Raises:
            OffloadProtocolError: a key has no load in progress; nothing was changed.
        """
        return None

    @abstractmethod
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Reserve room for blocks the worker is about to write.

        All or nothing: either every key that is not already present gets a slot (evicting idle
        blocks if needed, never one of `keys`), or nothing changes. Reserved blocks answer None
        to `lookup` and cannot be evicted until `complete_store`.

        Args:
            keys: candidate blocks; those already stored or in flight are skipped.
            req_context: the storing request.

        Returns:
            The keys to write, where, and what was evicted (an empty output when every key is
            already present), or None when there is no room: nothing was changed.
        """

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """Finish the writes of blocks prepared by `prepare_store`.

        Idempotent: keys already ready, and unknown keys, are ignored, so callers may pass a
        superset of the prepared keys.

        Args:
            keys: blocks whose write finished.
            req_context: the storing request.
            success: False if the write failed: pending blocks are dropped and announced nowhere.
        """
        return None

    @abstractmethod
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Called once, the first time the scheduler sees a request.

        Args:
            req_context: the new request.

        Returns:
            How the connector should offer this request's blocks to `prepare_store`.
        """

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Called once a request is done: no `prepare_*` call will name it again.

        Completions of its in-flight jobs may still arrive afterwards. It says nothing about
        persistence. Managers that rank a running request's blocks provisionally (vLLM's and
        kvref's LRU and ARC) commit the request's recency here. A manager composed of others must delay its children's finish until no
        more of the request's work can be submitted to them.

        Args:
            req_context: the finished request.
        """
        return None

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Return the events buffered since the last call, and forget them.

        A manager reports only storage it owns; composite managers aggregate their children's
        events and never synthesize events for them.

        Returns:
            The events, oldest first.
        """
        return ()

    def get_stats(self) -> OffloadingStats | None:
        """Return this manager's counters (see `OffloadingStats`), or None if it keeps none.

        Returns:
            A snapshot; later calls are not affected by reading it.
        """
        return None

    def reset_cache(self) -> None:
        """Forget every tracked block (sleep, weight update, prefix-cache reset).

        The caller guarantees that no completion of a job submitted before the reset is
        delivered afterwards.
        """
        return None

    def shutdown(self) -> None:
        """Release resources (threads, files, shared memory); the manager is unusable after."""
        return None
