"""Many engines on one root of the filesystem tier: sharing, capacity across the root, faults.

Each engine is a separate OS process (spawn context) with its own `FileSystemSecondaryTier`
over a page-aligned primary, all on one root, driven through the job API
(`tests.tiering.fs_engines`). Every block reported loaded is checked against the bytes it was
stored with: a wrong byte anywhere fails the test, whatever else happened (kills, a full disk,
damaged or deleted files, evictions racing loads).

Where a test takes `place`, it runs twice: on the local disk (ext4 under `tmp_path`, so
O_DIRECT is on), and on a JuiceFS volume mounted twice (`tests.tiering.juicefs`), with the
engines split across the two mounts as across two hosts: engine i opens the root through mount
i % 2. Last, a state machine runs three tiers in one process on one root.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.sharedctypes import SynchronizedArray
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from typing_extensions import override

from kvref.tiering.fs import CONFIG_FILE_NAME, TierRootError
from kvref.tiering.fs.capacity import domains_for
from kvref.tiering.fs.root import FANOUT
from tests.tiering import fs_engines
from tests.tiering.juicefs import Place
from tests.tiering.juicefs import place as place  # fixtures, by name
from tests.tiering.juicefs import shared_volume as shared_volume
from tests.tiering.fs_engines import (
    BLOCK_BYTES,
    FILE_BYTES,
    Engine,
    Outcome,
    block_content,
    kill_writers_while_loading,
    run_dir,
    scan_root,
)

SPAWN: SpawnContext = multiprocessing.get_context("spawn")


# --- engines in processes ---


class EngineProcess:
    """An engine in a process of its own, answering `Engine` method calls over a pipe."""

    def __init__(self) -> None:
        self._conn, child = SPAWN.Pipe()
        self.process: SpawnProcess = SPAWN.Process(target=fs_engines.serve, args=(child,), daemon=True)
        self.process.start()
        child.close()

        self.unanswered = 0

    def begin(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Send a call without waiting (engines sent calls one after another run them at once)."""
        self._conn.send((method, args, kwargs))
        self.unanswered += 1

    def end(self, timeout: float = 60.0) -> Any:
        """The answer of the call `begin` sent; an exception in the engine fails the test."""
        if not self._conn.poll(timeout):
            raise AssertionError(f"engine {self.process.pid} did not answer in {timeout} s")
        status, value = self._conn.recv()
        self.unanswered -= 1
        if status != "ok":
            raise AssertionError(f"engine {self.process.pid} raised:\n{value}")
        return value

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.begin(method, *args, **kwargs)
        return self.end()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.call("exit")
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


@pytest.fixture(scope="module")
def engine_pool() -> Iterator[list[EngineProcess]]:
    pool = [EngineProcess() for _ in range(4)]
    yield pool
    for engine in pool:
        engine.stop()


@pytest.fixture
def engines(engine_pool: list[EngineProcess]) -> Iterator[list[EngineProcess]]:
    """Four engine processes; each test opens them on its own root, they are closed after."""
    yield engine_pool
    for index, engine in enumerate(engine_pool):
        try:
            while engine.unanswered:  # a test that failed midway left calls unanswered
                with contextlib.suppress(AssertionError):
                    engine.end()
            engine.call("close")
        except Exception:
            engine.stop()
            engine_pool[index] = EngineProcess()


# --- where the root is: the local disk, or one volume through two mounts ---


