"""`kvref server` answers `initialize`, `shutdown` and `exit` cleanly and declares what it does;
without the `server` extra it exits 2 with one line naming it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lsprotocol import types

from tests.server.lsp_client import CHECKOUT, started
from tests.server.projects import BASE, write_project


@pytest.mark.asyncio
async def test_initialize_declares_the_features_and_shutdown_exit_end_the_process(tmp_path: Path) -> None:
    root = write_project(tmp_path / "proj", {"base.py": BASE})
    async with started(root) as client:
        server: asyncio.subprocess.Process = getattr(client, "_server")
        result = client.initialized_with
        assert result is not None and result.server_info is not None and result.server_info.name == "kvref"
        capabilities = result.capabilities
        sync = capabilities.text_document_sync
        assert isinstance(sync, types.TextDocumentSyncOptions)
        assert sync.change == types.TextDocumentSyncKind.Incremental and sync.open_close
        assert isinstance(capabilities.code_action_provider, types.CodeActionOptions)
        assert set(capabilities.code_action_provider.code_action_kinds or ()) == {"quickfix", "source.fixAll.kvref"}
        assert capabilities.position_encoding == types.PositionEncodingKind.Utf16
    assert server.returncode == 0  # `started` sent shutdown, then exit


def test_without_pygls_installed(tmp_path: Path) -> None:
    # `None` in sys.modules makes `import pygls` fail as if it were not installed.
    script = "import sys; sys.modules['pygls'] = None; sys.argv = ['kvref', 'server']; from kvref.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["kvref: error: kvref server needs pygls and lsprotocol: pip install 'kvref[server]'"]
