"""Indexing a workspace reports `$/progress` with a percentage, only to a client that supports
`window/workDoneProgress`."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import client_capabilities

from tests.server.lsp_client import started, wait_until
from tests.server.projects import BASE, write_project

pytestmark = pytest.mark.asyncio


def _many_files(root: Path) -> Path:
    files = {f"pkg/m{index:03}.py": BASE.replace("Base", f"Base{index}") for index in range(100)}
    return write_project(root, {"pkg/__init__.py": "", **files})


async def test_indexing_reports_progress_with_a_rising_percentage(tmp_path: Path) -> None:
    root = _many_files(tmp_path / "proj")
    async with started(root) as client:
        await wait_until(
            lambda: any(isinstance(v, types.WorkDoneProgressEnd) for r in client.progress_reports.values() for v in r),
            "the end of indexing",
        )
        [reports] = client.progress_reports.values()
        begin, *middle, end = reports
        assert isinstance(begin, types.WorkDoneProgressBegin) and begin.percentage == 0
        assert isinstance(end, types.WorkDoneProgressEnd)
        percentages = [report.percentage or 0 for report in middle if isinstance(report, types.WorkDoneProgressReport)]
        assert len(percentages) >= 3 and percentages == sorted(percentages) and percentages[-1] == 100
        assert (root / ".kvref_cache").is_dir()  # the index is kvref audit's summary cache


async def test_no_progress_without_client_support(tmp_path: Path) -> None:
    root = _many_files(tmp_path / "proj")
    capabilities = client_capabilities("visual-studio-code")
    capabilities.window = types.WindowClientCapabilities(work_done_progress=False)
    async with started(root, capabilities=capabilities) as client:
        uri = client.open(root / "pkg" / "m000.py")
        await wait_until(lambda: client.latest(uri) is not None, "diagnostics")
        await wait_until(lambda: any((root / ".kvref_cache").glob("summaries-*.pack")), "the index saved")
        assert client.progress_reports == {}