def eventually(check: Any, within_s: float) -> None:
    """Assert `check()` is true now or becomes true within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"still false after {within_s} s"
        time.sleep(0.02)


def open_all(engines: Sequence[EngineProcess], roots: Sequence[Path], **options: Any) -> None:
    """Open engine i on `roots[i % len(roots)]`, all at once (every call sent before any answer
    is read)."""
    for index, engine in enumerate(engines):
        engine.begin("open", str(roots[index % len(roots)]), **options)
    pids = [engine.end() for engine in engines]
    assert len(set(pids)) == len(engines)


def open_three(
    roots: Sequence[Path], engines: Sequence[EngineProcess], capacity_files: int | None
) -> Sequence[EngineProcess]:
    """The first three engines, open on `roots` with room for `capacity_files` files (None: no bound)."""
    three = engines[:3]
    open_all(three, roots, capacity_bytes=None if capacity_files is None else capacity_files * FILE_BYTES)
    return three


def run_all(engines: Sequence[EngineProcess], method: str, args: Sequence[Any]) -> list[Any]:
    """Call `method` in each engine with its own argument, all at once."""
    for engine, arg in zip(engines, args):
        engine.begin(method, arg)
    return [engine.end() for engine in engines]


def jobs_of(numbers: Sequence[int], size: int) -> list[list[int]]:
    return [list(numbers[i : i + size]) for i in range(0, len(numbers), size)]


def assert_loaded(outcomes: Sequence[Outcome]) -> None:
    for outcome in outcomes:
        assert outcome.success and outcome.wrong == (), outcome


# --- the root as the filesystem shows it ---


class RootSampler(threading.Thread):
    """Samples the root's file bytes while writers run, each sample with the bound the writers'
    jobs in flight allow: capacity plus every block submitted before the scan ended and not
    reported finished before it began (`store_stream`'s counters).

    Attributes:
        samples: (root bytes, blocks in flight during the scan, temporary files seen).
    """

    def __init__(self, root: Path, counters: SynchronizedArray[int], writers: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.counters = counters
        self.writers = writers
        self.samples: list[tuple[int, int, int]] = []
        self.done = threading.Event()

    def _counts(self) -> list[int]:
        with self.counters.get_lock():
            return list(self.counters[: 2 * self.writers])

    @override
    def run(self) -> None:
        while not self.done.is_set():
            before = self._counts()
            total, _blocks, tmps = scan_root(self.root)
            after = self._counts()
            in_flight = sum(after[2 * w] - before[2 * w + 1] for w in range(self.writers))
            self.samples.append((total, in_flight, len(tmps)))
            time.sleep(0.002)


def start_writer(
    root: Path,
    options: dict[str, Any],
    jobs: list[list[int]],
    jobs_in_flight: int,
    *,
    counters: SynchronizedArray[int] | None = None,
    index: int = 0,
    log_path: Path | None = None,
    result_path: Path | None = None,
) -> SpawnProcess:
    process = SPAWN.Process(
        target=fs_engines.store_stream,
        args=(
            str(root),
            options,
            jobs,
            jobs_in_flight,
            counters,
            index,
            None if log_path is None else str(log_path),
            None if result_path is None else str(result_path),
        ),
        daemon=True,
    )
    process.start()
    return process


def start_loader(
    root: Path,
    options: dict[str, Any],
    numbers: list[int],
    per_job: int,
    stop: Any,
    result_path: Path,
    seed: int,
) -> SpawnProcess:
    process = SPAWN.Process(
        target=fs_engines.load_loop,
        args=(str(root), options, numbers, per_job, stop, str(result_path), seed),
        daemon=True,
    )
    process.start()
    return process


def joined(process: SpawnProcess, timeout: float = 120.0) -> int | None:
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        raise AssertionError(f"process {process.pid} did not finish in {timeout} s")
    return process.exitcode


def read_json(path: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(path.read_text())
    return result


# --- 1. many engines, one root ---


def test_engines_open_one_root_at_once_and_see_each_others_blocks_at_once(
    engines: list[EngineProcess], place: Place
) -> None:
    roots = place.roots()  # new: the four openers race to write its config
    open_all(engines, roots)
    assert all(engine.call("direct") for engine in engines)  # ext4 and JuiceFS take O_DIRECT
    latencies: list[float] = []
    for round_ in range(3):
        for writer, engine in enumerate(engines):
            numbers = [1000 * writer + 100 * round_ + i for i in range(8)]
            assert engine.call("store", numbers)  # reported finished ...
            for other in engines:
                if other is not engine:
                    # ... is a hit in every other engine within a second, with the right bytes.
                    latency = other.call("wait_hit", numbers, 1.0)
                    assert latency is not None, f"engine {writer}'s blocks not seen in 1 s"
                    latencies.append(latency)
                    assert_loaded([other.call("load", numbers)])
    assert max(latencies) < 1.0
    print(f"\n{place.label}: stored in one engine, seen in another after at most {max(latencies) * 1000:.1f} ms")
    stored = [1000 * w + 100 * r + i for w in range(4) for r in range(3) for i in range(8)]
    for engine in engines:
        engine.call("close")
    # An engine started later, on either host, finds every block any engine stored, and loads it.
    for engine, root in zip(engines, roots):
        engine.call("open", str(root))
        assert engine.call("lookup", stored) == [True] * len(stored)
        assert_loaded(engine.call("load_all", jobs_of(stored, 16)))


def test_engines_storing_the_same_blocks_at_once_leave_one_good_copy(
    engines: list[EngineProcess], place: Place
) -> None:
    roots = place.roots()
    root = roots[0]
    open_all(engines, roots, n_write_threads=4)
    total = 0
    for round_ in range(2 if place.shared else 3):
        numbers = list(range(100 * round_, 100 * round_ + 64))
        orders = [numbers, numbers[::-1], random.Random(round_).sample(numbers, len(numbers)), numbers]
        results = run_all(engines, "store_all", [jobs_of(order, 8) for order in orders])
        assert all(outcome.success for outcomes in results for outcome in outcomes)
        total += len(numbers)
        _bytes, blocks, tmps = scan_root(root)
        assert len(blocks) == total and tmps == []
        for engine in engines:
            assert_loaded(engine.call("load_all", jobs_of(numbers, 16)))


# --- 2. capacity across the root ---


def test_capacity_holds_across_three_engines_storing_at_full_speed(tmp_path: Path, place: Place) -> None:
    """Peak root bytes stay within capacity plus the blocks in flight, in one eviction domain
    and in many; every block written is still there or was evicted by exactly one engine.

    On two mounts, many domains only, and the root is filled first by an unbounded engine: a
    bounded store lists its domain's directories (all 256 with one domain), a few milliseconds
    each on JuiceFS (BENCHMARKS.md), so filling a bounded root costs about 16,000 directory
    listings whatever its capacity; the writers then evict on every store."""
    report: list[str] = [place.label]
    shared = place.shared
    for capacity_files, jobs_per_writer in ((512, 14),) if shared else ((48, 40), (512, 70)):
        roots = place.roots(f"root{capacity_files}")
        root = roots[0]
        capacity = capacity_files * FILE_BYTES
        prefill = list(range(900_000, 900_000 + capacity_files)) if shared else []
        if prefill:
            filler = Engine(root, num_blocks=64)
            try:
                assert all(outcome.success for outcome in filler.store_all(jobs_of(prefill, 64)))
            finally:
                filler.close()
        options: dict[str, Any] = {"capacity_bytes": capacity, "n_write_threads": 4}
        per_job, in_flight, writers = 4, 4, 3
        counters: SynchronizedArray[int] = SPAWN.Array("q", 2 * writers)
        processes = [
            start_writer(
                roots[w % len(roots)],
                options,
                jobs_of(range(100_000 * w, 100_000 * w + jobs_per_writer * per_job), per_job),
                in_flight,
                counters=counters,
                index=w,
                result_path=tmp_path / f"writer{capacity_files}-{w}.json",
            )
            for w in range(writers)
        ]
        sampler = RootSampler(root, counters, writers)
        sampler.start()
        exit_codes = [joined(process) for process in processes]
        sampler.done.set()
        sampler.join()
        assert exit_codes == [0] * writers
        summaries = [read_json(tmp_path / f"writer{capacity_files}-{w}.json") for w in range(writers)]
        assert sum(s["failed"] for s in summaries) == 0
        over = [(total - capacity, blocks * FILE_BYTES) for total, blocks, _ in sampler.samples]
        assert len(over) > (2 if shared else 20)  # a scan of the whole root takes JuiceFS about 1 s
        beyond = [(i, sample) for i, sample in enumerate(sampler.samples) if sample[0] - capacity > sample[1] * FILE_BYTES]
        assert not beyond, (len(over), beyond[:10])
        final_bytes, blocks, tmps = scan_root(root)
        assert tmps == []
        written = writers * jobs_per_writer * per_job + len(prefill)
        # Each block written is either in the root or was evicted once (by one engine).
        assert len(blocks) + sum(s["evicted"] for s in summaries) == written
        peak = max(excess for excess, _ in over)
        report.append(
            f"{domains_for(capacity, FILE_BYTES)} domain(s): {len(over)} samples, peak over "
            f"capacity {peak} B ({peak / FILE_BYTES:+.0f} files), in-flight bound at that sample "
            f"{max(over)[1]} B, largest in-flight bound {max(b for _, b in over)} B, final "
            f"{final_bytes - capacity:+d} B"
        )
        assert final_bytes <= capacity, report[-1]
    print("\n".join(report))


def test_racing_writers_leave_the_root_within_capacity_once_their_jobs_finished(
    engines: list[EngineProcess], place: Place
) -> None:
    roots = place.roots()
    root = roots[0]
    capacity = 10 * FILE_BYTES
    open_all(engines[:2], roots, capacity_bytes=capacity, n_write_threads=1)
    assert engines[0].call("store", list(range(10)))  # full
    over: list[int] = []
    trials = 10 if place.shared else 40  # each store lists 256 directories: slow on JuiceFS
    for trial in range(trials):
        # Both store a new block at once: each must make room for the other's too.
        assert run_all(engines[:2], "store", [[1000 + 2 * trial], [1001 + 2 * trial]]) == [True, True]
        total = scan_root(root)[0]  # nothing in flight now
        if total > capacity:
            over.append(total - capacity)
    assert over == [], f"{len(over)}/{trials} trials ended over capacity (no job in flight)"


def test_eviction_is_lru_across_engines_in_one_domain(engines: list[EngineProcess], tmp_path: Path) -> None:
    root = tmp_path / "root"
    capacity_files = 16
    assert domains_for(capacity_files * FILE_BYTES, FILE_BYTES) == 1  # exact LRU
    open_all(engines[:3], [root], capacity_bytes=capacity_files * FILE_BYTES)
    a, b, c = engines[:3]
    for number in range(capacity_files):  # oldest first, each with its own mtime
        assert a.call("store", [number])
        time.sleep(0.02)
    assert_loaded([b.call("load", [0])])  # a load in B is a use
    b.call("touch", [1])  # so is a touch in B
    c.call("touch", [2])  # or in C
    time.sleep(0.02)
    for number in range(100, 106):  # six blocks more: six evicted, by A
        assert a.call("store", [number])
        time.sleep(0.02)
    expected = [True] * 3 + [False] * 6 + [True] * 7 + [True] * 6
    numbers = [*range(capacity_files), *range(100, 106)]
    for engine in (a, b, c):
        assert engine.call("lookup", numbers) == expected
    assert a.call("evicted") == 6
    assert_loaded(c.call("load_all", [[0, 1, 2], list(range(9, 16))]))


def test_eviction_is_approximately_lru_across_engines_in_many_domains(
    engines: list[EngineProcess], tmp_path: Path
) -> None:
    """With several domains an eviction takes the least recently used file of its domain, which
    is among the oldest `domains` files of the root in expectation (the capacity module's
    promise): measured on each eviction of a full root whose files have distinct ages."""
    root = tmp_path / "root"
    capacity_files = 256
    capacity = capacity_files * FILE_BYTES
    domains = domains_for(capacity, FILE_BYTES)
    assert domains == 4
    open_all(engines[:2], [root], capacity_bytes=capacity)
    a, b = engines[:2]
    stored: list[Outcome] = a.call("store_all", jobs_of(range(400), 16))
    assert all(outcome.success for outcome in stored)  # every domain at its share now
    first = time.time_ns()
    time.sleep(0.3)
    names = {Path(a.call("block_path", n)).name: n for n in range(400)}
    paths = {name: run_dir(root) / name[:2] / name for name in names}
    # Every file used once, in a random order, at distinct times in the last 0.3 s (as any
    # engine's loads would have marked them).
    order = [name for name in names if paths[name].exists()]
    random.Random(5).shuffle(order)
    for age, name in enumerate(order):
        stamp = first + age * 1_000_000
        os.utime(paths[name], ns=(stamp, stamp))
    used = random.Random(6).sample(order, len(order) // 4)
    assert_loaded(b.call("load_all", jobs_of([names[name] for name in used], 16)))  # uses in B
    ranks: list[int] = []

    def domain(name: str) -> int:
        return int(name[:2], 16) * domains // FANOUT

    for number in range(1000, 1064):  # one store, about one eviction, at a time
        ages = {entry.name: entry.stat().st_mtime_ns for entry in run_dir(root).glob("*/*.kvb")}
        assert a.call("store", [number])
        for victim in (name for name in ages if not (run_dir(root) / name[:2] / name).exists()):
            # Exact within its domain: no file of the domain was older.
            same_domain = [age for name, age in ages.items() if domain(name) == domain(victim)]
            assert min(same_domain) == ages[victim]
            assert victim not in used, "a block used in another engine went before older ones"
            ranks.append(sum(age < ages[victim] for age in ages.values()))
    assert len(ranks) >= 60
    # Across the root: on average among the oldest tenth of its files (a simulation of
    # 4-64 domains of 64 files gives 4-7%, 4-5% here).
    mean = sum(ranks) / len(ranks)
    assert mean <= capacity_files / 10, ranks
    print(
        f"\n{domains} domains: {len(ranks)} evictions; victim's age rank in the root (0 = the "
        f"least recently used of {capacity_files} files): mean {mean:.1f}, max {max(ranks)}, "
        f"rank 0 in {ranks.count(0)}"
    )


def test_loads_racing_evictions_in_another_engine_never_report_wrong_bytes(tmp_path: Path, place: Place) -> None:
    """On two mounts the loaders' host reads files the writer's host evicts: JuiceFS fails such
    a read with ENOENT, a miss (never wrong bytes, and the block is not barred afterwards)."""
    roots = place.roots()
    capacity_files = 8
    options: dict[str, Any] = {"capacity_bytes": capacity_files * FILE_BYTES}
    hot = [1, 2]
    jobs: list[list[int]] = []
    filler = 1000
    rounds = 3 if place.shared else 50  # each store lists 256 directories: slow on JuiceFS
    for _round in range(rounds):  # each round stores the hot blocks, then evicts them
        jobs += [[1], [2]]
        for _ in range(2):
            jobs.append(list(range(filler, filler + capacity_files)))
            filler += capacity_files
    stop = SPAWN.Event()
    loaders = [
        start_loader(roots[-1], options, hot, per_job, stop, tmp_path / f"loader{per_job}.json", per_job)
        for per_job in (1, 2)
    ]
    time.sleep(1.0)  # loaders up (before the root exists: they create it)
    writer = start_writer(roots[0], options, jobs, 1, result_path=tmp_path / "writer.json")
    assert joined(writer) == 0
    stop.set()
    assert [joined(loader) for loader in loaders] == [0, 0]
    summary = read_json(tmp_path / "writer.json")
    assert summary["failed"] == 0 and summary["evicted"] >= 2 * rounds
    results = [read_json(tmp_path / f"loader{per_job}.json") for per_job in (1, 2)]
    assert [r["wrong"] for r in results] == [[], []]
    assert sum(r["ok"] for r in results) > 0 and sum(r["failed"] for r in results) > 0, results
    print(f"\n{place.label}: loads racing evictions: {results}, writer {summary}")


# --- 3. faults with many engines ---


@pytest.mark.parametrize("capacity_files", [None, 512])
def test_writers_killed_mid_store_while_others_load(tmp_path: Path, place: Place, capacity_files: int | None) -> None:
    """Writers killed mid-store (six; three on two mounts) while two engines load: no wrong bytes, no exception; the
    dead writers' temporary files are gone once a later engine lists the root after
    `stale_tmp_s`, and (unbounded) a later engine on each host finds every block a dead writer
    reported stored. On two mounts, writers, loaders and later engines alternate between them."""
    options: dict[str, Any] = {
        "stale_tmp_s": 1.0,
        "n_write_threads": 4,
        "capacity_bytes": None if capacity_files is None else capacity_files * FILE_BYTES,
    }
    waves = 1 if place.shared else 2  # JuiceFS stores slower: one wave kills enough
    report = kill_writers_while_loading(
        place.roots(), tmp_path, options, waves=waves, writers_per_wave=3, seed=capacity_files or 1, check_at_most=500
    )
    assert report.kills == 3 * waves and report.dead_tmps > 0  # killed in the middle of stores
    assert [loader["wrong"] for loader in report.loaders] == [[], []]
    assert all(loader["loaded"] > 0 for loader in report.loaders), report.loaders
    assert report.after_sweep == []
    assert report.missing == [] and report.lookups_wrong == 0
    assert report.wrong == [] and report.failed_loads == 0
    print(
        f"\n{place.label}, capacity {capacity_files}: {report.kills} SIGKILLs, {report.dead_tmps} temporary "
        f"files of killed writers seen at their deaths, {report.left} left once all were dead, "
        f"{len(report.after_sweep)} after a later engine's sweep; {report.stored} blocks "
        f"reported stored, {report.checked} loaded back, 0 wrong; loaders {report.loaders}"
    )


def wait_stopped(pid: int) -> None:
    """Wait until every thread of a process sent SIGSTOP is stopped (a thread running on
    another core goes on for a moment after `kill` returns)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states: list[str] = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):
                stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
                states.append(stat.rsplit(")", 1)[1].split()[0])
        if states and all(state in "tT" for state in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop")


def test_a_paused_writer_whose_temporary_files_went_stale_reports_only_blocks_stored(
    tmp_path: Path,
) -> None:
    """A writer stopped (SIGSTOP) in the middle of its stores for longer than `stale_tmp_s`
    loses its temporary files to another engine's sweep; resumed, it must not report those
    blocks stored: every block it reports is there, with its bytes."""
    root = tmp_path / "root"
    options: dict[str, Any] = {"stale_tmp_s": 1.0, "n_write_threads": 4}
    log = tmp_path / "writer.log"
    go, ready = SPAWN.Event(), SPAWN.Semaphore(0)
    jobs = jobs_of(range(200_000), 8)
    writer = SPAWN.Process(
        target=fs_engines.store_stream,
        args=(str(root), options, jobs, 4, None, 0, str(log), None, go, ready),
        daemon=True,
    )
    writer.start()
    assert writer.pid is not None and ready.acquire(timeout=60)
    go.set()
    try:
        while not (log.exists() and log.stat().st_size > 0):
            assert writer.is_alive()
            time.sleep(0.005)
        caught: list[str] = []
        for _attempt in range(50):  # stop it until it is stopped in the middle of a write
            time.sleep(random.uniform(0.005, 0.03))
            os.kill(writer.pid, signal.SIGSTOP)
            wait_stopped(writer.pid)
            caught = [path for path in scan_root(root)[2] if f"-{writer.pid}-" in path]
            if caught:
                break
            os.kill(writer.pid, signal.SIGCONT)
        assert caught
        time.sleep(1.3)
        later = Engine(root, **options)
        try:
            later.drain()  # its start-up sweep removes them: the writer looks dead
            assert not any(os.path.exists(path) for path in caught)
            os.kill(writer.pid, signal.SIGCONT)
            time.sleep(0.3)
            os.kill(writer.pid, signal.SIGKILL)
            writer.join()
            raw = log.read_bytes()
            stored = sorted({int.from_bytes(raw[i : i + 8], "big") for i in range(0, len(raw) - 7, 8)})
            assert later.lookup(stored) == [True] * len(stored)
            assert_loaded(later.load_all(jobs_of(stored[-512:], 16)))
            # The blocks whose temporary files were removed were neither stored nor reported.
            lost = {os.path.basename(path).split(".")[0] + ".kvb" for path in caught}
            assert not any(os.path.exists(run_dir(root) / name[:2] / name) for name in lost)
            assert not lost & {os.path.basename(later.block_path(n)) for n in stored}
        finally:
            later.close()
    finally:
        if writer.is_alive():
            os.kill(writer.pid, signal.SIGKILL)
            writer.join()


@pytest.mark.parametrize("capacity_files", [None, 64])
def test_stale_temporary_files_are_removed_only_once_stale(
    tmp_path: Path, engines: list[EngineProcess], capacity_files: int | None
) -> None:
    root = tmp_path / "root"
    options: dict[str, Any] = {
        "stale_tmp_s": 2.0,
        "capacity_bytes": None if capacity_files is None else capacity_files * FILE_BYTES,
    }
    open_all(engines[:1], [root], **options)
    assert engines[0].call("store", [1, 2, 3])
    block = Path(engines[0].call("block_path", 1))
    fresh = block.parent / f"{block.name}.otherhost-4242-deadbeef.tmp"
    stale = block.parent / f"{block.name}.otherhost-4343-deadbeef.tmp"
    for path in (fresh, stale):
        path.write_bytes(bytes(FILE_BYTES // 2))
    past = time.time() - 3.0
    os.utime(stale, (past, past))
    engines[1].call("open", str(root), **options)  # starts with a sweep of every directory
    engines[1].call("drain")
    assert fresh.exists() and not stale.exists()
    os.utime(fresh, (past, past))
    engines[2].call("open", str(root), **options)
    engines[2].call("drain")
    assert not fresh.exists()
    assert_loaded([engines[2].call("load", [1, 2, 3])])


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Generator[bool]:
    """Mount a tmpfs of `size` at `path`; yield whether it was mounted (False: not allowed)."""
    path.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            check=False,
        ).returncode == 0
    except OSError:
        mounted = False
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.parametrize("capacity_files", [None, 4096])
def test_a_full_disk_fails_stores_and_keeps_serving_loads(
    tmp_path: Path, engines: list[EngineProcess], capacity_files: int | None
) -> None:
    options: dict[str, Any] = {
        "capacity_bytes": None if capacity_files is None else capacity_files * FILE_BYTES
    }
    with small_filesystem(tmp_path / "mnt", "4m") as mounted:
        root = tmp_path / "mnt" / "root"
        a, b, c = engines[:3]
        open_all([a, b], [root], **options)
        if not mounted:  # no tmpfs allowed here: writes fail as on a full disk, past a point
            for engine in (a, b):
                engine.call("fill_disk_after", 150)
        # A and B store at once, 800 files of 8 KiB in all: more than 4 MiB.
        mine = {a: list(range(400)), b: list(range(1000, 1400))}
        results = run_all([a, b], "store_all", [jobs_of(mine[a], 8), jobs_of(mine[b], 8)])
        outcomes: list[Outcome] = [outcome for result in results for outcome in result]
        ok = [n for outcome in outcomes if outcome.success for n in outcome.keys]
        failed_jobs = [outcome for outcome in outcomes if not outcome.success]
        assert ok and failed_jobs, (len(ok), len(failed_jobs))
        assert all(not result[-1].success for result in results)  # both ran out of room
        _bytes, blocks, tmps = scan_root(root)
        assert tmps == []  # failed writes leave nothing behind
        numbers = mine[a] + mine[b]
        paths = [Path(a.call("block_path", n)) for n in numbers]
        for engine in (a, b):
            assert engine.call("lookup", numbers) == [path.exists() for path in paths]
        assert len(blocks) == sum(path.exists() for path in paths)
        # Loads of what is stored still work on the full disk, in any engine, new ones too.
        assert_loaded(a.call("load_all", jobs_of(ok, 8)) + b.call("load_all", jobs_of(ok, 8)))
        c.call("open", str(root), **options)  # a new engine on the full disk
        assert_loaded(c.call("load_all", jobs_of(ok[:64], 8)))
        # Room made by hand: stores work again.
        for path in paths[:40]:
            path.unlink(missing_ok=True)
        if not mounted:
            a.call("fill_disk_after", None)
        assert a.call("store", [5000, 5001, 5002, 5003])  # the disk had room again
        assert_loaded([b.call("load", [5000, 5001, 5002, 5003])])
        for engine in (a, b, c):
            engine.call("close")
        print(f"\nfull disk (capacity {capacity_files}): {len(ok)} blocks stored, {len(failed_jobs)} jobs failed")


DAMAGES: dict[str, tuple[int, int]] = {
    # kind: (block number, what) where what >= 0 flips that byte and < 0 truncates to -what - 1
    "payload first byte": (10, 4096),
    "payload last byte": (11, 4096 + BLOCK_BYTES - 1),
    "magic": (12, 0),
    "format field": (13, 8),
    "payload length field": (14, 16),
    "header checksum": (15, 24),
    "record checksum": (16, 32),
    "key": (17, 45),
    "truncated payload": (18, -(4096 + 100) - 1),
    "truncated header": (19, -100 - 1),
    "emptied": (20, -1),
}


def damage(path: Path, what: int) -> None:
    if what < 0:
        os.truncate(path, -what - 1)
        return
    with open(path, "r+b") as file:
        file.seek(what)
        byte = file.read(1)
        file.seek(what)
        file.write(bytes([byte[0] ^ 0x5A]))


# On two mounts unbounded only: with a capacity under 128 files every store lists all 256
# directories, slow on JuiceFS, and the bounded root adds nothing across hosts here.
@pytest.mark.parametrize(
    ("place", "capacity_files"), [("disk", None), ("disk", 64), ("two-mounts", None)], indirect=["place"]
)
def test_a_damaged_block_file_fails_its_load_and_is_gone_for_every_engine(
    place: Place, engines: list[EngineProcess], capacity_files: int | None
) -> None:
    """On two mounts, B (on the other mount) finds the damage done through A's, and A and C
    see the file gone once their mount's caches expire."""
    a, b, c = open_three(place.roots(), engines, capacity_files)
    damaged = [number for number, _what in DAMAGES.values()]
    extras = {"grown": 21, "another block's file": 22}
    numbers = [*damaged, *extras.values(), 1, 2, 30]
    assert a.call("store", numbers)
    paths = {n: Path(a.call("block_path", n)) for n in numbers}
    for number, what in DAMAGES.values():
        damage(paths[number], what)
    with open(paths[21], "ab") as file:
        file.write(bytes(4096))
    shutil.copyfile(paths[30], paths[22])  # a whole, valid file of block 30 under 22's name
    bad = [*damaged, *extras.values()]
    for engine in (a, b, c):  # the files are there: hits until a load reads them
        assert engine.call("lookup", bad) == [True] * len(bad)
    outcomes: list[Outcome] = b.call("load_all", [[n] for n in bad])
    assert [(o.success, o.loaded, o.wrong) for o in outcomes] == [(False, (), ())] * len(bad)
    # Deleted: a miss for everyone.
    eventually(lambda: not any(paths[n].exists() for n in bad), place.stale_s)
    for engine in (a, b, c):
        eventually(lambda: engine.call("lookup", bad) == [False] * len(bad), place.stale_s)
    assert c.call("load", bad[:4]).loaded == ()
    # A job mixing a damaged block and good ones loads the good ones, and says so.
    assert a.call("store", [40])
    damage(Path(a.call("block_path", 40)), 4096 + 7)
    mixed: Outcome = c.call("load", [1, 40, 2])
    assert (mixed.success, mixed.loaded, mixed.wrong) == (False, (1, 2), ())
    # Stored again, they load again.
    assert a.call("store", [*bad, 40])
    assert_loaded([b.call("load", [*bad, 40]), c.call("load", numbers)])


@pytest.mark.parametrize("capacity_files", [None, 64])
def test_files_and_directories_deleted_by_hand(
    tmp_path: Path, engines: list[EngineProcess], capacity_files: int | None
) -> None:
    root = tmp_path / "root"
    a, b, c = open_three([root], engines, capacity_files)
    numbers = list(range(48))
    assert a.call("store", numbers)
    paths = {n: Path(a.call("block_path", n)) for n in numbers}
    paths[0].unlink()
    gone_dir = paths[1].parent
    shutil.rmtree(gone_dir)
    gone = [n for n in numbers if paths[n].parent == gone_dir or n == 0]
    kept = [n for n in numbers if n not in gone]
    for engine in (a, b, c):
        assert engine.call("lookup", numbers) == [n in kept for n in numbers]
    outcomes: list[Outcome] = b.call("load_all", [[n] for n in gone])
    assert [(o.success, o.loaded, o.wrong) for o in outcomes] == [(False, (), ())] * len(gone)
    assert_loaded(c.call("load_all", jobs_of(kept, 8)))
    assert a.call("store", numbers)  # stored again: the directory is made again
    assert gone_dir.is_dir()
    assert_loaded([b.call("load", gone)])
    # Every fan-out directory deleted under running engines.
    for directory in root.iterdir():
        if directory.is_dir():
            shutil.rmtree(directory)
    for engine in (a, b, c):
        assert engine.call("lookup", numbers) == [False] * len(numbers)
    assert c.call("load", numbers[:8]).loaded == ()
    assert b.call("store", numbers)
    assert_loaded([a.call("load", numbers), c.call("load", numbers)])


GARBLED_CONFIGS: dict[str, bytes] = {
    "not UTF-8": b"\xff\xfe{",
    "NUL bytes": b"\x00\x01\x02",
    "empty": b"",
    "cut short": b'{"format": 4, "block_',
    "a huge number": b"9" * 5000,
    "deeply nested": b"[" * 100_000,
    "another block size": json.dumps({"format": 4, "block_bytes": 2 * BLOCK_BYTES}).encode(),
}


@pytest.mark.parametrize("garbage", list(GARBLED_CONFIGS.values()), ids=list(GARBLED_CONFIGS))
def test_a_garbled_config_file_is_refused_naming_the_file(tmp_path: Path, garbage: bytes) -> None:
    root = tmp_path / "root"
    run_dir(root).mkdir(parents=True)
    config = run_dir(root) / CONFIG_FILE_NAME
    config.write_bytes(garbage)
    with pytest.raises(TierRootError, match=re.escape(str(config))):
        Engine(root)
    assert config.read_bytes() == garbage  # left as found


@settings(max_examples=40, deadline=None)
@given(garbage=st.binary(max_size=48))
def test_any_garbled_config_file_is_refused_naming_the_file(garbage: bytes) -> None:
    root = Path(tempfile.mkdtemp(prefix="kvref-fs-config-"))
    try:
        config = run_dir(root) / CONFIG_FILE_NAME
        config.parent.mkdir()
        config.write_bytes(garbage)
        with pytest.raises(TierRootError, match=re.escape(str(config))):
            Engine(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- 4. three tiers in one process, one root: a state machine ---

MACHINE_BLOCKS = list(range(20))
MACHINE_CAPACITY_FILES = 10
MACHINE_DAMAGES = [4096, 4096 + BLOCK_BYTES - 1, 0, 24, 32, 45, -(4096 + 512) - 1, -1]


class SharedRootMachine(RuleBasedStateMachine):
    """Three tiers sharing a bounded root. After every step: a load reported successful held
    exactly the stored bytes; the root is within its capacity (no jobs are in flight then);
    every tier's lookups say whether the block's file exists; and every block file that
    vanished without being deleted or damaged by hand was evicted by exactly one tier."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="kvref-fs-engines-"))
        options: dict[str, Any] = {
            "capacity_bytes": MACHINE_CAPACITY_FILES * FILE_BYTES,
            "n_read_threads": 1,
            "n_write_threads": 2,
        }
        self.engines = [Engine(self.root, num_blocks=16, **options) for _ in range(3)]
        self.paths = {n: Path(self.engines[0].block_path(n)) for n in MACHINE_BLOCKS}
        self.present: set[int] = set()
        self.evicted = 0
        self.damaged: set[int] = set()

    @override
    def teardown(self) -> None:
        for engine in self.engines:
            engine.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def files(self) -> set[int]:
        return {n for n, path in self.paths.items() if path.exists()}

    def settle(self, stored: set[int]) -> None:
        """Account for a step that stored `stored`: what vanished was evicted."""
        now = self.files()
        evicted = sum(engine.evicted() for engine in self.engines)
        vanished = (self.present | stored) - now
        assert len(vanished) == evicted - self.evicted, (vanished, evicted - self.evicted)
        self.evicted = evicted
        self.present = now
        self.damaged &= now

    @rule(
        engine=st.integers(0, 2),
        numbers=st.lists(st.sampled_from(MACHINE_BLOCKS), min_size=1, max_size=4, unique=True),
    )
    def store(self, engine: int, numbers: list[int]) -> None:
        ok = self.engines[engine].store(numbers)
        assert ok  # a job of at most 4 blocks always finds room among 10
        assert all(self.paths[n].exists() for n in numbers)
        self.settle(set(numbers))

    @rule(
        engines=st.lists(st.integers(0, 2), min_size=2, max_size=3, unique=True),
        numbers=st.lists(st.sampled_from(MACHINE_BLOCKS), min_size=1, max_size=4, unique=True),
        data=st.data(),
    )
    def store_at_once(self, engines: list[int], numbers: list[int], data: st.DataObject) -> None:
        jobs = [data.draw(st.permutations(numbers)) for _ in engines]
        for index, job in zip(engines, jobs):
            self.engines[index].submit(job, promotion=False)
        for index in engines:
            self.engines[index].drain()
        outcomes = [outcome for index in engines for outcome in self.engines[index].poll()]
        assert all(outcome.success for outcome in outcomes)
        self.settle(set(numbers))

    @rule(
        engine=st.integers(0, 2),
        numbers=st.lists(st.sampled_from(MACHINE_BLOCKS), min_size=1, max_size=4, unique=True),
    )
    def load(self, engine: int, numbers: list[int]) -> None:
        before = self.files()
        outcome = self.engines[engine].load(numbers)
        assert outcome.wrong == ()
        if outcome.success:
            assert before.issuperset(numbers) and not self.damaged.intersection(numbers)
        else:
            assert set(numbers) - before or self.damaged.intersection(numbers)
        assert not self.damaged.intersection(outcome.loaded)
        read_damaged = self.damaged.intersection(numbers)
        for number in read_damaged:
            assert not self.paths[number].exists()  # read, found damaged, deleted
        self.present -= read_damaged
        self.damaged -= read_damaged
        self.settle(set())

    @rule(
        engine=st.integers(0, 2),
        numbers=st.lists(st.sampled_from(MACHINE_BLOCKS), min_size=1, max_size=4, unique=True),
    )
    def touch(self, engine: int, numbers: list[int]) -> None:
        self.engines[engine].touch(numbers)
        self.settle(set())

    # Damage and deletion draw from every block, not from those present: which are present
    # depends on evictions that racing writers decide, and hypothesis needs the same draws
    # from the same choices.
    @rule(number=st.sampled_from(MACHINE_BLOCKS), what=st.sampled_from(MACHINE_DAMAGES))
    def damage(self, number: int, what: int) -> None:
        if number not in self.present or number in self.damaged:
            return  # a second flip of one byte could undo the first
        damage(self.paths[number], what)
        self.damaged.add(number)

    @rule(number=st.sampled_from(MACHINE_BLOCKS), whole_directory=st.booleans())
    def delete_by_hand(self, number: int, whole_directory: bool) -> None:
        if number not in self.present:
            return
        if whole_directory:
            shutil.rmtree(self.paths[number].parent)
        else:
            self.paths[number].unlink()
        self.present = self.files()
        self.damaged &= self.present

    @invariant()
    def root_within_capacity_and_lookups_match_files(self) -> None:
        total, _blocks, tmps = scan_root(self.root)
        assert tmps == []
        assert total <= MACHINE_CAPACITY_FILES * FILE_BYTES
        exists = [self.paths[n].exists() for n in MACHINE_BLOCKS]
        for engine in self.engines:
            assert engine.lookup(MACHINE_BLOCKS) == exists


TestSharedRootMachine = SharedRootMachine.TestCase
TestSharedRootMachine.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)


def test_block_content_differs_per_block() -> None:
    assert block_content(1) != block_content(2) and len(block_content(1)) == BLOCK_BYTES
