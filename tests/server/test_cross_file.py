"""The server's index follows the editors' buffers and the disk: editing a base class in one
open document republishes the diagnostics of the open documents that derive from it, and files
changed on disk (`workspace/didChangeWatchedFiles`) are read again."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types

from tests.server.lsp_client import started, wait_until
from tests.server.projects import BASE, SUB, write_project

pytestmark = pytest.mark.asyncio

# Both subclass methods carry @override: clean until the base changes.
CLEAN_SUB = SUB.replace("    def load", "    @override\n    def load")


async def test_editing_a_base_buffer_republishes_its_subclasses(tmp_path: Path) -> None:
    root = write_project(tmp_path / "proj", {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/sub.py": CLEAN_SUB})
    async with started(root, settings={"debounce": 0}) as client:
        base = client.open(root / "pkg" / "base.py")
        sub = client.open(root / "pkg" / "sub.py")
        await wait_until(lambda: client.latest(base) and client.latest(sub), "both documents published")
        assert client.codes(sub) == []
        # Renaming the base method (unsaved): the subclass's @override on `load` is stale.
        client.replace_all(base, BASE.replace("def load", "def fetch"), version=2)
        await wait_until(lambda: client.codes(sub) == [(7, "KVR002")], "KVR002 in the subclass")
        # Adding a method the subclass also defines: a missing @override appears.
        added = BASE + "\n    def close(self) -> None: ...\n"
        client.replace_all(base, added, version=3)
        client.replace_all(sub, CLEAN_SUB + "\n    def close(self) -> None: ...\n", version=2)
        await wait_until(lambda: client.codes(sub) == [(13, "KVR001")], "KVR001 for the new base method")
        assert (root / "pkg" / "base.py").read_text(encoding="utf-8") == BASE  # nothing written


async def test_a_file_changed_on_disk_updates_the_index(tmp_path: Path) -> None:
    root = write_project(tmp_path / "proj", {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/sub.py": CLEAN_SUB})
    async with started(root, settings={"debounce": 0}) as client:
        sub = client.open(root / "pkg" / "sub.py")
        await wait_until(lambda: client.latest(sub) is not None, "diagnostics")
        assert client.codes(sub) == []
        assert any(r.method == types.WORKSPACE_DID_CHANGE_WATCHED_FILES for r in client.record.registrations)
        base = root / "pkg" / "base.py"
        base.write_text(BASE.replace("def store", "def put"), encoding="utf-8")
        client.workspace_did_change_watched_files(
            types.DidChangeWatchedFilesParams(changes=[types.FileEvent(uri=base.as_uri(), type=types.FileChangeType.Changed)])
        )
        await wait_until(lambda: client.codes(sub) == [(11, "KVR002")], "KVR002 after the base changed on disk")
        # A new file deriving from the subclass, then the base deleted: the index follows.
        base.unlink()
        client.workspace_did_change_watched_files(
            types.DidChangeWatchedFilesParams(changes=[types.FileEvent(uri=base.as_uri(), type=types.FileChangeType.Deleted)])
        )
        await wait_until(lambda: client.codes(sub) == [], "no findings once the base is gone (unresolved)")
