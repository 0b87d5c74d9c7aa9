"""kvref's vLLM tiers against their baselines, through vLLM 0.33's SecondaryTierManager API.

    .venv-vllm/bin/python tools/bench_vllm_tiers.py            # starts a throw-away redis-server
    .venv-vllm/bin/python tools/bench_vllm_tiers.py --url redis://host:6379 --total 512M

Every tier is built by vLLM's own `SecondaryTierFactory` over one page-aligned primary view of
`--block` rows, and driven as vLLM's tiering manager drives it: `TransferJob`s of `--job-blocks`
blocks (numpy `chunk_ids`), all submitted at once, timed until `drain_jobs` returns, then
`get_finished_jobs` must report every job successful. A phase moves `--total` bytes; stores use
keys no tier has seen, loads read the last store's blocks into other rows and are checked byte
for byte. Figures are GB/s (1e9 B/s), best of `--repeats`, with ratios measured in the same run:

* `FileSystemTier` / vLLM's own `fs` tier, each with its defaults (vLLM's 16 read + 16 write
  threads and O_DIRECT where the filesystem takes it; kvref's threads per core, buffered I/O);
  target >= 1.0x, store and load;
* `RedisTier` / one redis-py (+ hiredis) client running one pipeline per job over the same rows
  (`_tier_bench.RedisPyPipeline`, as `bench_redis.py`); target >= 0.8x, store and load.
"""

from __future__ import annotations

import argparse
import itertools
import mmap
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager, TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.fs.io import probe_o_direct

from kvref.tiering.redis.local import LocalRedisServer, redis_server_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tier_bench import RedisPyPipeline, human, key_of, parse_size  # noqa: E402
from _vllm_spec import mock_offloading_spec  # noqa: E402

__all__ = ["main", "Primary", "measure_tier"]

_CTX = ReqContext(req_id="bench")
_MODULE = "kvref.integrations.vllm"


class Primary:
    """`2 * count` page-aligned rows of `block_bytes`: sources [0, count), load targets after."""

    def __init__(self, count: int, block_bytes: int) -> None:
        self.count = count
        self._mmap = mmap.mmap(-1, 2 * count * block_bytes)  # anonymous: page-aligned, as vLLM's
        self.array = np.frombuffer(self._mmap, dtype=np.uint8).reshape(2 * count, block_bytes)
        self.array[:count] = np.random.default_rng(0).integers(0, 256, self.array[:count].shape, dtype=np.uint8)
        self.view = self.array.data

    def rows(self, first: int) -> list[memoryview]:
        return [self.array[i].data for i in range(first, first + self.count)]

    def loaded_right(self) -> bool:
        return bool((self.array[self.count :] == self.array[: self.count]).all())

    def clear_targets(self) -> None:
        self.array[self.count :] = 0


def best_of(repeats: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeats))


def measure_tier(
    make: Callable[[], SecondaryTierManager],
    primary: Primary,
    job_blocks: int,
    repeats: int,
    before_store: Callable[[], object] = lambda: None,
) -> tuple[float, float]:
    """(store seconds, load seconds) of one tier, best of `repeats` each.

    `before_store` runs before each store phase, untimed (the Redis server is emptied, as for
    the baseline, so every phase writes into an empty server).
    """
    job_ids = itertools.count()
    key_rounds = itertools.count()
    tier = make()
    stored: list[OffloadKey] = []

    def run(promotion: bool, keys: Sequence[OffloadKey]) -> float:
        first_row = primary.count if promotion else 0
        jobs = [
            TransferJob(
                job_id=next(job_ids),
                keys=list(keys[start : start + job_blocks]),
                chunk_ids=np.arange(first_row + start, first_row + min(start + job_blocks, len(keys)), dtype=np.int64),
                is_promotion=promotion,
                req_context=_CTX,
            )
            for start in range(0, len(keys), job_blocks)
        ]
        started = time.perf_counter()
        for job in jobs:
            (tier.submit_load if promotion else tier.submit_store)(job)
        tier.drain_jobs()
        elapsed = time.perf_counter() - started
        results = list(tier.get_finished_jobs())
        assert len(results) == len(jobs) and all(r.success for r in results), "a job failed"
        return elapsed

    def store() -> float:
        before_store()
        round_number = next(key_rounds)
        keys = [OffloadKey(key_of(round_number * primary.count + i)) for i in range(primary.count)]
        stored[:] = keys
        return run(False, keys)

    def load() -> float:
        primary.clear_targets()
        elapsed = run(True, stored)
        assert primary.loaded_right(), "loaded bytes differ"
        return elapsed

    try:
        return best_of(repeats, store), best_of(repeats, load)
    finally:
        tier.shutdown()


