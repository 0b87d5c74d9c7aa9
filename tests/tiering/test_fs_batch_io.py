"""The fs tier's two paths of block-file I/O held to each other: the C extension
(`kvref.tiering.fs._batch_io`, one call per task without the GIL) and Python (`BlockIO` without
it, the reference). They must write the same bytes, read each other's files, and agree on every
outcome: missing, damaged (and then deleted), existing, no room, failed."""

from __future__ import annotations

import errno

import mmap
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvref.tiering.base import PrimaryBlocks
from kvref.tiering.fs import block_io, posix_io
from kvref.tiering.fs.block_io import BlockIO, ReadProblem, Transfer, WriteOutcome
from kvref.tiering.fs.format import MAX_KEY_BYTES, file_bytes
from kvref.tiering.fs.posix_io import MAX_LAST_REQUEST_BYTES, MAX_REQUEST_BYTES, publish_file
from kvref.tiering.fs.root import block_name, open_root, probe_o_direct

NATIVE = block_io.NATIVE_BATCH_IO
needs_native = pytest.mark.skipif(NATIVE is None, reason="kvref.tiering.fs._batch_io was not built")


def test_the_extension_is_built_wherever_a_compiler_is() -> None:
    # The tier still works without it (the Python path), only slower: CI must build it.
    compiler = sysconfig.get_config_var("CC") or "cc"
    if sys.platform.startswith("linux") and shutil.which(compiler.split()[0]):
        assert NATIVE is not None, "a C compiler is here, but kvref.tiering.fs._batch_io was not built"


