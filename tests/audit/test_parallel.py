"""summarize_many: the same answers in-process and across processes, with and without a cache."""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path
from typing import cast

import pytest

from kvref.audit.runner.cache import SummaryCache
from kvref.audit.model import FileError
from kvref.audit.runner.parallel import SERIAL_THRESHOLD, Pickled, summarize_many, summarize_path

CALLS: list[str] = []


class NotPython(Exception):
    """Carries a position the way kvref.audit.summarise.summary.SummaryError does."""

    def __init__(self, message: str, line: int, col: int) -> None:
        super().__init__(message)
        self.message, self.line, self.col = message, line, col


OLD_NS = time.time_ns() - 3_600_000_000_000


def class_names(relative: str, source: bytes) -> tuple[str, ...]:
    """A small real summariser: the classes a module defines (raises like the engine's)."""
    CALLS.append(relative)
    try:
        tree = ast.parse(source, relative)
    except SyntaxError as error:
        raise NotPython(f"syntax error: {error.msg}", error.lineno or 1, error.offset or 1) from None
    return tuple(node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef))


def crashing(relative: str, source: bytes) -> str:
    raise RuntimeError("boom")


def make_tree(root: Path, count: int) -> list[Path]:
    paths: list[Path] = []
    for index in range(count):
        path = root / f"pkg{index % 7}" / f"mod{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"class C{index}:\n    def f(self) -> int:\n        return {index}\n")
        old = time.time_ns() - 3_600_000_000_000
        os.utime(path, ns=(old, old))
        paths.append(path)
    return paths


def test_pool_and_in_process_agree(tmp_path: Path) -> None:
    paths = make_tree(tmp_path, SERIAL_THRESHOLD * 3)
    (tmp_path / "pkg0" / "broken.py").write_text("class (:\n")
    paths.append(tmp_path / "pkg0" / "broken.py")
    serial = summarize_many(paths, root=tmp_path, jobs=1, summarize=class_names)
    pooled = summarize_many(paths, root=tmp_path, jobs=2, summarize=class_names)
    assert pooled == serial
    assert list(pooled) == list(dict.fromkeys(paths)) or set(pooled) == set(paths)
    assert serial[paths[5]] == ("C5",)
    broken = serial[paths[-1]]
    assert isinstance(broken, FileError)
    assert (broken.path, broken.line) == ("pkg0/broken.py", 1)
    assert broken.message.startswith("syntax error")


def test_cache_turns_a_second_run_into_lookups(tmp_path: Path) -> None:
    paths = make_tree(tmp_path / "src", 20)
    cache = SummaryCache[tuple[str, ...] | FileError](tmp_path / "cache", "t")
    cache.load()
    first = summarize_many(paths, root=tmp_path, jobs=1, cache=cache, summarize=class_names)
    cache.save()
    CALLS.clear()
    warm = SummaryCache[tuple[str, ...] | FileError](tmp_path / "cache", "t")
    warm.load()
    second = summarize_many(paths, root=tmp_path, jobs=1, cache=warm, summarize=class_names)
    assert second == first
    assert CALLS == []
    assert warm.hits == len(paths)

    paths[3].write_text("class Edited:\n    pass\n")
    third = summarize_many(paths, root=tmp_path, jobs=1, cache=warm, summarize=class_names)
    assert third[paths[3]] == ("Edited",)
    assert CALLS == ["src/pkg3/mod3.py"]


def test_cache_with_the_process_pool(tmp_path: Path) -> None:
    paths = make_tree(tmp_path, SERIAL_THRESHOLD * 2)
    cache = SummaryCache[tuple[str, ...] | FileError](tmp_path / "cache", "t")
    cache.load()
    cold = summarize_many(paths, root=tmp_path, jobs=2, cache=cache, summarize=class_names)
    assert cache.misses == len(paths)
    # Touch every file: the pool hashes them and answers "unchanged" instead of summaries.
    for path in paths:
        os.utime(path)
    touched = summarize_many(paths, root=tmp_path, jobs=2, cache=cache, summarize=class_names)
    assert touched == cold
    assert cache.hits == len(paths)


