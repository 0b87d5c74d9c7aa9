"""Benchmark the filesystem tier on a shared volume mounted twice (two hosts): how soon a block
stored through one mount is a HIT through the other, and store/load throughput through one mount.

    .venv/bin/python tools/bench_shared_fs.py                       # a fresh JuiceFS volume
    .venv/bin/python tools/bench_shared_fs.py --mount-option=--negative-entry-cache=1
    .venv/bin/python tools/bench_shared_fs.py --mounts /mnt/a/kv /mnt/b/kv --local-dir /work/tmp

Without `--mounts`, a fresh JuiceFS volume (SQLite metadata, a local directory as object store,
`tests/tiering/juicefs.py`) is formatted under `--local-dir` and mounted twice with JuiceFS's
default caches, or with the `--mount-option`s given (JuiceFS's `juicefs mount` flags, e.g.
`--writeback`, `--attr-cache=10`); `--mounts` names one directory of an existing volume as two
mounts show it.
`--local-dir` is also where the baselines run: the same tier on the local disk.

Part 1, store to HIT: an engine on mount B asks for a block (a MISS), as an engine asks for a
prefix another host is computing; an engine on mount A stores it; from the moment the job is
reported finished, B polls `lookup` until it answers HIT (every 5 ms); then B loads it (bytes
checked). A mount that caches negative lookups hides the block until that cache expires. `--trials` times; median, p90 and max. Baseline: the same with both engines
on mount A (one host).

Part 2, throughput: one engine on mount A stores `--total` bytes of `--block-bytes` blocks in
jobs of 16 into a fresh root, then a new engine on mount A loads them all (bytes checked). The
tier's defaults otherwise (O_DIRECT where the root takes it, threads by block size). Baseline:
the same on the local disk in the same run; the ratio is shared/local. Loads are not cold: the
page cache is not dropped (with O_DIRECT the tier bypasses it, but a FUSE client such as
JuiceFS keeps its own memory buffer and disk cache, which serve re-reads of recent writes).

Part 3, what a bounded store's listing costs: after part 2, every fan-out directory of its root
is listed as `RootCapacity` lists a domain (`os.scandir`, inode numbers from the listing), five
times; milliseconds per directory, on the volume and on the local disk. A store into a bounded
root lists `256 / domains` directories (`kvref.tiering.fs.capacity`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvref.tiering.fs.root import FANOUT
from tests.tiering.fs_engines import Engine
from tests.tiering.juicefs import juicefs_binary, juicefs_volume

_JOB_BLOCKS = 16


def store_to_hit(writer_root: Path, reader_root: Path, trials: int, block_bytes: int) -> list[float]:
    """Seconds from a store reported finished in one engine to a HIT in another, per trial."""
    writer = Engine(writer_root, block_bytes=block_bytes, num_blocks=4)
    reader = Engine(reader_root, block_bytes=block_bytes, num_blocks=4)
    try:
        latencies: list[float] = []
        for trial in range(trials):
            number = 10_000_000 + trial
            assert reader.lookup([number]) == [False]
            assert writer.store([number])
            latency = reader.wait_hit([number], timeout=30.0)
            assert latency is not None, f"block {number} not a HIT after 30 s"
            outcome = reader.load([number])
            assert outcome.success and outcome.wrong == (), outcome
            latencies.append(latency)
        return latencies
    finally:
        writer.close()
        reader.close()


def throughput(root: Path, total: int, block_bytes: int) -> tuple[float, float]:
    """(store, load) bytes per second of one engine through `root`."""
    numbers = list(range(total // block_bytes))
    jobs = [numbers[i : i + _JOB_BLOCKS] for i in range(0, len(numbers), _JOB_BLOCKS)]
    rates: list[float] = []
    for promotion in (False, True):
        engine = Engine(root, block_bytes=block_bytes, num_blocks=4 * _JOB_BLOCKS, n_read_threads=None, n_write_threads=None)
        try:
            start = time.perf_counter()
            outcomes = engine.run(jobs, promotion=promotion)
            seconds = time.perf_counter() - start
        finally:
            engine.close()
        assert all(o.success and o.wrong == () for o in outcomes), "a job failed or loaded wrong bytes"
        rates.append(len(numbers) * block_bytes / seconds)
    return rates[0], rates[1]


def listing_ms(root: Path, repeats: int = 5) -> float:
    """Milliseconds to list one fan-out directory of `root`, as a capacity listing does."""
    start = time.perf_counter()
    for _ in range(repeats):
        for index in range(FANOUT):
            try:
                with os.scandir(root / f"{index:02x}") as entries:
                    for entry in entries:
                        entry.inode()
            except FileNotFoundError:
                continue
    return (time.perf_counter() - start) * 1000 / (repeats * FANOUT)


def _summary(latencies: Sequence[float]) -> str:
    ordered = sorted(latencies)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(ordered) * 1000:7.1f} ms, p90 {p90 * 1000:7.1f} ms, max {ordered[-1] * 1000:7.1f} ms"


def run(mounts: tuple[Path, Path], local: Path, args: argparse.Namespace) -> None:
    stamp = f"bench-{time.time_ns()}"
    print(f"shared: {mounts[0]} and {mounts[1]}; local baseline: {local}")
    print(f"\n1. store on one mount -> HIT on the other ({args.trials} trials, {args.block_bytes} B blocks)")
    one = store_to_hit(mounts[0] / stamp / "hit", mounts[0] / stamp / "hit", args.trials, args.block_bytes)
    two = store_to_hit(mounts[0] / stamp / "hit2", mounts[1] / stamp / "hit2", args.trials, args.block_bytes)
    print(f"   same mount (baseline):  {_summary(one)}")
    print(f"   other mount:            {_summary(two)}")
    print(f"   ratio other/same (medians): {statistics.median(two) / max(statistics.median(one), 1e-9):.1f}x")
    print(f"\n2. throughput of one engine, {args.total >> 20} MiB of {args.block_bytes >> 10} KiB blocks")
    local_store, local_load = throughput(local / stamp, args.total, args.block_bytes)
    shared_store, shared_load = throughput(mounts[0] / stamp / "rate", args.total, args.block_bytes)
    for name, local_rate, shared_rate in (("store", local_store, shared_store), ("load", local_load, shared_load)):
        print(
            f"   {name}: local disk {local_rate / 1e6:8.1f} MB/s, shared volume {shared_rate / 1e6:8.1f} MB/s,"
            f" ratio {shared_rate / local_rate:.2f}x"
        )
    local_ms, shared_ms = listing_ms(local / stamp), listing_ms(mounts[0] / stamp / "rate")
    files = args.total // args.block_bytes
    print(f"\n3. listing a fan-out directory ({files / FANOUT:.0f} files each), as a bounded store does")
    print(f"   local disk {local_ms:.3f} ms, shared volume {shared_ms:.3f} ms, ratio {shared_ms / local_ms:.0f}x")
    shutil.rmtree(local / stamp, ignore_errors=True)
    shutil.rmtree(mounts[0] / stamp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mounts", type=Path, nargs=2, default=None, help="one directory as two mounts show it")
    parser.add_argument("--local-dir", type=Path, default=Path(tempfile.gettempdir()), help="local disk: baselines, and a fresh volume")
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--block-bytes", type=int, default=256 << 10)
    parser.add_argument("--total", type=int, default=256 << 20, help="bytes stored and loaded in part 2")
    parser.add_argument("--mount-option", action="append", default=[], help="a juicefs mount flag (repeat)")
    args = parser.parse_args(argv)
    if args.mounts is not None:
        run((args.mounts[0], args.mounts[1]), args.local_dir, args)
        return 0
    binary = juicefs_binary()
    if binary is None:
        print("juicefs is not installed (make juicefs), and --mounts was not given", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kvref-shared-fs-", dir=args.local_dir))
    try:
        with juicefs_volume(work, binary, args.mount_option) as volume:
            print(f"a fresh JuiceFS volume ({binary}, mount options {args.mount_option or 'default'}), under {work}")
            run(volume.mounts, args.local_dir, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
