"""kvref's tiers inside vLLM's own tiering manager, judged against vLLM's own fs tier.

Each trace is served by a vLLM engine's real offloading code (`TieringOffloadingSpec` ->
`TieringOffloadingManager` over `CPUPrimaryTierOffloadingManager`, see examples/vllm_engine.py)
whose CPU tier holds far fewer blocks than the trace touches, so most hits are promotions from
the secondary tier. Every block loaded is checked byte for byte (`Engine.serve` raises
`WrongBytes`), and each request's hit count must equal that of the same trace served with
vLLM's own `fs` tier: the same lookups, promotions and evictions, whatever tier answers.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from examples.vllm_engine import Engine, prompt_keys
from kvref.tiering.redis.local import LocalRedisServer

Trace = list[tuple[str, int]]  # (document, blocks of it the request covers)

_NUM_CHUNKS = 12  # CPU tier capacity; every trace touches several times more blocks
_BLOCK_BYTES = 16 << 10


def make_trace(seed: int, *, requests: int = 36, documents: int = 6, longest: int = 10) -> Trace:
    """Requests over shared documents: each covers a prefix of one (vLLM's prefix caching)."""
    rng = random.Random(seed)
    return [(f"doc-{rng.randrange(documents)}", rng.randint(1, longest)) for _ in range(requests)]


def serve_trace(tiers: Sequence[dict[str, Any]], trace: Trace) -> list[int]:
    """Serve `trace` one request at a time, letting every transfer finish in between."""
    engine = Engine(tiers, num_chunks=_NUM_CHUNKS, block_bytes=_BLOCK_BYTES)
    try:
        hits: list[int] = []
        for index, (document, length) in enumerate(trace):
            hits.append(engine.serve(f"req-{index}", prompt_keys(document, length)))
            engine.settle()  # no cascade still pins a CPU block when the next request evicts
        return hits
    finally:
        engine.close()


@pytest.fixture
def tier_configs(tmp_path: Path, redis_server: LocalRedisServer) -> Iterator[dict[str, dict[str, Any]]]:
    namespace = f"traces-{uuid.uuid4().hex}"
    yield {
        "vllm-fs": {"type": "fs", "root_dir": str(tmp_path / "vllm-fs"), "n_read_threads": 2, "n_write_threads": 2},
        "FileSystemTier": {"type": "FileSystemTier", "module_path": "kvref.integrations.vllm", "root_dir": str(tmp_path / "kvref-fs")},
        "RedisTier": {"type": "RedisTier", "module_path": "kvref.integrations.vllm", "url": redis_server.url, "namespace": namespace},
    }  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hits_per_request_equal_vllm_fs_tier(tier_configs: dict[str, dict[str, Any]], seed: int) -> None:
    trace = make_trace(seed)
    cpu_only = serve_trace([], trace)
    by_tier = {name: serve_trace([config], trace) for name, config in tier_configs.items()}
    expected = by_tier.pop("vllm-fs")
    assert sum(expected) > sum(cpu_only), "the trace must need the secondary tier"
    for name, hits in by_tier.items():
        assert hits == expected, f"{name}: hits per request differ from vLLM's fs tier"


def test_blocks_outlive_the_engine(tier_configs: dict[str, dict[str, Any]]) -> None:
    # A new engine on the same configuration (a restart) finds every block the last one stored.
    keys = prompt_keys("restart", _NUM_CHUNKS - 2)
    for name in ("FileSystemTier", "RedisTier"):
        config = tier_configs[name]
        assert serve_trace([config], [("restart", len(keys))]) == [0], name
        assert serve_trace([config], [("restart", len(keys))]) == [len(keys)], name