class Rows:
    """A primary of `count` rows: page-aligned (mmap), or one byte off (so O_DIRECT bounces)."""

    def __init__(self, count: int, block_bytes: int, *, aligned: bool) -> None:
        offset = 0 if aligned else 1
        self.memory = mmap.mmap(-1, count * block_bytes + offset)
        flat = memoryview(self.memory)[offset : offset + count * block_bytes]
        self.primary = PrimaryBlocks(flat.cast("B", (count, block_bytes)))

    def fill(self, block_id: int, seed: int) -> bytes:
        data = (seed.to_bytes(4, "little") * (len(self.primary.row(block_id)) // 4 + 1))[: len(self.primary.row(block_id))]
        self.primary.row(block_id)[:] = data
        return data


def make_io(rows: Rows, *, direct: bool, native: bool, drop_pages: bool = False, staged: bool | None = None) -> BlockIO:
    return BlockIO(
        rows.primary, direct=direct, keep_page_cache=not drop_pages, fsync=False, token="t-1-ab", native=native,
        huge_page_staging=staged,
    )  # fmt: skip


def paths_of(root: Path, keys: list[bytes]) -> list[str]:
    paths: list[str] = []
    for key in keys:
        name = block_name(key)
        paths.append(str(root / name[:2] / name))
    return paths


def always_room(_: int) -> bool:
    return True


def fresh_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    open_root(root, 4096)
    return root


@needs_native
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    block_bytes=st.sampled_from([4096, 8192, 12288, 1000, 5000, 1 << 20]),
    key_lengths=st.lists(st.sampled_from([1, 16, 32, 100, 4000, MAX_KEY_BYTES]), min_size=1, max_size=4),
    aligned=st.booleans(),
    buffered=st.booleans(),
    writer_native=st.booleans(),
    staged=st.booleans(),
    avx2=st.booleans(),
)
def test_both_paths_write_the_same_files_and_read_each_others(
    tmp_path_factory: pytest.TempPathFactory,
    block_bytes: int,
    key_lengths: list[int],
    aligned: bool,
    buffered: bool,
    writer_native: bool,
    staged: bool,
    avx2: bool,
) -> None:
    # The C path hashes with AVX2 where the CPU has it, else SSE2: both match the Python path.
    assert NATIVE is not None
    NATIVE.set_avx2(avx2)
    try:
        roots = [tmp_path_factory.mktemp("native"), tmp_path_factory.mktemp("python")]
        for root in roots:
            open_root(root, block_bytes)
        direct = not buffered and probe_o_direct(roots[0])
        keys = [bytes([i + 1]) * length for i, length in enumerate(key_lengths)]
        rows = Rows(2 * len(keys), block_bytes, aligned=aligned)
        contents = [rows.fill(i, seed=1000 + i) for i in range(len(keys))]
        ids = list(range(len(keys)))
        # Every transfer writes the same bytes: staged on huge pages, zero-copy, or bounced.
        for root, native in zip(roots, (True, False)):
            io = make_io(rows, direct=direct, native=native, staged=staged)
            if direct:
                whole_pages = aligned and block_bytes % 4096 == 0
                expected = Transfer.BOUNCE if not whole_pages else Transfer.HUGE_PAGES if staged else Transfer.ZERO_COPY
                assert io.transfer is expected
            outcomes = io.write_blocks(paths_of(root, keys), keys, ids, always_room)
            assert outcomes == [WriteOutcome.WRITTEN] * len(keys)
        for native_path, python_path, key in zip(paths_of(roots[0], keys), paths_of(roots[1], keys), keys):
            data = Path(native_path).read_bytes()
            assert data == Path(python_path).read_bytes()  # byte for byte: header, checksums, padding
            assert len(data) == file_bytes(len(key), block_bytes)
        assert sorted(p.name for p in roots[0].rglob("*.tmp")) == []
        # Each path reads the files the other wrote, into other rows.
        reader_root = roots[1] if writer_native else roots[0]
        targets = [len(keys) + i for i in ids]
        reader = make_io(rows, direct=direct, native=not writer_native, staged=not staged)
        problems = reader.read_blocks(paths_of(reader_root, keys), keys, targets)
        assert problems == [None] * len(keys)
        assert [bytes(rows.primary.row(t)) for t in targets] == contents
        # A second store of the same blocks writes nothing: they exist.
        again = make_io(rows, direct=direct, native=writer_native).write_blocks(paths_of(reader_root, keys), keys, ids, always_room)
        assert again == [WriteOutcome.EXISTED] * len(keys)
    finally:
        NATIVE.set_avx2(True)


@needs_native
@pytest.mark.parametrize("zero_copy", [False, True])
def test_pipelined_writes_match_one_by_one_writes_whatever_each_block_meets(
    tmp_path: Path, zero_copy: bool
) -> None:
    """With a second scratch a helper thread prepares block i + 1 while block i is written:
    the files and outcomes are those of writing one block after the other, with a block whose
    file exists and one whose temporary file cannot be made among them."""
    assert NATIVE is not None
    block_bytes = 12288
    rows = Rows(6, block_bytes, aligned=True)
    for i in range(6):
        rows.fill(i, seed=7 + i)
    keys = [bytes([i + 1]) * 32 for i in range(6)]
    results: list[tuple[list[int], list[bytes | None]]] = []
    for piped in (False, True):
        root = tmp_path / ("piped" if piped else "serial")
        paths = [str(root / f"b{i}") for i in range(6)]
        tmp_paths = [path + ".tmp" for path in paths]
        root.mkdir()
        Path(paths[2]).write_bytes(b"already here")  # block 2: its file exists
        (root / "file").write_bytes(b"")
        tmp_paths[4] = str(root / "file" / "b4.tmp")  # block 4: ENOTDIR
        size = 8 * 4096 + (0 if zero_copy else block_bytes)
        scratch, second = (memoryview(mmap.mmap(-1, size)) for _ in range(2))
        codes = NATIVE.write_blocks(
            paths, tmp_paths, keys, [rows.primary.row(i) for i in range(6)], scratch, block_bytes,
            False, zero_copy, 0, second if piped else None,
        )  # fmt: skip
        results.append((codes, [Path(p).read_bytes() if Path(p).exists() else None for p in tmp_paths]))
    assert results[0] == results[1]
    codes, written = results[0]
    assert codes[2] == 1 and codes[4] == -errno.ENOTDIR and [codes[i] for i in (0, 1, 3, 5)] == [0] * 4
    assert written[2] is None and written[4] is None
    assert all(len(written[i] or b"") == file_bytes(32, block_bytes) for i in (0, 1, 3, 5))


DAMAGE = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**9)),
    st.tuples(st.just("truncate"), st.integers(0, 10**9)),
    st.tuples(st.just("extend"), st.integers(1, 5000)),
    st.tuples(st.just("delete"), st.just(0)),
    st.tuples(st.just("other key"), st.just(0)),
)


