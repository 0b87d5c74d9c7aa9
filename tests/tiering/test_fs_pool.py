"""The fs tier's I/O thread pool: which kind of thread takes which task, and that every task
runs (or, after shutdown, is cancelled) exactly once."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.tiering.fs.pool import DualQueuePool, IOTask


class Recorder:
    """Tasks that note which thread ran or cancelled them, optionally held at a gate."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran: list[tuple[str, str]] = []  # (task, thread name)
        self.cancelled: list[str] = []
        self.started = threading.Semaphore(0)

    def task(self, name: str, gate: threading.Event | None = None) -> IOTask:
        def run() -> None:
            self.started.release()
            if gate is not None:
                assert gate.wait(10)
            with self.lock:
                self.ran.append((name, threading.current_thread().name))

        def cancel() -> None:
            with self.lock:
                self.cancelled.append(name)

        return IOTask(run, cancel)

    def thread_of(self, name: str) -> str:
        with self.lock:
            return next(thread for task, thread in self.ran if task == name)

    def wait_for(self, name: str) -> bool:
        for _ in range(500):
            with self.lock:
                if any(task == name for task, _ in self.ran):
                    return True
            threading.Event().wait(0.01)
        return False


def kind(thread_name: str) -> str:
    """`r` or `w`: the kind of an I/O thread, from its name (`<prefix>-r3`)."""
    return thread_name.rsplit("-", 1)[1][0]


def test_reads_are_not_starved_by_writes() -> None:
    pool = DualQueuePool(1, 1, "test")
    recorder = Recorder()
    # One gate per write, so the test decides when each write may finish (no timing races).
    gates = [threading.Event() for _ in range(10)]
    for i in range(10):
        pool.submit(recorder.task(f"w{i}", gates[i]), read=False)
    # Both threads busy with writes: the read thread takes writes when no read is queued.
    assert recorder.started.acquire(timeout=10) and recorder.started.acquire(timeout=10)
    pool.submit(recorder.task("r"), read=True)
    gates[0].set()
    gates[1].set()
    assert recorder.wait_for("r")
    for gate in gates:
        gate.set()
    pool.drain()
    pool.shutdown()
    done = [task for task, _ in recorder.ran]
    # Only the two writes that were already running may finish before the read.
    assert set(done[: done.index("r")]) <= {"w0", "w1"}, done
    assert len(done) == 11


def test_without_read_threads_taking_writes_stores_stay_on_write_threads() -> None:
    """O_DIRECT's pool: as many writes in flight as write threads, and a load queued behind a
    burst of stores starts at once on a read thread."""
    pool = DualQueuePool(2, 1, "test", read_threads_take_writes=False)
    recorder = Recorder()
    gate = threading.Event()
    for i in range(5):
        pool.submit(recorder.task(f"w{i}", gate), read=False)
    assert recorder.started.acquire(timeout=10)
    assert not recorder.started.acquire(timeout=0.2)  # the two read threads took no write
    pool.submit(recorder.task("r"), read=True)
    assert recorder.wait_for("r") and kind(recorder.thread_of("r")) == "r"
    gate.set()
    pool.drain()
    pool.shutdown()
    assert sorted(task for task, _ in recorder.ran) == ["r", "w0", "w1", "w2", "w3", "w4"]
    assert {kind(thread) for task, thread in recorder.ran if task != "r"} == {"w"}


def test_write_threads_take_loads_when_no_store_is_queued() -> None:
    pool = DualQueuePool(1, 2, "test", read_threads_take_writes=False)
    recorder = Recorder()
    gate = threading.Event()
    for i in range(3):
        pool.submit(recorder.task(f"r{i}", gate), read=True)
    for _ in range(3):  # every thread holds a load
        assert recorder.started.acquire(timeout=10)
    gate.set()
    pool.drain()
    pool.shutdown()
    assert Counter(kind(thread) for _, thread in recorder.ran) == {"r": 1, "w": 2}


@settings(max_examples=40, deadline=None)
@given(
    readers=st.integers(1, 3),
    writers=st.integers(1, 3),
    read_threads_take_writes=st.booleans(),
    tasks=st.lists(st.booleans(), max_size=40),  # True: a read
    shutdown_after=st.integers(0, 40),
)
def test_every_task_runs_or_is_cancelled_exactly_once(
    readers: int,
    writers: int,
    read_threads_take_writes: bool,
    tasks: list[bool],
    shutdown_after: int,
) -> None:
    pool = DualQueuePool(readers, writers, "test", read_threads_take_writes=read_threads_take_writes)
    recorder = Recorder()
    gate = threading.Event()  # holds the first tasks, so that shutdown finds some queued
    names = [f"{'r' if read else 'w'}{i}" for i, read in enumerate(tasks)]
    for i, (name, read) in enumerate(zip(names, tasks)):
        if i == shutdown_after:
            threading.Timer(0.01, gate.set).start()
            pool.shutdown()
        pool.submit(recorder.task(name, gate if i < shutdown_after else None), read=read)
    gate.set()
    pool.drain()
    pool.shutdown()
    ran = [task for task, _ in recorder.ran]
    assert sorted(ran + recorder.cancelled) == sorted(names)
    assert all(name in recorder.cancelled for name in names[shutdown_after:])
    if shutdown_after >= len(tasks):
        assert not recorder.cancelled
    if not read_threads_take_writes:
        assert all(kind(thread) == "w" for task, thread in recorder.ran if task[0] == "w")


@pytest.mark.parametrize("read_threads_take_writes", [True, False])
def test_shutdown_joins_threads_of_both_kinds(read_threads_take_writes: bool) -> None:
    pool = DualQueuePool(3, 2, "test-join", read_threads_take_writes=read_threads_take_writes)
    pool.shutdown()
    assert not [t for t in threading.enumerate() if t.name.startswith("test-join-")]
