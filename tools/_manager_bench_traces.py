"""The request traces of `tools/bench_manager.py` and the driver that replays them on a manager.

Both managers, kvref's and vLLM 0.33's, are driven by the same code through the same calls, the
way vLLM's offloading connector drives its manager: `on_new_request` with the key positions
recorded, a maximal-prefix lookup, a load of the hits and a touch of every block, stores of the
new blocks a few per step, completions some steps later and `on_request_finished` after the last
store (`serve`). The traces (`traces`) and the managers the call patterns start from
(`filled_managers`) are described in the benchmark's docstring.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvref.base import LookupResult, OffloadKey, ReqContext, make_offload_key
from kvref.cpu.manager import CPUOffloadingManager
from tools.compare_vllm_manager import VLLMKVOffload

__all__ = [
    "Shape",
    "Side",
    "absent_keys",
    "filled_managers",
    "flatten",
    "kvref_side",
    "make_contexts",
    "make_requests",
    "serve",
    "traces",
    "vllm_side",
]


@dataclass(frozen=True)
class Shape:
    """One trace: its requests and how they are served.

    Attributes:
        name: the trace's name in the table.
        num_blocks: the CPU cache size, in blocks.
        num_requests: requests replayed.
        num_prefixes: shared prefixes, Zipf-popular (0: every block is unique).
        prefix_blocks: the longest shared prefix (a request shares `min_shared`..this many).
        min_shared: the shortest shared prefix a request uses.
        suffix_blocks: unique blocks per request (1..this many).
        num_groups: KV-cache groups (every block has one key per group).
        concurrency: requests running at once.
        blocks_per_step: blocks a request stores per step.
        lag: steps before a store or load completes.
        zipf: the popularity exponent.
        seed: the random seed.
    """

    name: str
    num_blocks: int
    num_requests: int
    num_prefixes: int
    prefix_blocks: int
    min_shared: int
    suffix_blocks: int
    num_groups: int = 1
    concurrency: int = 8
    blocks_per_step: int = 8
    lag: int = 2
    zipf: float = 1.1
    seed: int = 0


def traces(num_blocks: int, seed: int = 0) -> list[Shape]:
    """The benchmark's three request traces for a cache of `num_blocks` blocks."""
    return [
        # About 2.5x (prefix) and 2x (store) the cache in unique blocks: the cache fills early
        # and then evicts on most stores.
        Shape("prefix", num_blocks, max(1, num_blocks // 2), max(1, num_blocks // 64), 32, 1, 8, seed=seed),
        Shape("store", num_blocks, max(1, num_blocks // 8), 0, 0, 0, 32, blocks_per_step=16, seed=seed),
        # Popular prefixes fill about half the cache; each request reads up to 64 of their blocks.
        Shape("lookup", num_blocks, max(1, num_blocks // 8), max(1, num_blocks // 128), 64, 32, 1, seed=seed),
    ]


def _key(*parts: int) -> bytes:
    return hashlib.blake2b(b"".join(p.to_bytes(8, "big") for p in parts), digest_size=16).digest()


def make_requests(shape: Shape) -> list[list[list[OffloadKey]]]:
    """Return the trace's requests: per request its blocks, per block one key per group."""
    rng = random.Random(shape.seed)
    weights = [1.0 / (rank + 1) ** shape.zipf for rank in range(shape.num_prefixes)]
    requests: list[list[list[OffloadKey]]] = []
    for index in range(shape.num_requests):
        hashes: list[bytes] = []
        if shape.num_prefixes:
            prefix = rng.choices(range(shape.num_prefixes), weights)[0]
            shared = rng.randint(shape.min_shared, shape.prefix_blocks)
            hashes = [_key(0, prefix, block) for block in range(shared)]
        hashes += [_key(1, index, block) for block in range(rng.randint(1, shape.suffix_blocks))]
        requests.append([[make_offload_key(h, g) for g in range(shape.num_groups)] for h in hashes])
    return requests


@dataclass(frozen=True)
class Side:
    """One implementation under test: how to build its manager and contexts, what a hit is."""

    name: str
    make_manager: Callable[[int, str], Any]
    make_context: Callable[[str], Any]
    hit: object


def kvref_side() -> Side:
    """kvref's manager."""
    return Side("kvref", lambda n, policy: CPUOffloadingManager(n, policy), ReqContext, LookupResult.HIT)


def vllm_side(vllm: VLLMKVOffload) -> Side:
    """vLLM 0.33's manager, executed from the sdist."""

    def make(n: int, policy: str) -> Any:
        return vllm.manager_class(num_chunks=n, cache_policy=policy)

    return Side("vllm", make, vllm.req_context_class, vllm.lookup_result.HIT)


def make_contexts(side: Side, requests: Sequence[list[OffloadKey]], groups: int, block_tokens: int = 16) -> list[Any]:
    """One context per (flattened) request, key positions recorded (the scheduler's work, not
    timed)."""
    contexts: list[Any] = []
    for index, keys in enumerate(requests):
        context = side.make_context(f"req-{index}")
        for offset, key in enumerate(keys):
            context.set_offload_key_position(key, (offset // groups + 1) * block_tokens)
        contexts.append(context)
    return contexts


def flatten(requests: Sequence[list[list[OffloadKey]]]) -> list[list[OffloadKey]]:
    """Each request's keys in order, block by block (the form `serve` replays)."""
    return [[key for block in blocks for key in block] for blocks in requests]


def serve(
    manager: Any,
    hit: object,
    requests: Sequence[list[OffloadKey]],
    contexts: list[Any],
    shape: Shape,
    record: list[object] | None = None,
) -> int:
    """Drive `manager` through the (flattened) requests as the connector does.

    A block hits when all its keys (one per group) do; the lookups stop at the first miss.
    `contexts` is consumed (reversed, then popped), so a finished request's context is dropped
    as an engine drops it. The driver is kept lean (it is timed with each manager): with
    `record`, each request's hit count and each store's outcome (stored and evicted keys, or
    None when refused) are appended and the key-operations counted and returned (else 0).
    """
    contexts.reverse()
    lookup, prepare_load, touch = manager.lookup, manager.prepare_load, manager.touch
    prepare_store, complete_store, complete_load = manager.prepare_store, manager.complete_store, manager.complete_load
    on_new_request, on_request_finished = manager.on_new_request, manager.on_request_finished
    waiting = deque(requests)
    # Per running request: [keys, context, next key to store, keys loaded (completed with the
    # request's first store job)].
    running: list[list[Any]] = []
    in_flight: deque[tuple[int, Any, list[OffloadKey], list[OffloadKey]]] = deque()
    concurrency, chunk, lag, groups = shape.concurrency, shape.blocks_per_step * shape.num_groups, shape.lag, shape.num_groups
    key_ops = 0
    step = 0
    while waiting or running or in_flight:
        step += 1
        while in_flight and in_flight[0][0] <= step:
            _, context, stored, loaded = in_flight.popleft()
            complete_store(stored, context)
            if loaded:
                complete_load(loaded, context)
            if record is not None:
                key_ops += len(stored) + len(loaded)
        while waiting and len(running) < concurrency:
            keys = waiting.popleft()
            context = contexts.pop()
            on_new_request(context)
            hits = 0
            for key in keys:
                if lookup(key, context) is not hit:
                    break
                hits += 1
            looked_up = min(hits + 1, len(keys))
            hits -= hits % groups
            loaded = keys[:hits]
            if loaded:
                prepare_load(loaded, context)
            touch(keys, context)
            if record is not None:
                key_ops += looked_up + len(loaded) + len(keys)
                record.append(hits)
            running.append([keys, context, hits, loaded])
        for request in list(running):
            keys, context, start, loaded = request
            request[2] = end = start + chunk
            store = keys[start:end]
            output = prepare_store(store, context)
            stored: list[OffloadKey] = output.keys_to_store if output is not None else []
            if record is not None:
                key_ops += len(store)
                record.append(None if output is None else (stored, output.evicted_keys))
            in_flight.append((step + lag, context, stored, loaded))
            request[3] = []
            if end >= len(keys):
                running.remove(request)
                on_request_finished(context)
    return key_ops


def filled_managers(
    sides: Sequence[Side], policy: str, num_blocks: int, seed: int
) -> tuple[list[tuple[Any, Any]], list[OffloadKey]]:
    """Build each side's manager, fill it with the prefix trace, and give each a fresh context.

    Returns the (manager, context) pairs and the trace's keys, in order, once each.
    """
    shape = traces(num_blocks, seed)[0]
    requests = flatten(make_requests(shape))
    filled: list[tuple[Any, Any]] = []
    for side in sides:
        manager = side.make_manager(num_blocks, policy)
        serve(manager, side.hit, requests, make_contexts(side, requests, shape.num_groups), shape)
        filled.append((manager, side.make_context("probe")))
    return filled, list(dict.fromkeys(key for request in requests for key in request))


def absent_keys(num_blocks: int) -> list[OffloadKey]:
    """Keys no trace uses, their hashes computed (bytes cache theirs: neither side pays)."""
    absent = [make_offload_key(_key(2, index), 0) for index in range(max(num_blocks, 200_000))]
    for key in absent:
        hash(key)
    return absent
