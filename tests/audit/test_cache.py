"""The summary cache: reuse only what is provably unchanged, survive corruption and races."""

from __future__ import annotations

import dataclasses
import marshal
import os
import pickle
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from typing_extensions import override

from kvref.audit.runner.cache import (
    RACY_WINDOW_NS,
    SummaryCache,
    content_digest,
    dumps,
    loads,
    version_stamp,
)
from kvref.audit.runner.results import ResultCache
from kvref.audit.model import (
    AnalysisResult,
    Applicability,
    Edit,
    FileError,
    Finding,
    Fix,
)
from kvref.audit.runner.parallel import summarize_many

STAMP = "test-stamp"
# Far enough in the past that the racy-timestamp rule never applies.
OLD_NS = time.time_ns() - 3_600_000_000_000


def age(path: Path, mtime_ns: int = OLD_NS) -> os.stat_result:
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path.stat()


def write_old(path: Path, text: str, mtime_ns: int = OLD_NS) -> os.stat_result:
    path.write_text(text)
    return age(path, mtime_ns)


def store(cache: SummaryCache[str], path: Path, value: str) -> None:
    cache.store(path, path.stat(), content_digest(path.read_bytes()), value)


def reloaded(directory: Path, stamp: str = STAMP) -> SummaryCache[str]:
    cache = SummaryCache[str](directory, stamp)
    cache.load()
    return cache


