"""The pytest plugin of `tools/vllm_suite.py`'s runs of vLLM's own tests (`-p _vllm_suite_plugin`).

Loaded as a top-level module from `tools/` because vLLM's sdist has `tests` and `tools` packages
of its own, which the run must import. It marks every test `skip_global_cleanup` (vLLM's marker
for tests that need no GPU cleanup; its autouse cleanup otherwise costs a third of a second a
test), and writes a JSON report into the file `$KVREF_VLLM_SUITE_REPORT` names: where
`vllm.v1.kv_offload` and its CPU manager were imported from (so the caller can tell which copy of
vLLM, or kvref through `tests/vllm/kvref_vllm_shim.py`, ran) and each
test's outcome by node id. At the end it deletes the `/dev/shm` region files this process's
`SharedOffloadRegion`s created and left: vLLM's tests leave 17 a run (25 MB of memory each time)
where no worker barrier unlinks them.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "REPORT_ENV",
    "pytest_collection_modifyitems",
    "pytest_runtest_logreport",
    "pytest_sessionfinish",
    "pytest_sessionstart",
]

REPORT_ENV = "KVREF_VLLM_SUITE_REPORT"
_outcomes: dict[str, str] = {}
_created_regions: list[str] = []  # files of the regions this process created


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note the files of every shared region this process creates (it is their creator)."""
    module = importlib.import_module("vllm.v1.kv_offload.cpu.shared_offload_region")
    region_class = module.SharedOffloadRegion
    original = region_class.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self._creator:
            _created_regions.extend(path for path, _offset, _length in self._segments)

    region_class.__init__ = init


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.skip_global_cleanup)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # A test's verdict is its worst phase: a failed call, else an error in setup or teardown.
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "skipped"
    else:
        outcome = "passed"
    previous = _outcomes.get(report.nodeid)
    if previous in (None, "passed") or (previous == "skipped" and outcome != "passed"):
        _outcomes[report.nodeid] = outcome


def pytest_sessionfinish(session: pytest.Session) -> None:
    for path in _created_regions:  # mappings of them stay valid: only the names go
        Path(path).unlink(missing_ok=True)
    destination = os.environ.get(REPORT_ENV)
    if not destination:
        return
    package = importlib.import_module("vllm.v1.kv_offload")
    assert package.__file__ is not None
    manager = sys.modules.get("vllm.v1.kv_offload.cpu.manager")
    manager_file = getattr(manager, "__file__", None)
    report = {
        "imported_from": str(Path(package.__file__).resolve().parent),
        # Where the CPU manager under test came from: vLLM's, or kvref's through the shim.
        "manager_from": str(Path(manager_file).resolve()) if manager_file else None,
        "outcomes": _outcomes,
    }
    Path(destination).write_text(json.dumps(report, indent=1, sort_keys=True))
    # A test of vLLM's (its shared-region races, cpu/test_shared_offload_region.py) can leave
    # worker processes blocked on a queue when it fails under load; the interpreter's exit would
    # join them forever. The report is written: end them.
    for child in multiprocessing.active_children():
        child.kill()
        child.join(5)
