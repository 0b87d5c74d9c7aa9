"""kvref's vLLM tiers against their baselines, through vLLM 0.33's SecondaryTierManager API.

    .venv-vllm/bin/python tools/bench_vllm_tiers.py            # starts a throw-away redis-server
    .venv-vllm/bin/python tools/bench_vllm_tiers.py --skip-redis --fs-blocks 1M --repeats 7

Every tier is built by vLLM's own `SecondaryTierFactory` over a page-aligned primary view of
one block per row, and driven as vLLM's tiering manager drives it: `TransferJob`s of
`--job-blocks` blocks (numpy `chunk_ids`), all submitted at once, timed until `drain_jobs`
returns, then `get_finished_jobs` must report every job successful. Stores use keys no tier
has seen; loads read the stored blocks into other rows and are checked byte for byte.
GB/s = 1e9 B/s.

Disk tiers, per block size in `--fs-blocks` (`--fs-total` bytes per phase), in `--repeats`
interleaved rounds (each round runs every contender once, in a rotated order): a store into a
fresh root, then a cold load, the page cache dropped first (`_disk_bench.drop_page_cache`; the
run prints the method; `--cold drop_caches_all` drops dentries and inodes too, as after a
reboot, where each block file costs an inode read that one large file does not). Contenders:

* vLLM's own `fs` tier with its defaults (16 read + 16 write threads, O_DIRECT);
* kvref's `FileSystemTier` with its defaults (read + write threads by block size with O_DIRECT,
  as the table says; staging on huge pages where the kernel grants them);
* the device's own O_DIRECT bandwidth: plain large files written then read in 1 MiB aligned
  requests by one thread (as `dd`), and by `--streams` threads, one file each, from buffers on
  huge pages where the kernel grants them (`_disk_bench`; the run's header says);
* with `--plain`, kvref's file pattern without any tier: `_disk_bench.PlainBlockFiles`, a C
  program moving the same block files on kvref's thread counts, as it is and with kvref's
  per-block checksum and copy (what a verified block costs, beside what vLLM's unverified
  tier pays).

Ratios are medians of the per-round ratios. Targets: kvref >= 1.0x vLLM's fs tier, and
>= 0.8x the device, whose figure per round is the faster of its one- and many-stream runs
(the device's bandwidth is what its best plain access gets; a tier keeps requests in flight).

Then `--engines` processes, each with its own tier over one root, load at once (each a
distinct share of blocks one engine stored, cold), for kvref's and vLLM's tier in turn.

Redis: `RedisTier` / one redis-py (+ hiredis) client running one pipeline per job over the
same rows (`_tier_bench.RedisPyPipeline`, as `bench_redis.py`); target >= 0.8x.
"""

from __future__ import annotations

import argparse
import itertools
import mmap
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager, TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

from kvref.tiering.fs.format import file_bytes
from kvref.tiering.fs.pool import default_threads
from kvref.tiering.fs.root import probe_o_direct
from kvref.tiering.redis.local import LocalRedisServer, redis_server_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _disk_bench import COLD_CHOICES, COLD_METHODS, DirectFileBaseline, PlainBlockFiles, Rounds, SpentRoots, drop_page_cache, huge_pages_line, load_average, process_cpu_s, rotated  # noqa: E402
from _tier_bench import RedisPyPipeline, human, key_of, parse_size  # noqa: E402
from _vllm_spec import mock_offloading_spec  # noqa: E402

__all__ = ["Primary", "main", "run_jobs"]

_CTX = ReqContext(req_id="bench")
_MODULE = "kvref.integrations.vllm"
_VLLM, _KVREF = "vLLM fs", "kvref FileSystemTier"
_ONE, _MANY, _DEVICE = "O_DIRECT 1 stream", "O_DIRECT streams", "device"
_PLAIN, _PLAIN_WORK = "plain C block files", "plain C + checksum, copy"


class Primary:
    """Page-aligned rows of `block_bytes`: `sources` rows of random bytes, then `count` targets."""

    def __init__(self, count: int, block_bytes: int, *, sources: bool = True) -> None:
        self.count = count
        self.first_target = count if sources else 0
        rows = self.first_target + count
        self._mmap = mmap.mmap(-1, rows * block_bytes)  # anonymous: page-aligned, as vLLM's
        self.array = np.frombuffer(self._mmap, dtype=np.uint8).reshape(rows, block_bytes)
        if sources:
            self.array[:count] = np.random.default_rng(0).integers(0, 256, self.array[:count].shape, dtype=np.uint8)
        self.view = self.array.data

    def rows(self, first: int) -> list[memoryview]:
        return [self.array[i].data for i in range(first, first + self.count)]

    def digests(self) -> list[int]:
        return [xxhash.xxh3_64_intdigest(self.array[i].data) for i in range(self.count)]

    def targets_hold(self, digests: Sequence[int]) -> bool:
        first = self.first_target
        return all(xxhash.xxh3_64_intdigest(self.array[first + i].data) == d for i, d in enumerate(digests))

    def loaded_right(self) -> bool:
        return bool((self.array[self.count :] == self.array[: self.count]).all())

    def clear_targets(self) -> None:
        self.array[self.first_target :] = 0