def test_saved_summary_is_reused_on_unchanged_stat(tmp_path: Path) -> None:
    source = tmp_path / "a.py"
    file_stat = write_old(source, "x = 1\n")
    cache = reloaded(tmp_path / "cache")
    store(cache, source, "summary-a")
    cache.save()

    again = reloaded(tmp_path / "cache")
    assert again.discarded is None
    assert again.lookup(source, file_stat) == "summary-a"
    assert (tmp_path / "cache" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_changed_size_or_mtime_is_not_trusted_on_stat(tmp_path: Path) -> None:
    source = tmp_path / "a.py"
    write_old(source, "x = 1\n")
    cache = reloaded(tmp_path / "cache")
    store(cache, source, "old")
    cache.save()

    grown = write_old(source, "x = 12\n")
    assert reloaded(tmp_path / "cache").lookup(source, grown) is None
    same_size_newer = write_old(source, "x = 2\n", OLD_NS + 5_000_000_000)
    fresh = reloaded(tmp_path / "cache")
    assert fresh.lookup(source, same_size_newer) is None
    # The content differs, so the digest does not match either: it must be recomputed.
    assert fresh.lookup_digest(source, content_digest(source.read_bytes()), same_size_newer) is None


def test_touched_file_is_reused_by_digest_and_its_stat_refreshed(tmp_path: Path) -> None:
    source = tmp_path / "a.py"
    write_old(source, "x = 1\n")
    cache = reloaded(tmp_path / "cache")
    store(cache, source, "summary")
    cache.save()

    touched = age(source, OLD_NS + 7_000_000_000)
    again = reloaded(tmp_path / "cache")
    assert again.lookup(source, touched) is None
    assert again.expected_digest(source) == content_digest(b"x = 1\n")
    assert again.lookup_digest(source, content_digest(b"x = 1\n"), touched) == "summary"
    again.save()
    assert reloaded(tmp_path / "cache").lookup(source, touched) == "summary"


def test_racy_entry_needs_the_digest(tmp_path: Path) -> None:
    # Written in the same instant the pack is saved: a later edit within the same timestamp
    # tick would keep size and mtime, so stat alone must not be trusted.
    source = tmp_path / "a.py"
    source.write_text("x = 1\n")
    cache = reloaded(tmp_path / "cache")
    store(cache, source, "summary")
    cache.save()
    now_stat = source.stat()
    again = reloaded(tmp_path / "cache")
    assert again.lookup(source, now_stat) is None
    assert again.lookup_digest(source, content_digest(b"x = 1\n"), now_stat) == "summary"


def test_racy_entry_becomes_trusted_once_the_pack_is_rewritten_later(tmp_path: Path) -> None:
    source = tmp_path / "a.py"
    mtime = time.time_ns() - RACY_WINDOW_NS // 2
    file_stat = write_old(source, "x = 1\n", mtime)
    cache = reloaded(tmp_path / "cache")
    store(cache, source, "summary")
    cache.save()
    time.sleep(RACY_WINDOW_NS / 1e9)
    again = reloaded(tmp_path / "cache")
    assert again.lookup(source, file_stat) is None
    assert again.lookup_digest(source, content_digest(b"x = 1\n"), file_stat) == "summary"
    again.save()  # the digest confirmation marks the pack for rewriting
    assert reloaded(tmp_path / "cache").lookup(source, file_stat) == "summary"


def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def wrong_magic(data: bytes) -> bytes:
    return b"garbage" + data


def bit_rot(data: bytes) -> bytes:
    return data[:8] + bytes(byte ^ 0x5A for byte in data[8:])


def emptied(data: bytes) -> bytes:
    return b""


@pytest.mark.parametrize("damage", [truncated, wrong_magic, bit_rot, emptied])
def test_corrupt_pack_is_discarded_and_rebuilt(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    source = tmp_path / "a.py"
    file_stat = write_old(source, "x = 1\n")
    cache = reloaded(tmp_path / "cache")
    store(cache, source, "summary")
    cache.save()
    pack = cache.pack_path
    pack.write_bytes(damage(pack.read_bytes()))

    broken = reloaded(tmp_path / "cache")
    assert broken.discarded is not None
    assert len(broken) == 0
    assert broken.lookup(source, file_stat) is None
    broken.save()  # a discarded pack is replaced even when nothing new was computed
    assert reloaded(tmp_path / "cache").discarded is None


def test_foreign_version_is_never_read(tmp_path: Path) -> None:
    source = tmp_path / "a.py"
    file_stat = write_old(source, "x = 1\n")
    cache = reloaded(tmp_path / "cache", "kvref-0.0.1")
    store(cache, source, "old shape")
    cache.save()
    # Another version writes another pack, so two installed versions do not fight over one.
    other = reloaded(tmp_path / "cache", "kvref-0.0.2")
    assert other.pack_path != cache.pack_path
    assert other.lookup(source, file_stat) is None
    # Even a pack renamed into place under the new name is refused by its header stamp.
    os.replace(cache.pack_path, other.pack_path)
    renamed = reloaded(tmp_path / "cache", "kvref-0.0.2")
    assert renamed.discarded is not None and "foreign" in renamed.discarded
    assert renamed.lookup(source, file_stat) is None


class Evil:
    @override
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.remove, ("victim",))


def test_pack_with_foreign_classes_is_refused_not_executed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "victim").write_text("still here")
    source = tmp_path / "a.py"
    file_stat = write_old(source, "x = 1\n")
    cache = SummaryCache[str](tmp_path / "cache", STAMP)
    (tmp_path / "cache").mkdir()
    entry = (file_stat.st_size, file_stat.st_mtime_ns, b"d", pickle.dumps(Evil()))
    pack = marshal.dumps((STAMP, time.time_ns(), {str(source): entry}))
    cache.pack_path.write_bytes(b"KVRAUDC\x02" + pack)
    cache.load()
    assert cache.discarded is None and len(cache) == 1  # entries are unpickled on lookup
    assert cache.lookup(source, file_stat) is None
    assert cache.discarded is not None and "refusing" in cache.discarded
    assert (tmp_path / "victim").exists()
    assert len(cache) == 0  # the bad entry is dropped and recomputed, never trusted


def test_a_pickled_pack_of_the_old_layout_is_discarded(tmp_path: Path) -> None:
    cache = SummaryCache[str](tmp_path / "cache", STAMP)
    (tmp_path / "cache").mkdir()
    cache.pack_path.write_bytes(b"KVRAUDC\x01" + pickle.dumps((STAMP, 0, {})))
    cache.load()
    assert cache.discarded is not None and len(cache) == 0


def test_file_errors_and_audit_types_round_trip(tmp_path: Path) -> None:
    source = tmp_path / "bad.py"
    file_stat = write_old(source, "def (:\n")
    cache = SummaryCache[FileError](tmp_path / "cache", STAMP)
    cache.load()
    error = FileError("bad.py", 1, 5, "syntax error: invalid syntax")
    cache.store(source, file_stat, content_digest(source.read_bytes()), error)
    cache.save()
    again = SummaryCache[FileError](tmp_path / "cache", STAMP)
    again.load()
    assert again.lookup(source, file_stat) == error


