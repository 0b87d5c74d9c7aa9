"""Benchmark kvref's `CPUOffloadingManager` against vLLM 0.33's own CPU manager on the same traces.

vLLM's manager and policies are executed from the published sdist (cached outside the repository;
see `tools/compare_vllm_manager.py`, which loads them with stand-ins for logging, config and
metrics only). Both managers are driven by the same code through the same calls, the way vLLM's
offloading connector drives its manager: `on_new_request` with the key positions recorded, a
maximal-prefix lookup, a load of the hits and a touch of every block, stores of the new blocks a
few per step, completions some steps later and `on_request_finished` after the last store.

Traces (each scaled to the cache size, `--sizes`):

* prefix: prefix sharing with Zipf popularity (shared system prompts and documents plus unique
  suffixes); the cache keeps evicting.
* store: store-heavy streaming, every block unique: one missing lookup per request, then stores,
  completions and evictions.
* lookup: lookup-heavy, long popular prefixes that are mostly resident: lookups, loads and
  touches dominate, one new block per request.
* absent: vLLM's cheapest path, a lookup of a key the cache does not hold (full cache).
* stored, unprepared: `complete_store` of keys that are already stored, or that were never
  prepared (both no-ops, allowed since the call is idempotent), on the full cache; one row with
  one key per call and one with eight (a store job's keys), in a table of their own.

Printed per policy and trace: ns per key-operation of each (every key passed to any manager
call is one operation; the `complete_store` rows give ns per call), and kvref's time divided by
vLLM's: the median over `--repeat` pairs of runs, each pair timed back to back in alternating
order (A B, B A, ...) so load spikes hit both.
Times are this process's CPU time (`time.process_time`), so the time other processes of a shared
machine take from it counts for neither side.
Then bytes of Python memory per resident block (tracemalloc while the prefix trace fills the
cache; keys and request contexts are built before and excluded), and whether both took the same
decisions: the same lookups hit and every `prepare_store` stored and evicted the same keys.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import random
import statistics
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvref.base import OffloadKey, ReqContext, make_offload_key  # noqa: E402
from kvref.cpu.manager import CPUOffloadingManager  # noqa: E402
from kvref.cpu.policies.factory import CachePolicyName  # noqa: E402
from tools.compare_vllm_manager import VLLM_SPEC, VLLMKVOffload, load_vllm_kv_offload  # noqa: E402

__all__ = ["Shape", "Side", "TRACES", "make_requests", "flatten", "serve", "main"]

POLICIES: tuple[CachePolicyName, ...] = ("lru", "arc")


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


TRACES = ("prefix", "store", "lookup", "absent", "stored", "unprepared")
# Keys per call of the complete_store rows: one, then a store job's worth (blocks_per_step).
COMPLETE_BATCHES = (1, 8)


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
    make_manager: Callable[[int, CachePolicyName], Any]
    make_context: Callable[[str], Any]
    hit: object


def kvref_side() -> Side:
    """kvref's manager (lookup answers True for a ready block)."""
    return Side("kvref", lambda n, policy: CPUOffloadingManager(n, policy), ReqContext, True)


def vllm_side(vllm: VLLMKVOffload) -> Side:
    """vLLM 0.33's manager, executed from the sdist."""

    def make(n: int, policy: CachePolicyName) -> Any:
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


def absent_lookups(manager: Any, keys: Sequence[OffloadKey], context: Any) -> int:
    """Look up every key once (C-level loop, so the manager's call dominates); return the count."""
    lookup: Callable[[OffloadKey, Any], object] = manager.lookup
    deque(map(lookup, keys, repeat(context)), 0)
    return len(keys)


@dataclass
class Result:
    """One trace, one policy: both sides' times and whether they decided alike."""

    trace: str
    policy: str
    key_ops: int
    kvref_ns: float
    vllm_ns: float
    ratio: float
    agreement: float


def _timed(run: Callable[[], object]) -> float:
    gc.collect()
    start = time.process_time()
    run()
    return time.process_time() - start


def _pairs(runs: Sequence[Callable[[], float]], repeat_count: int) -> list[tuple[float, float]]:
    """Time two runs `repeat_count` times back to back, alternating which goes first."""
    pairs: list[tuple[float, float]] = []
    for index in range(repeat_count):
        if index % 2:
            second = runs[1]()
            first = runs[0]()
        else:
            first = runs[0]()
            second = runs[1]()
        pairs.append((first, second))
    return pairs


def _agreement(ours: Sequence[object], theirs: Sequence[object]) -> float:
    if len(ours) != len(theirs):
        return 0.0
    return sum(a == b for a, b in zip(ours, theirs)) / max(len(ours), 1)


