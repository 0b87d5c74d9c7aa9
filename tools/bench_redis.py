"""Benchmark the Redis tier against a raw redis-py pipeline moving the same bytes, same run.

For each block size: fill a primary of `--total` bytes with random rows, then

* tier store:  `RedisSecondaryTier.submit_store`, jobs of `--job-blocks` blocks, all submitted at
  once, timed until `drain_jobs` returns (checksums and headers included);
* tier load:   the same blocks back with `submit_load` into other rows (verification included);
* redis-py:    one `Redis` client, `pipeline(transaction=False)` of SET (the row's memoryview)
  per job, executed job after job; and GET per job, each reply copied into its row.

The server is flushed between phases, so every phase writes into an empty server. The ratio
tier/redis-py is the figure of merit (target >= 0.8 at 1 MiB). The tier is measured with one
connection (like the baseline) and with `--connections` (its default: 4).

    .venv/bin/python tools/bench_redis.py                 # starts a throw-away redis-server
    .venv/bin/python tools/bench_redis.py --url redis://host:6379
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvref.tiering.base import TransferJob
from kvref.tiering.redis import RedisSecondaryTier
from kvref.tiering.redis.local import LocalRedisServer, redis_server_path

# Sizes and keys are spelled as in the tiering benchmark, which runs this one with --redis.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tier_bench import RedisPyPipeline, bench_spec, human, key_of, parse_size, transfer_job  # noqa: E402

__all__ = ["main", "bench_block_size", "bench_latency", "percentile"]


def redis_tier(view: memoryview, url: str, connections: int) -> RedisSecondaryTier:
    block_bytes = view.strides[0] if view.strides else 0
    spec = bench_spec(block_bytes)
    return RedisSecondaryTier(spec, view, "redis", url=url, num_connections=connections, socket_timeout_s=30)


def best_of(repeats: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeats))


def bench_block_size(
    url: str, block_bytes: int, total: int, job_blocks: int, connections: Sequence[int], repeats: int
) -> dict[str, float]:
    """Return GB/s per phase for one block size ("tier store (1)", "redis-py load", ...)."""
    count = max(job_blocks, total // block_bytes)
    # Rows [0, count) are the source, [count, 2 count) the destination of loads.
    view = memoryview(bytearray(2 * count * block_bytes)).cast("B", (2 * count, block_bytes))
    flat = view.cast("B")
    chunk = os.urandom(min(count * block_bytes, 8 << 20))
    for start in range(0, count * block_bytes, len(chunk)):
        end = min(start + len(chunk), count * block_bytes)
        flat[start:end] = chunk[: end - start]
    keys = [key_of(i) for i in range(count)]
    moved = count * block_bytes / 1e9
    baseline = RedisPyPipeline(url)
    figures: dict[str, float] = {}

    def row(i: int) -> memoryview:
        return flat[i * block_bytes : (i + 1) * block_bytes]

    def jobs(promotion: bool) -> list[TransferJob]:
        offset = count if promotion else 0
        return [
            transfer_job(
                keys[start : start + job_blocks],
                [offset + i for i in range(start, min(start + job_blocks, count))],
                promotion,
            )
            for start in range(0, count, job_blocks)
        ]

    for n_connections in connections:

        def tier_store() -> float:
            baseline.flush()
            tier = redis_tier(view, url, n_connections)
            try:
                started = time.perf_counter()
                for job in jobs(False):
                    tier.submit_store(job)
                tier.drain_jobs()
                elapsed = time.perf_counter() - started
                assert all(result.success for result in tier.get_finished_jobs()), "a store failed"
            finally:
                tier.shutdown()
            return elapsed

        figures[f"tier store ({n_connections})"] = moved / best_of(repeats, tier_store)
        tier = redis_tier(view, url, n_connections)
        try:

            def tier_load() -> float:
                started = time.perf_counter()
                for job in jobs(True):
                    tier.submit_load(job)
                tier.drain_jobs()
                elapsed = time.perf_counter() - started
                assert all(result.success for result in tier.get_finished_jobs()), "a load failed"
                return elapsed

            figures[f"tier load ({n_connections})"] = moved / best_of(repeats, tier_load)
            assert flat[count * block_bytes :] == flat[: count * block_bytes], "loaded bytes differ"
        finally:
            tier.shutdown()

    redis_keys = [b"bench:" + key.hex().encode() for key in keys]
    sources = [row(i) for i in range(count)]
    destinations = [row(count + i) for i in range(count)]

    def pipeline_store() -> float:
        baseline.flush()
        return baseline.store(redis_keys, sources, job_blocks)

    figures["redis-py store"] = moved / best_of(repeats, pipeline_store)
    figures["redis-py load"] = moved / best_of(repeats, lambda: baseline.load(redis_keys, destinations, job_blocks))
    baseline.flush()
    baseline.close()
    flat.release()
    return figures


def percentile(samples: Sequence[float], pct: float) -> float:
    """The `pct`-th percentile (nearest rank) of `samples`."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))]


def bench_latency(url: str, block_bytes: int, job_blocks: int, jobs: int, connections: int) -> dict[str, list[float]]:
    """Seconds per job, one job at a time (submit, then wait for it), for each phase.

    The tier: `submit_*` then `drain_jobs` and `get_finished_jobs`, as a scheduler waiting for
    one job would; redis-py: one pipeline per job. `jobs` stores of new keys, then loads of
    them into other rows (checked after timing). Tier and redis-py jobs alternate, so both see
    the same server (and the same machine) at every moment.
    """
    view = memoryview(bytearray(2 * job_blocks * block_bytes)).cast("B", (2 * job_blocks, block_bytes))
    flat = view.cast("B")
    flat[: job_blocks * block_bytes] = os.urandom(job_blocks * block_bytes)
    sources = [flat[i * block_bytes : (i + 1) * block_bytes] for i in range(job_blocks)]
    destinations = [flat[(job_blocks + i) * block_bytes : (job_blocks + i + 1) * block_bytes] for i in range(job_blocks)]
    keys = [[key_of(j * job_blocks + i) for i in range(job_blocks)] for j in range(jobs)]
    redis_keys = [[b"bench:" + key.hex().encode() for key in job] for job in keys]
    baseline = RedisPyPipeline(url)
    baseline.flush()
    samples: dict[str, list[float]] = {name: [] for name in ("tier store", "tier load", "redis-py store", "redis-py load")}
    tier = redis_tier(view, url, connections)
    try:
        for promotion, direction in ((False, "store"), (True, "load")):
            first_row = job_blocks if promotion else 0
            for j in range(jobs):
                job = transfer_job(keys[j], range(first_row, first_row + job_blocks), promotion)
                started = time.perf_counter()
                (tier.submit_load if promotion else tier.submit_store)(job)
                tier.drain_jobs()
                results = list(tier.get_finished_jobs())
                samples[f"tier {direction}"].append(time.perf_counter() - started)
                assert [r.success for r in results] == [True], f"tier {direction} job {j} failed"
                if promotion:
                    assert flat[job_blocks * block_bytes :] == flat[: job_blocks * block_bytes], "loaded bytes differ"
                    samples["redis-py load"].append(baseline.load(redis_keys[j], destinations, job_blocks))
                else:
                    samples["redis-py store"].append(baseline.store(redis_keys[j], sources, job_blocks))
    finally:
        tier.shutdown()
    baseline.flush()
    baseline.close()
    return samples


def report_latency(samples: dict[str, list[float]]) -> list[str]:
    """Print p50/p90/p99 per phase; return the verdict of each target per direction."""
    print(f"{'phase':>16} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, values in samples.items():
        p50, p90, p99 = (percentile(values, pct) * 1e3 for pct in (50, 90, 99))
        print(f"{name:>16} {p50:8.1f} {p90:8.1f} {p99:8.1f} {max(values) * 1e3:8.1f}")
    verdicts: list[str] = []
    for direction in ("store", "load"):
        ours, theirs = samples[f"tier {direction}"], samples[f"redis-py {direction}"]
        p50, p99, their_p50, their_p99 = (percentile(v, q) for v, q in ((ours, 50), (ours, 99), (theirs, 50), (theirs, 99)))
        tail = p99 <= 1.5 * p50 or p99 <= their_p99
        median = p50 <= 1.25 * their_p50
        verdicts.append(
            f"{direction}: p99/p50 {p99 / p50:.2f} (p99 {p99 / their_p99:.2f}x redis-py's): {'met' if tail else 'NOT met'}; "
            f"p50 {p50 / their_p50:.2f}x redis-py's: {'met' if median else 'NOT met'}"
        )
    return verdicts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a Redis server to use (default: start a throw-away redis-server)")
    parser.add_argument("--total", type=parse_size, default=parse_size("128M"), help="bytes per block size (default 128M)")
    parser.add_argument(
        "--block-sizes",
        type=lambda text: [parse_size(part) for part in text.split(",")],
        default=[parse_size(s) for s in ("64K", "1M")],
        help="comma-separated block sizes (default 64K,1M)",
    )
    parser.add_argument("--job-blocks", type=int, default=16, help="blocks per job / per redis-py pipeline")
    parser.add_argument("--connections", type=int, default=4, help="the tier's second configuration")
    parser.add_argument("--repeats", type=int, default=3, help="best of N runs per figure")
    parser.add_argument(
        "--latency", type=int, metavar="JOBS", default=0,
        help="instead: per-job latency of JOBS jobs at 1 MiB, one job at a time (p50/p90/p99 vs redis-py)",
    )  # fmt: skip
    args = parser.parse_args(argv)

    server: LocalRedisServer | None = None
    url = args.url
    if url is None:
        if redis_server_path() is None:
            print("No Redis server available: pass --url, or install redis-server. Nothing measured.")
            return 0
        server = LocalRedisServer().start()
        url = server.url
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, server {url}")
    connections = sorted({1, args.connections})
    if args.latency:
        try:
            print(f"\nlatency: {args.latency} jobs of {args.job_blocks} x 1 MiB, one at a time, tier with {args.connections} connections")
            samples = bench_latency(url, 1 << 20, args.job_blocks, args.latency, args.connections)
            for verdict in report_latency(samples):
                print(verdict)
        finally:
            if server is not None:
                server.stop()
        return 0
    try:
        at_1m: dict[str, float] | None = None
        for block_bytes in args.block_sizes:
            figures = bench_block_size(url, block_bytes, args.total, args.job_blocks, connections, args.repeats)
            print(f"\nblock {human(block_bytes)}, {human(args.total)} per phase, {args.job_blocks} blocks per job (GB/s):")
            for direction in ("store", "load"):
                base = figures[f"redis-py {direction}"]
                print(f"  redis-py pipeline {direction:5}  {base:6.2f}")
                for n in connections:
                    tier = figures[f"tier {direction} ({n})"]
                    print(f"  tier {direction:5} ({n} conn)      {tier:6.2f}   {tier / base:5.2f}x")
            if block_bytes == 1 << 20:
                at_1m = figures
        if at_1m is not None:
            ratios = [at_1m[f"tier {d} (1)"] / at_1m[f"redis-py {d}"] for d in ("store", "load")]
            verdict = "met" if min(ratios) >= 0.8 else "NOT met"
            print(
                f"\ntarget >= 0.8x of a redis-py pipeline at 1 MiB (one connection each): {verdict} "
                f"(store {ratios[0]:.2f}x, load {ratios[1]:.2f}x)"
            )
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