def test_forget_missing_drops_deleted_files(tmp_path: Path) -> None:
    kept, gone = tmp_path / "kept.py", tmp_path / "gone.py"
    for path in (kept, gone):
        write_old(path, "pass\n")
    cache = reloaded(tmp_path / "cache")
    store(cache, kept, "k")
    store(cache, gone, "g")
    gone.unlink()
    cache.forget_missing([kept])
    assert len(cache) == 1


def test_version_stamp_covers_schema_bytes_and_interpreter(tmp_path: Path) -> None:
    schema = tmp_path / "summary.py"
    schema.write_text("A = 1\n")
    first = version_stamp([schema])
    assert version_stamp([schema]) == first
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in first
    schema.write_text("A = 2\n")
    assert version_stamp([schema]) != first


_WRITER = """
import sys, time
from pathlib import Path
from kvref.audit.runner.cache import SummaryCache
directory, name, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for round_ in range(rounds):
    cache = SummaryCache(directory, "race")
    cache.load()
    cache.store(directory.parent / f"{name}.py", directory.parent.stat(), b"d", name * 2000)
    cache.save()
"""


def test_two_concurrent_runs_never_leave_a_torn_pack(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(directory), name, "40"])
        for name in ("left", "right")
    ]
    seen_packs = 0
    while any(writer.poll() is None for writer in writers):
        reader = SummaryCache[str](directory, "race")
        reader.load()
        assert reader.discarded is None, reader.discarded
        seen_packs += len(reader) > 0
    assert all(writer.returncode == 0 for writer in writers)
    final = SummaryCache[str](directory, "race")
    final.load()
    assert final.discarded is None and len(final) >= 1
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


# --- a model-based test: whatever happens to the files, a cached run equals a fresh one ---


def describe(relative: str, source: bytes) -> str:
    """A stand-in summariser (module level, so worker processes can receive it)."""
    return f"{relative}:{content_digest(source).hex()}"


class CacheNeverStale(RuleBasedStateMachine):
    """Edits, touches, reloads: results through the cache always match the files' bytes.

    mtimes only move forward (as with editors and checkouts); restoring an old mtime after an
    edit of the same size is the one change no stat-based cache (make, git, mypy) can see.
    """

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.base = Path(tempfile.mkdtemp(prefix="kvref-cache-model-"))
        self.files = [self.base / f"m{index}.py" for index in range(3)]
        self.clock = OLD_NS
        self.cache = SummaryCache[str | FileError](self.base / "cache", STAMP)
        self.cache.load()

    def tick(self) -> int:
        self.clock += 1_000_000_000
        return self.clock

    @initialize()
    def create(self) -> None:
        for path in self.files:
            write_old(path, "x = 0\n", self.tick())

    @rule(index=st.integers(0, 2), text=st.sampled_from(["x = 0\n", "x = 1\n", "y = 22\n", ""]))
    def edit(self, index: int, text: str) -> None:
        write_old(self.files[index], text, self.tick())

    @rule(index=st.integers(0, 2))
    def edit_now(self, index: int) -> None:
        # A fresh, racy mtime: within the window of the next pack write.
        self.files[index].write_text(f"z = {time.time_ns()}\n")

    @rule(index=st.integers(0, 2))
    def touch(self, index: int) -> None:
        age(self.files[index], self.tick())

    @rule()
    def save_and_reload(self) -> None:
        self.cache.save()
        self.cache = SummaryCache[str | FileError](self.base / "cache", STAMP)
        self.cache.load()

    @invariant()
    def cached_run_matches_the_files(self) -> None:
        results = summarize_many(
            self.files, root=self.base, jobs=1, cache=self.cache, summarize=describe
        )
        expected = {path: describe(path.name, path.read_bytes()) for path in self.files}
        assert results == expected

    @override
    def teardown(self) -> None:
        import shutil

        shutil.rmtree(self.base, ignore_errors=True)


