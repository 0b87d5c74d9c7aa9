"""Code actions: a quick fix per fixable finding (the edits `--fix` makes), `source.fixAll.kvref`
(what `kvref audit --fix` writes), `# noqa: CODE` on the line, and unsafe fixes only when the
settings allow them, marked unsafe."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from lsprotocol import types

from kvref.audit.source import split_lines
from tests.server.lsp_client import CHECKOUT, KvrefClient, started, wait_until
from tests.server.projects import BASE, write_project

pytestmark = pytest.mark.asyncio

TWO_MISSING = """\
from pkg.base import Base


class Cached(Base):
    def load(self, key: str) -> bytes:
        return b"cached"

    def store(self, key: str, value: bytes) -> None: ...
"""

NARROWED = """\
from collections.abc import Collection, Sequence

from typing_extensions import override


class Base:
    def touch(self, keys: Collection[bytes]) -> None: ...


class Sub(Base):
    @override
    def touch(self, keys: Sequence[bytes]) -> None: ...
"""


def apply(text: str, edit: types.WorkspaceEdit | None, uri: str) -> str:
    """`text` after the one-document edit (ASCII text: positions are characters)."""
    assert edit is not None
    if edit.document_changes:
        [change] = edit.document_changes
        assert isinstance(change, types.TextDocumentEdit) and change.text_document.uri == uri
        edits = list(change.edits)
    else:
        assert edit.changes is not None
        edits = list(edit.changes[uri])
    lines = split_lines(text)
    offsets = [sum(len(line) + 1 for line in lines[:index]) for index in range(len(lines))]
    for each in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        assert isinstance(each, types.TextEdit)
        start = offsets[each.range.start.line] + each.range.start.character
        end = offsets[each.range.end.line] + each.range.end.character
        text = text[:start] + each.new_text + text[end:]
    return text


async def actions(client: KvrefClient, uri: str, line: int, only: list[str] | None = None) -> list[types.CodeAction]:
    result = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(start=types.Position(line=line, character=0), end=types.Position(line=line, character=0)),
            context=types.CodeActionContext(diagnostics=[], only=only),
        )
    )
    return [action for action in result or [] if isinstance(action, types.CodeAction)]


def cli_fixed(root: Path, name: str, text: str, *extra: str) -> str:
    """What `kvref audit - --stdin-filename NAME --fix` prints for `text`."""
    done = subprocess.run(
        [sys.executable, "-m", "kvref", "audit", "-", "--stdin-filename", name, "--fix", "--no-cache", *extra],
        input=text, capture_output=True, text=True, cwd=root, env={"PYTHONPATH": str(CHECKOUT), "PATH": ""},
        timeout=120,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


async def test_quick_fix_and_fix_all_make_the_edits_of_fix(tmp_path: Path) -> None:
    root = write_project(tmp_path / "proj", {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/sub.py": TWO_MISSING})
    async with started(root) as client:
        uri = client.open(root / "pkg" / "sub.py")
        await wait_until(lambda: client.codes(uri) == [(4, "KVR001"), (7, "KVR001")], "two KVR001")
        [quick, noqa] = await actions(client, uri, 4, only=[types.CodeActionKind.QuickFix])
        assert quick.kind == types.CodeActionKind.QuickFix and quick.is_preferred
        assert quick.diagnostics is not None and [str(d.code) for d in quick.diagnostics] == ["KVR001"]
        fixed_one = apply(TWO_MISSING, quick.edit, uri)
        assert fixed_one.count("@override") == 1 and "from typing_extensions import override" in fixed_one
        assert fixed_one.index("@override") < fixed_one.index("def load")
        # The same text `--fix` gives once the other finding is suppressed.
        suppressed = TWO_MISSING.replace("-> None: ...", "-> None: ...  # noqa: KVR001")
        assert apply(suppressed, quick.edit, uri) == cli_fixed(root, "pkg/sub.py", suppressed)
        assert noqa.title.endswith("(# noqa: KVR001)")
        [fix_all] = await actions(client, uri, 0, only=["source.fixAll.kvref"])
        assert fix_all.kind == "source.fixAll.kvref"
        assert apply(TWO_MISSING, fix_all.edit, uri) == cli_fixed(root, "pkg/sub.py", TWO_MISSING)


async def test_noqa_action_suppresses_the_finding(tmp_path: Path) -> None:
    root = write_project(tmp_path / "proj", {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/sub.py": TWO_MISSING})
    async with started(root, settings={"debounce": 0}) as client:
        uri = client.open(root / "pkg" / "sub.py")
        await wait_until(lambda: client.codes(uri) == [(4, "KVR001"), (7, "KVR001")], "two KVR001")
        noqa = [a for a in await actions(client, uri, 7) if "noqa" in a.title]
        assert len(noqa) == 1
        text = apply(TWO_MISSING, noqa[0].edit, uri)
        assert split_lines(text)[7] == "    def store(self, key: str, value: bytes) -> None: ...  # noqa: KVR001"
        client.replace_all(uri, text, version=2)
        await wait_until(lambda: client.codes(uri) == [(4, "KVR001")], "only the other finding left")


async def test_unsafe_fixes_only_when_allowed_and_marked(tmp_path: Path) -> None:
    root = write_project(tmp_path / "proj", {"m.py": NARROWED})
    async with started(root) as client:
        uri = client.open(root / "m.py")
        await wait_until(lambda: client.codes(uri) == [(11, "KVR101")], "KVR101")
        offered = await actions(client, uri, 11)
        assert [a.title for a in offered if "noqa" not in a.title] == []  # no fix, no fix-all
    async with started(root, settings={"unsafeFixes": True}) as client:
        uri = client.open(root / "m.py")
        await wait_until(lambda: client.codes(uri) == [(11, "KVR101")], "KVR101")
        [fix] = [a for a in await actions(client, uri, 11, only=["quickfix"]) if "noqa" not in a.title]
        assert fix.title.endswith("(unsafe)") and not fix.is_preferred
        assert apply(NARROWED, fix.edit, uri) == cli_fixed(root, "m.py", NARROWED, "--unsafe-fixes")
        [fix_all] = await actions(client, uri, 0, only=["source.fixAll"])
        assert "unsafe" in fix_all.title
