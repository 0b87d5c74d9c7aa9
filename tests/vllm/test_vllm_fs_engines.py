"""Two vLLM engine processes on one `FileSystemTier` root, as replicas of a model on one host
or on two hosts sharing a volume.

Each process runs vLLM 0.33's own offloading (`TieringOffloadingManager` over its
`CPUPrimaryTierOffloadingManager`) with kvref's `FileSystemTier` built by vLLM's factory from the
operator's dict (`tests.vllm.engine_process`); both dicts name the same root. Every block an
engine loads is checked byte for byte in its process, and any exception raised inside vLLM's
manager fails the test where it happens.

Tests taking `place` run on the local disk and on a JuiceFS volume mounted twice
(`tests.tiering.juicefs`), engine i on mount i % 2, as on two hosts.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kvref.tiering.fs.format import file_bytes
from kvref.tiering.fs.root import block_name
from examples.vllm_engine import prompt_keys
from tests.tiering.juicefs import Place
from tests.tiering.juicefs import place as place  # fixtures, by name
from tests.tiering.juicefs import shared_volume as shared_volume
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


def open_both(engines: tuple[EngineProcess, EngineProcess], roots: Sequence[Path], **options: Any) -> None:
    """Open engine i on `roots[i % len(roots)]`, both at once."""
    for index, engine in enumerate(engines):
        engine.send("open", [fs_tier(roots[index % len(roots)], **options)], _NUM_CHUNKS, _BLOCK_BYTES)
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
    engines: tuple[EngineProcess, EngineProcess], place: Place
) -> None:
    open_both(engines, place.roots())
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
    engines: tuple[EngineProcess, EngineProcess], place: Place
) -> None:
    roots = place.roots()
    root = roots[0]
    open_both(engines, roots)
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
    # A new engine (an empty CPU tier) on either host loads every one of them with the right bytes.
    for engine, engine_root in zip(engines, roots):
        engine.open([fs_tier(engine_root)], num_chunks=_NUM_CHUNKS, block_bytes=_BLOCK_BYTES)
        assert [hits for hits, _ in engine.serve(prompts)] == [_PROMPT_BLOCKS] * len(prompts)


def test_a_capacity_shared_by_both_engines_bounds_the_root(
    engines: tuple[EngineProcess, EngineProcess], place: Place
) -> None:
    roots = place.roots()
    root = roots[0]
    one_file = file_bytes(len(prompt_keys("any", 1)[0]), _BLOCK_BYTES)
    capacity = 30 * one_file
    in_flight = len(engines) * _WRITE_THREADS * one_file  # every writer thread of both engines
    open_both(engines, roots, capacity_bytes=capacity)
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
        # 2 x 60 distinct blocks, four times the capacity; on JuiceFS 2 x 36 (each store lists
        # the root's 256 directories there, a few milliseconds each).
        prompts = 3 if place.shared else 5
        for n, engine in enumerate(engines):
            engine.send("serve", [(f"bounded-{n}-{p}", _PROMPT_BLOCKS) for p in range(prompts)], start_at)
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


def block_files_of(root: Path, keys: Sequence[bytes]) -> list[Path]:
    """Where each key's block file is under `root` (vLLM's factory puts the kvref root in the run's
    directory, the one directory under `root`)."""
    (run_dir,) = [path for path in root.iterdir() if path.is_dir()]
    return [run_dir / name[:2] / name for name in (block_name(key) for key in keys)]


def test_blocks_an_engine_stored_before_it_was_killed_are_hits_on_either_host(
    engines: tuple[EngineProcess, EngineProcess], place: Place
) -> None:
    """A writer engine SIGKILLed mid-serve loses none of the blocks it had put in place: a new
    engine, on the writer's host and on the other one, hits every one of them (a prompt up to
    its first block not in place) and loads it with the right bytes, and the dead writer's
    temporary files are gone once stale."""
    roots = place.roots()
    prompts = [(f"killed-{n}", _PROMPT_BLOCKS) for n in range(24)]
    writer = EngineProcess("writer")
    try:
        writer.open([fs_tier(roots[0], stale_tmp_s=1.0)], num_chunks=_NUM_CHUNKS, block_bytes=_BLOCK_BYTES)
        writer.send("serve", prompts, 0.0)
        deadline = time.monotonic() + 60
        while len(root_files(roots[0])[0]) < 2 * _PROMPT_BLOCKS:  # it is storing
            assert time.monotonic() < deadline, "the writer stored nothing in 60 s"
            time.sleep(0.01)
        writer.kill()
    finally:
        writer.close()
    in_place = {path.name for path in root_files(roots[0])[0]}
    assert len(in_place) < len(prompts) * _PROMPT_BLOCKS  # killed mid-serve
    time.sleep(1.2)  # its temporary files are stale now
    hits_found = 0
    for index, engine in enumerate(engines):  # a new engine on each host, half the prompts each
        engine.open([fs_tier(roots[index % len(roots)], stale_tmp_s=1.0)], num_chunks=_NUM_CHUNKS, block_bytes=_BLOCK_BYTES)
        mine = prompts[index :: len(engines)]
        expected: list[int] = []
        for prompt, count in mine:
            names = [path.name for path in block_files_of(roots[0], prompt_keys(prompt, count))]
            expected.append(next((i for i, name in enumerate(names) if name not in in_place), count))
        assert [hits for hits, _ in engine.serve(mine)] == expected
        engine.settle()
        hits_found += sum(expected)
    assert hits_found > 0
    assert root_files(roots[0])[1] == []  # the new engines' start-up sweeps removed them


def test_a_damaged_block_fails_its_load_on_the_other_host_and_is_stored_again(
    engines: tuple[EngineProcess, EngineProcess], place: Place
) -> None:
    roots = place.roots()
    open_both(engines, roots)
    a, b = engines
    assert [hits for hits, _ in a.serve([("damaged", _PROMPT_BLOCKS)])] == [0]
    a.settle()
    damaged = block_files_of(roots[0], prompt_keys("damaged", _PROMPT_BLOCKS))[5]
    with open(damaged, "r+b") as file:  # one payload byte flipped, through the writer's mount
        file.seek(4096 + 100)
        byte = file.read(1)
        file.seek(4096 + 100)
        file.write(bytes([byte[0] ^ 0x5A]))
    # B (its CPU tier empty) loads the prefix up to the damaged block, whose load fails: vLLM
    # recomputes it and the rest (bytes checked in B), and stores them again.
    assert [hits for hits, _ in b.serve([("damaged", _PROMPT_BLOCKS)])] == [5]
    b.settle()
    # Stored again by B, it loads everywhere: in a new engine on A's host (its CPU tier empty)
    # once A's mount no longer shows the deleted file in its name's place.
    time.sleep(place.stale_s)
    a.open([fs_tier(roots[0])], num_chunks=_NUM_CHUNKS, block_bytes=_BLOCK_BYTES)
    assert [hits for hits, _ in a.serve([("damaged", _PROMPT_BLOCKS)])] == [_PROMPT_BLOCKS]