def build(config: dict[str, Any], primary: Primary) -> SecondaryTierManager:
    return SecondaryTierFactory.create_secondary_tier(config, primary.view, mock_offloading_spec(model="bench/model", engine_id="bench"))  # pyright: ignore[reportUnknownMemberType]


def run_jobs(
    tier: SecondaryTierManager, keys: Sequence[OffloadKey], first_row: int, job_blocks: int, promotion: bool
) -> tuple[float, float]:
    """Submit jobs moving `keys` to or from rows `first_row`...; (start, end) on the monotonic
    clock, which every process of the host shares."""
    jobs = [
        TransferJob(
            job_id=job_id,
            keys=list(keys[start : start + job_blocks]),
            chunk_ids=np.arange(first_row + start, first_row + min(start + job_blocks, len(keys)), dtype=np.int64),
            is_promotion=promotion,
            req_context=_CTX,
        )
        for job_id, start in enumerate(range(0, len(keys), job_blocks))
    ]
    started = time.monotonic()
    for job in jobs:
        (tier.submit_load if promotion else tier.submit_store)(job)
    tier.drain_jobs()
    ended = time.monotonic()
    results = list(tier.get_finished_jobs())
    assert len(results) == len(jobs) and all(r.success for r in results), "a job failed"
    return started, ended


def round_keys(round_index: int, count: int, first: int = 0) -> list[OffloadKey]:
    return [OffloadKey(key_of(round_index * count + first + i)) for i in range(count)]


def fs_config(name: str, root: Path) -> dict[str, Any]:
    if name == _VLLM:
        return {"type": "fs", "root_dir": str(root)}
    return {"type": "FileSystemTier", "module_path": _MODULE, "root_dir": str(root)}


# --- one engine: store, then load cold ---