def bench_trace(sides: Sequence[Side], policy: CachePolicyName, shape: Shape, repeat_count: int) -> Result:
    """Time one request trace on both sides; check their decisions on an untimed replay."""
    requests = flatten(make_requests(shape))
    groups = shape.num_groups
    records: list[list[object]] = []
    key_ops = 0
    for side in sides:
        record: list[object] = []
        manager = side.make_manager(shape.num_blocks, policy)
        key_ops = serve(manager, side.hit, requests, make_contexts(side, requests, groups), shape, record)
        records.append(record)

    def runner(side: Side) -> Callable[[], float]:
        def run() -> float:
            manager = side.make_manager(shape.num_blocks, policy)
            contexts = make_contexts(side, requests, groups)
            return _timed(lambda: serve(manager, side.hit, requests, contexts, shape))

        return run

    pairs = _pairs([runner(side) for side in sides], repeat_count)
    return Result(
        shape.name,
        policy,
        key_ops,
        statistics.median(a for a, _ in pairs) / key_ops * 1e9,
        statistics.median(b for _, b in pairs) / key_ops * 1e9,
        statistics.median(a / b for a, b in pairs),
        _agreement(records[0], records[1]),
    )


def filled_managers(
    sides: Sequence[Side], policy: CachePolicyName, num_blocks: int, seed: int
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


def bench_absent(sides: Sequence[Side], policy: CachePolicyName, num_blocks: int, repeat_count: int, seed: int) -> Result:
    """Time lookups of keys the cache does not hold, on caches the prefix trace filled."""
    absent = absent_keys(num_blocks)
    filled, _ = filled_managers(sides, policy, num_blocks, seed)
    answers = [
        [manager.lookup(key, context) is side.hit for key in absent[:1000]]
        for side, (manager, context) in zip(sides, filled)
    ]

    def runner(manager: Any, context: Any) -> Callable[[], float]:
        return lambda: _timed(lambda: absent_lookups(manager, absent, context))

    pairs = _pairs([runner(*pair) for pair in filled], repeat_count)
    n = len(absent)
    return Result(
        "absent",
        policy,
        n,
        statistics.median(a for a, _ in pairs) / n * 1e9,
        statistics.median(b for _, b in pairs) / n * 1e9,
        statistics.median(a / b for a, b in pairs),
        _agreement(answers[0], answers[1]),
    )


def redundant_completions(manager: Any, calls: Sequence[list[OffloadKey]], context: Any) -> int:
    """Call `complete_store` once per key list (C-level loop); return the calls made."""
    complete_store: Callable[[list[OffloadKey], Any], None] = manager.complete_store
    deque(map(complete_store, calls, repeat(context)), 0)
    return len(calls)


@dataclass
class Calls:
    """One no-op `complete_store` pattern, one policy, one batch size: both sides' times."""

    pattern: str
    policy: str
    keys_per_call: int
    calls: int
    kvref_ns: float
    vllm_ns: float
    ratio: float
    agreement: float


def bench_complete(
    sides: Sequence[Side], policy: CachePolicyName, num_blocks: int, repeat_count: int, seed: int, pattern: str
) -> list[Calls]:
    """Time `complete_store` of keys already stored ("stored") or never prepared ("unprepared").

    Both are no-ops (the call is idempotent) on caches the prefix trace filled; one row per
    batch size in COMPLETE_BATCHES. "Same answers" is the share of the keys whose lookup
    answers alike on both sides, checked before and after the calls (which change nothing).
    """
    filled, trace_keys = filled_managers(sides, policy, num_blocks, seed)
    if pattern == "stored":
        # Keys both sides hold and can read: the calls must find them ready on both.
        keys = [
            key for key in trace_keys if all(m.lookup(key, c) is s.hit for s, (m, c) in zip(sides, filled))
        ]
    else:
        keys = absent_keys(num_blocks)
    keys = (keys * (200_000 // max(len(keys), 1) + 1))[:200_000]

    def answers() -> list[list[object]]:
        return [[m.lookup(key, c) is s.hit for key in keys[:1000]] for s, (m, c) in zip(sides, filled)]

    before = answers()
    results: list[Calls] = []
    for batch in COMPLETE_BATCHES:
        calls = [keys[start : start + batch] for start in range(0, len(keys), batch)]

        def runner(manager: Any, context: Any, calls: list[list[OffloadKey]] = calls) -> Callable[[], float]:
            return lambda: _timed(lambda: redundant_completions(manager, calls, context))

        pairs = _pairs([runner(*pair) for pair in filled], repeat_count)
        after = answers()
        same = min(_agreement(before[0], before[1]), _agreement(after[0], after[1]), float(before == after))
        n = len(calls)
        results.append(
            Calls(
                pattern,
                policy,
                batch,
                n,
                statistics.median(a for a, _ in pairs) / n * 1e9,
                statistics.median(b for _, b in pairs) / n * 1e9,
                statistics.median(a / b for a, b in pairs),
                same,
            )
        )
    return results


@dataclass
class Memory:
    """Bytes of Python memory per resident block after the prefix trace filled the cache."""

    policy: str
    kvref: float
    vllm: float


def bench_memory(sides: Sequence[Side], policy: CachePolicyName, num_blocks: int, seed: int) -> Memory:
    """Measure each side's memory per resident block (tracemalloc; keys, contexts excluded)."""
    shape = traces(num_blocks, seed)[0]
    requests = flatten(make_requests(shape))
    figures: list[float] = []
    for side in sides:
        contexts = make_contexts(side, requests, shape.num_groups)
        probe = side.make_context("probe")
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            manager = side.make_manager(num_blocks, policy)
            serve(manager, side.hit, requests, contexts, shape)
            gc.collect()
            used = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        # Every job completed by the end of the trace: resident blocks are the ready ones.
        keys = {key for request in requests for key in request}
        resident = sum(1 for key in keys if manager.lookup(key, probe) is side.hit)
        figures.append(used / max(resident, 1))
        del manager
    return Memory(policy, figures[0], figures[1])


def _format(results: list[Result], calls: list[Calls], memory: list[Memory]) -> str:
    lines: list[str] = []
    if results:
        lines += [
            "| trace | policy | key-ops | kvref ns/op | vLLM ns/op | kvref / vLLM | same decisions |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in results:
            lines.append(
                f"| {r.trace} | {r.policy} | {r.key_ops:,} | {r.kvref_ns:.0f} | {r.vllm_ns:.0f} | "
                f"{r.ratio:.2f} | {r.agreement:.1%} |"
            )
    if calls:
        lines += [
            *([""] if lines else []),
            "| complete_store of keys | policy | keys/call | calls | kvref ns/call | vLLM ns/call "
            "| kvref / vLLM | same answers |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for c in calls:
            lines.append(
                f"| {c.pattern} | {c.policy} | {c.keys_per_call} | {c.calls:,} | {c.kvref_ns:.0f} | "
                f"{c.vllm_ns:.0f} | {c.ratio:.2f} | {c.agreement:.1%} |"
            )
    if memory:
        lines += [
            *([""] if lines else []),
            "| policy | kvref bytes/block | vLLM bytes/block | kvref / vLLM |",
            "|---|---:|---:|---:|",
        ]
        for m in memory:
            lines.append(f"| {m.policy} | {m.kvref:.0f} | {m.vllm:.0f} | {m.kvref / m.vllm:.2f} |")
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(value < 64 for value in values):
        raise argparse.ArgumentTypeError(f"expected cache sizes >= 64 blocks, got {text!r}")
    return values


def _choices(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        chosen = [part for part in text.split(",") if part]
        bad = [part for part in chosen if part not in allowed]
        if bad or not chosen:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {', '.join(allowed)}, got {text!r}")
        return chosen

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench_manager.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--sizes", type=_sizes, default=[10_000], help="CPU cache sizes, in blocks (comma-separated)")
    parser.add_argument("--policies", type=_choices(POLICIES), default=list(POLICIES), help="cache policies")
    parser.add_argument("--traces", type=_choices(TRACES), default=list(TRACES), help="traces")
    parser.add_argument("--repeat", type=int, default=11, help="timed pairs per trace (the median is kept)")
    parser.add_argument("--seed", type=int, default=0, help="trace seed")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc measurement")
    parser.add_argument("--memory-only", action="store_true", help="measure memory only (no timings)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.repeat < 1:
        print("error: --repeat must be >= 1", file=sys.stderr)
        return 2
    if args.memory_only and args.no_memory:
        print("error: --memory-only and --no-memory exclude each other", file=sys.stderr)
        return 2
    sides = [kvref_side(), vllm_side(load_vllm_kv_offload())]
    ratios: dict[str, list[float]] = {"traces": [], "no-op complete_store": [], "bytes/block": []}
    agreements: list[float] = []
    for size in args.sizes:
        results: list[Result] = []
        calls: list[Calls] = []
        memory: list[Memory] = []
        shapes = {shape.name: shape for shape in traces(size, args.seed)}
        for policy in args.policies:
            chosen: list[str] = [] if args.memory_only else args.traces
            for trace in chosen:
                if trace == "absent":
                    results.append(bench_absent(sides, policy, size, args.repeat, args.seed))
                elif trace in ("stored", "unprepared"):
                    calls += bench_complete(sides, policy, size, args.repeat, args.seed, trace)
                else:
                    results.append(bench_trace(sides, policy, shapes[trace], args.repeat))
            if not args.no_memory:
                memory.append(bench_memory(sides, policy, size, args.seed))
        timing = "" if args.memory_only else f", median of {args.repeat} interleaved pairs"
        print(f"# kvref vs {VLLM_SPEC}'s CPU manager, {size:,} blocks, python {sys.version.split()[0]}{timing}")
        print(_format(results, calls, memory))
        ratios["traces"] += [r.ratio for r in results]
        ratios["no-op complete_store"] += [c.ratio for c in calls]
        ratios["bytes/block"] += [m.kvref / m.vllm for m in memory]
        agreements += [r.agreement for r in results] + [c.agreement for c in calls]
    # The targets: traces <= 0.5x vLLM's time, no-op completions <= 1.0x, memory <= 1.0x.
    targets = {"traces": 0.5, "no-op complete_store": 1.0, "bytes/block": 1.0}
    worst = [f"{name} {max(values):.2f} (target {targets[name]:.2f})" for name, values in ratios.items() if values]
    agreement = f"; worst agreement: {min(agreements):.1%}" if agreements else ""
    print(f"worst kvref / vLLM: {', '.join(worst)}{agreement}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
