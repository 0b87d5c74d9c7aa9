"""Hit-rate curves of the CPU cache policies (LRU, ARC) over cache sizes, as a table and a PNG.

Each request of a trace is replayed into a `CPUOffloadingManager` the way vLLM's offloading
connector drives it: a maximal-prefix lookup, a load of the hit blocks, a touch of every block,
a store of the rest, the completions, then `on_request_finished`. The hit rate is the share of
all requested blocks that the lookups found (a block after the first miss counts as a miss, as
the engine recomputes it).

The trace is generated (prefix sharing: requests pick one of `--prefixes` shared prefixes by Zipf
popularity, share part of it and add unique blocks; a share of them are one-off long documents,
a scan) or read from `--trace`, a JSON-lines file with one request per line:

    {"blocks": ["9f86d081", "60303ae2", "fd61a03a"]}

`blocks` lists the request's block hashes in prefix order (any strings; equal strings are the
same block). Blank lines and lines starting with `#` are skipped.

Prints a markdown table (one row per cache size, one column per policy) and writes the plot
(`--out`, default docs/policy_hit_rates.png) with matplotlib's Agg backend.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvref.base import LookupResult, OffloadKey, ReqContext, make_offload_key  # noqa: E402
from kvref.cpu.manager import CPUOffloadingManager  # noqa: E402

__all__ = ["TraceShape", "generate_trace", "read_trace", "hit_rate", "simulate", "main"]

POLICIES: tuple[str, ...] = ("lru", "arc")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "policy_hit_rates.png"


@dataclass(frozen=True)
class TraceShape:
    """The generated trace.

    Attributes:
        num_requests: requests in the trace.
        num_prefixes: shared prefixes (system prompts, documents), Zipf-popular.
        prefix_blocks: the longest shared prefix, in blocks (a request shares 1..this many).
        suffix_blocks: unique blocks a request adds (1..this many).
        scan_share: the share of requests that are one-off documents of `scan_blocks` blocks.
        scan_blocks: the length of a one-off document, in blocks.
        zipf: the popularity exponent.
        seed: the random seed.
    """

    num_requests: int = 4000
    num_prefixes: int = 200
    prefix_blocks: int = 32
    suffix_blocks: int = 8
    scan_share: float = 0.2
    scan_blocks: int = 48
    zipf: float = 1.0
    seed: int = 0


def generate_trace(shape: TraceShape) -> list[list[str]]:
    """Return the requests of a generated prefix-sharing trace, each its block hashes in order."""
    rng = random.Random(shape.seed)
    weights = [1.0 / (rank + 1) ** shape.zipf for rank in range(shape.num_prefixes)]
    requests: list[list[str]] = []
    for index in range(shape.num_requests):
        if rng.random() < shape.scan_share:
            requests.append([f"scan-{index}-{block}" for block in range(shape.scan_blocks)])
            continue
        prefix = rng.choices(range(shape.num_prefixes), weights)[0]
        shared = rng.randint(1, shape.prefix_blocks)
        blocks = [f"prefix-{prefix}-{block}" for block in range(shared)]
        blocks += [f"req-{index}-{block}" for block in range(rng.randint(1, shape.suffix_blocks))]
        requests.append(blocks)
    return requests


def read_trace(path: Path) -> list[list[str]]:
    """Read a JSON-lines trace (see the module docstring).

    Raises:
        OSError: the file cannot be read.
        ValueError: a line is not `{"blocks": [str, ...]}` (the message names the line).
    """
    requests: list[list[str]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            record: object = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
        blocks = cast(dict[str, object], record).get("blocks") if isinstance(record, dict) else None
        if not isinstance(blocks, list):
            raise ValueError(f'{path}:{number}: expected {{"blocks": [str, ...]}}')
        names = cast(list[object], blocks)
        if not all(isinstance(block, str) for block in names):
            raise ValueError(f'{path}:{number}: expected {{"blocks": [str, ...]}}')
        requests.append([str(block) for block in names])
    if not requests:
        raise ValueError(f"{path}: no requests")
    return requests


def _keys(requests: Sequence[list[str]]) -> list[list[OffloadKey]]:
    interned: dict[str, OffloadKey] = {}
    result: list[list[OffloadKey]] = []
    for blocks in requests:
        keys: list[OffloadKey] = []
        for block in blocks:
            key = interned.get(block)
            if key is None:
                key = interned[block] = make_offload_key(block.encode(), 0)
            keys.append(key)
        result.append(keys)
    return result


def hit_rate(policy: str, num_blocks: int, requests: Sequence[list[OffloadKey]]) -> float:
    """Replay the requests into a fresh manager of `num_blocks`; return the share of blocks hit."""
    manager = CPUOffloadingManager(num_blocks, policy)
    hits = total = 0
    for index, keys in enumerate(requests):
        context = ReqContext(f"req-{index}")
        for position, key in enumerate(keys, start=1):
            context.set_offload_key_position(key, position * 16)
        manager.on_new_request(context)
        hit = 0
        for key in keys:
            if manager.lookup(key, context) is not LookupResult.HIT:
                break
            hit += 1
        hits += hit
        total += len(keys)
        loaded = keys[:hit]
        if loaded:
            manager.prepare_load(loaded, context)
        manager.touch(keys, context)
        # A request longer than the cache stores what fits (the engine offloads per step).
        output = manager.prepare_store(list(dict.fromkeys(keys[hit:]))[:num_blocks], context)
        if output is not None:
            manager.complete_store(output.keys_to_store, context)
        if loaded:
            manager.complete_load(loaded, context)
        manager.on_request_finished(context)
    return hits / total if total else 0.0


def simulate(
    requests: Sequence[list[str]], sizes: Sequence[int], policies: Sequence[str] = POLICIES
) -> dict[str, list[float]]:
    """Return each policy's hit rate at each cache size."""
    keyed = _keys(requests)
    return {policy: [hit_rate(policy, size, keyed) for size in sizes] for policy in policies}


