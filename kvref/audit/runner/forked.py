"""Run the shares of one job at once: the first in this process, the others in forked copies.

The audit's checking phase reads one big in-memory index. Sending that index to worker
processes would cost more than the checks themselves, but a forked child already has it (the
pages are shared until written), so each child checks its share against its own copy and sends
back only its answer. The parent computes share 0 meanwhile.

A child that fails in any way (an exception, a signal, an answer that does not decode) costs
time, never correctness: the parent, whose state the children cannot touch, computes that
share itself. Where `os.fork` is missing or unsafe (Windows, macOS, a process running other
threads), `fork_available()` is False and the shares run here in turn.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

__all__ = ["fork_available", "run_shares"]

T = TypeVar("T")
R = TypeVar("R")


def fork_available() -> bool:
    """Whether `run_shares` forks here: on Linux (macOS frameworks are not fork-safe), in a
    process with one thread (a child forked while another thread holds a lock, an import's
    or a stream's, would wait for it forever)."""
    return (
        hasattr(os, "fork")
        and sys.platform.startswith("linux")
        and threading.active_count() == 1
    )


def _child(work: Callable[[], bytes], write_fd: int) -> NoReturn:
    """Compute and send one share, then leave without running any exit handler or flushing
    the parent's buffered output (it is the parent's to write)."""
    code = 1
    try:
        payload = work()
        with os.fdopen(write_fd, "wb") as stream:
            stream.write(payload)
        code = 0
    finally:
        os._exit(code)  # noqa: SLF001 - the documented way for a forked child to leave


def run_shares(
    shares: Sequence[T],
    work: Callable[[T], R],
    *,
    encode: Callable[[R], bytes],
    decode: Callable[[bytes], R],
) -> list[R]:
    """Return `[work(share) for share in shares]`, computing the shares at the same time.

    Args:
        shares: the inputs; share 0 is computed here, each other one in a forked child
            (in this process, one after the other, when `fork_available()` is False).
        work: computes one share. It runs in a copy of this process: what it changes there
            is lost, only its result comes back.
        encode, decode: turn a result into bytes in the child and back in the parent;
            `decode` may raise on bad data (the share is then recomputed here).

    Returns:
        The results, in the order of `shares`.
    """
    if len(shares) < 2 or not fork_available():
        return [work(share) for share in shares]
    children: list[tuple[int, int, int]] = []  # (share index, pid, read end of its pipe)
    try:
        for index in range(1, len(shares)):
            read_fd, write_fd = os.pipe()
            # Flushed first, or whatever Python buffered for them would be in two processes.
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                share = shares[index]
                _child(lambda: encode(work(share)), write_fd)
            os.close(write_fd)
            children.append((index, pid, read_fd))
        results: dict[int, R] = {0: work(shares[0])}
        while children:
            index, pid, read_fd = children.pop(0)
            stream = os.fdopen(read_fd, "rb")
            try:
                data = stream.read()
            except BaseException:
                _stop(pid)
                raise
            finally:
                stream.close()
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) == 0:
                try:
                    results[index] = decode(data)
                    continue
                except Exception:  # noqa: BLE001 - a bad answer is recomputed, not trusted
                    pass
            results[index] = work(shares[index])
        return [results[index] for index in range(len(shares))]
    finally:
        # Only after an exception here (Ctrl-C, say): stop and reap the children left.
        for _, pid, read_fd in children:
            os.close(read_fd)
            _stop(pid)


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass
