"""Engines for the multi-engine tests of the filesystem tier (`test_fs_engines.py`).

An `Engine` is what one vLLM engine holds: a `FileSystemSecondaryTier` over a page-aligned
primary (an anonymous mmap, as vLLM's shared offload region is), driven through the job API.
Block contents are a function of the key, so any engine can check any block it loads.

The rest runs in worker processes (started with the spawn context, so each is a fresh
interpreter with its own tier): `serve` answers commands sent over a pipe, `store_stream`
keeps a number of store jobs in flight at full speed, and `load_loop` loads until told to stop.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import random
import signal
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import SynchronizedArray
from multiprocessing.synchronize import Event, Semaphore
from pathlib import Path
from typing import Any, NamedTuple

import xxhash
from typing_extensions import Buffer

from kvref.base import OffloadKey, ReqContext, make_offload_key
from kvref.tiering.base import TransferJob
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.fs.format import file_bytes
from kvref.tiering.fs.root import BLOCK_SUFFIX, FANOUT, TMP_SUFFIX, block_name
from kvref.tiering.run_identity import run_identity
from kvref.tiering.tier_reporting import KvrefTierMetrics
from tests.tiering.helpers import holds, make_spec

__all__ = [
    "BLOCK_BYTES",
    "FILE_BYTES",
    "Engine",
    "KillReport",
    "Outcome",
    "block_content",
    "key_of",
    "kill_writers_while_loading",
    "load_loop",
    "run_dir",
    "scan_root",
    "serve",
    "store_stream",
    "temporary_files",
]

BLOCK_BYTES = 4096
"""A page: with the page-aligned primary the tier moves payloads with O_DIRECT and no copy."""
FILE_BYTES = file_bytes(12, BLOCK_BYTES)
"""The size of one block file of the 12-byte keys used here."""
CTX = ReqContext(req_id="engines")
ENGINE_SPEC = make_spec()
"""Every engine here serves the same model and layout: they share one run directory."""
_POISON = 0xEE


def run_dir(root: str | os.PathLike[str]) -> Path:
    """The directory the engines' tiers keep their blocks in under `root` (their run identity's)."""
    return Path(root) / run_identity(ENGINE_SPEC)


def key_of(number: int) -> OffloadKey:
    """The key of test block `number` (12 bytes, as `tests.tiering.helpers.to_key` makes)."""
    return make_offload_key(number.to_bytes(8, "big"), 0)


def block_content(number: int, size: int = BLOCK_BYTES) -> bytes:
    """The bytes block `number` always holds: distinct per block, cheap to make."""
    digest = xxhash.xxh3_128_digest(number.to_bytes(8, "big") + b"kvref-engines")
    return (digest * (size // len(digest) + 1))[:size]


class Outcome(NamedTuple):
    """A finished job as an engine saw it (picklable, for the test process).

    Attributes:
        job_id: the job.
        promotion: a load (else a store).
        keys: its block numbers.
        success: the job's result.
        loaded: loads only: the blocks reported loaded (all on success, else `successful_keys`).
        wrong: loads only: blocks reported loaded whose primary row does not hold their bytes.
    """

    job_id: int
    promotion: bool
    keys: tuple[int, ...]
    success: bool
    loaded: tuple[int, ...]
    wrong: tuple[int, ...]


class Engine:
    """One engine's tier over a page-aligned primary, with blocking and streaming job helpers.

    Args:
        root: the shared root directory (the blocks go under `run_dir(root)`).
        num_blocks: primary slots (the most blocks in flight at once).
        block_bytes: the primary's row size.
        options: keyword arguments of `FileSystemSecondaryTier`.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, num_blocks: int = 128, block_bytes: int = BLOCK_BYTES, **options: Any
    ) -> None:
        self.block_bytes = block_bytes
        self._map = mmap.mmap(-1, num_blocks * block_bytes)
        self._rows = memoryview(self._map)
        self._view = self._rows.cast("B", (num_blocks, block_bytes))
        options.setdefault("n_read_threads", 2)
        options.setdefault("n_write_threads", 2)
        try:
            self.tier = FileSystemSecondaryTier(ENGINE_SPEC, self._view, "fs", root_dir=root, **options)
        except BaseException:
            self._release()
            raise
        self._free = list(range(num_blocks - 1, -1, -1))
        self._evicted = 0
        self._jobs: dict[int, tuple[bool, tuple[int, ...], list[int]]] = {}
        self._next_job = 0

    # --- primary rows ---

    def _row(self, slot: int) -> memoryview:
        return self._rows[slot * self.block_bytes : (slot + 1) * self.block_bytes]

    @property
    def in_flight(self) -> int:
        """Jobs submitted and not yet reported finished."""
        return len(self._jobs)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    # --- jobs ---

    def submit(self, numbers: Sequence[int], *, promotion: bool) -> int:
        """Submit a store (rows filled with the blocks' bytes) or a load (rows poisoned)."""
        slots = [self._free.pop() for _ in numbers]
        for number, slot in zip(numbers, slots):
            if promotion:
                self._row(slot)[:] = bytes([_POISON]) * self.block_bytes
            else:
                self._row(slot)[:] = block_content(number, self.block_bytes)
        self._next_job += 1
        job_id = self._next_job
        self._jobs[job_id] = (promotion, tuple(numbers), slots)
        job = TransferJob(job_id, tuple(key_of(n) for n in numbers), tuple(slots), promotion, CTX)
        (self.tier.submit_load if promotion else self.tier.submit_store)(job)
        return job_id

    def poll(self) -> list[Outcome]:
        """Collect finished jobs, checking the rows of every block reported loaded."""
        outcomes: list[Outcome] = []
        for result in self.tier.get_finished_jobs():
            promotion, numbers, slots = self._jobs.pop(result.job_id)
            loaded: tuple[int, ...] = ()
            wrong: list[int] = []
            if promotion:
                if result.success:
                    loaded = numbers
                elif result.successful_keys is not None:
                    reported = set(result.successful_keys)
                    loaded = tuple(n for n in numbers if key_of(n) in reported)
                slot_of = dict(zip(numbers, slots))
                for number in loaded:
                    if bytes(self._row(slot_of[number])) != block_content(number, self.block_bytes):
                        wrong.append(number)
            self._free.extend(slots)
            outcomes.append(Outcome(result.job_id, promotion, numbers, result.success, loaded, tuple(wrong)))
        return outcomes

    def run(self, jobs: Sequence[Sequence[int]], *, promotion: bool) -> list[Outcome]:
        """Submit jobs together (as many at once as the primary has slots for), wait for all,
        and return their outcomes in submission order."""
        ids: list[int] = []
        outcomes: dict[int, Outcome] = {}
        pending = list(reversed(jobs))
        while pending:
            while pending and len(pending[-1]) <= len(self._free):
                ids.append(self.submit(pending.pop(), promotion=promotion))
            self.tier.drain_jobs()
            outcomes.update((outcome.job_id, outcome) for outcome in self.poll())
        return [outcomes[job_id] for job_id in ids]

    def store_all(self, jobs: Sequence[Sequence[int]]) -> list[Outcome]:
        return self.run(jobs, promotion=False)

    def load_all(self, jobs: Sequence[Sequence[int]]) -> list[Outcome]:
        return self.run(jobs, promotion=True)

    def store(self, numbers: Sequence[int]) -> bool:
        """Store blocks as one job; return its success."""
        return self.run([numbers], promotion=False)[0].success

    def load(self, numbers: Sequence[int]) -> Outcome:
        """Load blocks as one job."""
        return self.run([numbers], promotion=True)[0]

    # --- the rest of the tier's API ---

    def lookup(self, numbers: Sequence[int]) -> list[bool]:
        """Whether each block is a lookup hit here, for a new request (once checked)."""
        return holds(self.tier, [key_of(n) for n in numbers])

    def wait_hit(self, numbers: Sequence[int], timeout: float) -> float | None:
        """Seconds until every block is a lookup hit here, or None after `timeout`."""
        start = time.monotonic()
        while True:
            if all(self.lookup(numbers)):
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                return None
            time.sleep(0.005)

    def touch(self, numbers: Sequence[int]) -> None:
        self.tier.touch([key_of(n) for n in numbers], CTX)
        self.tier.drain_jobs()  # the marks are I/O tasks: done when this returns

    def drain(self) -> None:
        self.tier.drain_jobs()

    def evicted(self) -> int:
        """Blocks this engine evicted since it opened."""
        _, values = self.tier.get_stats().metric_sections()
        self._evicted += values.get(KvrefTierMetrics.CHUNKS_EVICTED, {}).get(("fs",), 0)
        return self._evicted

    def block_path(self, number: int) -> str:
        return self.tier.block_path(key_of(number))

    def direct(self) -> bool:
        return self.tier.direct

    def close(self) -> None:
        self.tier.shutdown()
        self._release()

    def _release(self) -> None:
        self._view.release()
        self._rows.release()
        self._map.close()


