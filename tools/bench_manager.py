"""Benchmark `CPUOffloadingManager` on a synthetic prefix-sharing serving trace.

Requests share long prefixes (a few popular system prompts and documents, Zipf-distributed) and
add a unique suffix. Each request is replayed the way vLLM's offloading connector drives the
manager: a maximal-prefix lookup, a load of the hit blocks, a touch of every block, a store of
the rest, and completions of stores and loads a few requests later (so blocks are pending or
being read while others are evicted), each followed by the request's `on_request_finished`.

Printed per policy and cache size, each next to a baseline measured in the same run:

* ns per key-operation over the whole trace (every key passed to any manager call counts as one
  operation), against a plain `dict` doing the same lookups (`dict.get` of every key the replay
  looked up, in the same order);
* ns per lookup, replaying only the lookups against the final manager, against the same dict;
* bytes of Python memory per tracked block (tracemalloc, keys excluded: they exist before the
  manager), against a `dict` mapping the same keys to their slot ids.

The trace is generated from `--seed`, so two runs replay the same requests.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import random
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvref.base import OffloadKey, ReqContext, make_offload_key  # noqa: E402
from kvref.cpu.manager import CPUOffloadingManager  # noqa: E402
from kvref.cpu.policies.factory import CachePolicyName  # noqa: E402

__all__ = ["TraceShape", "make_trace", "replay", "main"]

POLICIES: tuple[CachePolicyName, ...] = ("lru", "arc")


@dataclass(frozen=True)
class TraceShape:
    """How the synthetic trace for one cache size looks.

    Attributes:
        num_blocks: the CPU cache size the trace is scaled to.
        passes: unique blocks stored over the trace, as a multiple of `num_blocks`.
        prefix_blocks: the longest shared prefix, in blocks.
        suffix_blocks: the unique blocks each request adds.
        prefix_share: the fraction of the cache the shared prefixes would fill.
        seed: the random seed.
    """

    num_blocks: int
    passes: float = 2.0
    prefix_blocks: int = 32
    suffix_blocks: int = 8
    prefix_share: float = 0.5
    seed: int = 0

    @property
    def num_prefixes(self) -> int:
        return max(1, int(self.num_blocks * self.prefix_share) // self.prefix_blocks)

    @property
    def num_requests(self) -> int:
        return max(1, int(self.num_blocks * self.passes) // self.suffix_blocks)


def _block_key(*parts: int) -> OffloadKey:
    # A 16-byte hash, like a chained prefix hash, then the group index (always 0 here).
    digest = hashlib.blake2b(b"".join(p.to_bytes(8, "big") for p in parts), digest_size=16)
    return make_offload_key(digest.digest(), 0)


def make_trace(shape: TraceShape) -> list[list[OffloadKey]]:
    """Return the requests of the trace, each the list of its block keys in prefix order."""
    rng = random.Random(shape.seed)
    prefixes = [
        [_block_key(0, prefix, block) for block in range(shape.prefix_blocks)]
        for prefix in range(shape.num_prefixes)
    ]
    weights = [1.0 / (rank + 1) ** 1.1 for rank in range(shape.num_prefixes)]
    chosen = rng.choices(prefixes, weights, k=shape.num_requests)
    trace: list[list[OffloadKey]] = []
    for request, prefix in enumerate(chosen):
        shared = rng.randint(1, shape.prefix_blocks)
        suffix = [_block_key(1, request, block) for block in range(shape.suffix_blocks)]
        trace.append(prefix[:shared] + suffix)
    return trace


@dataclass
class ReplayStats:
    """What one replay did."""

    key_ops: int = 0
    lookups: int = 0
    hits: int = 0
    stored: int = 0
    evicted: int = 0
    refused_stores: int = 0


def replay(
    manager: CPUOffloadingManager,
    trace: Sequence[list[OffloadKey]],
    lag: int,
    record_lookups: list[OffloadKey] | None = None,
) -> ReplayStats:
    """Drive `manager` through `trace` like the connector's scheduler side does.

    Stores and loads complete `lag` requests after they were prepared.
    """
    stats = ReplayStats()
    in_flight: deque[tuple[ReqContext, list[OffloadKey], list[OffloadKey]]] = deque()
    lookup = manager.lookup
    for index, keys in enumerate(trace):
        # One context per request: managers keep the request's access record in it.
        context = ReqContext(f"req-{index}")
        hits = 0
        for key in keys:
            if record_lookups is not None:
                record_lookups.append(key)
            if lookup(key, context) is not True:
                break
            hits += 1
        stats.lookups += min(hits + 1, len(keys))
        stats.hits += hits
        loaded = keys[:hits]
        if loaded:
            manager.prepare_load(loaded, context)
        manager.touch(keys, context)
        output = manager.prepare_store(keys[hits:], context)
        stored: list[OffloadKey] = []
        if output is None:
            stats.refused_stores += 1
        else:
            stored = output.keys_to_store
            stats.stored += len(stored)
            stats.evicted += len(output.evicted_keys)
        # lookups + prepare_load + touch + prepare_store, then both completions below
        stats.key_ops += min(hits + 1, len(keys)) + hits + len(keys) + (len(keys) - hits)
        stats.key_ops += len(stored) + hits
        in_flight.append((context, stored, loaded))
        if len(in_flight) > lag:
            done_context, done_stored, done_loaded = in_flight.popleft()
            manager.complete_store(done_stored, done_context)
            manager.complete_load(done_loaded, done_context)
            manager.on_request_finished(done_context)
    while in_flight:
        done_context, done_stored, done_loaded = in_flight.popleft()
        manager.complete_store(done_stored, done_context)
        manager.complete_load(done_loaded, done_context)
        manager.on_request_finished(done_context)
    return stats


def _best_seconds(runs: Sequence[Callable[[], object]], repeat: int) -> list[float]:
    """Time each of `runs` `repeat` times, interleaved so load spikes hit all alike; keep the best."""
    best = [float("inf")] * len(runs)
    for _ in range(repeat):
        for index, run in enumerate(runs):
            gc.collect()
            start = time.perf_counter()
            run()
            best[index] = min(best[index], time.perf_counter() - start)
    return best


def _traced_bytes(build: Callable[[], object]) -> tuple[int, object]:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        built = build()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return after - before, built


@dataclass
class Row:
    policy: str
    num_blocks: int
    stats: ReplayStats
    ns_per_key_op: float
    dict_ns_per_lookup: float
    ns_per_lookup: float
    bytes_per_block: float | None
    dict_bytes_per_block: float | None


def bench_one(
    policy: CachePolicyName, shape: TraceShape, trace: list[list[OffloadKey]], args: argparse.Namespace
) -> Row:
    context = ReqContext("bench")
    # Half the trace: the cache is full and has been evicting (ARC's ghost lists are filled).
    half = trace[: len(trace) // 2]
    recorded: list[OffloadKey] = []

    def fill() -> CPUOffloadingManager:
        filled = CPUOffloadingManager(shape.num_blocks, policy)
        replay(filled, half, args.lag, recorded)
        return filled

    bytes_per_block = dict_bytes_per_block = None
    if args.no_memory:
        fill()
    else:
        manager_bytes, filled = _traced_bytes(fill)
        assert isinstance(filled, CPUOffloadingManager)
        # The recorded lookups belong to the benchmark, not to the manager.
        manager_bytes -= sys.getsizeof(recorded)
        tracked = filled.num_blocks - filled.num_free_blocks
        kept = list(dict.fromkeys(key for keys in half for key in keys if filled.lookup(key, context)))
        dict_bytes, _ = _traced_bytes(lambda: {key: index for index, key in enumerate(kept)})
        bytes_per_block = manager_bytes / max(tracked, 1)
        dict_bytes_per_block = dict_bytes / max(len(kept), 1)

    managers: list[CPUOffloadingManager] = []
    stats: list[ReplayStats] = []

    def run_trace() -> None:
        manager = CPUOffloadingManager(shape.num_blocks, policy)
        stats.append(replay(manager, trace, args.lag))
        managers.append(manager)

    (trace_seconds,) = _best_seconds([run_trace], args.repeat)
    manager = managers[-1]
    table = {key: index for index, key in enumerate(recorded) if manager.lookup(key, context)}

    def dict_lookups() -> None:
        get = table.get
        for key in recorded:
            get(key)

    def manager_lookups() -> None:
        lookup = manager.lookup
        for key in recorded:
            lookup(key, context)

    dict_seconds, lookup_seconds = _best_seconds([dict_lookups, manager_lookups], args.repeat + 2)
    return Row(
        policy,
        shape.num_blocks,
        stats[-1],
        trace_seconds / stats[-1].key_ops * 1e9,
        dict_seconds / len(recorded) * 1e9,
        lookup_seconds / len(recorded) * 1e9,
        bytes_per_block,
        dict_bytes_per_block,
    )


def _format(rows: list[Row]) -> str:
    header = (
        "| policy | blocks | key-ops | hit rate | evicted | ns/key-op | dict ns/lookup | ratio "
        "| ns/lookup | ratio | bytes/block | dict bytes/block | ratio |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        mem = ["n/a", "n/a", "n/a"]
        if row.bytes_per_block is not None and row.dict_bytes_per_block is not None:
            mem = [
                f"{row.bytes_per_block:.0f}",
                f"{row.dict_bytes_per_block:.0f}",
                f"{row.bytes_per_block / row.dict_bytes_per_block:.2f}x",
            ]
        hit_rate = row.stats.hits / max(row.stats.lookups, 1)
        lines.append(
            f"| {row.policy} | {row.num_blocks:,} | {row.stats.key_ops:,} | {hit_rate:.1%} | "
            f"{row.stats.evicted:,} | {row.ns_per_key_op:.0f} | {row.dict_ns_per_lookup:.0f} | "
            f"{row.ns_per_key_op / row.dict_ns_per_lookup:.1f}x | {row.ns_per_lookup:.0f} | "
            f"{row.ns_per_lookup / row.dict_ns_per_lookup:.1f}x | {' | '.join(mem)} |"
        )
    return "\n".join(lines)


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _policies(text: str) -> list[CachePolicyName]:
    chosen: list[CachePolicyName] = []
    for name in text.split(","):
        if name not in POLICIES:
            raise argparse.ArgumentTypeError(f"policies must be among {', '.join(POLICIES)}, got {name!r}")
        chosen.append("lru" if name == "lru" else "arc")
    return chosen


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench_manager.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--sizes", type=_positive_ints, default=[10_000, 100_000], help="CPU cache sizes, in blocks")
    parser.add_argument("--policies", type=_policies, default=list(POLICIES), help="cache policies")
    parser.add_argument("--passes", type=float, default=2.0, help="unique blocks stored, as a multiple of the cache size")
    parser.add_argument("--prefix-blocks", type=int, default=32, help="longest shared prefix, in blocks")
    parser.add_argument("--suffix-blocks", type=int, default=8, help="unique blocks per request")
    parser.add_argument("--lag", type=int, default=4, help="requests before a store or load completes")
    parser.add_argument("--repeat", type=int, default=2, help="timed repetitions (the best is kept)")
    parser.add_argument("--seed", type=int, default=0, help="trace seed")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc measurement")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.passes <= 0 or args.prefix_blocks < 1 or args.suffix_blocks < 1 or args.lag < 0 or args.repeat < 1:
        print(
            "error: --passes must be > 0, --prefix-blocks/--suffix-blocks/--repeat >= 1, --lag >= 0",
            file=sys.stderr,
        )
        return 2
    rows: list[Row] = []
    for size in args.sizes:
        shape = TraceShape(size, args.passes, args.prefix_blocks, args.suffix_blocks, seed=args.seed)
        trace = make_trace(shape)
        print(
            f"# {size:,} blocks: {len(trace):,} requests over {shape.num_prefixes:,} shared prefixes "
            f"(<= {shape.prefix_blocks} blocks) + {shape.suffix_blocks} unique blocks each",
            file=sys.stderr,
        )
        for policy in args.policies:
            rows.append(bench_one(policy, shape, trace, args))
    print(f"python {sys.version.split()[0]}, seed {args.seed}, lag {args.lag}, best of {args.repeat}")
    print(_format(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
