"""What the disk-tier benchmarks (`bench_tiering.py`, `bench_vllm_tiers.py`) share: a cold page
cache before every load phase, the device's own O_DIRECT bandwidth, the page-cache residency of a
tier's files, and figures over interleaved rounds with ratios paired per round.

Cold: `drop_page_cache` syncs, then, as root, writes `1` to `/proc/sys/vm/drop_caches` (the
page cache of the whole host: file data); otherwise it calls `posix_fadvise(DONTNEED)` on every
file under the roots it is given (their data pages too). Either way the file system's metadata
caches (dentries, inodes) stay, as they do for a running engine whose tier files were used
lately. `drop_caches_all` writes `3` instead, dropping dentries and inodes as well: the case of an
engine restarted on a root no process has touched since boot, where every block file's inode is
one more small read that a single large file does not pay. All print as `COLD_METHODS` says.

The device: `DirectFileBaseline` writes and reads plain large files with O_DIRECT in aligned
requests (1 MiB by default), one file and one thread per stream: one stream is `dd`'s pattern,
several keep several requests in flight, as a tier's I/O threads do. Each stream's buffer is on
transparent huge pages where the kernel grants them (`kvref.tiering.fs.huge_pages`): a device
takes a huge page as one segment and 4 KiB pages one by one, and on this project's virtio disk
that doubles what a plain reader gets, so a baseline on 4 KiB pages would understate the device.

`PlainBlockFiles` is the tier's own I/O pattern without the tier: a small C program
(`_plain_block_files.c`, built with the host's `cc` on first use) that writes and reads one
O_DIRECT file per block from huge-page staging, with or without the tier's per-block CPU work
(a checksum and a copy). It separates what the pattern and the work cost from what the tier adds.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kvref.tiering.fs.format import file_bytes
from kvref.tiering.fs.huge_pages import StagingBuffer, transparent_huge_pages
from kvref.tiering.fs.pool import default_threads

__all__ = [
    "COLD_CHOICES",
    "COLD_METHODS",
    "drop_page_cache",
    "files_under",
    "huge_pages_line",
    "DirectFileBaseline",
    "PlainBlockFiles",
    "resident_bytes",
    "Rounds",
    "SpentRoots",
    "rotated",
    "load_average",
    "process_cpu_s",
]

_DROP_CACHES = "/proc/sys/vm/drop_caches"
_O_DIRECT = getattr(os, "O_DIRECT", 0)

COLD_METHODS = {
    "drop_caches": "os.sync(), then 1 written to /proc/sys/vm/drop_caches (as root): the page cache",
    "drop_caches_all": (
        "os.sync(), then 3 written to /proc/sys/vm/drop_caches (as root): the page cache, dentries "
        "and inodes"
    ),
    "fadvise": "os.sync(), then posix_fadvise(DONTNEED) on every file of the tier roots",
}
"""How `drop_page_cache` made a phase cold, by the name it returns."""

COLD_CHOICES = ("auto", *COLD_METHODS)
"""The `--cold` choices of the disk benchmarks: "auto" is drop_caches as root, else fadvise."""

_DROP_CACHES_VALUE = {"drop_caches": "1", "drop_caches_all": "3"}


def files_under(roots: Iterable[Path]) -> list[str]:
    """Every regular file under the roots (the roots may be files themselves)."""
    paths: list[str] = []
    for root in roots:
        if root.is_file():
            paths.append(str(root))
            continue
        for directory, _dirs, names in os.walk(root):
            paths.extend(os.path.join(directory, name) for name in names)
    return paths


def drop_page_cache(roots: Sequence[Path], method: str = "auto") -> str:
    """Sync, then drop the page cache: all of it as root, else the roots' files' pages.

    Args:
        roots: directories (or files) whose cached pages must go.
        method: one of `COLD_CHOICES`: "auto" (drop_caches when root, else fadvise),
            "drop_caches", "drop_caches_all" (dentries and inodes too) or "fadvise".

    Returns:
        The method used, a key of `COLD_METHODS`.

    Raises:
        ValueError: an unknown method.
        PermissionError: a drop_caches method when not root.
    """
    if method not in COLD_CHOICES:
        raise ValueError(f"method must be one of {', '.join(COLD_CHOICES)}, got {method!r}")
    os.sync()
    forced = method in _DROP_CACHES_VALUE
    if (forced or method == "auto") and os.geteuid() == 0:
        name = method if forced else "drop_caches"
        try:
            with open(_DROP_CACHES, "w") as control:
                control.write(_DROP_CACHES_VALUE[name])
            return name
        except OSError:
            if forced:
                raise
    elif forced:
        raise PermissionError(f"writing {_DROP_CACHES} needs root")
    for path in files_under(roots):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile (a temporary file renamed into place)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise"


def huge_pages_line() -> str:
    """What the run's memory is on, for its header: it moves the figures by up to 2x."""
    if transparent_huge_pages():
        return (
            "transparent huge pages: granted on request; the device's O_DIRECT buffers and "
            "kvref's fs tier staging buffers are on huge pages"
        )
    return "transparent huge pages: off; every buffer is on 4 KiB pages"