# --- worker processes ---


def serve(conn: Connection) -> None:
    """Answer `(method, args, kwargs)` commands with `("ok", value)` or `("error", traceback)`.

    `open` starts an `Engine` (closing the one before), `close` closes it, `exit` ends the
    process; any other command calls that `Engine` method.
    """
    engine: Engine | None = None
    while True:
        method, args, kwargs = conn.recv()
        try:
            if method == "exit":
                if engine is not None:
                    engine.close()
                conn.send(("ok", None))
                return
            if method == "open":
                if engine is not None:
                    engine.close()
                    engine = None
                engine = Engine(*args, **kwargs)
                value: object = os.getpid()
            elif method == "fill_disk_after":
                _fill_disk_after(*args)
                value = None
            elif method == "close":
                if engine is not None:
                    engine.close()
                engine = None
                value = None
            else:
                assert engine is not None, "no engine open"
                value = getattr(engine, method)(*args, **kwargs)
            conn.send(("ok", value))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


_real_pwritev = os.pwritev


def _fill_disk_after(writes: int | None) -> None:
    """Make this process's `os.pwritev` fail with ENOSPC after `writes` more calls (a full
    disk where no small filesystem can be mounted); None restores it."""
    if writes is None:
        os.pwritev = _real_pwritev
        return
    left = [writes]

    def pwritev(fd: int, buffers: Sequence[Buffer], offset: int, flags: int = 0) -> int:
        left[0] -= 1
        if left[0] < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _real_pwritev(fd, buffers, offset, flags)

    os.pwritev = pwritev


