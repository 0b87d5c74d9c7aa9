"""The I/O thread pool of `FileSystemSecondaryTier`: a read queue and a write queue.

Read threads serve loads (promotions) and write threads serve stores (and the tier's other
writes: sweeps, marks of use) first. A write thread takes a load when no write is queued, so
a burst of stores never starves promotions and, while only loads are queued, every thread does
them. Whether a read thread takes a store when no load is queued depends on what bounds a
store: with O_DIRECT the device, which writes fastest with fewer requests in flight than it
reads with (`default_threads`), so no; through the page cache the cores, so yes. Submitting
never waits on a lock an I/O thread may hold.
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
_DIRECT_WRITERS_MIN = 2
_DIRECT_WRITES_IN_FLIGHT_BYTES = 16 << 20


def default_threads(*, read: bool, direct: bool, file_bytes: int) -> int:
    """I/O threads of one kind by default.

    With O_DIRECT a thread spends its time waiting on the device, not on a core, and (with the
    C extension) without the GIL, so the counts are set by what the device needs in flight.
    Small files need more threads: each file costs an open, a close and a round trip that moves
    no bytes while the next file waits. Large files need fewer: past what the device needs in
    flight, its queue only grows. Reads and writes differ:

    - Loads run on every thread (write threads take loads when no store is queued), which hold
      block files of about 32 MiB in all, at least 16 and at most 64 files. On the disk of
      `BENCHMARKS.md` cold loads of 2 MiB blocks were slower with 32 threads than with 16
      (3.50 against 3.89 GB/s, medians of 5 rounds), and 256 KiB blocks loaded faster with 64
      than with 32 (4.02 against 3.80 GB/s).
    - Pipelined stores (`FileSystemSecondaryTier` says where) run on the write threads alone,
      which hold block files of about 16 MiB in all, at least 2 and at most half of all
      threads. A device writes at full speed with fewer requests in flight than it reads
      with, and more writers only queue: on that disk plain
      writers of 1 MiB block files (create, write, rename; their checksums and copies on other
      threads, as the C path's pipeline does) reached 1.01x the device's large-file write
      bandwidth with 8 threads and 0.95x with 16. The tier's writers also stop between tasks
      (Python, renames), so they want more in flight than plain ones: stores of 2 MiB blocks
      reached 0.83x the device with 4 write threads, 0.91x with 8 and 0.89x with 16; of 1 MiB
      blocks 0.01-0.03x more with 16 than with 8 in each of four paired runs.

    So, of 64, 32 and 16 threads at 256 KiB, 1 MiB and 2 MiB blocks, 32, 16 and 8 write.

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
        size = max(1, file_bytes)
        total = max(_DIRECT_THREADS_MIN, min(_DIRECT_THREADS_MAX, -(-_DIRECT_FILES_IN_FLIGHT_BYTES // size)))
        writers = max(_DIRECT_WRITERS_MIN, min(total // 2, -(-_DIRECT_WRITES_IN_FLIGHT_BYTES // size)))
        return total - writers if read else writers
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

    Submitting never waits on a lock an I/O thread may hold: a task is appended to its deque,
    and a token to the `SimpleQueue` of each kind of thread that may take it. A thread takes
    one of its kind's tokens, then one task from its own queue or, if that is empty, from the
    other one if it may take those. A token may find no task (a thread of the other kind took
    it); a task always finds a thread: each kind holds a token for every queued task it may
    take.

    Args:
        n_read_threads: threads that take reads first.
        n_write_threads: threads that take writes first; they take reads too.
        name: the prefix of the threads' names.
        read_threads_take_writes: whether read threads take writes when no read is queued
            (else writes run on the write threads alone).
    """

    def __init__(
        self,
        n_read_threads: int,
        n_write_threads: int,
        name: str,
        *,
        read_threads_take_writes: bool = True,
    ) -> None:
        self._reads: deque[IOTask] = deque()
        self._writes: deque[IOTask] = deque()
        self._read_tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._write_tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._read_threads_take_writes = read_threads_take_writes
        self._counts = (n_read_threads, n_write_threads)
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
        self._write_tokens.put(True)
        if read or self._read_threads_take_writes:
            self._read_tokens.put(True)

    def _work(self, prefer_reads: bool) -> None:
        if prefer_reads:
            own, other, tokens = self._reads, self._writes, self._read_tokens
            take_other = self._read_threads_take_writes
        else:
            own, other, tokens = self._writes, self._reads, self._write_tokens
            take_other = True
        while tokens.get():
            try:
                task = own.popleft()
            except IndexError:
                if not take_other:
                    continue  # a write thread took this token's read
                try:
                    task = other.popleft()
                except IndexError:
                    continue  # a thread of the other kind took this token's task
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
        # After every queued task's tokens: those tasks get cancelled.
        for tokens, count in zip((self._read_tokens, self._write_tokens), self._counts):
            for _ in range(count):
                tokens.put(False)
        for thread in self._threads:
            thread.join()
