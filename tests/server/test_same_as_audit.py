"""For any file, the server's diagnostics are the findings `kvref audit` gives for that file's
text: on examples/engine (each file through `kvref audit - --stdin-filename`, unedited and
edited), and on a copy of vLLM 0.33's `vllm/v1/kv_offload` with vLLM's environment resolving
its bases (every file open at once, against one `kvref audit` of the copy)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from lsprotocol import types

from tests.server.lsp_client import CHECKOUT, KvrefClient, started, wait_until

pytestmark = pytest.mark.asyncio

Row = tuple[str, int, int, int, int, str]
VLLM_PYTHON = CHECKOUT / ".venv-vllm" / "bin" / "python"


def audit_json(cwd: Path, *args: str, text: str | None = None) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "kvref", "audit", *args, "--output-format", "json", "--exit-zero", "--no-cache"],
        input=text, capture_output=True, text=True, cwd=cwd, timeout=300,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT), "VIRTUAL_ENV": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["errors"] == []
    return cast(list[dict[str, Any]], report["findings"])


def audit_rows(findings: list[dict[str, Any]]) -> dict[str, set[Row]]:
    rows: dict[str, set[Row]] = {}
    for f in findings:
        row = (f["code"], f["line"] - 1, f["col"] - 1, f["end_line"] - 1, f["end_col"] - 1, f["message"])
        rows.setdefault(f["path"], set()).add(row)
    return rows


def server_rows(client: KvrefClient, uri: str) -> set[Row]:
    published = client.latest(uri)
    assert published is not None
    return {
        (str(d.code), d.range.start.line, d.range.start.character, d.range.end.line, d.range.end.character, d.message)
        for d in published.diagnostics
    }


async def test_examples_engine_gives_the_findings_of_kvref_audit_stdin(tmp_path: Path) -> None:
    engine = CHECKOUT / "examples" / "engine"
    names = sorted(path.name for path in engine.glob("*.py"))
    async with started(CHECKOUT, cache_dir=tmp_path / "cache", settings={"debounce": 0}) as client:
        uris = {name: client.open(engine / name) for name in names}
        await wait_until(lambda: all(client.latest(uri) for uri in uris.values()), "every file published", 120)
        total = 0
        for name in names:
            text = (engine / name).read_text(encoding="utf-8")
            expected = audit_rows(audit_json(CHECKOUT, "-", "--stdin-filename", f"examples/engine/{name}", text=text))
            assert server_rows(client, uris[name]) == expected.get(f"examples/engine/{name}", set()), name
            total += len(expected.get(f"examples/engine/{name}", ()))
        assert total >= 10  # the example's deliberate findings
        # An unsaved edit: the same as the command line on the edited text.
        text = (engine / "manager.py").read_text(encoding="utf-8").replace("    def prepare_load", "    @override\n    def prepare_load")
        client.replace_all(uris["manager.py"], text, version=2)
        await wait_until(lambda: client.published_version(uris["manager.py"]) == 2, "the edit checked")
        expected = audit_rows(audit_json(CHECKOUT, "-", "--stdin-filename", "examples/engine/manager.py", text=text))
        assert server_rows(client, uris["manager.py"]) == expected["examples/engine/manager.py"]


async def test_vllm_kv_offload_gives_the_findings_of_kvref_audit(tmp_path: Path) -> None:
    assert VLLM_PYTHON.exists(), "make vllm-env builds vLLM 0.33's environment"
    found = subprocess.run(
        [str(VLLM_PYTHON), "-c", "import vllm.v1.kv_offload as m, os; print(os.path.dirname(m.__file__))"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    root = tmp_path / "proj"
    shutil.copytree(found.stdout.strip(), root / "kv_offload", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "pyproject.toml").write_text('[project]\nname = "copy"\ndependencies = ["vllm"]\n', encoding="utf-8")
    expected = audit_rows(audit_json(root, "kv_offload", "--python", str(VLLM_PYTHON)))
    assert sum(len(rows) for rows in expected.values()) >= 30  # vLLM 0.33 misses @override often
    files = sorted((root / "kv_offload").rglob("*.py"))
    assert len(files) >= 40
    async with started(root, args=("--python", str(VLLM_PYTHON)), settings={"debounce": 0}) as client:
        uris = {path: client.open(path) for path in files}
        await wait_until(lambda: all(client.latest(uri) for uri in uris.values()), "every file published", 180)
        for path, uri in uris.items():
            name = path.relative_to(root).as_posix()
            assert server_rows(client, uri) == expected.get(name, set()), name
        assert not [m for m in client.messages if m.type == types.MessageType.Error]