@needs_native
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=DAMAGE, block_bytes=st.sampled_from([4096, 5000]), buffered=st.booleans(), staged=st.booleans())
def test_both_paths_agree_on_damaged_and_missing_files(
    tmp_path_factory: pytest.TempPathFactory, damage: tuple[str, int], block_bytes: int, buffered: bool, staged: bool
) -> None:
    root = tmp_path_factory.mktemp("damage")
    open_root(root, block_bytes)
    direct = not buffered and probe_o_direct(root)
    rows = Rows(2, block_bytes, aligned=True)
    rows.fill(0, seed=7)
    key, other = b"k" * 32, b"o" * 32
    path = paths_of(root, [key])[0]
    outcomes: list[ReadProblem | None] = []
    for native in (True, False):
        io = make_io(rows, direct=direct, native=native, drop_pages=buffered, staged=staged)
        if not os.path.exists(path):
            assert io.write_blocks([path], [key], [0], always_room) == [WriteOutcome.WRITTEN]
        kind, where = damage
        file = Path(path)
        data = bytearray(file.read_bytes())
        if kind == "flip":
            data[where % len(data)] ^= 0x40
        elif kind == "truncate":
            data = data[: where % len(data)]
        elif kind == "extend":
            data += b"\0" * where
        elif kind == "other key":
            io.write_blocks([path + ".other"], [other], [0], always_room)
            data = bytearray(Path(path + ".other").read_bytes())
            os.unlink(path + ".other")
        if kind == "delete":
            file.unlink()
        else:
            file.write_bytes(bytes(data))
        marker = rows.fill(1, seed=99)
        outcomes.append(io.read_blocks([path], [key], [1])[0])
        if outcomes[-1] is not None and io.transfer is not Transfer.ZERO_COPY:
            assert bytes(rows.primary.row(1)) == marker  # verified before it reaches the row
        if outcomes[-1] is ReadProblem.DAMAGED:
            assert not file.exists()  # deleted: every engine misses it from now on
    assert outcomes[0] == outcomes[1]
    # Only a flip in the padding past the payload (never read as data) goes unnoticed.
    assert outcomes[0] in (ReadProblem.DAMAGED, ReadProblem.MISSING) or damage[0] == "flip"


@needs_native
@pytest.mark.parametrize("native", [True, False])
def test_no_room_and_failures_leave_no_temporary_file(tmp_path: Path, native: bool) -> None:
    root = fresh_root(tmp_path)
    rows = Rows(3, 4096, aligned=True)
    keys = [b"a" * 32, b"b" * 32, b"c" * 32]
    paths = paths_of(root, keys)
    (root / "a file").write_bytes(b"")
    paths[2] = str(root / "a file" / "y.kvb")  # its directory is a file: creation fails
    outcomes = make_io(rows, direct=False, native=native).write_blocks(paths, keys, [0, 1, 2], lambda i: i != 1)
    assert outcomes[:2] == [WriteOutcome.WRITTEN, WriteOutcome.NO_ROOM]
    assert isinstance(outcomes[2], OSError) and outcomes[2].filename == paths[2]
    assert [p.name for p in root.rglob("*.tmp")] == []
    assert os.path.exists(paths[0]) and not os.path.exists(paths[1])


@needs_native
@pytest.mark.parametrize("native", [True, False])
def test_a_deleted_fan_out_directory_or_root_is_made_again(tmp_path: Path, native: bool) -> None:
    root = fresh_root(tmp_path)
    rows = Rows(2, 4096, aligned=True)
    keys = [b"a" * 32, b"b" * 32]
    shutil.rmtree(root)
    assert make_io(rows, direct=False, native=native).write_blocks(paths_of(root, keys), keys, [0, 1], always_room) == [
        WriteOutcome.WRITTEN
    ] * 2


@needs_native
@pytest.mark.parametrize("native", [True, False])
def test_a_block_another_writer_published_meanwhile_is_never_replaced(tmp_path: Path, native: bool) -> None:
    # Another writer (on another host) publishes the block between this writer's existence check
    # and its own publish: the first file keeps its name and inode, which other hosts may cache.
    root = fresh_root(tmp_path)
    rows = Rows(1, 4096, aligned=True)
    key = b"a" * 32
    path = Path(paths_of(root, [key])[0])

    def other_writer_publishes_first(_: int) -> bool:
        path.write_bytes(b"the other writer's file")
        return True

    io = make_io(rows, direct=False, native=native)
    assert io.write_blocks([str(path)], [key], [0], other_writer_publishes_first) == [WriteOutcome.EXISTED]
    assert path.read_bytes() == b"the other writer's file"
    assert list(root.rglob("*.tmp")) == []


@pytest.mark.parametrize("way", ["renameat2", "link"])
def test_publish_file_never_replaces_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str) -> None:
    if way == "link":  # a filesystem (NFS) or libc without renameat2's flag
        monkeypatch.setattr(posix_io, "_renameat2", None)
    source, target = tmp_path / "source", tmp_path / "target"
    source.write_bytes(b"first")
    publish_file(str(source), str(target))
    assert target.read_bytes() == b"first" and not source.exists()
    source.write_bytes(b"second")
    with pytest.raises(FileExistsError):
        publish_file(str(source), str(target))
    assert target.read_bytes() == b"first" and source.read_bytes() == b"second"