class DirectFileBaseline:
    """The device's own O_DIRECT bandwidth: `streams` plain files of `total / streams` bytes,
    each written, then read, sequentially in `request`-byte aligned requests by its own thread.

    Args:
        directory: where the files go (on the device under test).
        total: bytes written and read per phase (rounded down to whole requests per stream).
        streams: files, threads and requests in flight.
        request: bytes per `pwrite`/`preadv` (a multiple of 4 KiB).
    """

    def __init__(self, directory: Path, total: int, streams: int, request: int = 1 << 20) -> None:
        if not _O_DIRECT:
            raise OSError("O_DIRECT is not available on this platform")
        self.streams = streams
        self.request = request
        self.stream_bytes = max(1, total // streams // request) * request
        self.total = self.stream_bytes * streams
        self.paths = [directory / f"o_direct-{streams}x-{index}.bin" for index in range(streams)]
        self._data = os.urandom(request)
        self.huge_pages = transparent_huge_pages()
        """Whether the streams' buffers are on huge pages."""

    def _run(self, flags: int, stream: Callable[[int, int, memoryview], None]) -> float:
        """Open each stream's file with `flags | O_DIRECT` and run `stream(index, fd, buffer)` on
        a thread of its own with a page-aligned buffer of one request; return the seconds taken.

        Raises:
            BaseException: the first failure of any stream, once all have ended.
        """
        failures: list[BaseException] = []

        def work(index: int) -> None:
            if self.huge_pages:
                staging = StagingBuffer(self.request, 0, self.request)
                buffer, release = staging.view, staging.close
            else:
                plain = mmap.mmap(-1, self.request)  # page-aligned, as O_DIRECT needs
                buffer = memoryview(plain)

                def release() -> None:
                    buffer.release()
                    plain.close()

            try:
                fd = os.open(self.paths[index], flags | _O_DIRECT, 0o644)
                try:
                    stream(index, fd, buffer)
                finally:
                    os.close(fd)
            except BaseException as exc:
                failures.append(exc)
            finally:
                release()

        started = time.perf_counter()
        if self.streams == 1:
            work(0)
        else:
            threads = [threading.Thread(target=work, args=(index,)) for index in range(self.streams)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        elapsed = time.perf_counter() - started
        if failures:
            raise failures[0]
        return elapsed

    def write(self) -> float:
        """Write the files afresh; return the seconds taken."""
        self.remove()

        def stream(index: int, fd: int, buffer: memoryview) -> None:
            buffer[:] = self._data
            for offset in range(0, self.stream_bytes, self.request):
                if os.pwrite(fd, buffer, offset) != self.request:
                    raise OSError(f"short O_DIRECT write to {self.paths[index]}")

        return self._run(os.O_WRONLY | os.O_CREAT | os.O_EXCL, stream)

    def read(self) -> float:
        """Read the files back; return the seconds taken."""

        def stream(index: int, fd: int, buffer: memoryview) -> None:
            for offset in range(0, self.stream_bytes, self.request):
                if os.preadv(fd, [buffer], offset) != self.request:
                    raise OSError(f"short O_DIRECT read of {self.paths[index]}")
            if bytes(buffer) != self._data:
                raise OSError(f"{self.paths[index]} read back other bytes")

        return self._run(os.O_RDONLY, stream)

    def remove(self) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)


# --- page-cache residency ---


def resident_bytes(paths: Sequence[str]) -> tuple[int, str]:
    """Bytes of the files' data in the page cache now, and the tool that counted them:
    util-linux `fincore` where it is installed, else `mincore(2)` directly."""
    fincore = shutil.which("fincore")
    if fincore is None:
        return sum(_mincore_bytes(path) for path in paths), "mincore"
    total = 0
    for start in range(0, len(paths), 256):
        done = subprocess.run(
            [fincore, "--bytes", "--noheadings", "--raw", "--output", "RES", *paths[start : start + 256]],
            capture_output=True,
            text=True,
            check=False,
        )
        total += sum(int(line) for line in done.stdout.split())
    return total, "fincore"


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _mincore_bytes(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            resident = sum(byte & 1 for byte in vector)
        finally:
            _libc.munmap(address, size)
        return min(size, resident * mmap.PAGESIZE)
    finally:
        os.close(fd)


# --- tier roots of finished rounds ---


class SpentRoots:
    """Keeps the tier roots of finished rounds on disk until the benchmark ends, where the disk
    has room for all of them, rather than deleting each before the next round.

    Why: deleting a round's thousands of block files and creating the next round's at once
    measures how the file system reuses freed inodes, not the tier. ext4 without a journal (the
    disk of `BENCHMARKS.md`) passes over every inode freed less than 60 s ago (300 s while its
    inode table block is dirty) when it allocates one, looking each up in its inode table block.
    Storing 1 GiB of 256 KiB blocks right after 12,288 block files were deleted took 1.37 s of
    system CPU and ran at 1.22 GB/s; on a quiet root it took 0.12-0.15 s and ran at
    2.22-2.29 GB/s. A tier in service pays this only where it deletes (evictions of a bounded
    root), and not on a file system with a journal. The device baseline's few large files do
    not pay it either way.

    Args:
        work: the directory the benchmark's roots are under (deleted whole when it ends).
        needed: the bytes every root of the run together holds.
    """

    def __init__(self, work: Path, needed: int) -> None:
        free = shutil.disk_usage(work).free
        self.keep = free >= needed + (4 << 30)  # with room to spare for everything else
        self.line = (
            f"tier roots of finished rounds: kept until the run ends ({needed / (1 << 30):.1f} GiB), "
            "so no round creates files right after another deleted thousands"
            if self.keep
            else f"tier roots of finished rounds: deleted at once ({free / (1 << 30):.1f} GiB free of the "
            f"{needed / (1 << 30):.1f} GiB that keeping them takes); stores may then run slower on a "
            "file system that defers reusing freed inodes (ext4 without a journal)"
        )

    def done(self, root: Path) -> None:
        """A round is over with `root`: delete it now unless roots are kept."""
        if not self.keep:
            shutil.rmtree(root, ignore_errors=True)


_PLAIN_SOURCE = Path(__file__).with_name("_plain_block_files.c")
_FS_TIER_DIR = Path(__file__).resolve().parents[1] / "kvref" / "tiering" / "fs"  # copy_payload.h, vendor/xxhash.h


def _avx2_flags() -> list[str]:
    """`-mavx2` where the CPU has AVX2: xxHash then hashes in AVX2, as the tier's C path chooses
    at run time (built for SSE2 alone, the plain program's checksum would cost twice the tier's)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    return ["-mavx2"] if " avx2" in cpuinfo else []


class PlainBlockFiles:
    """Block files written and read by `_plain_block_files.c`: no Python, no pool, no jobs.

    Args:
        build_dir: where the program is built (once per directory).
        files: block files per phase.
        payload: bytes per block (each file holds one header page more).
        threads: (store threads, load threads).
        work: whether each block also gets the tier's CPU work (a checksum and a copy).

    Raises:
        OSError: no C compiler, or the program failed to build (the message says which).
    """

    def __init__(
        self, build_dir: Path, files: int, payload: int, threads: tuple[int, int], *, work: bool
    ) -> None:
        self.files = files
        self.payload = payload
        self.threads = threads
        self.work = work
        self.program = build_dir / "_plain_block_files"
        if not self.program.exists():
            compiler = shutil.which(os.environ.get("CC", "cc"))
            if compiler is None:
                raise OSError("--plain needs a C compiler: set CC or install cc")
            built = subprocess.run(
                [compiler, "-O2", *_avx2_flags(), "-pthread", f"-I{_FS_TIER_DIR}", f"-I{_FS_TIER_DIR / 'vendor'}", "-o", str(self.program), str(_PLAIN_SOURCE)],
                capture_output=True,
                text=True,
                check=False,
            )
            if built.returncode != 0:
                raise OSError(f"building {_PLAIN_SOURCE.name} failed: {built.stderr.strip()}")

    @classmethod
    def like_the_tier(cls, build_dir: Path, files: int, payload: int, *, work: bool) -> PlainBlockFiles:
        """On the fs tier's default O_DIRECT threads for `payload`-byte blocks: stores on its
        write threads, loads on all of them."""
        writers, readers = (
            default_threads(read=read, direct=True, file_bytes=file_bytes(32, payload)) for read in (False, True)
        )
        return cls(build_dir, files, payload, (writers, readers + writers), work=work)

    @property
    def label(self) -> str:
        """What a results table calls it."""
        return "the same, + checksum and copy" if self.work else f"plain C block files, {self.threads[0]} / {self.threads[1]} thr"

    def run_round(self, rounds: Rounds, name: str, root: Path, cold: str, spent: SpentRoots) -> str:
        """One round: write the block files into `root` (new), make them cold (`drop_page_cache`
        with `cold`), read them back; add both times to `rounds` as `name`'s, hand `root` to
        `spent`, and return the cold method."""
        rounds.add(name, "store", self.write(root))
        method = drop_page_cache([root], cold)
        rounds.add(name, "load", self.read(root))
        spent.done(root)
        return method

    def _run(self, mode: str, root: Path, threads: int) -> float:
        done = subprocess.run(
            [str(self.program), mode, str(root), str(self.files), str(self.payload), str(threads), str(int(self.work))],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise OSError(done.stderr.strip() or f"{self.program.name} {mode} exited {done.returncode}")
        return float(done.stdout)

    def write(self, root: Path) -> float:
        """Write the block files into `root` (new, or holding none of them); the seconds taken."""
        return self._run("write", root, self.threads[0])

    def read(self, root: Path) -> float:
        """Read back the block files `write` made in `root`; the seconds taken."""
        return self._run("read", root, self.threads[1])


# --- interleaved rounds ---


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """`names` starting at the `round_index`-th (so no contender always runs first)."""
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


class Rounds:
    """Seconds per (contender, phase) per round, for best-of figures and per-round ratios."""

    def __init__(self) -> None:
        self._seconds: dict[tuple[str, str], list[float]] = {}

    def add(self, name: str, phase: str, seconds: float) -> None:
        self._seconds.setdefault((name, phase), []).append(seconds)

    def has(self, name: str, phase: str) -> bool:
        return (name, phase) in self._seconds

    def seconds(self, name: str, phase: str) -> list[float]:
        return self._seconds[(name, phase)]

    def best_gbps(self, name: str, phase: str, moved: int) -> float:
        return moved / min(self.seconds(name, phase)) / 1e9

    def median_gbps(self, name: str, phase: str, moved: int) -> float:
        return moved / statistics.median(self.seconds(name, phase)) / 1e9

    def ratios(self, name: str, base: str, phase: str, base_moved: int, moved: int) -> list[float]:
        """Per round: `name`'s speed / `base`'s speed (`base` may be a `combine`d name)."""
        return [
            (moved / ours) / (base_moved / theirs)
            for ours, theirs in zip(self.seconds(name, phase), self.seconds(base, phase))
        ]

    def combine_fastest(self, combined: str, names: Sequence[str], phase: str, moved: dict[str, int]) -> None:
        """Record under `combined`, per round, the fastest of `names`: its seconds scaled to
        `moved[combined]` bytes (each of `names` moved `moved[name]`)."""
        columns = [[s * moved[combined] / moved[name] for s in self.seconds(name, phase)] for name in names]
        self._seconds[(combined, phase)] = [min(values) for values in zip(*columns)]


def process_cpu_s() -> float:
    """CPU seconds this process has used so far, every thread, user and system."""
    times = os.times()
    return times.user + times.system


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"