def store_stream(
    root: str,
    options: dict[str, Any],
    jobs: list[list[int]],
    jobs_in_flight: int,
    counters: SynchronizedArray[int] | None,
    counter_index: int,
    log_path: str | None,
    result_path: str | None,
    go: Event | None = None,
    ready: Semaphore | None = None,
) -> None:
    """Store `jobs` with up to `jobs_in_flight` in flight at all times (a writer at full speed).

    Args:
        root, options: the tier's root and options.
        jobs: the block numbers of each store job, in order.
        jobs_in_flight: jobs kept submitted at once.
        counters: shared counters: `[2 * counter_index]` blocks submitted, `+ 1` blocks whose
            jobs were reported finished (submitted is counted before the job is, finished after
            its result), so a sampler bounds the blocks in flight over any interval.
        log_path: the block numbers of every successful job are appended here (8 bytes each,
            one `write` per job, so a writer killed at any time leaves whole records).
        result_path: a JSON summary is written here at the end.
        go: if given, the engine is opened first and the stores start once it is set.
        ready: released once the engine is open.
    """
    per_job = max(len(job) for job in jobs)
    engine = Engine(root, num_blocks=jobs_in_flight * per_job, **options)
    if ready is not None:
        ready.release()
    if go is not None:
        go.wait()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log_path else None
    stored = failed = 0
    start = time.monotonic()
    pending = list(reversed(jobs))
    while pending or engine.in_flight:
        while pending and engine.in_flight < jobs_in_flight:
            numbers = pending.pop()
            if counters is not None:
                with counters.get_lock():
                    counters[2 * counter_index] += len(numbers)
            engine.submit(numbers, promotion=False)
        outcomes = engine.poll()
        for outcome in outcomes:
            if outcome.success:
                stored += 1
                if log is not None:
                    os.write(log, b"".join(n.to_bytes(8, "big") for n in outcome.keys))
            else:
                failed += 1
            if counters is not None:
                with counters.get_lock():
                    counters[2 * counter_index + 1] += len(outcome.keys)
        if not outcomes:
            time.sleep(0.0005)
    seconds = time.monotonic() - start
    evicted = engine.evicted()
    engine.close()
    if log is not None:
        os.close(log)
    if result_path:
        summary = {"stored": stored, "failed": failed, "evicted": evicted, "seconds": seconds}
        Path(result_path).write_text(json.dumps(summary))


