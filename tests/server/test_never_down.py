"""Never down: thousands of random opens, edits (incremental and whole, parsable or not, with
text outside ASCII), saves, closes, disk events, code-action requests and cancellations. Every
request is answered (a result, or -32800 for a cancelled one), every published range lies
inside the text it was published for, and the server is still up and checking at the end."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled

from kvref.audit.source import split_lines
from tests.server.lsp_client import started, wait_until
from tests.server.projects import BASE, SUB, write_project

NAMES = ("pkg/base.py", "pkg/sub.py", "pkg/unsaved.py")
PIECES = ("\n", "(", ")", ":", "    ", "def ", "class ", "@override\n", "é", "\U0001f600", "\r\n", "x", "load", '"', "#")

Op = tuple[Any, ...]
ops = st.one_of(
    st.tuples(st.just("open"), st.sampled_from(NAMES)),
    st.tuples(st.just("close"), st.sampled_from(NAMES)),
    st.tuples(st.just("insert"), st.sampled_from(NAMES), st.integers(0, 40), st.integers(0, 60), st.lists(st.sampled_from(PIECES), max_size=4).map("".join)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES), st.integers(0, 40), st.integers(0, 60), st.integers(0, 80)),
    st.tuples(st.just("replace"), st.sampled_from(NAMES), st.sampled_from((BASE, SUB, "", "class (", "\U0001f600" * 3))),
    st.tuples(st.just("save"), st.sampled_from(NAMES)),
    st.tuples(st.just("disk"), st.sampled_from(NAMES)),
    st.tuples(st.just("action"), st.sampled_from(NAMES), st.integers(0, 20), st.booleans()),
)


def _utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _place(text: str, line: int, column: int) -> tuple[int, types.Position]:
    """A valid (offset, position) at or before (line, column) of `text`."""
    lines = split_lines(text)
    line = min(line, len(lines) - 1)
    column = min(column, len(lines[line]))
    offset = sum(len(each) for each in text.splitlines(keepends=True)[:line]) + column
    return offset, types.Position(line=line, character=_utf16(lines[line][:column]))


async def _scenario(root: Path, script: Sequence[Op]) -> None:
    async with started(root, settings={"debounce": 0, "unsafeFixes": True}) as client:
        texts: dict[str, str] = {}
        versions: dict[str, int] = {}
        seen: dict[tuple[str, int], str] = {}
        requests: list[Future[Any]] = []
        ids = itertools.count()
        for op in script:
            kind, name = op[0], op[1]
            uri = (root / name).as_uri()
            if kind == "open" and uri not in texts:
                path = root / name
                texts[uri] = path.read_text(encoding="utf-8") if path.exists() else SUB
                # Versions keep rising across a close and a reopen: each names one text.
                versions[uri] = versions.get(uri, 0) + 1
                seen[uri, versions[uri]] = texts[uri]
                client.open(path, texts[uri], version=versions[uri])
            elif uri not in texts:
                continue  # an edit, save or request for a closed document: not sent
            elif kind == "close":
                del texts[uri]
                client.text_document_did_close(types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
            elif kind in ("insert", "delete", "replace"):
                old = texts[uri]
                if kind == "replace":
                    change: Any = types.TextDocumentContentChangeWholeDocument(text=op[2])
                    new = op[2]
                else:
                    start, start_position = _place(old, op[2], op[3])
                    end = start if kind == "insert" else min(len(old), start + op[4])
                    while end < len(old) and old[end - 1 : end + 1] == "\r\n":
                        end += 1  # never split a line break
                    inserted = op[4] if kind == "insert" else ""
                    end_lines = split_lines(old[:end])
                    end_position = types.Position(line=len(end_lines) - 1, character=_utf16(end_lines[-1]))
                    change = types.TextDocumentContentChangePartial(
                        range=types.Range(start=start_position, end=end_position), text=inserted
                    )
                    new = old[:start] + inserted + old[end:]
                versions[uri] += 1
                texts[uri] = new
                seen[uri, versions[uri]] = new
                client.text_document_did_change(
                    types.DidChangeTextDocumentParams(
                        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=versions[uri]),
                        content_changes=[change],
                    )
                )
            elif kind == "save":
                client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
            elif kind == "disk":
                client.workspace_did_change_watched_files(
                    types.DidChangeWatchedFilesParams(changes=[types.FileEvent(uri=uri, type=types.FileChangeType.Changed)])
                )
            elif kind == "action":
                msg_id = f"action-{next(ids)}"
                params = types.CodeActionParams(
                    text_document=types.TextDocumentIdentifier(uri=uri),
                    range=types.Range(start=types.Position(line=op[2], character=0), end=types.Position(line=op[2], character=0)),
                    context=types.CodeActionContext(diagnostics=[]),
                )
                requests.append(client.protocol.send_request(types.TEXT_DOCUMENT_CODE_ACTION, params, msg_id=msg_id))
                if op[3]:
                    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
            await asyncio.sleep(0)
        done, pending = (
            await asyncio.wait([asyncio.wrap_future(request) for request in requests], timeout=120)
            if requests
            else (set[asyncio.Future[Any]](), set[asyncio.Future[Any]]())
        )
        assert not pending, f"{len(pending)} of {len(requests)} requests never answered"
        for answer in done:
            error = answer.exception()
            assert error is None or isinstance(error, JsonRpcRequestCancelled), repr(error)
        # Still up: a new document is checked.
        probe = client.open(root / "pkg" / "probe.py", SUB)
        await wait_until(lambda: client.latest(probe) is not None, "the probe's diagnostics", 60)
        assert getattr(client, "_server").returncode is None
        for published in client.record.published:
            if published.version is None or (published.uri, published.version) not in seen:
                continue
            lines = split_lines(seen[published.uri, published.version])
            for diagnostic in published.diagnostics:
                for position in (diagnostic.range.start, diagnostic.range.end):
                    assert position.line < len(lines)
                    assert position.character <= _utf16(lines[position.line])


# No shrinking: each example is a whole server session, and a failing one is reported as it is.
@settings(
    max_examples=5,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(script=st.lists(ops, min_size=400, max_size=500))
def test_random_sessions_leave_the_server_up_and_every_request_answered(tmp_path: Path, script: list[Op]) -> None:
    root = write_project(tmp_path / "proj", {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/sub.py": SUB})
    asyncio.run(_scenario(root, script))