def test_publish_file_renames_where_neither_way_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_hard_links(source: str, target: str) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(posix_io, "_renameat2", None)
    monkeypatch.setattr(os, "link", no_hard_links)
    source, target = tmp_path / "source", tmp_path / "target"
    target.write_bytes(b"first")
    source.write_bytes(b"second")
    publish_file(str(source), str(target))  # replaces: the only way left
    assert target.read_bytes() == b"second" and not source.exists()


@needs_native
@pytest.mark.parametrize("native", [True, False])
def test_a_stale_temporary_file_of_the_same_writer_is_replaced(tmp_path: Path, native: bool) -> None:
    root = fresh_root(tmp_path)
    rows = Rows(1, 4096, aligned=True)
    path = paths_of(root, [b"a" * 32])[0]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Path(path + ".t-1-ab.tmp").write_bytes(b"left by a crash")
    assert make_io(rows, direct=False, native=native).write_blocks([path], [b"a" * 32], [0], always_room) == [
        WriteOutcome.WRITTEN
    ]
    assert not os.path.exists(path + ".t-1-ab.tmp")


@needs_native
def test_touch_sets_mtime_and_skips_missing_files(tmp_path: Path) -> None:
    rows = Rows(1, 4096, aligned=True)
    file = tmp_path / "f"
    file.write_bytes(b"x")
    os.utime(file, (1, 1))
    make_io(rows, direct=False, native=True).mark_used([str(file), str(tmp_path / "gone")])
    assert file.stat().st_mtime > 1e9


@needs_native
def test_wrong_arguments_raise_and_touch_nothing(tmp_path: Path) -> None:
    assert NATIVE is not None
    scratch = memoryview(mmap.mmap(-1, 8 * 4096))
    row = memoryview(bytearray(4096))
    with pytest.raises(TypeError):
        NATIVE.read_blocks([str(tmp_path / "a")], ["not bytes"], [row], scratch, 4096, False, True, False)
    with pytest.raises(ValueError, match="differ in length"):
        NATIVE.read_blocks([str(tmp_path / "a")], [], [row], scratch, 4096, False, True, False)
    with pytest.raises(ValueError, match="block_bytes contiguous"):
        NATIVE.read_blocks([str(tmp_path / "a")], [b"k"], [memoryview(bytearray(10))], scratch, 4096, False, True, False)
    with pytest.raises(ValueError, match="scratch"):
        NATIVE.read_blocks([str(tmp_path / "a")], [b"k"], [row], memoryview(bytearray(10)), 4096, False, True, False)
    with pytest.raises(ValueError, match="longer than a block file holds"):
        NATIVE.read_blocks([str(tmp_path / "a")], [b"k" * (MAX_KEY_BYTES + 1)], [row], scratch, 4096, False, True, False)
    with pytest.raises(TypeError):
        NATIVE.write_blocks([str(tmp_path / "a")], [str(tmp_path / "a.tmp")], [b"k"], [row], scratch, 4096, False, True, "0")
    with pytest.raises(ValueError, match="second_scratch"):
        NATIVE.write_blocks(
            [str(tmp_path / "a")], [str(tmp_path / "a.tmp")], [b"k"], [row], scratch, 4096, False, True, 0,
            memoryview(mmap.mmap(-1, 4096)),
        )  # fmt: skip
    with pytest.raises(TypeError):
        NATIVE.touch_files([str(tmp_path / "a"), 3])
    assert list(tmp_path.iterdir()) == []  # refused before any file work