def test_a_crashing_summariser_becomes_a_file_error(tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_text("x = 1\n")
    result = summarize_many([path], root=tmp_path, jobs=1, summarize=crashing)[path]
    assert result == FileError("a.py", 1, 1, "cannot summarize: RuntimeError: boom")


def test_progress_is_reported_for_every_file(tmp_path: Path) -> None:
    paths = make_tree(tmp_path, SERIAL_THRESHOLD * 2)
    counts: list[int] = []
    summarize_many(paths, root=tmp_path, jobs=2, summarize=class_names, on_progress=counts.append)
    assert sum(counts) == len(paths)


def test_duplicates_are_summarised_once(tmp_path: Path) -> None:
    path = make_tree(tmp_path, 1)[0]
    CALLS.clear()
    results = summarize_many([path, path], root=tmp_path, jobs=1, summarize=class_names)
    assert list(results) == [path]
    assert CALLS == ["pkg0/mod0.py"]


def test_jobs_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        summarize_many([], root=tmp_path, jobs=0, summarize=class_names)


def test_unchanged_digest_skips_the_summariser(tmp_path: Path) -> None:
    path = make_tree(tmp_path, 1)[0]
    _, file_stat, digest = summarize_path(path, tmp_path, class_names)
    assert file_stat is not None
    CALLS.clear()
    result, _, _ = summarize_path(path, tmp_path, class_names, expected_digest=digest)
    assert CALLS == []
    assert type(result).__name__ == "Unchanged"


def test_lazy_hands_out_pickles_from_the_pool_and_the_cache_that_load_to_the_same(
    tmp_path: Path,
) -> None:
    paths = make_tree(tmp_path / "src", SERIAL_THRESHOLD * 2)
    for path in paths:
        os.utime(path, ns=(OLD_NS, OLD_NS))
    eager = summarize_many(paths, root=tmp_path, jobs=1, summarize=class_names)
    cache = SummaryCache[tuple[str, ...] | FileError](tmp_path / "cache", "t")
    cache.load()
    pooled = summarize_many(
        paths, root=tmp_path, jobs=2, cache=cache, summarize=class_names, lazy=True
    )
    assert all(isinstance(value, Pickled) for value in pooled.values())
    assert {path: cast(Pickled[object], value).load() for path, value in pooled.items()} == eager
    cache.save()

    warm = SummaryCache[tuple[str, ...] | FileError](tmp_path / "cache", "t")
    warm.load()
    hits = summarize_many(paths, root=tmp_path, jobs=2, cache=warm, summarize=class_names, lazy=True)
    assert warm.hits == len(paths)
    assert all(isinstance(value, Pickled) and value.weight > 0 for value in hits.values())
    assert {path: cast(Pickled[object], value).load() for path, value in hits.items()} == eager


FOLLOWED: dict[str, str] = {}  # a class name -> the file a summary naming it leads to


def lead_to_followed(summary: tuple[str, ...]) -> list[str]:
    """A `follow` for `class_names`: the files registered for the classes a module defines."""
    return [FOLLOWED[name] for name in summary if name in FOLLOWED]


def test_followed_files_are_summarised_by_the_pool_into_the_cache_only(tmp_path: Path) -> None:
    paths = make_tree(tmp_path / "src", SERIAL_THRESHOLD * 2)
    extra = tmp_path / "elsewhere" / "extra.py"
    extra.parent.mkdir()
    extra.write_text("class Extra:\n    pass\n")
    again = tmp_path / "elsewhere" / "again.py"  # led to by a followed file: followed too
    again.write_text("class Again:\n    pass\n")
    for path in (extra, again):
        os.utime(path, ns=(OLD_NS, OLD_NS))
    FOLLOWED.update({"C3": str(extra), "C5": str(extra), "Extra": str(again)})
    try:
        cache = SummaryCache[tuple[str, ...] | FileError](tmp_path / "cache", "t")
        cache.load()
        results = summarize_many(
            paths, root=tmp_path, jobs=2, cache=cache, summarize=class_names,
            lazy=True, follow=lead_to_followed,
        )  # fmt: skip
        assert set(results) == set(paths)  # followed files are not returned
        cache.save()
        warm = SummaryCache[tuple[str, ...] | FileError](tmp_path / "cache", "t")
        warm.load()
        assert warm.lookup(extra, extra.stat()) == ("Extra",)
        assert warm.lookup(again, again.stat()) == ("Again",)
        # Without a cache there is nowhere to keep them: `follow` is not even called.
        MARKER.append(str(tmp_path / "followed"))
        summarize_many(paths, root=tmp_path, jobs=2, summarize=class_names, follow=marking_follow)
        assert not (tmp_path / "followed").exists()
        summarize_many(
            paths, root=tmp_path, jobs=2, summarize=class_names, follow=marking_follow,
            cache=SummaryCache[tuple[str, ...] | FileError](tmp_path / "other", "t"),
        )  # fmt: skip
        assert (tmp_path / "followed").exists()  # (the marker works)
    finally:
        FOLLOWED.clear()
        MARKER.clear()


MARKER: list[str] = []


def marking_follow(summary: tuple[str, ...]) -> list[str]:
    """A `follow` that leaves a file behind when a worker calls it, and leads nowhere."""
    Path(MARKER[0]).touch()
    return []