def build(config: dict[str, Any], primary: Primary) -> SecondaryTierManager:
    return SecondaryTierFactory.create_secondary_tier(config, primary.view, mock_offloading_spec(model="bench/model", engine_id="bench"))  # pyright: ignore[reportUnknownMemberType]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a Redis server (default: start a throw-away redis-server)")
    parser.add_argument("--total", type=parse_size, default=parse_size("256M"), help="bytes per phase (default 256M)")
    parser.add_argument("--block", type=parse_size, default=parse_size("1M"), help="block bytes (default 1M)")
    parser.add_argument("--job-blocks", type=int, default=16, help="blocks per job (default 16)")
    parser.add_argument("--repeats", type=int, default=3, help="best of N per figure (default 3)")
    parser.add_argument("--dir", type=Path, default=None, help="where the fs tiers write (default: a temporary directory)")
    args = parser.parse_args(argv)

    count = max(args.job_blocks, args.total // args.block)
    primary = Primary(count, args.block)
    moved = count * args.block / 1e9
    work = Path(tempfile.mkdtemp(prefix="kvref-bench-vllm-", dir=args.dir))
    server: LocalRedisServer | None = None
    try:
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {human(args.block)} blocks, "
            f"{args.job_blocks}-block jobs, {human(count * args.block)} per phase, GB/s (best of {args.repeats})"
        )
        figures: dict[str, tuple[float, float]] = {}
        fs_configs = {
            "vLLM fs": {"type": "fs", "root_dir": str(work / "vllm-fs")},
            "FileSystemTier": {"type": "FileSystemTier", "module_path": _MODULE, "root_dir": str(work / "kvref-fs")},
        }
        for name, config in fs_configs.items():
            figures[name] = measure_tier(lambda config=config: build(config, primary), primary, args.job_blocks, args.repeats)
        url = args.url
        if url is None and redis_server_path() is not None:
            server = LocalRedisServer().start()
            url = server.url
        if url is not None:
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

            figures["redis-py pipeline"] = (best_of(args.repeats, pipeline_store), best_of(args.repeats, pipeline_load))
            redis = {"type": "RedisTier", "module_path": _MODULE, "url": url, "namespace": f"bench-{os.getpid()}"}
            figures["RedisTier"] = measure_tier(
                lambda: build(redis, primary), primary, args.job_blocks, args.repeats, before_store=baseline.flush
            )
            baseline.flush()
            baseline.close()
        else:
            print("no Redis server (pass --url or install redis-server): the Redis tier is not measured")

        o_direct = "O_DIRECT" if probe_o_direct(str(work)) else "buffered: no O_DIRECT here"
        labels = {"vLLM fs": f"vLLM fs ({o_direct})", "FileSystemTier": "kvref FileSystemTier",
                  "redis-py pipeline": "redis-py pipeline", "RedisTier": "kvref RedisTier"}  # fmt: skip
        baselines = {"FileSystemTier": ("vLLM fs", 1.0), "RedisTier": ("redis-py pipeline", 0.8)}
        verdicts: list[str] = []
        for name, (store_s, load_s) in figures.items():
            line = f"  {labels[name]:42} store {moved / store_s:6.2f}   load {moved / load_s:6.2f}"
            if name in baselines:
                base_name, target = baselines[name]
                base_store, base_load = figures[base_name]
                ratios = (base_store / store_s, base_load / load_s)
                line += f"   ({ratios[0]:.2f}x, {ratios[1]:.2f}x of {base_name})"
                met = "met" if min(ratios) >= target else "NOT met"
                verdicts.append(f"{name} >= {target}x of {base_name}, store and load: {met}")
            print(line)
        for verdict in verdicts:
            print(verdict)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
