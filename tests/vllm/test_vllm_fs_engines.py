"""Two vLLM engine processes on one `FileSystemTier` root, as replicas of a model on a host are.

Each process runs vLLM 0.33's own offloading (`TieringOffloadingManager` over its
`CPUPrimaryTierOffloadingManager`) with kvref's `FileSystemTier` built by vLLM's factory from the
operator's dict (`tests.vllm.engine_process`); both dicts name the same `root_dir`. Every block
an engine loads is checked byte for byte in its process, and any exception raised inside vLLM's
manager fails the test where it happens.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvref.tiering.fs.format import file_bytes
from examples.vllm_engine import prompt_keys
from tests.vllm.engine_process import EngineProcess

_BLOCK_BYTES = 16 << 10
_NUM_CHUNKS = 16  # each engine's CPU tier: room for every prompt here, so loads come from disk
_PROMPT_BLOCKS = 12
_WRITE_THREADS = 2
_SHARED_WITHIN_S = 1.0


def fs_tier(root: Path, **options: Any) -> dict[str, Any]:
    return {
        "type": "FileSystemTier",
        "module_path": "kvref.integrations.vllm",
        "root_dir": str(root),
        "n_read_threads": 2,
        "n_write_threads": _WRITE_THREADS,
        **options,
    }


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[EngineProcess, EngineProcess]]:
    """Two engine processes for the module (each test opens new engines in them)."""
    pair = (EngineProcess("engine-a"), EngineProcess("engine-b"))
    try:
        yield pair
    finally:
        for engine in pair:
            engine.stop()  # both exit at once
        for engine in pair:
            engine.close()


def open_both(engines: tuple[EngineProcess, EngineProcess], tier: dict[str, Any]) -> None:
    for engine in engines:
        engine.send("open", [tier], _NUM_CHUNKS, _BLOCK_BYTES)
    for engine in engines:
        engine.reply()


def root_files(root: Path) -> tuple[list[Path], list[Path]]:
    """(block files, temporary files) anywhere under `root`."""
    blocks: list[Path] = []
    temporary: list[Path] = []
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith(".kvb"):
                blocks.append(Path(directory, name))
            elif name.endswith(".tmp"):
                temporary.append(Path(directory, name))
    return blocks, temporary


def root_bytes(root: Path) -> int:
    """Bytes of the block and temporary files under `root` now (files go while it counts)."""
    blocks, temporary = root_files(root)
    total = 0
    for path in (*blocks, *temporary):
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # evicted, or renamed into place, since it was listed
            pass
    return total


def test_blocks_one_engine_offloaded_are_hits_in_the_other(
    engines: tuple[EngineProcess, EngineProcess], tmp_path: Path
) -> None:
    open_both(engines, fs_tier(tmp_path / "shared"))
    for writer, reader, prompt in ((*engines, "doc-a"), (*reversed(engines), "doc-b")):
        ((hits, _),) = writer.serve([(prompt, _PROMPT_BLOCKS)])
        assert hits == 0  # nothing of it stored anywhere yet: computed, then offloaded
        stored_at = writer.settle()  # every store job reported finished
        ((hits, asked_at),) = reader.serve([(prompt, _PROMPT_BLOCKS)], start_at=stored_at)
        # Its CPU tier never held the prompt: each block is a lookup HIT in its fs tier on the
        # first ask (a MISS would end the prefix) and is promoted from disk, bytes checked.
        assert asked_at - stored_at < _SHARED_WITHIN_S
        assert hits == _PROMPT_BLOCKS, f"{reader.name} found {hits} of {writer.name}'s {_PROMPT_BLOCKS} blocks"
        reader.settle()


def test_two_engines_storing_the_same_blocks_at_once_leave_one_good_copy(
    engines: tuple[EngineProcess, EngineProcess], tmp_path: Path
) -> None:
    root = tmp_path / "same"
    open_both(engines, fs_tier(root))
    prompts = [(f"same-{n}", _PROMPT_BLOCKS) for n in range(3)]
    start_at = time.monotonic() + 0.5  # both asked to start at once, after both have the message
    for engine in engines:
        engine.send("serve", prompts, start_at)
    for engine in engines:
        engine.reply()
    for engine in engines:
        engine.settle()
    blocks, temporary = root_files(root)
    assert len(blocks) == len(prompts) * _PROMPT_BLOCKS and temporary == []
    # A new engine (an empty CPU tier) loads every one of them with the right bytes.
    engines[0].open([fs_tier(root)], num_chunks=_NUM_CHUNKS, block_bytes=_BLOCK_BYTES)
    assert [hits for hits, _ in engines[0].serve(prompts)] == [_PROMPT_BLOCKS] * len(prompts)


def test_a_capacity_shared_by_both_engines_bounds_the_root(
    engines: tuple[EngineProcess, EngineProcess], tmp_path: Path
) -> None:
    root = tmp_path / "bounded"
    one_file = file_bytes(len(prompt_keys("any", 1)[0]), _BLOCK_BYTES)
    capacity = 30 * one_file
    in_flight = len(engines) * _WRITE_THREADS * one_file  # every writer thread of both engines
    open_both(engines, fs_tier(root, capacity_bytes=capacity))
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, root_bytes(root))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        start_at = time.monotonic() + 0.5
        for n, engine in enumerate(engines):  # 2 x 60 distinct blocks: four times the capacity
            engine.send("serve", [(f"bounded-{n}-{p}", _PROMPT_BLOCKS) for p in range(5)], start_at)
        for engine in engines:
            engine.reply()
        for engine in engines:
            engine.settle()
    finally:
        stop.set()
        sampler.join()
    at_rest = root_bytes(root)
    assert at_rest <= capacity
    assert peak <= capacity + in_flight, f"peak {peak} bytes, capacity {capacity} + in flight {in_flight}"
    assert at_rest >= capacity - 2 * one_file  # it did fill up: the bound was tested
    blocks, _ = root_files(root)
    assert {path.stat().st_size for path in blocks} == {one_file}
