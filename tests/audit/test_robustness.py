"""Hostile trees: every bad file is reported once with a clear message, the rest is audited."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from kvref.audit.command import EXIT_FINDINGS, AuditRequest, run_audit
from kvref.audit.report import OutputFormat
from kvref.cli import audit_main as main
from kvref.audit.model import FileError
from kvref.audit.runner.parallel import DEFAULT_MAX_FILE_BYTES, summarize_many
from kvref.audit.runner.scale import _Summaries  # pyright: ignore[reportPrivateUsage]
from kvref.audit.summarise.records import ModuleSummary
from kvref.audit.summarise.summary import summarize
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


def test_a_base_module_over_the_limit_is_a_file_error_not_a_missing_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "base.py").write_text("class Base:\n    def work(self) -> None: ...\n" + "#" * 3000 + "\n")
    (tmp_path / "child.py").write_text("from base import Base\n\n\nclass C(Base):\n    def work(self) -> None: ...\n")
    (tmp_path / "pyproject.toml").write_text('[tool.kvref]\nmax-file-size = "2 KiB"\n')
    monkeypatch.chdir(tmp_path)
    assert main([".", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "base.py:1:1: error: skipped: 3.0 KiB is over the 2 KiB limit" in err
    assert "base.Base (1)" in err  # C is checked against its known bases only
    assert "not installed" not in err  # base.py is there: the file error says why it is unread


def test_a_base_module_summarised_on_demand_keeps_the_size_limit(tmp_path: Path) -> None:
    # The runner summarises modules a lookup reaches (installed packages, the standard
    # library) on demand: one over the limit stays skipped, it is not parsed after all.
    big = tmp_path / "big_base.py"
    big.write_text("class Base:\n    def work(self) -> None: ...\n" + "#" * 4096 + "\n")
    small = tmp_path / "small_base.py"
    small.write_text("class Base:\n    def work(self) -> None: ...\n")
    summaries = _Summaries(tmp_path, jobs=1, cache=None, on_progress=None, max_bytes=1024)
    assert summaries.load(big) is None
    loaded = summaries.load(small)
    assert isinstance(loaded, ModuleSummary)


def test_unreadable_file_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "secret.py"
    secret.write_text("x = 1\n")
    secret.chmod(0)
    if os.geteuid() == 0:
        # Root reads a file whatever its mode (CI runs as root): refuse it the way the kernel
        # refuses anyone else, at the open that reads it.
        real_open = os.open

        def refusing_open(path: str | os.PathLike[str], flags: int, *args: int, **kwargs: int) -> int:
            if os.fspath(path) == str(secret):
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", refusing_open)
    results = summarize_many([secret], root=tmp_path, jobs=1, summarize=class_names)
    assert errors_of(dict(results)) == {"secret.py": "cannot read: Permission denied"}


@pytest.mark.parametrize("output_format", ["text", "json", "sarif", "github"])
def test_a_file_name_that_is_not_utf8_is_audited_with_the_cache_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output_format: str
) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "base.py").write_text("class Base:\n    def work(self) -> None: ...\n")
    odd = os.fsdecode(b"caf\xe9.py")  # Latin-1 bytes: lone surrogates once decoded
    (tmp_path / odd).write_text(
        "from base import Base\n\n\nclass C(Base):\n    def work(self) -> None: ...\n"
    )
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # cold, then warm from the cache
        raw_out, raw_err = io.BytesIO(), io.BytesIO()
        out = io.TextIOWrapper(raw_out, encoding="utf-8", errors="strict")
        err = io.TextIOWrapper(raw_err, encoding="utf-8", errors="strict")
        request = AuditRequest(paths=(Path("."),), output_format=OutputFormat(output_format))
        code = run_audit(request, stdout=out, stderr=err)
        out.flush()
        err.flush()
        assert b"internal error" not in raw_err.getvalue()
        assert code == EXIT_FINDINGS, raw_err.getvalue()
        printed = raw_out.getvalue()
        if output_format == "json":
            assert json.loads(printed)["findings"][0]["path"] == odd
        elif output_format == "sarif":
            location = json.loads(printed)["runs"][0]["results"][0]["locations"][0]
            assert location["physicalLocation"]["artifactLocation"]["uri"] == "caf%E9.py"
        else:  # the name's own bytes, as `ls` prints them
            assert b"caf\xe9.py" in printed and b"KVR001" in printed


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
    results = summarize_many(paths, root=tmp_path, summarize=summarize)
    assert len(results) == 10_000
    assert errors_of(dict(results)).keys() == {"pkg7/m3512.py"}
    last = results[paths[9_999]]
    assert isinstance(last, ModuleSummary) and [c.name for c in last.classes] == ["K9999"]


def test_cli_reports_each_bad_file_once_and_audits_the_rest(
    hostile: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (hostile / "pyproject.toml").write_text("[project]\nname = 'hostile'\n")
    (hostile / "child.py").write_text(
        "from good import Good\n\n\nclass Child(Good):\n    def __repr__(self) -> str: ...\n"
    )
    monkeypatch.chdir(hostile)
    (hostile / "sub").mkdir()
    (hostile / "sub" / "again").symlink_to(hostile)
    code = main([".", "--no-cache"])
    captured = capsys.readouterr()
    assert "child.py:5:9: KVR001" in captured.out
    bad = ["syntax.py", "latin1.py", "nul.py", "deep.py", "loop_a.py", "loop_b.py", "dangling.py"]
    for name in bad:
        assert captured.err.count(f"{name}:") == 1, (name, captured.err)
    assert captured.err.count("sub/again: symbolic link loop, not followed") == 1
    assert "loop_a.py: cannot read (Too many levels of symbolic links), skipped" in captured.err
    assert "dangling.py: broken symbolic link (dangling or a loop), skipped" in captured.err
    assert code == 2


def test_max_file_size_is_configurable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "base.py").write_text("class Base:\n    def work(self) -> None: ...\n")
    (tmp_path / "big.py").write_text(
        "from base import Base\n\n\nclass C(Base):\n    def work(self) -> None: ...\n" + "#" * 3000 + "\n"
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.kvref]\nmax-file-size = "2 KiB"\n')
    assert main(["."]) == 2  # cached, then the limit changes: the cache must not keep the skip
    err = capsys.readouterr().err
    assert "big.py:1:1: error: skipped: 3.0 KiB is over the 2 KiB limit for one file" in err
    assert "max-file-size" in err
    (tmp_path / "pyproject.toml").write_text('[tool.kvref]\nmax-file-size = "8 KiB"\n')
    assert main(["."]) == 1
    assert "big.py:5:9: KVR001" in capsys.readouterr().out