TestCacheNeverStale = CacheNeverStale.TestCase
# Each step runs a real audit pass over files on disk; keep the walk short on 2 cores.
TestCacheNeverStale.settings = settings(max_examples=25, stateful_step_count=12, deadline=None)


def test_audit_types_survive_the_fast_pickler() -> None:
    finding = Finding(
        "pkg/a.py", 3, 9, 3, 12, "KVR001", "missing @override", "A.f",
        Fix(Applicability.SAFE, (Edit(3, 4, 3, 4, "@override\n    "),), "Add @override"),
    )
    data = dumps([finding, FileError("b.py", 1, 1, "syntax error")])
    assert loads(data) == [finding, FileError("b.py", 1, 1, "syntax error")]
    # Rebuilt through the constructor: the pickle names the class, not a __setstate__ call.
    assert b"_dataclass_setstate" not in data


def test_loads_refuses_foreign_classes() -> None:
    with pytest.raises(pickle.UnpicklingError, match="refusing collections.OrderedDict"):
        loads(pickle.dumps(OrderedDict(a=1)))


_TEXT = st.text(max_size=8)
_EDITS = st.builds(Edit, st.integers(1, 9), st.integers(0, 9), st.integers(1, 9), st.integers(0, 9), _TEXT)
_FIXES = st.builds(
    Fix, st.sampled_from(Applicability), st.lists(_EDITS, max_size=3).map(tuple), _TEXT, _TEXT
)
_FINDINGS = st.builds(
    Finding,
    _TEXT, st.integers(1, 99), st.integers(1, 99), st.integers(1, 99), st.integers(1, 99),
    _TEXT, _TEXT, _TEXT, st.none() | _FIXES,
)  # fmt: skip
_RESULTS = st.builds(
    AnalysisResult,
    findings=st.lists(_FINDINGS, max_size=3),
    errors=st.lists(st.builds(FileError, _TEXT, st.integers(1, 9), st.integers(1, 9), _TEXT), max_size=2),
    unresolved_bases=st.dictionaries(_TEXT, st.integers(1, 9), max_size=2),
    files_analyzed=st.integers(0, 99),
    suppression_lines=st.none() | st.dictionaries(_TEXT, st.lists(st.integers(1, 99), max_size=3).map(tuple)),
    dependent_paths=st.lists(_TEXT, max_size=2).map(tuple),
    missing_modules=st.dictionaries(_TEXT, st.integers(1, 9), max_size=2),
)


def test_the_result_strategy_sets_every_field() -> None:
    # A field added to these records must be added to the strategies above (and so be
    # round-tripped by the result cache), or a warm run would drop it: a fix's imports
    # once were (a separate field then), and --fix wrote annotations without their import.
    assert [f.name for f in dataclasses.fields(Fix)] == ["applicability", "edits", "description", "unsafe_reason"]
    assert len(dataclasses.fields(Finding)) == 9
    assert [f.name for f in dataclasses.fields(AnalysisResult)] == [
        "findings", "errors", "unresolved_bases", "files_analyzed", "suppression_lines",
        "dependent_paths", "missing_modules",
    ]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(result=_RESULTS)
def test_every_field_of_a_result_survives_the_result_cache(
    tmp_path_factory: pytest.TempPathFactory, result: AnalysisResult
) -> None:
    cache = ResultCache(tmp_path_factory.mktemp("results"), STAMP)
    cache.save(b"key", result)
    assert cache.load(b"key", OLD_NS) == result


def test_a_stored_result_comes_back_whole(tmp_path: Path) -> None:
    fix = Fix(Applicability.SAFE, (Edit(3, 0, 3, 0, "    @override\n"),), "Add @override")
    result = AnalysisResult(
        findings=[Finding("a.py", 3, 9, 3, 12, "KVR001", "m", "A.f", fix)],
        errors=[FileError("b.py", 1, 5, "syntax error: invalid syntax")],
        unresolved_bases={"torch.nn.Module": 2},
        files_analyzed=7,
        suppression_lines={"a.py": (3, 9)},
    )
    cache = ResultCache(tmp_path / "cache", STAMP)
    cache.save(b"key", result)
    assert cache.load(b"key", OLD_NS) == result
    assert cache.load(b"other key", OLD_NS) is None
    unknown = AnalysisResult(files_analyzed=1)  # suppression lines not known: stays None
    cache.save(b"key", unknown)
    assert cache.load(b"key", OLD_NS) == unknown


