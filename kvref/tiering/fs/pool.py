"""The I/O thread pool of `FileSystemSecondaryTier`: a read queue and a write queue.

Read threads serve loads (promotions) first and write threads serve stores and deletions
first; each kind takes from the other queue when its own is empty, so a burst of stores never
starves promotions and no thread idles while work is queued. Submitting never waits on a lock
an I/O thread may hold.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["IOTask", "DualQueuePool", "default_threads"]


_DIRECT_THREADS_MIN = 16
_DIRECT_THREADS_MAX = 64
_DIRECT_FILES_IN_FLIGHT_BYTES = 32 << 20


def default_threads(*, read: bool, direct: bool, file_bytes: int) -> int:
    """I/O threads of one kind by default.

    With O_DIRECT a thread spends its time waiting on the device, not on a core, and (with the
    C extension) without the GIL, so the count is set by what the device needs in flight: all
    the threads together (a thread takes the other kind when its own queue is empty, so while
    only loads or only stores are queued every thread does them) hold block files of about
    32 MiB in all, at least 16 and at most 64 files. Small files need more of them: each one
    costs an open, a close and a round trip that moves no bytes while the next file waits. Large
    files need fewer: past about 16 requests of 1 MiB in flight, a device's queue only grows, and
    on the disk of `BENCHMARKS.md` cold loads of 2 MiB blocks were slower with 32 threads than
    with 16 (3.50 against 3.89 GB/s, medians of 5 rounds), while 256 KiB blocks loaded faster
    with 64 than with 32 (4.02 against 3.80 GB/s). So: 8 of each kind for blocks of 2 MiB and
    more, 16 for 1 MiB (vLLM's fs tier runs 16 of each at every size), 32 for 512 KiB and less.

    Without O_DIRECT: a read thread per usable core and a write thread per two, at least one
    and at most four of each. Reads and writes through the page cache are copying and hashing
    on a core; a thread beyond the cores only hands the GIL around and preempts a thread in the
    middle of its copy. Reads get a thread per core because a load is on a request's critical
    path and verifying it costs a hash pass over the bytes on top of the copy: a second reader
    hides that pass behind the first one's copy. Stores are asynchronous cascades, and read
    threads take writes whenever no load is queued.

    Args:
        read: count read threads (else write threads).
        direct: the tier uses O_DIRECT.
        file_bytes: the size of one block file.

    Returns:
        The number of threads.
    """
    if direct:
        files = -(-_DIRECT_FILES_IN_FLIGHT_BYTES // max(1, file_bytes))
        return max(_DIRECT_THREADS_MIN, min(_DIRECT_THREADS_MAX, files)) // 2
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        cores = os.cpu_count() or 2
    return max(1, min(4, cores if read else cores // 2))


class IOTask:
    """One unit of I/O for the pool; `run` and `cancel` never raise."""

    __slots__ = ("run", "cancel")

    def __init__(self, run: Callable[[], None], cancel: Callable[[], None]) -> None:
        self.run = run
        self.cancel = cancel


class DualQueuePool:
    """I/O threads over a read queue and a write queue; each thread prefers one queue.

    Submitting never waits on a lock an I/O thread may hold: a task is appended to its deque
    and a token to a `SimpleQueue`; a thread takes one token, then one task from its own queue
    or, if that is empty, from the other (there is always one: tasks go in before tokens).

    Args:
        n_read_threads: threads that take reads first.
        n_write_threads: threads that take writes first.
        name: the prefix of the threads' names.
    """

    def __init__(self, n_read_threads: int, n_write_threads: int, name: str) -> None:
        self._reads: deque[IOTask] = deque()
        self._writes: deque[IOTask] = deque()
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._closed = False
        self._submitted = 0  # written by the submitting thread only
        self._finished = 0  # under _idle
        self._idle = threading.Condition()
        self._threads = [
            threading.Thread(
                target=self._work, args=(prefer_reads,), name=f"{name}-{kind}{i}", daemon=True
            )
            for prefer_reads, kind, count in (
                (True, "r", n_read_threads),
                (False, "w", n_write_threads),
            )
            for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, task: IOTask, *, read: bool) -> None:
        """Queue `task` (cancelled at once after `shutdown`).

        Args:
            task: the work.
            read: queue it as a read (served first by read threads) or as a write.
        """
        if self._closed:
            task.cancel()
            return
        (self._reads if read else self._writes).append(task)
        self._submitted += 1
        self._tokens.put(True)

    def _work(self, prefer_reads: bool) -> None:
        own, other = (self._reads, self._writes) if prefer_reads else (self._writes, self._reads)
        while self._tokens.get():
            try:
                task = own.popleft()
            except IndexError:
                task = other.popleft()
            try:
                if self._closed:
                    task.cancel()
                else:
                    task.run()
            finally:
                with self._idle:
                    self._finished += 1
                    self._idle.notify_all()

    def drain(self) -> None:
        """Block until every task submitted so far has run or been cancelled."""
        with self._idle:
            while self._finished < self._submitted:
                self._idle.wait()

    def shutdown(self) -> None:
        """Let running tasks finish, cancel queued ones, and join the threads."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._tokens.put(False)  # after every queued task's token: those get cancelled
        for thread in self._threads:
            thread.join()
