"""Benchmark the filesystem tier on the disk, its page-cache footprint, and the tiering manager's
cost on the scheduler thread.

    .venv/bin/python tools/bench_tiering.py --dir /work            # every part
    .venv/bin/python tools/bench_tiering.py --dir /work --skip-scheduler --skip-residency

Part 1, throughput on the device: for each block size, `FileSystemSecondaryTier` (its defaults:
O_DIRECT where the root takes it, threads by block size) stores `--total` bytes from a page-aligned
shared-memory primary into a fresh root, then loads them back cold: before every load phase the
page cache is dropped (`_disk_bench.drop_page_cache`: `1` to `/proc/sys/vm/drop_caches` as root,
else `posix_fadvise(DONTNEED)` on every file, after a sync; the run prints which;
`--cold drop_caches_all` drops dentries and inodes too, as after a reboot). Loads are checked
against the stored bytes. Baseline, measured in the same rounds: the device's own O_DIRECT
bandwidth, plain large files written then read in 1 MiB aligned requests by one thread (as `dd`)
and by `--streams` threads, one file each, from buffers on huge pages where the kernel grants
them (`_disk_bench`; the run's header says). `--fallback` adds the tier with O_DIRECT refused
(buffered I/O whose pages are dropped), as on a filesystem without it. Each round runs every
contender once, in a rotated order; ratios are medians of the per-round ratios, against the
faster device run of the round. Target: >= 0.8x of the device, store and load.
`--plain` adds the tier's own pattern without the tier, in the same rounds: a C program
(`_plain_block_files.c`) writing and reading one O_DIRECT file per block from huge-page staging
on the tier's thread counts, once as it is and once with the tier's per-block CPU work (an
XXH3 checksum and a copy between the row and the staging buffer) on the I/O thread.

Part 1b, page cache: an engine stores `--residency-total` bytes; once its jobs finish, the share
of those bytes still in the page cache (`fincore`, else `mincore`) must be at most 10%, with
O_DIRECT and with the buffered fallback (forced by refusing the O_DIRECT probe); the same after
a load. `page_cache=True`, which keeps the pages on purpose, is shown for contrast.

Part 1c, loads behind stores: with 1 MiB blocks, a job loading `--behind-load` bytes (cold) is
submitted right behind jobs storing `--behind-store` bytes, as a promotion arrives during a
burst of offloads; the time until the load job finishes, against the same load alone in the
same round (ratio: how much the burst delays it). With O_DIRECT stores run on the write threads
only (`kvref.tiering.fs.pool.default_threads`); `--behind-write-threads` sets how many, which
trades store bandwidth for this delay.

Part 2, scheduler-thread cost: drive a `TieringOffloadingManager` (CPU primary + fs tier) with
steps of prepare_store/complete_store (which submits cascades), lookups of evicted blocks (which
stage promotions) and end_step (which submits them), while the tier's I/O threads are busy, and
report p50/p99/max wall time per call. Baseline: the same calls on a plain
`CPUOffloadingManager` (no tiers, no I/O). "Never blocked on I/O" means the max stays far below
the time of one block's I/O.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Generator, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import xxhash

import kvref.tiering.fs.tier as fs_tier_module
from kvref.base import OffloadingManager, ReqContext, ScheduleEndContext
from kvref.cpu.manager import CPUOffloadingManager
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.fs.format import file_bytes
from kvref.tiering.fs.root import BLOCK_SUFFIX
from kvref.tiering.manager import CPUPrimaryTierOffloadingManager, TieringOffloadingManager

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _disk_bench import (  # noqa: E402
    COLD_CHOICES,
    COLD_METHODS,
    DirectFileBaseline,
    PlainBlockFiles,
    Rounds,
    SpentRoots,
    drop_page_cache,
    files_under,
    huge_pages_line,
    load_average,
    resident_bytes,
    rotated,
)
from _tier_bench import PrimaryRegion, bench_spec, human, key_of, parse_size, transfer_job  # noqa: E402
from bench_redis import main as bench_redis  # noqa: E402  (run by --redis)

__all__ = ["main"]

CTX = ReqContext(req_id="bench")
END_OF_STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
_TIER, _FALLBACK, _ONE, _MANY, _DEVICE = "tier", "tier, buffered fallback", "1 stream", "streams", "device"
_PLAIN, _PLAIN_WORK = "plain block files", "plain block files, checksum + copy"


def fill(rows: memoryview) -> None:
    # Random bytes (so no layer can compress or dedupe), generated once and repeated.
    chunk = os.urandom(min(len(rows), 8 << 20))
    for start in range(0, len(rows), len(chunk)):
        end = min(start + len(chunk), len(rows))
        rows[start:end] = chunk[: end - start]


def refuse_o_direct(root: Path) -> bool:
    return False


@contextlib.contextmanager
def o_direct_refused() -> Generator[None]:
    """Tiers made inside see a root that refuses O_DIRECT (they warn once and go buffered)."""
    probe = fs_tier_module.probe_o_direct
    fs_tier_module.probe_o_direct = refuse_o_direct
    tier_logger = logging.getLogger(fs_tier_module.__name__)
    was_disabled, tier_logger.disabled = tier_logger.disabled, True  # the warning is expected
    try:
        yield
    finally:
        fs_tier_module.probe_o_direct = probe
        tier_logger.disabled = was_disabled


def make_tier(
    view: memoryview, root: Path, *, fallback: bool = False, page_cache: bool = False, write_threads: int | None = None
) -> FileSystemSecondaryTier:
    with o_direct_refused() if fallback else contextlib.nullcontext():
        spec = bench_spec(view.strides[0] if view.strides else 0)
        return FileSystemSecondaryTier(
            spec, view, "fs", root_dir=root, page_cache=page_cache, n_write_threads=write_threads
        )


def run_jobs(tier: FileSystemSecondaryTier, num_blocks: int, job_blocks: int, promotion: bool, first_key: int = 0) -> float:
    """Submit jobs storing (or loading) blocks `first_key...` from (into) rows 0...; the seconds
    until the tier drained them, all reported successful."""
    start = time.perf_counter()
    jobs = 0
    for first in range(0, num_blocks, job_blocks):
        ids = list(range(first, min(first + job_blocks, num_blocks)))
        job = transfer_job([key_of(first_key + i) for i in ids], ids, promotion)
        (tier.submit_load if promotion else tier.submit_store)(job)
        jobs += 1
    tier.drain_jobs()
    elapsed = time.perf_counter() - start
    results = list(tier.get_finished_jobs())
    assert len(results) == jobs and all(r.success for r in results), "a job failed"
    return elapsed


def bench_throughput(args: argparse.Namespace, work_dir: Path) -> list[str]:
    """Interleaved rounds of the tier and the device per block size; returns the verdicts."""
    names = [_TIER, _ONE, _MANY, *([_FALLBACK] if args.fallback else []), *([_PLAIN, _PLAIN_WORK] if args.plain else [])]
    methods: set[str] = set()
    verdicts: list[str] = []
    tiers = 1 + args.fallback + 2 * args.plain  # contenders that keep a root per round
    spent = SpentRoots(
        work_dir,
        sum(
            args.repeats * tiers * max(args.job_blocks, args.total // size) * file_bytes(32, size)
            for size in args.block_sizes
        ),
    )
    print(spent.line)
    for block_bytes in args.block_sizes:
        num_blocks = max(args.job_blocks, args.total // block_bytes)
        moved = num_blocks * block_bytes
        baselines = {_ONE: DirectFileBaseline(work_dir, moved, 1), _MANY: DirectFileBaseline(work_dir, moved, args.streams)}
        plain = {
            name: PlainBlockFiles.like_the_tier(work_dir, num_blocks, block_bytes, work=name == _PLAIN_WORK)
            for name in names
            if name in (_PLAIN, _PLAIN_WORK)
        }
        rounds = Rounds()
        with PrimaryRegion(num_blocks, block_bytes) as region:
            view = region.create_kv_memoryview()
            rows = view.cast("B")
            fill(rows)
            expected = xxhash.xxh3_64_intdigest(rows)
            for round_index in range(args.repeats):
                for name in rotated(names, round_index):
                    os.sync()  # the previous contender's write-back is not this one's
                    baseline = baselines.get(name)
                    if baseline is not None:
                        rounds.add(name, "store", baseline.write())
                        methods.add(drop_page_cache(baseline.paths, args.cold))
                        rounds.add(name, "load", baseline.read())
                        baseline.remove()
                        continue
                    if name in plain:
                        root = work_dir / f"plain-{int(plain[name].work)}-{block_bytes}-{round_index}"
                        methods.add(plain[name].run_round(rounds, name, root, args.cold, spent))
                        continue
                    root = work_dir / f"{'fallback' if name == _FALLBACK else 'tier'}-{block_bytes}-{round_index}"
                    tier = make_tier(view, root, fallback=name == _FALLBACK)
                    try:
                        rounds.add(name, "store", run_jobs(tier, num_blocks, args.job_blocks, False))
                        methods.add(drop_page_cache([root], args.cold))
                        rows[:] = bytes(len(rows))
                        rounds.add(name, "load", run_jobs(tier, num_blocks, args.job_blocks, True))
                        assert xxhash.xxh3_64_intdigest(rows) == expected, "the tier loaded other bytes"
                    finally:
                        tier.shutdown()
                        spent.done(root)
            rows.release()
            view.release()
        moved_by = {_TIER: moved, _FALLBACK: moved, _DEVICE: moved, _PLAIN: moved, _PLAIN_WORK: moved, **{n: b.total for n, b in baselines.items()}}
        for phase in ("store", "load"):
            rounds.combine_fastest(_DEVICE, [_ONE, _MANY], phase, moved_by)
        print(
            f"\n== {human(block_bytes)} blocks, {human(moved)} per phase, {args.repeats} rounds "
            f"interleaved, jobs of {args.job_blocks} blocks, {load_average()} =="
        )
        print(f"  {'':36} {'store GB/s':>17}   {'cold load GB/s':>17}   ratio to the device, median [range]")
        print(f"  {'':36} {'best':>8} {'median':>8}   {'best':>8} {'median':>8}")
        labels = {
            _ONE: "O_DIRECT file, 1 MiB x 1 stream",
            _MANY: f"O_DIRECT files, 1 MiB x {args.streams} streams",
            _TIER: "FileSystemSecondaryTier (defaults)",
            _FALLBACK: "the tier, buffered fallback",
            **{name: runner.label for name, runner in plain.items()},
        }
        medians: dict[str, list[float]] = {}
        for name in [_ONE, _MANY, *names[:1], *names[3:]]:
            cells = [
                f"{rounds.best_gbps(name, phase, moved_by[name]):8.2f} {rounds.median_gbps(name, phase, moved_by[name]):8.2f}"
                for phase in ("store", "load")
            ]
            line = f"  {labels[name]:36} {cells[0]}   {cells[1]}"
            if name in (_TIER, _FALLBACK, _PLAIN, _PLAIN_WORK):
                ratios = [rounds.ratios(name, _DEVICE, phase, moved, moved) for phase in ("store", "load")]
                medians[name] = [statistics.median(r) for r in ratios]
                line += "   " + ", ".join(
                    f"{phase} {m:.2f}x [{min(r):.2f}, {max(r):.2f}]" for phase, m, r in zip(("store", "load"), medians[name], ratios)
                )
            print(line, flush=True)
        met = "met" if min(medians[_TIER]) >= 0.8 else "NOT met"
        verdicts.append(
            f"{human(block_bytes)}: the tier >= 0.8x of the device (the faster of 1 and {args.streams} "
            f"streams each round), store and load: {met}"
        )
    verdicts.extend(f"cold loads: {COLD_METHODS[method]}" for method in sorted(methods))
    return verdicts


def block_files(root: Path) -> list[str]:
    return [path for path in files_under([root]) if path.endswith(BLOCK_SUFFIX)]


def bench_residency(args: argparse.Namespace, work_dir: Path) -> list[str]:
    """The share of an engine's stored (then loaded) bytes left in the page cache."""
    block_bytes = 1 << 20
    num_blocks = max(1, args.residency_total // block_bytes)
    stored = num_blocks * block_bytes
    print(f"\n== page cache after an engine stores {human(stored)} ({human(block_bytes)} blocks) and its jobs finish ==")
    verdicts: list[str] = []
    with PrimaryRegion(num_blocks, block_bytes) as region:
        view = region.create_kv_memoryview()
        fill(view.cast("B"))
        for label, fallback, page_cache in (
            ("O_DIRECT", False, False),
            ("buffered fallback (O_DIRECT refused)", True, False),
            ("page_cache=True (keeps pages, for contrast)", False, True),
        ):
            root = work_dir / "residency"
            drop_page_cache([work_dir], args.cold)
            tier = make_tier(view, root, fallback=fallback, page_cache=page_cache)
            try:
                run_jobs(tier, num_blocks, 16, False)
                after_store, counter = resident_bytes(block_files(root))
                run_jobs(tier, num_blocks, 16, True)
                after_load, _ = resident_bytes(block_files(root))
                direct = tier.direct
            finally:
                tier.shutdown()
                shutil.rmtree(root, ignore_errors=True)
            shares = (after_store / stored, after_load / stored)
            print(
                f"  {label:44} (direct={direct}) resident after the store: {human(after_store):>9} "
                f"({shares[0]:6.1%}), after a load: {human(after_load):>9} ({shares[1]:6.1%})  [{counter}]"
            )
            if not page_cache:
                met = "met" if max(shares) <= 0.10 else "NOT met"
                verdicts.append(f"page cache <= 10% of the stored bytes, {label}: {met}")
        view.release()
    return verdicts


def bench_checksums() -> None:
    data = os.urandom(1 << 20) * 64
    speeds: list[str] = []
    for name, checksum in (("XXH3-64", xxhash.xxh3_64_intdigest), ("CRC-32 (zlib)", zlib.crc32)):
        best = min(_time_once(lambda: checksum(data)) for _ in range(3))
        speeds.append(f"{name} {len(data) / best / 1e9:.1f} GB/s")
    print(f"checksum speed, one core, 64 MiB: {', '.join(speeds)}")


def _time_once(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def timed(samples: dict[str, list[float]], name: str, call: Callable[[], object]) -> object:
    start = time.perf_counter_ns()
    result = call()
    samples.setdefault(name, []).append((time.perf_counter_ns() - start) / 1e3)
    return result


def drive(manager: OffloadingManager, steps: int, keys_per_step: int, lookups: int) -> dict[str, list[float]]:
    """Steps of: store new blocks (cascade), look up old ones (promotion), end the step."""
    samples: dict[str, list[float]] = {}
    next_key = 0
    manager.on_new_request(CTX)
    for step in range(steps):
        keys = [key_of(i) for i in range(next_key, next_key + keys_per_step)]
        next_key += keys_per_step
        output = timed(samples, "prepare_store", lambda: manager.prepare_store(keys, CTX))
        if output is not None:
            timed(samples, "complete_store", lambda: manager.complete_store(keys, CTX))
        for j in range(lookups):
            old = key_of((step * 7919 + j * 104729) % max(1, next_key))
            timed(samples, "lookup", lambda: manager.lookup(old, CTX))
        if isinstance(manager, TieringOffloadingManager):
            timed(samples, "end_step", lambda: manager.on_schedule_end(END_OF_STEP))
    return samples


def bench_scheduler(args: argparse.Namespace, work_dir: Path) -> None:
    block_bytes = args.sched_block
    num_blocks = max(64, (256 << 20) // block_bytes)  # a 256 MiB primary
    print(
        f"\n== scheduler-thread cost per call (us): {args.steps} steps x ({args.keys_per_step} "
        f"stores + {args.lookups} lookups), {human(block_bytes)} blocks, primary of {num_blocks} "
        f"blocks, fs tier I/O in flight =="
    )
    baseline = drive(CPUOffloadingManager(num_blocks), args.steps, args.keys_per_step, args.lookups)
    primary = CPUPrimaryTierOffloadingManager(num_blocks, PrimaryRegion(num_blocks, block_bytes))
    tier = FileSystemSecondaryTier(bench_spec(block_bytes), primary.get_kv_memoryview(), "fs", root_dir=work_dir / "sched-tier")
    manager = TieringOffloadingManager(primary, [tier], tier_poll_interval_s=0)
    io_start = time.perf_counter()
    tiering = drive(manager, args.steps, args.keys_per_step, args.lookups)
    drive_s = time.perf_counter() - io_start
    inflight_at_end = manager.has_pending_work()
    tier.drain_jobs()
    io_s = time.perf_counter() - io_start
    manager.shutdown()
    print(
        f"(driving took {drive_s * 1e3:.0f} ms, the tier's I/O {io_s * 1e3:.0f} ms; "
        f"jobs {'still' if inflight_at_end else 'no longer'} in flight when driving ended)"
    )
    print(f"{'call':>15} | {'cpu p50':>8} {'p99':>8} {'max':>8} | {'tiering p50':>11} {'p99':>8} {'max':>8} | p99 ratio")
    for name in ("prepare_store", "complete_store", "lookup", "end_step"):
        ours = tiering.get(name, [])
        if not ours:
            continue
        base = baseline.get(name, [])
        base_cols = (
            f"{statistics.median(base):8.1f} {percentile(base, 99):8.1f} {max(base):8.1f}"
            if base
            else f"{'-':>8} {'-':>8} {'-':>8}"
        )
        ratio = f"{percentile(ours, 99) / percentile(base, 99):8.1f}x" if base else "        -"
        print(
            f"{name:>15} | {base_cols} | {statistics.median(ours):11.1f} "
            f"{percentile(ours, 99):8.1f} {max(ours):8.1f} | {ratio}"
        )
    one_block_us = block_bytes / 2e9 * 1e6
    print(f"(for scale: one {human(block_bytes)} block at 2 GB/s takes {one_block_us:.0f} us of I/O)")


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def bench_loads_behind_stores(args: argparse.Namespace, work_dir: Path) -> None:
    """Loads submitted right behind a burst of stores, against the same loads alone."""
    block_bytes = 1 << 20
    loads = max(1, args.behind_load // block_bytes)
    stores = max(1, args.behind_store // block_bytes)
    print(
        f"\n== a {human(loads * block_bytes)} load (cold) behind {human(stores * block_bytes)} of stores, "
        f"{human(block_bytes)} blocks, {args.repeats} rounds, {load_average()} =="
    )
    alone: list[float] = []
    behind: list[float] = []
    store_gbps: list[float] = []
    root = work_dir / "behind"
    with PrimaryRegion(loads + stores, block_bytes) as region:
        view = region.create_kv_memoryview()
        fill(view.cast("B"))
        tier = make_tier(view, root, write_threads=args.behind_write_threads)
        print(f"  {tier.n_read_threads} read + {tier.n_write_threads} write threads, direct={tier.direct}")
        try:
            run_jobs(tier, loads, args.job_blocks, False, first_key=1 << 40)  # the blocks to load
            for round_index in range(args.repeats):
                drop_page_cache([root], args.cold)
                alone.append(run_jobs(tier, loads, args.job_blocks, True, first_key=1 << 40))
                drop_page_cache([root], args.cold)
                start = time.perf_counter()
                pending: set[int] = set()
                for first in range(0, stores, args.job_blocks):
                    ids = list(range(loads + first, loads + min(first + args.job_blocks, stores)))
                    keys = [key_of((round_index + 1) * stores + i - loads) for i in ids]
                    store = transfer_job(keys, ids, False)
                    pending.add(store.job_id)
                    tier.submit_store(store)
                load = transfer_job([key_of((1 << 40) + i) for i in range(loads)], list(range(loads)), True)
                pending.add(load.job_id)
                tier.submit_load(load)
                while pending:
                    for result in tier.get_finished_jobs():
                        assert result.success, f"job {result.job_id} failed"
                        pending.discard(result.job_id)
                        if result.job_id == load.job_id:
                            behind.append(time.perf_counter() - start)
                    if pending:
                        time.sleep(0.0002)
                store_gbps.append(stores * block_bytes / (time.perf_counter() - start) / 1e9)
        finally:
            tier.shutdown()
            view.release()
    ratios = [b / a for a, b in zip(alone, behind)]
    print(f"  load alone:          median {statistics.median(alone) * 1e3:7.1f} ms")
    print(f"  load behind stores:  median {statistics.median(behind) * 1e3:7.1f} ms (the stores: {statistics.median(store_gbps):.2f} GB/s)")
    print(f"  behind / alone: {statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="where block files go (default: a temp dir under /tmp)")
    parser.add_argument("--total", type=parse_size, default=parse_size("1G"), help="bytes per phase and block size (default 1G)")
    parser.add_argument(
        "--block-sizes",
        type=lambda text: [parse_size(part) for part in text.split(",")],
        default=[parse_size(s) for s in ("2M", "1M", "256K")],
        help="comma-separated block sizes (default 2M,1M,256K)",
    )
    parser.add_argument("--streams", type=int, default=8, help="the many-stream O_DIRECT baseline's streams (default 8)")
    parser.add_argument("--fallback", action="store_true", help="also measure the tier with O_DIRECT refused (buffered)")
    parser.add_argument("--plain", action="store_true", help="also run the tier's file pattern in plain C (_plain_block_files.c, built with cc), without and with its checksum and copy")
    parser.add_argument("--cold", choices=COLD_CHOICES, default="auto", help="how loads are made cold: drop_caches (the page cache), drop_caches_all (dentries and inodes too), fadvise (default: drop_caches as root, else fadvise)")
    parser.add_argument("--job-blocks", type=int, default=16, help="blocks per submitted job")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds per block size (default 5)")
    parser.add_argument("--residency-total", type=parse_size, default=parse_size("256M"), help="bytes stored for the page-cache part (default 256M)")
    parser.add_argument("--behind-load", type=parse_size, default=parse_size("256M"), help="loads-behind-stores part: bytes loaded (default 256M)")
    parser.add_argument("--behind-store", type=parse_size, default=parse_size("1G"), help="loads-behind-stores part: bytes stored ahead of them (default 1G)")
    parser.add_argument("--steps", type=int, default=300, help="scheduler benchmark steps")
    parser.add_argument("--keys-per-step", type=int, default=8)
    parser.add_argument("--lookups", type=int, default=32, help="lookups per step")
    parser.add_argument("--sched-block", type=parse_size, default=parse_size("1M"), help="block size of the scheduler benchmark")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-residency", action="store_true")
    parser.add_argument("--behind-write-threads", type=int, default=None, help="loads-behind-stores part: the tier's write threads (default: its default)")
    parser.add_argument("--skip-behind", action="store_true", help="skip the loads-behind-stores part")
    parser.add_argument("--skip-scheduler", action="store_true")
    parser.add_argument("--redis", action="store_true", help="also run tools/bench_redis.py: the Redis tier vs a redis-py pipeline")
    args = parser.parse_args(argv)

    work_dir = Path(tempfile.mkdtemp(prefix="kvref-bench-", dir=args.dir))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, files under {work_dir}, {load_average()}")
    print(huge_pages_line())
    verdicts: list[str] = []
    try:
        if not args.skip_throughput:
            bench_checksums()
            verdicts += bench_throughput(args, work_dir)
        if not args.skip_residency:
            verdicts += bench_residency(args, work_dir)
        if not args.skip_behind:
            bench_loads_behind_stores(args, work_dir)
        if verdicts:
            print()
            print("\n".join(verdicts))
        if not args.skip_scheduler:
            bench_scheduler(args, work_dir)
        if args.redis:
            bench_redis(["--repeats", str(args.repeats)])
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