def test_pickled_entries_are_handed_out_as_stored_and_exported_to_another_cache(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first_stat, second_stat = write_old(first, "a = 1\n"), write_old(second, "b = 2\n")
    cache = reloaded(tmp_path / "cache")
    cache.store_pickled(first, first_stat, content_digest(first.read_bytes()), dumps("summary-a"))
    cache.save()

    warm = reloaded(tmp_path / "cache")
    blob = warm.lookup_pickled(first, first_stat)
    assert blob is not None and loads(blob) == "summary-a"
    assert warm.lookup_pickled(second, second_stat) is None
    assert warm.lookup(first, first_stat) == "summary-a"
    assert warm.lookup_pickled(first, first_stat) is None  # unpickled now: use lookup

    # A forked checker's cache sends what it stored after a mark back to its parent's.
    mark = warm.stored_count
    store(warm, second, "summary-b")
    exported = warm.export_stored(mark)
    parent = reloaded(tmp_path / "cache")
    parent.import_stored(exported)
    assert parent.lookup(second, second_stat) == "summary-b"
    parent.save()
    assert reloaded(tmp_path / "cache").lookup(second, second_stat) == "summary-b"


@pytest.mark.parametrize(
    "data",
    [
        marshal.dumps({"a": 1}),
        marshal.dumps([("k", 1, 2, b"d")]),
        marshal.dumps([("good", 1, 2, b"d", b"x"), ("k", "1", 2, b"d", b"x")]),
    ],
)
def test_malformed_exported_entries_are_refused(tmp_path: Path, data: bytes) -> None:
    cache = reloaded(tmp_path / "cache")
    with pytest.raises(ValueError, match="malformed"):
        cache.import_stored(data)
    assert len(cache) == 0


def test_a_warm_fix_writes_the_imports_its_annotation_needs(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\ndependencies = ['typing_extensions']\n")
    (tmp_path / "base.py").write_text(
        "from collections.abc import Collection\n\n\nclass Base:\n"
        "    def work(self, xs: Collection[int]) -> None: ...\n"
    )
    child = tmp_path / "child.py"
    child.write_text(
        "from collections.abc import Sequence\n\nfrom typing_extensions import override\n\n"
        "from base import Base\n\n\nclass C(Base):\n    @override\n"
        "    def work(self, xs: Sequence[int]) -> None: ...\n"
    )
    for path in (tmp_path / "base.py", child):
        os.utime(path, ns=(OLD_NS, OLD_NS))  # old enough for the result cache to be trusted

    def audit(*args: str) -> int:
        command = [sys.executable, "-m", "kvref", "audit", ".", *args]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, check=False).returncode

    assert audit() == 1
    assert audit() == 1  # stores, then is answered by, the result cache
    assert audit("--fix", "--unsafe-fixes") == 0
    fixed = child.read_text()
    assert "xs: Collection[int]" in fixed
    namespace: dict[str, object] = {}
    source = fixed.replace("from base import Base", "Base = object")
    exec(compile(source, "child.py", "exec", dont_inherit=True), namespace)  # annotations run


def test_an_in_memory_cache_serves_one_run_and_writes_nothing(tmp_path: Path) -> None:
    # `--no-cache`: what the pool summarised is found by the checkers, never saved.
    module = tmp_path / "m.py"
    module.write_text("x = 1\n")
    before = time.time_ns() - 10 * RACY_WINDOW_NS
    os.utime(module, ns=(before, before))
    cache: SummaryCache[str] = SummaryCache(None, STAMP)
    cache.load()
    assert not cache.persistent and len(cache) == 0
    stat = module.stat()
    cache.store(module, stat, content_digest(module.read_bytes()), "summary")
    assert cache.lookup(module, stat) == "summary"
    cache.save()
    assert sorted(tmp_path.iterdir()) == [module]
    # A file changed since it was summarised no longer matches its entry.
    module.write_text("x = 2\n")
    assert cache.lookup(module, module.stat()) is None
