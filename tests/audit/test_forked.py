"""run_shares: the same answers as running the shares in turn, whatever a child does."""

from __future__ import annotations

import os
import signal
import threading

import pytest

import kvref.audit.runner.forked
from kvref.audit.runner.forked import fork_available, run_shares

needs_fork = pytest.mark.skipif(not fork_available(), reason="os.fork is not used on this platform")


def _encode(value: tuple[int, int]) -> bytes:
    return f"{value[0]},{value[1]}".encode()


def _decode(data: bytes) -> tuple[int, int]:
    first, second = data.decode().split(",")
    return int(first), int(second)


@needs_fork
def test_each_share_after_the_first_runs_in_its_own_child_and_results_keep_their_order() -> None:
    parent = os.getpid()
    results = run_shares([1, 2, 3, 4], lambda n: (n * n, os.getpid()), encode=_encode, decode=_decode)
    assert [square for square, _ in results] == [1, 4, 9, 16]
    pids = [pid for _, pid in results]
    assert pids[0] == parent
    assert len(set(pids[1:])) == 3 and parent not in pids[1:]


@needs_fork
def test_a_child_that_raises_is_recomputed_here() -> None:
    parent = os.getpid()

    def work(n: int) -> tuple[int, int]:
        if os.getpid() != parent and n == 2:
            raise RuntimeError("only in the child")
        return n, os.getpid()

    assert run_shares([1, 2, 3], work, encode=_encode, decode=_decode)[1] == (2, parent)


@needs_fork
def test_a_child_killed_by_a_signal_is_recomputed_here() -> None:
    parent = os.getpid()

    def work(n: int) -> tuple[int, int]:
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return n, os.getpid()

    assert run_shares([1, 2], work, encode=_encode, decode=_decode) == [(1, parent), (2, parent)]


@needs_fork
def test_an_answer_that_does_not_decode_is_recomputed_here() -> None:
    parent = os.getpid()

    def decode(data: bytes) -> tuple[int, int]:
        raise ValueError(f"refusing {data!r}")

    results = run_shares([5, 6], lambda n: (n, os.getpid()), encode=_encode, decode=decode)
    assert results == [(5, parent), (6, parent)]


@needs_fork
def test_an_exception_in_the_parents_share_propagates_and_leaves_no_child_behind() -> None:
    parent = os.getpid()

    def work(n: int) -> tuple[int, int]:
        if os.getpid() == parent:
            raise KeyError("parent share")
        return n, os.getpid()

    with pytest.raises(KeyError):
        run_shares([1, 2, 3], work, encode=_encode, decode=_decode)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # every child was reaped


def test_without_fork_the_shares_run_here_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvref.audit.runner.forked, "fork_available", lambda: False)
    parent = os.getpid()
    results = run_shares([1, 2, 3], lambda n: (n, os.getpid()), encode=_encode, decode=_decode)
    assert results == [(1, parent), (2, parent), (3, parent)]


def test_one_share_never_forks() -> None:
    assert run_shares([7], lambda n: (n, os.getpid()), encode=_encode, decode=_decode) == [
        (7, os.getpid())
    ]


def test_a_process_running_other_threads_does_not_fork() -> None:
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        assert not fork_available()
        parent = os.getpid()
        results = run_shares([1, 2], lambda n: (n, os.getpid()), encode=_encode, decode=_decode)
        assert results == [(1, parent), (2, parent)]
    finally:
        release.set()
        worker.join()
