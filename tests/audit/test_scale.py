"""`kvref audit` with the cache, the pool and `--python`, end to end through `main(argv)`."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import cast

import pytest

import kvref.audit.pipeline
import kvref.audit.resolve.modules
import kvref.audit.runner.scale
from kvref.audit.resolve.stdlib import TYPESHED
from kvref.audit.runner.cache import SummaryCache
from kvref.cli import audit_main as main
from kvref.audit.model import DEFAULT_MAX_FILE_BYTES, AnalysisResult

OLD_NS = time.time_ns() - 3_600_000_000_000


def make_project(root: Path) -> None:
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    package = root / "demo"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text("class Base:\n    def run(self) -> None: ...\n")
    (package / "child.py").write_text(
        "from demo.base import Base\n\n\nclass Child(Base):\n    def run(self) -> None: ...\n"
    )
    for path in root.rglob("*"):
        os.utime(path, ns=(OLD_NS, OLD_NS))


def audit_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main(["--output-format", "json", *argv])
    out = capsys.readouterr().out
    document = cast(object, json.loads(out) if out.strip() else {"findings": []})
    if isinstance(document, dict):
        document = cast(dict[str, object], document)["findings"]
    findings = cast(list[dict[str, object]], document)
    return code, sorted(f"{item['path']}:{item['line']}:{item['code']}" for item in findings)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    make_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KVREF_CACHE_DIR", raising=False)
    return tmp_path


def test_warm_run_reuses_the_stored_result(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cold = audit_json(capsys)
    assert cold == (1, ["demo/child.py:5:KVR001"])
    assert (project / ".kvref_cache" / "result.bin").is_file()

    def must_not_run(*args: object, **kwargs: object) -> AnalysisResult:
        raise AssertionError("the warm run analysed again")

    monkeypatch.setattr(kvref.audit.pipeline, "plan", must_not_run)
    assert audit_json(capsys) == cold


def test_an_edit_is_seen_and_unchanged_files_come_from_the_summary_cache(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    audit_json(capsys)
    child = project / "demo" / "child.py"
    child.write_text(
        "from typing_extensions import override\n\nfrom demo.base import Base\n\n\n"
        "class Child(Base):\n    @override\n    def run(self) -> None: ...\n\n"
        "    def walk(self) -> None: ...\n"
    )
    summarized: list[str] = []
    real = kvref.audit.runner.scale.summarize

    def counting(path: str, source: bytes) -> object:
        summarized.append(path)
        return real(path, source)

    monkeypatch.setattr(kvref.audit.runner.scale, "summarize", counting)
    assert audit_json(capsys, "--jobs", "1") == (0, [])
    assert summarized == ["demo/child.py"]


def test_no_cache_writes_nothing(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert audit_json(capsys, "--no-cache") == (1, ["demo/child.py:5:KVR001"])
    assert not (project / ".kvref_cache").exists()


def test_cache_dir_option_and_a_corrupt_cache(
    project: Path, capsys: pytest.CaptureFixture[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    elsewhere = tmp_path_factory.mktemp("cache")
    first = audit_json(capsys, "--cache-dir", str(elsewhere))
    assert not (project / ".kvref_cache").exists()
    for entry in elsewhere.iterdir():
        if entry.is_file() and entry.name != ".gitignore":
            entry.write_bytes(b"\x00garbage")
    assert audit_json(capsys, "--cache-dir", str(elsewhere)) == first


def test_bad_python_is_a_usage_error(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--python", "/no/such/python"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvref: error: --python: /no/such/python is not an executable")
    assert "Traceback" not in err


def test_python_option_accepts_an_interpreter(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert audit_json(capsys, "--python", sys.executable, "--no-cache") == (
        1,
        ["demo/child.py:5:KVR001"],
    )


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_jobs_must_be_a_positive_number(
    project: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    assert main(["--jobs", value]) == 2
    assert "--jobs" in capsys.readouterr().err


def test_every_analysis_option_is_part_of_the_result_cache_key() -> None:
    from dataclasses import fields, replace

    from kvref.audit.model import AnalysisOptions

    key = kvref.audit.runner.scale._options_key  # pyright: ignore[reportPrivateUsage]
    default = AnalysisOptions()
    changed = {
        "object_dunders": False,
        "abstract_implementations": False,
        "protocol_members": False,
        "exempt_names": frozenset({"__init__"}),
        "override_import": "typing",
        "python_floor": (3, 12),
        "typing_extensions": "undeclared",
        "build_typing_extensions": True,
        "import_line_length": 100,
        "first_party": frozenset({"pkg"}),
        "max_file_bytes": 1024,
        "report_dependents": True,
        "rules": frozenset({"KVR001"}),
    }
    assert {item.name for item in fields(default)} == set(changed)
    for name, value in changed.items():
        assert key(replace(default, **{name: value})) != key(default), name
    assert key(AnalysisOptions()) == key(default)


def test_an_audit_leaves_the_cyclic_collector_as_it_found_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gc.isenabled()
    audit_json(capsys)
    assert gc.isenabled()
    gc.disable()
    try:
        audit_json(capsys)
        assert not gc.isenabled()  # a caller that turned it off keeps it off
    finally:
        gc.enable()


def test_summaries_made_in_a_forked_checker_are_saved_with_the_parents_cache(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # One module per checker process; the last share (a forked child) is the only one that
    # reaches json.encoder, so its summary reaches the cache only if the child sends it back.
    monkeypatch.setattr(kvref.audit.runner.scale, "MIN_SHARE", 1)
    # This process may have summarised json.encoder for an earlier test: forget it.
    monkeypatch.setattr(kvref.audit.resolve.modules, "FILE_CACHE", {})
    (project / "demo" / "zz.py").write_text(
        "import json\n\n\nclass Encoder(json.JSONEncoder):\n    def default(self, o: object) -> object: ...\n"
    )
    os.utime(project / "demo" / "zz.py", ns=(OLD_NS, OLD_NS))
    code, found = audit_json(capsys, "--jobs", "2")
    assert (code, found) == (1, ["demo/child.py:5:KVR001", "demo/zz.py:5:KVR001"])
    cache = SummaryCache[object](
        project / ".kvref_cache",
        kvref.audit.runner.scale.summary_stamp(project, DEFAULT_MAX_FILE_BYTES),
    )
    cache.load()
    assert TYPESHED is not None
    encoder = TYPESHED / "json" / "encoder.pyi"  # what the checkers read for json.encoder
    assert cache.lookup(encoder, encoder.stat()) is not None


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "in-process"])
def test_caches_are_on_disk_when_the_command_returns(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fork: bool
) -> None:
    # The command line asks for the caches to be written in the background; run_audit must
    # wait for them, and without fork they are written in this process.
    monkeypatch.setattr(kvref.audit.runner.scale, "fork_available", lambda: fork)
    assert audit_json(capsys) == (1, ["demo/child.py:5:KVR001"])
    packs = list((project / ".kvref_cache").glob("summaries-*.pack"))
    assert len(packs) == 1 and (project / ".kvref_cache" / "result.bin").is_file()
    assert not kvref.audit.runner.scale._saving  # pyright: ignore[reportPrivateUsage]