def bench_fs(args: argparse.Namespace, work: Path, block_bytes: int, spent: SpentRoots) -> tuple[list[str], str]:
    """Interleaved rounds of every contender at one block size; the table's lines and verdicts."""
    count = max(args.job_blocks, args.fs_total // block_bytes)
    moved = count * block_bytes
    primary = Primary(count, block_bytes)
    one = DirectFileBaseline(work, moved, 1)
    many = DirectFileBaseline(work, moved, args.streams)
    rounds = Rounds()
    methods: set[str] = set()
    plain = {
        name: PlainBlockFiles.like_the_tier(work, count, block_bytes, work=name == _PLAIN_WORK)
        for name in ([_PLAIN, _PLAIN_WORK] if args.plain else [])
    }
    for round_index in range(args.repeats):
        for name in rotated([_VLLM, _KVREF, _ONE, _MANY, *plain], round_index):
            os.sync()  # the previous contender's write-back is not this one's
            if name in plain:
                root = work / f"plain-{int(plain[name].work)}-{block_bytes}-{round_index}"
                methods.add(plain[name].run_round(rounds, name, root, args.cold, spent))
                continue
            if name in (_ONE, _MANY):
                baseline = one if name == _ONE else many
                rounds.add(name, "store", baseline.write())
                methods.add(drop_page_cache(baseline.paths, args.cold))
                rounds.add(name, "load", baseline.read())
                baseline.remove()
                continue
            root = work / f"{name.split()[0]}-{block_bytes}-{round_index}"
            tier = build(fs_config(name, root), primary)
            keys = round_keys(round_index, count)
            try:
                cpu = process_cpu_s()
                start, end = run_jobs(tier, keys, 0, args.job_blocks, False)
                rounds.add(name, "store", end - start)
                rounds.add(name, "store CPU", process_cpu_s() - cpu)
                methods.add(drop_page_cache([root], args.cold))
                primary.clear_targets()
                cpu = process_cpu_s()
                start, end = run_jobs(tier, keys, count, args.job_blocks, True)
                rounds.add(name, "load", end - start)
                rounds.add(name, "load CPU", process_cpu_s() - cpu)
                assert primary.loaded_right(), f"{name} loaded other bytes"
            finally:
                tier.shutdown()
                spent.done(root)
    moved_by = {_VLLM: moved, _KVREF: moved, _ONE: one.total, _MANY: many.total, _DEVICE: moved, _PLAIN: moved, _PLAIN_WORK: moved}
    for phase in ("store", "load"):
        rounds.combine_fastest(_DEVICE, [_ONE, _MANY], phase, moved_by)
    lines = [
        (
            f"\n== disk tiers, {human(block_bytes)} blocks, {human(moved)} per phase, {args.repeats} "
            f"rounds interleaved, {load_average()} =="
        ),
        f"  {'':38} {'store GB/s':>17}   {'cold load GB/s':>17}",
        f"  {'':38} {'best':>8} {'median':>8}   {'best':>8} {'median':>8}",
    ]
    labels = {
        _ONE: "O_DIRECT file, 1 MiB x 1 stream",
        _MANY: f"O_DIRECT files, 1 MiB x {args.streams} streams",
        _VLLM: "vLLM fs (16+16 threads, O_DIRECT)",
        _KVREF: (
            f"kvref FileSystemTier ({default_threads(read=True, direct=True, file_bytes=file_bytes(32, block_bytes))}+"
            f"{default_threads(read=False, direct=True, file_bytes=file_bytes(32, block_bytes))}, O_DIRECT)"
        ),
        **{name: runner.label for name, runner in plain.items()},
    }
    for name in (_ONE, _MANY, _VLLM, _KVREF, *plain):
        cells = [
            f"{rounds.best_gbps(name, phase, moved_by[name]):8.2f} {rounds.median_gbps(name, phase, moved_by[name]):8.2f}"
            for phase in ("store", "load")
        ]
        if rounds.has(name, "store CPU"):
            cells.append(
                "CPU s/GiB: store {:.2f}, load {:.2f}".format(
                    *(statistics.median(rounds.seconds(name, f"{phase} CPU")) * (1 << 30) / moved for phase in ("store", "load"))
                )
            )
        lines.append(f"  {labels[name]:38} {'   '.join(cells)}")
    lines.append("  ratios, median of the per-round ratios [lowest, highest]:")
    verdicts: list[str] = []
    plain_ratios = [(_PLAIN, _DEVICE, None), (_PLAIN_WORK, _DEVICE, None), (_PLAIN_WORK, _VLLM, None)] if plain else []
    for name, base, target in ((_KVREF, _VLLM, 1.0), (_KVREF, _DEVICE, 0.8), (_VLLM, _DEVICE, None), *plain_ratios):
        cells: list[str] = []
        medians: list[float] = []
        for phase in ("store", "load"):
            ratios = rounds.ratios(name, base, phase, moved_by[base], moved_by[name])
            medians.append(statistics.median(ratios))
            cells.append(f"{phase} {medians[-1]:5.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]")
        base_label = "the device (faster of 1 and many streams)" if base == _DEVICE else base
        lines.append(f"    {name} / {base_label}: {'   '.join(cells)}")
        if target is not None:
            met = "met" if min(medians) >= target else "NOT met"
            verdicts.append(f"{human(block_bytes)}: {name} >= {target}x of {base_label}, store and load: {met}")
    return lines + [f"  {verdict}" for verdict in verdicts], ", ".join(sorted(methods))


# --- many engines on one root ---


def _engine(conn: Connection, config: dict[str, Any], count: int, block_bytes: int, job_blocks: int) -> None:
    """One engine process: a tier over the shared root; loads the blocks it is sent, cold."""
    primary = Primary(count, block_bytes, sources=False)
    tier = build(config, primary)
    conn.send("ready")
    try:
        while (order := conn.recv()) is not None:
            round_index, total_count, first, digests = order
            primary.clear_targets()
            start, end = run_jobs(tier, round_keys(round_index, total_count, first)[:count], 0, job_blocks, True)
            conn.send((start, end, primary.targets_hold(digests)))
    finally:
        tier.shutdown()


def bench_engines(args: argparse.Namespace, work: Path) -> list[str]:
    """`--engines` processes per tier load at once from one root (distinct shares, cold)."""
    engines, block_bytes = args.engines, args.engines_block
    share = max(args.job_blocks, args.fs_total // block_bytes // engines)
    count = share * engines
    primary = Primary(count, block_bytes)
    digests = primary.digests()
    # Forked before any tier (and its threads) exists here: the engines start at once, with
    # vLLM already imported.
    context = multiprocessing.get_context("fork")
    groups: dict[str, tuple[Path, SecondaryTierManager | None, list[tuple[Any, Connection]]]] = {}
    rounds = Rounds()
    try:
        for name in (_VLLM, _KVREF):
            root = work / f"engines-{name.split()[0]}"
            children: list[tuple[Any, Connection]] = []
            for _ in range(engines):
                parent_end, child_end = context.Pipe()
                process = context.Process(
                    target=_engine, args=(child_end, fs_config(name, root), share, block_bytes, args.job_blocks)
                )
                process.start()
                child_end.close()  # so a child that dies is an EOFError here, not a hang
                children.append((process, parent_end))
            groups[name] = (root, None, children)
        for name, (root, _none, children) in groups.items():
            groups[name] = (root, build(fs_config(name, root), primary), children)
        for _process, conn in (child for group in groups.values() for child in group[2]):
            assert conn.recv() == "ready"
        for round_index in range(args.engine_repeats):
            for name in rotated([_VLLM, _KVREF], round_index):
                root, tier, children = groups[name]
                assert tier is not None
                os.sync()
                run_jobs(tier, round_keys(round_index, count), 0, args.job_blocks, False)
                drop_page_cache([root], args.cold)
                for k, (_process, conn) in enumerate(children):
                    conn.send((round_index, count, k * share, digests[k * share : (k + 1) * share]))
                spans = [conn.recv() for _process, conn in children]
                assert all(ok for _s, _e, ok in spans), f"an engine of {name} loaded other bytes"
                rounds.add(name, "load", max(e for _s, e, _ok in spans) - min(s for s, _e, _ok in spans))
    finally:
        for root, tier, children in groups.values():
            for process, conn in children:
                if process.is_alive():
                    conn.send(None)
                process.join(timeout=60)
            if tier is not None:
                tier.shutdown()
            shutil.rmtree(root, ignore_errors=True)
    moved = count * block_bytes
    ratios = rounds.ratios(_KVREF, _VLLM, "load", moved, moved)
    lines = [
        (
            f"\n== {engines} engines loading at once from one root: {human(block_bytes)} blocks, "
            f"{human(share * block_bytes)} each, cold, {args.engine_repeats} rounds, {load_average()} =="
        )
    ]
    for name in (_VLLM, _KVREF):
        lines.append(
            f"  {name:22} aggregate cold load GB/s: best {rounds.best_gbps(name, 'load', moved):.2f}, "
            f"median {rounds.median_gbps(name, 'load', moved):.2f}"
        )
    lines.append(
        f"  {_KVREF} / {_VLLM}: {statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]"
    )
    return lines


# --- Redis ---


def best_pair(
    make: Callable[[], SecondaryTierManager], primary: Primary, job_blocks: int, repeats: int, before_store: Callable[[], object]
) -> tuple[float, float]:
    """(store seconds, load seconds) of one tier, best of `repeats` each (fresh keys per store)."""
    tier = make()
    key_rounds = itertools.count()
    stored: list[OffloadKey] = []

    def store() -> float:
        before_store()
        stored[:] = round_keys(next(key_rounds), primary.count)
        start, end = run_jobs(tier, stored, 0, job_blocks, False)
        return end - start

    def load() -> float:
        primary.clear_targets()
        start, end = run_jobs(tier, stored, primary.count, job_blocks, True)
        assert primary.loaded_right(), "loaded bytes differ"
        return end - start

    try:
        return min(store() for _ in range(repeats)), min(load() for _ in range(repeats))
    finally:
        tier.shutdown()


def bench_redis(args: argparse.Namespace) -> list[str]:
    server: LocalRedisServer | None = None
    url = args.url
    if url is None and redis_server_path() is not None:
        server = LocalRedisServer().start()
        url = server.url
    if url is None:
        return ["no Redis server (pass --url or install redis-server): the Redis tier is not measured"]
    try:
        count = max(args.job_blocks, args.redis_total // args.redis_block)
        primary = Primary(count, args.redis_block)
        baseline = RedisPyPipeline(url)
        keys = [b"bench:" + key_of(i).hex().encode() for i in range(count)]

        def pipeline_store() -> float:
            baseline.flush()
            return baseline.store(keys, primary.rows(0), args.job_blocks)

        def pipeline_load() -> float:
            primary.clear_targets()
            elapsed = baseline.load(keys, primary.rows(count), args.job_blocks)
            assert primary.loaded_right(), "redis-py loaded other bytes"
            return elapsed

        base = (min(pipeline_store() for _ in range(args.repeats)), min(pipeline_load() for _ in range(args.repeats)))
        config = {"type": "RedisTier", "module_path": _MODULE, "url": url, "namespace": f"bench-{os.getpid()}"}
        ours = best_pair(lambda: build(config, primary), primary, args.job_blocks, args.repeats, baseline.flush)
        baseline.flush()
        baseline.close()
    finally:
        if server is not None:
            server.stop()
    moved = count * args.redis_block / 1e9
    ratios = (base[0] / ours[0], base[1] / ours[1])
    met = "met" if min(ratios) >= 0.8 else "NOT met"
    return [
        (
            f"\n== Redis: {human(args.redis_block)} blocks, {human(count * args.redis_block)} per phase, "
            f"best of {args.repeats}, {load_average()} =="
        ),
        f"  {'redis-py pipeline':42} store {moved / base[0]:6.2f}   load {moved / base[1]:6.2f}",
        (
            f"  {'kvref RedisTier':42} store {moved / ours[0]:6.2f}   load {moved / ours[1]:6.2f}"
            f"   ({ratios[0]:.2f}x, {ratios[1]:.2f}x of redis-py pipeline)"
        ),
        f"RedisTier >= 0.8x of redis-py pipeline, store and load: {met}",
    ]


def size_list(text: str) -> list[int]:
    return [parse_size(part) for part in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fs-total", type=parse_size, default=parse_size("1G"), help="disk tiers: bytes per phase (default 1G)")
    parser.add_argument("--fs-blocks", type=size_list, default=size_list("2M,1M,256K"), help="disk tiers: block sizes (default 2M,1M,256K)")
    parser.add_argument("--streams", type=int, default=8, help="the many-stream O_DIRECT baseline's streams (default 8)")
    parser.add_argument("--engines", type=int, default=4, help="engines loading at once from one root (default 4; 0 skips)")
    parser.add_argument("--engines-block", type=parse_size, default=parse_size("1M"), help="their block size (default 1M)")
    parser.add_argument("--engine-repeats", type=int, default=3, help="rounds of the engines part (default 3)")
    parser.add_argument("--cold", choices=COLD_CHOICES, default="auto", help="how loads are made cold: drop_caches (the page cache), drop_caches_all (dentries and inodes too), fadvise (default: drop_caches as root, else fadvise)")
    parser.add_argument("--url", help="a Redis server (default: start a throw-away redis-server)")
    parser.add_argument("--redis-total", type=parse_size, default=parse_size("256M"), help="Redis: bytes per phase (default 256M)")
    parser.add_argument("--redis-block", type=parse_size, default=parse_size("1M"), help="Redis: block bytes (default 1M)")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="disk tiers: also run kvref's file pattern in plain C (_plain_block_files.c, built with cc), without and with its checksum and copy",
    )
    parser.add_argument("--skip-redis", action="store_true", help="measure the disk tiers only")
    parser.add_argument("--skip-fs", action="store_true", help="measure the Redis tier only")
    parser.add_argument("--job-blocks", type=int, default=16, help="blocks per job (default 16)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds per figure (default 5)")
    parser.add_argument("--dir", type=Path, default=None, help="where the disk tiers write (default: a temporary directory under /tmp)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="kvref-bench-vllm-", dir=args.dir))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, files under {work}, {load_average()}")
    print(huge_pages_line())
    try:
        if not args.skip_fs:
            if not probe_o_direct(work):
                print(f"{work} does not take O_DIRECT: both tiers fall back to buffered I/O")
            # Each round's root (two tiers, two plain C runs with --plain) holds a phase's blocks; the
            # engines' roots one per round.
            needed = sum(
                args.repeats * (4 if args.plain else 2) * max(args.job_blocks, args.fs_total // size) * file_bytes(32, size)
                for size in args.fs_blocks
            )
            if args.engines:
                share = max(args.job_blocks, args.fs_total // args.engines_block // args.engines)
                needed += args.engine_repeats * 2 * share * args.engines * file_bytes(32, args.engines_block)
            spent = SpentRoots(work, needed)
            print(spent.line)
            methods: set[str] = set()
            for block_bytes in args.fs_blocks:
                lines, method = bench_fs(args, work, block_bytes, spent)
                methods.add(method)
                print("\n".join(lines), flush=True)
            if args.engines:
                print("\n".join(bench_engines(args, work)), flush=True)
            for method in sorted(methods):
                print(f"cold loads: {COLD_METHODS[method]}")
        if not args.skip_redis:
            print("\n".join(bench_redis(args)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