def run_traced(tmp_path: Path, calls: str, script: str) -> tuple[str, list[str]]:
    """Run `script` in a Python child under strace, tracing `calls`: its stdout, and each traced
    call as strace prints it (without the pid)."""
    trace = tmp_path / "trace"
    result = subprocess.run(
        ["strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={calls}", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    return result.stdout, [line.split(None, 1)[1] for line in trace.read_text().splitlines()]


@needs_native
@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (make test installs it)")
def test_fsync_makes_each_file_then_its_name_durable(tmp_path: Path) -> None:
    # The C extension's system calls, traced: each block file is fsynced before its rename,
    # and its directory after it.
    script = textwrap.dedent(
        f"""
        import mmap
        from kvref.tiering.base import PrimaryBlocks
        from kvref.tiering.fs.block_io import BlockIO
        from kvref.tiering.fs.root import block_name, open_root
        from pathlib import Path
        root = Path({str(tmp_path / "root")!r})
        open_root(root, 4096)
        memory = mmap.mmap(-1, 2 * 4096)
        io = BlockIO(PrimaryBlocks(memoryview(memory).cast("B", (2, 4096))), direct=False,
                     keep_page_cache=True, fsync=True, token="t-1-ab")
        keys = [b"a" * 32, b"b" * 32]
        paths = [str(root / block_name(k)[:2] / block_name(k)) for k in keys]
        print("OUTCOMES", io.write_blocks(paths, keys, [0, 1], lambda i: True))
        """
    )
    stdout, traced = run_traced(tmp_path, "openat,fsync,rename,renameat,renameat2", script)
    assert "WRITTEN" in stdout
    calls = [call for call in traced if ".kvb" in call or call.startswith("fsync(")]
    events: list[str] = []
    for call in calls:
        if call.startswith("openat(") and ".tmp" in call and "O_CREAT" in call and "= -1" not in call:
            events.append("create")
        elif call.startswith("fsync("):
            events.append("fsync")
        elif call.startswith("rename"):
            events.append("rename")
    # create, fsync(file), rename per block (one call for the task), then a directory fsync each.
    assert events[:4] == ["create", "fsync", "create", "fsync"], calls
    assert events[4:6] == ["rename", "rename"], calls
    assert events[6:] in (["fsync"], ["fsync", "fsync"]), calls


@needs_native
@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (make test installs it)")
@pytest.mark.parametrize("native", [True, False])
def test_requests_are_about_max_request_bytes_and_none_is_a_small_remainder(tmp_path: Path, native: bool) -> None:
    # A 2 MiB block file (2 MiB + 4 KiB with its header) goes to and from the device as 1 MiB
    # and 1 MiB + 4 KiB, never with a request of its last page alone, on both paths and every
    # transfer, and still round-trips.
    block = 2 << 20
    script = textwrap.dedent(
        f"""
        import mmap
        from kvref.tiering.base import PrimaryBlocks
        from kvref.tiering.fs.block_io import BlockIO
        from kvref.tiering.fs.root import block_name, open_root, probe_o_direct
        from pathlib import Path
        root = Path({str(tmp_path / "root")!r})
        open_root(root, {block})
        memory = mmap.mmap(-1, 2 * {block})
        rows = PrimaryBlocks(memoryview(memory).cast("B", (2, {block})))
        rows.row(0)[:] = bytes(range(256)) * ({block} // 256)
        for staged in (True, False):
            io = BlockIO(rows, direct=probe_o_direct(root), keep_page_cache=False, fsync=False,
                         token="t-1-ab", native={native}, huge_page_staging=staged)
            key = bytes([staged]) * 32
            path = str(root / block_name(key)[:2] / block_name(key))
            assert io.write_blocks([path], [key], [0], lambda i: True)[0].value == "written"
            assert io.read_blocks([path], [key], [1]) == [None]
            assert bytes(rows.row(1)) == bytes(rows.row(0))
        print("ROUND TRIPS")
        """
    )
    stdout, traced = run_traced(tmp_path, "preadv,pwritev,preadv2,pwritev2", script)
    assert "ROUND TRIPS" in stdout
    moved = [int(call.rsplit("= ", 1)[1]) for call in traced if call.startswith(("preadv", "pwritev"))]
    # Left out: a read's last call, which finds the end of the file (0), and the O_DIRECT
    # probe's read of the root's config file (tens of bytes); a page alone would be 4096.
    moved = [size for size in moved if size >= 4096]
    assert moved and max(moved) <= MAX_LAST_REQUEST_BYTES, moved
    assert min(moved) >= MAX_REQUEST_BYTES, moved  # no small remainder on its own
    # Two writes and two reads, each of two requests.
    assert moved.count(MAX_REQUEST_BYTES) == 4 and moved.count(MAX_REQUEST_BYTES + 4096) == 4, moved


@needs_native
def test_a_build_of_other_code_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stale .so (another format, or result codes the Python side reads differently) must
    # never write or read blocks: the tier falls back to the Python path instead.
    assert NATIVE is not None
    assert block_io._load_native() is NATIVE  # pyright: ignore[reportPrivateUsage]
    for name, value in (("FORMAT_VERSION", 3), ("READ_DAMAGED", 7), ("WRITE_EXISTED", None), ("MAX_REQUEST", 2 << 20)):
        stale = types.ModuleType(NATIVE.__name__)
        stale.__dict__.update({k: v for k, v in vars(NATIVE).items() if not k.startswith("__")})
        if value is None:
            del stale.__dict__[name]
        else:
            setattr(stale, name, value)
        monkeypatch.setitem(sys.modules, NATIVE.__name__, stale)
        monkeypatch.setattr(sys.modules["kvref.tiering.fs"], "_batch_io", stale)
        assert block_io._load_native() is None, name  # pyright: ignore[reportPrivateUsage]
