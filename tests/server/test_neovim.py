"""A real editor: Neovim's built-in LSP client (Debian's neovim, 0.7), headless, set up by the
configuration docs/EDITORS.md gives, opens a file, reads the KVR001 diagnostic, applies the
quick fix, and the buffer holds what `--fix` writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.server.lsp_client import CHECKOUT
from tests.server.projects import BASE, write_project
from tests.test_docs import EDITORS, code_blocks

DOCUMENTED_COMMAND = "/path/to/project/.venv/bin/kvref"

ONE_MISSING = """\
from typing_extensions import override

from pkg.base import Base


class Cached(Base):
    def load(self, key: str) -> bytes:
        return b"cached"

    @override
    def store(self, key: str, value: bytes) -> None: ...
"""


def test_neovim_reads_the_diagnostic_and_applies_the_quick_fix(tmp_path: Path) -> None:
    nvim = shutil.which("nvim")
    assert nvim is not None, "make neovim installs Debian's neovim"
    root = write_project(tmp_path / "proj", {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/sub.py": ONE_MISSING})
    out = tmp_path / "report.json"
    command = tmp_path / "kvref"  # the documented path, made real: this checkout's kvref
    command.write_text(f'#!/bin/sh\nexec {sys.executable} -m kvref "$@"\n')
    command.chmod(0o755)
    (documented,) = code_blocks(EDITORS.read_text(encoding="utf-8"), "lua")
    assert DOCUMENTED_COMMAND in documented
    setup = tmp_path / "setup.lua"
    setup.write_text(documented.replace(DOCUMENTED_COMMAND, str(command)))
    env = {
        **os.environ,
        "KVREF_SETUP": str(setup),
        "KVREF_FILE": str(root / "pkg" / "sub.py"),
        "KVREF_OUT": str(out),
        "KVREF_CACHE_DIR": str(tmp_path / "cache"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg-cache"),
        "XDG_STATE_HOME": str(tmp_path / "xdg-state"),
        "PYTHONPATH": str(CHECKOUT),
    }
    script = CHECKOUT / "tests" / "server" / "neovim_client.lua"
    done = subprocess.run(
        [nvim, "--headless", "--clean", "-n", "-c", f"luafile {script}"],
        env=env, cwd=root, capture_output=True, text=True, timeout=150, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    report = json.loads(out.read_text(encoding="utf-8"))
    assert done.returncode == 0, (report, done.stderr[-2000:])
    assert report["diagnostic"]["code"] == "KVR001"
    assert report["diagnostic"]["message"].startswith('Method "Cached.load" overrides')
    assert (report["diagnostic"]["lnum"], report["diagnostic"]["col"], report["diagnostic"]["end_col"]) == (6, 8, 12)
    assert report["applied"] == "kvref (KVR001): Add @override"
    assert report["lines"] == ONE_MISSING.replace("    def load", "    @override\n    def load").splitlines()
    assert report["cleared"] is True
