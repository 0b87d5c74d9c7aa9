"""What the tier benchmarks (`bench_tiering.py`, `bench_redis.py`, `bench_vllm_tiers.py`) share:
block sizes as the command line spells them and as the tables print them, the keys of the blocks
they move, the engine a kvref tier serves (its spec and primary memory), and the Redis tiers'
baseline, a redis-py pipeline moving the same bytes.

It lives below them, so `bench_tiering.py --redis` can run `bench_redis.py` without the two
importing each other; the tiering tests (`tests/tiering/helpers.py`) build their engines with it
too.
"""

from __future__ import annotations

import itertools
import mmap
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Protocol, cast

from typing_extensions import override

# The benchmarks that import this put the checkout on sys.path first.
from kvref.base import OffloadingManager, OffloadingSpec, OffloadingWorker, OffloadKey, ReqContext, make_offload_key
from kvref.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from kvref.tiering.base import TransferJob

__all__ = ["parse_size", "human", "key_of", "bench_spec", "transfer_job", "PrimaryRegion", "RedisPyPipeline"]

_CTX = ReqContext(req_id="bench")

_SIZES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """`"64K"`, `"1MiB"`, `"4m"` or `"512"` -> bytes."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in _SIZES:
        return int(float(text[:-1]) * _SIZES[text[-1]])
    return int(text)


def human(size: int) -> str:
    """`1048576` -> `"1 MiB"` (bytes when no unit divides it)."""
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


def key_of(i: int) -> OffloadKey:
    """The offload key of the benchmark's `i`-th block (group 0)."""
    return make_offload_key(i.to_bytes(32, "big"), 0)


class _BenchSpec(OffloadingSpec):
    """The engine a tier serves, described only (tiers read its config and KV-events flag)."""

    @override
    def get_manager(self) -> OffloadingManager:
        raise NotImplementedError("build the manager yourself (kvref.tiering.factory.create_tiering_manager)")

    @override
    def get_worker(self, kv_caches: Any) -> OffloadingWorker:
        raise NotImplementedError("no GPU memory is moved here")


def bench_spec(
    block_bytes: int, *, model: str = "kvref-bench/model", rank: int = 0, tp_size: int = 1, kv_events: bool = False
) -> OffloadingSpec:
    """One model on `rank` of `tp_size`, one KV-cache group, one block of `block_bytes` per
    chunk, the engine's KV-events flag: what a tier reads of its engine (its identity follows)."""
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(16, ("layer.0",), 0),),
        worker_kv_bytes_per_block=block_bytes,
        enable_kv_cache_events=kv_events,
        extra_config={},
        engine_id=f"{model}-{rank}",
        model=OffloadingModelConfig(name=model, dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=rank, world_size=tp_size, tp_size=tp_size, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),  # fmt: skip
    )
    return _BenchSpec(config)


_job_ids = itertools.count()


def transfer_job(keys: Sequence[OffloadKey], chunk_ids: Sequence[int], promotion: bool) -> TransferJob:
    """A job moving `keys` from (a promotion: into) primary rows `chunk_ids`, with a fresh id."""
    return TransferJob(next(_job_ids), tuple(keys), tuple(chunk_ids), promotion, _CTX)


class PrimaryRegion:
    """The primary's memory: shared anonymous memory, page-aligned, as vLLM's region is; a
    `KVMemoryRegion` and a context manager."""

    def __init__(self, num_chunks: int, chunk_bytes: int) -> None:
        self._memory = mmap.mmap(-1, num_chunks * chunk_bytes)
        self._shape = (num_chunks, chunk_bytes)

    def create_kv_memoryview(self) -> memoryview:
        return memoryview(self._memory).cast("B", self._shape)

    def cleanup(self) -> None:
        try:
            self._memory.close()
        except BufferError:
            pass  # a view is still alive: the memory goes with the last one

    def __enter__(self) -> PrimaryRegion:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.cleanup()


class _Pipeline(Protocol):
    """The part of redis-py's pipeline used here (redis-py's own annotations are partial)."""

    def set(self, name: bytes, value: memoryview) -> object: ...
    def get(self, name: bytes) -> object: ...
    def execute(self) -> list[Any]: ...


class _Client(Protocol):
    def pipeline(self, transaction: bool = True) -> _Pipeline: ...
    def flushall(self) -> object: ...
    def close(self) -> None: ...


class RedisPyPipeline:
    """The Redis tiers' baseline: one redis-py (+ hiredis) client, one pipeline per job.

    A store job is a pipeline of SETs of its rows' memoryviews; a load job a pipeline of GETs,
    each reply copied into its row. Jobs run one after another.
    """

    def __init__(self, url: str) -> None:
        import redis  # the benchmarks' optional baseline (the `redis` extra)

        self._client = cast(_Client, redis.Redis.from_url(url, socket_timeout=30))  # pyright: ignore[reportUnknownMemberType]

    def flush(self) -> None:
        """Empty the server (every phase writes into an empty server)."""
        self._client.flushall()

    def store(self, keys: Sequence[bytes], rows: Sequence[memoryview], job_blocks: int) -> float:
        """SET `rows[i]` under `keys[i]`, `job_blocks` per pipeline; return the seconds taken."""
        started = time.perf_counter()
        for start in range(0, len(keys), job_blocks):
            pipe = self._client.pipeline(transaction=False)
            for i in range(start, min(start + job_blocks, len(keys))):
                pipe.set(keys[i], rows[i])
            pipe.execute()
        return time.perf_counter() - started

    def load(self, keys: Sequence[bytes], rows: Sequence[memoryview], job_blocks: int) -> float:
        """GET `keys[i]` into `rows[i]`, `job_blocks` per pipeline; return the seconds taken."""
        started = time.perf_counter()
        for start in range(0, len(keys), job_blocks):
            pipe = self._client.pipeline(transaction=False)
            for i in range(start, min(start + job_blocks, len(keys))):
                pipe.get(keys[i])
            for i, value in zip(range(start, len(keys)), pipe.execute()):
                rows[i][:] = value
        return time.perf_counter() - started

    def close(self) -> None:
        self._client.close()