def load_loop(
    root: str,
    options: dict[str, Any],
    numbers: list[int],
    per_job: int,
    stop: Event,
    result_path: str,
    seed: int,
) -> None:
    """Load random blocks of `numbers`, `per_job` a job, one job at a time, until `stop`; write
    a JSON summary: jobs, successes, failures, blocks reported loaded, and those of them whose
    bytes were wrong (with their numbers)."""
    engine = Engine(root, num_blocks=per_job, **options)
    rng = random.Random(seed)
    summary: dict[str, Any] = {"jobs": 0, "ok": 0, "failed": 0, "partial": 0, "loaded": 0, "wrong": []}
    while not stop.is_set():
        outcome = engine.load(rng.sample(numbers, min(per_job, len(numbers))))
        summary["jobs"] += 1
        summary["ok" if outcome.success else "failed"] += 1
        summary["partial"] += bool(not outcome.success and outcome.loaded)
        summary["loaded"] += len(outcome.loaded)
        summary["wrong"].extend(outcome.wrong)
        time.sleep(0.0005)  # two cores: leave some to the writers
    engine.close()
    Path(result_path).write_text(json.dumps(summary))


# --- writers killed mid-store while others load ---


def scan_root(root: Path) -> tuple[int, list[str], list[str]]:
    """The run directory's (`run_dir(root)`) file bytes (its fan-out directories' block and temporary files), its block
    file names and its temporary file paths.

    A file renamed from its temporary name while the directory is read may be listed under
    both names: it is counted once (same inode and block name).
    """
    seen: set[tuple[int, str]] = set()
    total = 0
    blocks: list[str] = []
    tmps: list[str] = []
    for index in range(FANOUT):
        try:
            with os.scandir(run_dir(root) / f"{index:02x}") as listing:
                entries = list(listing)
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # evicted or renamed meanwhile
            identity = (stat.st_ino, entry.name.split(".", 1)[0])
            if identity in seen:
                continue
            seen.add(identity)
            total += stat.st_size
            if entry.name.endswith(BLOCK_SUFFIX):
                blocks.append(entry.name)
            elif entry.name.endswith(TMP_SUFFIX):
                tmps.append(entry.path)
    return total, blocks, tmps


def temporary_files(root: Path) -> list[str]:
    """The temporary files in the root's fan-out directories."""
    return scan_root(root)[2]


class KillReport(NamedTuple):
    """What `kill_writers_while_loading` saw.

    Attributes:
        kills: writers killed with SIGKILL, each in the middle of its stores.
        dead_tmps: temporary files of killed writers found right after their deaths.
        left: temporary files in the root once every writer was dead.
        after_sweep: temporary files left after the later engines' start-up sweeps.
        stored: blocks the writers reported stored before they died.
        missing: blocks reported stored that a later engine misses (unbounded roots only).
        lookups_wrong: blocks whose lookup in a later engine disagrees with their file.
        loaders: the loaders' summaries (`load_loop`).
        checked: blocks the later engines loaded; `wrong` those of them with wrong bytes.
        wrong: see `checked`.
        failed_loads: blocks present in a later engine whose load failed.
    """

    kills: int
    dead_tmps: int
    left: int
    after_sweep: list[str]
    stored: int
    missing: list[int]
    lookups_wrong: int
    loaders: list[dict[str, Any]]
    checked: int
    wrong: list[int]
    failed_loads: int


