"""Benchmark kvref's `CPUOffloadingManager` against vLLM 0.33's own CPU manager on the same traces.

vLLM's manager and policies are executed from the published sdist (cached outside the repository;
see `tools/compare_vllm_manager.py`, which loads them with stand-ins for logging, config and
metrics only), with numpy when it is installed (vLLM's specs are numpy arrays), as in an engine. Both managers are driven by the same code through the same calls, the way vLLM's
offloading connector drives its manager (`tools/_manager_bench_traces.py`, which also builds the
traces): `on_new_request` with the key positions recorded, a maximal-prefix lookup, a load of
the hits and a touch of every block, stores of the new blocks a few per step, completions some
steps later and `on_request_finished` after the last store.

Traces (each scaled to the cache size, `--sizes`):

* prefix: prefix sharing with Zipf popularity (shared system prompts and documents plus unique
  suffixes); the cache keeps evicting.
* store: store-heavy streaming, every block unique: one missing lookup per request, then stores,
  completions and evictions.
* lookup: lookup-heavy, long popular prefixes that are mostly resident: lookups, loads and
  touches dominate, one new block per request.
* absent: vLLM's cheapest path, a lookup of a key the cache does not hold (full cache): one
  cheap call per key, held to the cheap calls' target rather than the traces'.

Cheap calls, in a table of their own (CALL_PATTERNS), on the full cache the prefix trace left;
one row with one key per call and one with eight (a store job's keys):

* stored, unprepared: `complete_store` of keys that are already stored, or that were never
  prepared (both no-ops, allowed since the call is idempotent);
* touch-stored, touch-absent: `touch` of keys both sides hold ready (each moves to the most
  recent end), or of keys neither holds (a no-op).

Printed per policy and trace: ns per key-operation of each (every key passed to any manager
call is one operation; the cheap calls give ns per call), and kvref's time divided by
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

try:
    # vLLM's specs hold their ids in np.int32 arrays: with numpy importable, vLLM's manager runs
    # as it does in an engine (tools.compare_vllm_manager otherwise stands a list in for it).
    import numpy  # noqa: F401  # pyright: ignore[reportUnusedImport]
except ImportError:
    pass

from kvref.base import OffloadKey  # noqa: E402
from tools._manager_bench_traces import (  # noqa: E402
    Shape,
    Side,
    absent_keys,
    filled_managers,
    flatten,
    kvref_side,
    make_contexts,
    make_requests,
    serve,
    traces,
    vllm_side,
)
from tools.compare_vllm_manager import VLLM_SPEC, load_vllm_kv_offload  # noqa: E402

__all__ = ["CALL_PATTERNS", "Shape", "Side", "TRACES", "flatten", "main", "make_requests", "serve"]

POLICIES: tuple[str, ...] = ("lru", "arc")


TRACES = ("prefix", "store", "lookup", "absent")


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


def bench_trace(sides: Sequence[Side], policy: str, shape: Shape, repeat_count: int) -> Result:
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


def bench_absent(sides: Sequence[Side], policy: str, num_blocks: int, repeat_count: int, seed: int) -> Result:
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


# The cheap calls timed on their own, per call, on the full cache the prefix trace left: the
# manager method, and which keys it is given ("stored": keys both sides hold ready; any other:
# keys neither holds, never prepared). Each is a no-op but the touch of stored keys, which moves
# them to the most recent end on both sides.
CALL_PATTERNS: dict[str, tuple[str, str]] = {
    "stored": ("complete_store", "stored"),
    "unprepared": ("complete_store", "unprepared"),
    "touch-stored": ("touch", "stored"),
    "touch-absent": ("touch", "absent"),
}
# Keys per call: one, then a store job's worth (blocks_per_step).
CALL_BATCHES = (1, 8)


def repeated_calls(call: Callable[[list[OffloadKey], Any], object], calls: Sequence[list[OffloadKey]], context: Any) -> int:
    """Call `call` once per key list (C-level loop); return the calls made."""
    deque(map(call, calls, repeat(context)), 0)
    return len(calls)


@dataclass
class Calls:
    """One cheap-call pattern, one policy, one batch size: both sides' times."""

    pattern: str
    method: str
    keys: str
    policy: str
    keys_per_call: int
    calls: int
    kvref_ns: float
    vllm_ns: float
    ratio: float
    agreement: float