def format_table(sizes: Sequence[int], rates: dict[str, list[float]]) -> str:
    """The hit rates as a markdown table, one row per cache size."""
    policies = list(rates)
    lines = [
        "| cache blocks | " + " | ".join(f"{policy.upper()} hit rate" for policy in policies) + " |",
        "|---:|" + "---:|" * len(policies),
    ]
    for row, size in enumerate(sizes):
        lines.append(f"| {size:,} | " + " | ".join(f"{rates[p][row]:.1%}" for p in policies) + " |")
    return "\n".join(lines)


def ceiling(requests: Sequence[list[str]]) -> float:
    """The hit rate of an unbounded cache: every block requested before is found."""
    seen: set[str] = set()
    hits = total = 0
    for blocks in requests:
        hit = 0
        while hit < len(blocks) and blocks[hit] in seen:
            hit += 1
        hits, total = hits + hit, total + len(blocks)
        seen.update(blocks)
    return hits / total if total else 0.0


def plot(
    sizes: Sequence[int], rates: dict[str, list[float]], title: str, out: Path, limit: float | None = None
) -> None:
    """Draw the hit-rate curves to `out` (PNG) with matplotlib's Agg backend (and `limit`, the
    unbounded cache's hit rate, as a dashed line)."""
    import matplotlib

    matplotlib.use("Agg")
    # matplotlib's annotations leave **kwargs untyped, which strict pyright rejects at every call.
    plt: Any = importlib.import_module("matplotlib.pyplot")
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
    for policy, values in rates.items():
        axes.plot(sizes, [100 * value for value in values], marker="o", label=policy.upper())
    if limit is not None:
        axes.axhline(100 * limit, color="grey", linestyle="--", label="unbounded cache")
    axes.set_xscale("log", base=2)
    axes.set_xticks(list(sizes), [f"{size:,}" for size in sizes])
    axes.set_xlabel("CPU cache size (blocks)")
    axes.set_ylabel("blocks served from the cache (%)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png")
    plt.close(figure)


def _sizes(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return sorted(set(values))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simulate_policies.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    defaults = TraceShape()
    parser.add_argument("--trace", type=Path, help="JSON-lines trace (default: a generated one)")
    parser.add_argument("--sizes", type=_sizes, default=[128, 256, 512, 1024, 2048, 4096, 8192], help="cache sizes, in blocks")
    parser.add_argument("--requests", type=int, default=defaults.num_requests, help="generated requests")
    parser.add_argument("--prefixes", type=int, default=defaults.num_prefixes, help="generated shared prefixes")
    parser.add_argument("--scan-share", type=float, default=defaults.scan_share, help="share of one-off long documents")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="generated trace's seed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the PNG")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulation; print the table and write the plot. Returns the exit status."""
    args = _parser().parse_args(argv)
    if args.requests < 1 or args.prefixes < 1 or not 0.0 <= args.scan_share <= 1.0:
        print("error: --requests and --prefixes must be >= 1, --scan-share in [0, 1]", file=sys.stderr)
        return 2
    if args.trace is not None:
        try:
            requests = read_trace(args.trace)
        except (OSError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        title = f"LRU vs ARC on {args.trace.name} ({len(requests):,} requests)"
    else:
        shape = TraceShape(args.requests, args.prefixes, scan_share=args.scan_share, seed=args.seed)
        requests = generate_trace(shape)
        title = (
            f"LRU vs ARC: {shape.num_requests:,} requests, {shape.num_prefixes} Zipf prefixes, "
            f"{shape.scan_share:.0%} scans"
        )
    rates = simulate(requests, args.sizes)
    print(f"# {title}; {sum(map(len, requests)):,} blocks requested")
    print(format_table(args.sizes, rates))
    limit = ceiling(requests)
    print(f"unbounded cache: {limit:.1%}")
    plot(args.sizes, rates, title, args.out, limit)
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
