"""Hostile trees: every bad file is reported once with a clear message, the rest is audited."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvref.audit.model import FileError
from kvref.audit.parallel import DEFAULT_MAX_FILE_BYTES, summarize_many
from tests.audit.test_parallel import class_names


def errors_of(results: dict[Path, object]) -> dict[str, str]:
    return {
        result.path: result.message for result in results.values() if isinstance(result, FileError)
    }


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    (tmp_path / "good.py").write_text("class Good:\n    pass\n")
    (tmp_path / "syntax.py").write_text("class Broken(:\n    pass\n")
    (tmp_path / "latin1.py").write_bytes(b"name = '\xe9t\xe9'\n")
    (tmp_path / "nul.py").write_bytes(b"x = 1\x00\n")
    (tmp_path / "deep.py").write_text("x = " + "(" * 5000 + ")" * 5000 + "\n")
    (tmp_path / "loop_a.py").symlink_to(tmp_path / "loop_b.py")
    (tmp_path / "loop_b.py").symlink_to(tmp_path / "loop_a.py")
    (tmp_path / "dangling.py").symlink_to(tmp_path / "nowhere.py")
    os.mkfifo(tmp_path / "fifo.py")
    (tmp_path / "dir.py").mkdir()
    return tmp_path


@pytest.mark.parametrize("jobs", [1, 2])
def test_each_bad_file_is_reported_once_and_the_rest_audited(hostile: Path, jobs: int) -> None:
    names = ["good", "syntax", "latin1", "nul", "deep", "loop_a", "dangling", "fifo", "dir"]
    # Pad past the in-process threshold so jobs=2 really uses the pool.
    padding = [hostile / f"pad{index}.py" for index in range(60)]
    for path in padding:
        path.write_text(f"class Pad{path.stem}:\n    pass\n")
    paths = [hostile / f"{name}.py" for name in names] + padding
    results = summarize_many(paths, root=hostile, jobs=jobs, summarize=class_names)
    assert set(results) == set(paths)
    assert results[hostile / "good.py"] == ("Good",)
    assert all(not isinstance(results[path], FileError) for path in padding)
    errors = errors_of(dict(results))
    assert sorted(errors) == sorted(f"{name}.py" for name in names if name != "good")
    assert errors["syntax.py"].startswith("syntax error")
    assert "null bytes" in errors["nul.py"]
    assert errors["loop_a.py"] == "cannot read: Too many levels of symbolic links"
    assert errors["dangling.py"] == "cannot read: No such file or directory"
    assert errors["fifo.py"] == "cannot read: not a regular file"
    assert errors["dir.py"] == "cannot read: not a regular file"
    assert "too many nested parentheses" in errors["deep.py"]
    # A non-UTF-8 file without a coding cookie is a decoding error with its position.
    assert "can't decode byte 0xe9" in errors["latin1.py"]


def test_enormous_file_is_skipped_not_parsed(tmp_path: Path) -> None:
    generated = tmp_path / "generated_pb2.py"
    generated.write_bytes(b"x = 1\n" * (2 * 1024 * 1024 // 6 + 1))
    small = tmp_path / "small.py"
    small.write_text("class Small:\n    pass\n")
    results = summarize_many(
        [generated, small], root=tmp_path, jobs=1, summarize=class_names, max_bytes=1024 * 1024
    )
    error = results[generated]
    assert isinstance(error, FileError)
    assert error.message.startswith("skipped: 2.0 MiB is over the 1 MiB limit")
    assert results[small] == ("Small",)
    assert DEFAULT_MAX_FILE_BYTES >= 8 * 1024 * 1024  # real generated modules stay audited


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_reported(tmp_path: Path) -> None:
    secret = tmp_path / "secret.py"
    secret.write_text("x = 1\n")
    secret.chmod(0)
    results = summarize_many([secret], root=tmp_path, jobs=1, summarize=class_names)
    assert errors_of(dict(results)) == {"secret.py": "cannot read: Permission denied"}


def test_ten_thousand_files_with_one_bad_one(tmp_path: Path) -> None:
    paths: list[Path] = []
    for index in range(10_000):
        directory = tmp_path / f"pkg{index // 500}"
        if index % 500 == 0:
            directory.mkdir()
            (directory / "__init__.py").write_text("")
        path = directory / f"m{index}.py"
        path.write_text(f"class K{index}:\n    def run(self) -> None: ...\n")
        paths.append(path)
    bad = tmp_path / "pkg7" / "m3512.py"
    bad.write_bytes(b"\xff\xfe not python at all (\n")
    results = summarize_many(paths, root=tmp_path, summarize=class_names)
    assert len(results) == 10_000
    assert errors_of(dict(results)).keys() == {"pkg7/m3512.py"}
    assert results[paths[9_999]] == ("K9999",)