def bench_calls(
    sides: Sequence[Side], policy: str, num_blocks: int, repeat_count: int, seed: int, pattern: str
) -> list[Calls]:
    """Time one of CALL_PATTERNS per call, one row per batch size in CALL_BATCHES.

    The calls go to caches the prefix trace filled. "Same answers" is the share of the keys
    whose lookup answers alike on both sides, checked before and after the calls (which leave
    every answer as it was).
    """
    method, which = CALL_PATTERNS[pattern]
    filled, trace_keys = filled_managers(sides, policy, num_blocks, seed)
    if which == "stored":
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
    for batch in CALL_BATCHES:
        calls = [keys[start : start + batch] for start in range(0, len(keys), batch)]

        def runner(manager: Any, context: Any, calls: list[list[OffloadKey]] = calls) -> Callable[[], float]:
            call = getattr(manager, method)
            return lambda: _timed(lambda: repeated_calls(call, calls, context))

        pairs = _pairs([runner(*pair) for pair in filled], repeat_count)
        after = answers()
        same = min(_agreement(before[0], before[1]), _agreement(after[0], after[1]), float(before == after))
        n = len(calls)
        results.append(
            Calls(
                pattern,
                method,
                which,
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


def bench_memory(sides: Sequence[Side], policy: str, num_blocks: int, seed: int) -> Memory:
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
            "| call | of keys | policy | keys/call | calls | kvref ns/call | vLLM ns/call "
            "| kvref / vLLM | same answers |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for c in calls:
            lines.append(
                f"| {c.method} | {c.keys} | {c.policy} | {c.keys_per_call} | {c.calls:,} | {c.kvref_ns:.0f} | "
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
    patterns = (*TRACES, *CALL_PATTERNS)
    parser.add_argument("--traces", type=_choices(patterns), default=list(patterns), help="traces and call patterns")
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
    ratios: dict[str, list[float]] = {"traces": [], "cheap calls": [], "bytes/block": []}
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
                elif trace in CALL_PATTERNS:
                    calls += bench_calls(sides, policy, size, args.repeat, args.seed, trace)
                else:
                    results.append(bench_trace(sides, policy, shapes[trace], args.repeat))
            if not args.no_memory:
                memory.append(bench_memory(sides, policy, size, args.seed))
        timing = "" if args.memory_only else f", median of {args.repeat} interleaved pairs"
        print(f"# kvref vs {VLLM_SPEC}'s CPU manager, {size:,} blocks, python {sys.version.split()[0]}{timing}")
        print(_format(results, calls, memory))
        # A lookup of an absent key is one cheap call (the connector's cheapest), not a trace.
        ratios["traces"] += [r.ratio for r in results if r.trace != "absent"]
        ratios["cheap calls"] += [c.ratio for c in calls] + [r.ratio for r in results if r.trace == "absent"]
        ratios["bytes/block"] += [m.kvref / m.vllm for m in memory]
        agreements += [r.agreement for r in results] + [c.agreement for c in calls]
    # The targets (issue 42): traces <= 0.6x vLLM's time, cheap calls <= 1.0x, memory <= 1.0x.
    targets = {"traces": 0.6, "cheap calls": 1.0, "bytes/block": 1.0}
    worst = [f"{name} {max(values):.2f} (target {targets[name]:.2f})" for name, values in ratios.items() if values]
    agreement = f"; worst agreement: {min(agreements):.1%}" if agreements else ""
    print(f"worst kvref / vLLM: {', '.join(worst)}{agreement}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