def kill_writers_while_loading(
    roots: Sequence[Path],
    work_dir: Path,
    options: dict[str, Any],
    *,
    waves: int,
    writers_per_wave: int,
    seed: int,
    check_at_most: int = 2000,
) -> KillReport:
    """Writers store at full speed and are killed with SIGKILL at random moments of their
    stores while two loaders load; once `stale_tmp_s` passed, a later engine opens the root
    through each of `roots`.

    `roots` are one root as each mount of a shared volume shows it (one path: one host); the
    writers, the loaders and the later engines take them in turn, so on two mounts every block
    a writer stored is loaded through the other mount too. Each wave starts `writers_per_wave`
    writer processes, lets them store at once, waits until each reported a job stored, then
    kills them one by one at random moments. Writers store the 400 blocks the loaders load (in
    an order of their own), then blocks of their own, so they are always writing when killed.
    """
    from multiprocessing import get_context

    spawn = get_context("spawn")
    root = roots[0]
    universe = list(range(400))
    rng = random.Random(seed)
    stop = spawn.Event()
    loader_paths = [work_dir / f"loader{seed}-{i}.json" for i in range(2)]
    loaders = [
        spawn.Process(
            target=load_loop,
            args=(str(roots[(i + 1) % len(roots)]), options, universe, 4, stop, str(path), seed + i),
            daemon=True,
        )
        for i, path in enumerate(loader_paths)
    ]
    for loader in loaders:
        loader.start()
    logs: list[Path] = []
    dead_tmps: set[str] = set()
    kills = 0
    for _wave in range(waves):
        wave: list[tuple[Any, Path]] = []
        go = spawn.Event()
        ready = spawn.Semaphore(0)
        for _ in range(writers_per_wave):
            index = len(logs)
            log = work_dir / f"writer{seed}-{index}.log"
            logs.append(log)
            own = range(1_000_000 * (index + 1), 1_000_000 * (index + 1) + 100_000)
            jobs = [list(chunk) for chunk in _chunks([*rng.sample(universe, len(universe)), *own], 8)]
            process = spawn.Process(
                target=store_stream,
                args=(str(roots[index % len(roots)]), options, jobs, 4, None, 0, str(log), None, go, ready),
                daemon=True,
            )
            process.start()
            wave.append((process, log))
        for process, _log in wave:  # each opens the root, then waits for `go`
            if not ready.acquire(timeout=60):
                raise AssertionError(f"writer {process.pid} did not start: {process.exitcode}")
        go.set()
        for process, log in wave:
            deadline = time.monotonic() + 60
            while not (log.exists() and log.stat().st_size > 0):  # it is storing
                if not process.is_alive() or time.monotonic() > deadline:
                    raise AssertionError(f"writer {process.pid} ended: {process.exitcode}")
                time.sleep(0.005)
        for process, _log in wave:
            time.sleep(rng.uniform(0.0, 0.1))
            if not process.is_alive():
                raise AssertionError(f"writer {process.pid} ended: {process.exitcode}")
            os.kill(process.pid, signal.SIGKILL)
            process.join()
            if process.exitcode != -signal.SIGKILL:
                raise AssertionError(f"writer {process.pid} ended: {process.exitcode}")
            kills += 1
            dead_tmps.update(p for p in temporary_files(root) if f"-{process.pid}-" in p)
    stop.set()
    for loader in loaders:
        loader.join(120)
        if loader.exitcode != 0:
            raise AssertionError(f"loader {loader.pid} ended: {loader.exitcode}")
    summaries: list[dict[str, Any]] = [json.loads(path.read_text()) for path in loader_paths]
    stored: set[int] = set()
    for log in logs:
        raw = log.read_bytes() if log.exists() else b""
        stored.update(int.from_bytes(raw[i : i + 8], "big") for i in range(0, len(raw) - 7, 8))
    left = len(temporary_files(root))
    # Dead writers' temporary files are removed by the next engine that lists the directories
    # once they are older than `stale_tmp_s`.
    time.sleep(float(options.get("stale_tmp_s", 900.0)) + 0.2)
    numbers = sorted(stored)
    unbounded = options.get("capacity_bytes") is None
    missing: set[int] = set()
    lookups_wrong = checked = failed = 0
    wrong: list[int] = []
    after_sweep: list[str] = []
    for later_root in roots:
        later = Engine(later_root, **options)
        try:
            later.drain()  # its start-up sweep
            if later_root is root:
                after_sweep = temporary_files(root)
            hits = later.lookup(numbers)
            names = [block_name(key_of(n)) for n in numbers]
            files = [os.path.exists(run_dir(later_root) / name[:2] / name) for name in names]
            lookups_wrong += sum(hit != exists for hit, exists in zip(hits, files))
            missing.update(n for n, hit in zip(numbers, hits) if unbounded and not hit)
            present = [n for n, hit in zip(numbers, hits) if hit]
            present = [n for n in present if n < 400] + rng.sample(
                [n for n in present if n >= 400], min(check_at_most, sum(n >= 400 for n in present))
            )
            outcomes = later.load_all([chunk for chunk in _chunks(present, 16)])
            checked += len(present)
            wrong += [n for outcome in outcomes for n in outcome.wrong]
            failed += sum(len(outcome.keys) - len(outcome.loaded) for outcome in outcomes)
        finally:
            later.close()
    return KillReport(
        kills, len(dead_tmps), left, after_sweep, len(stored), sorted(missing), lookups_wrong,
        summaries, checked, wrong, failed,
    )


def _chunks(numbers: Sequence[int], size: int) -> list[list[int]]:
    return [list(numbers[i : i + size]) for i in range(0, len(numbers), size)]
