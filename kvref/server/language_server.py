"""The language server: open documents, the projects they belong to, and when to check.

Threads: pygls reads and answers the protocol on its event loop; every analysis (reading a
project, checking, fixing, indexing) runs on one analysis thread, in the order it was asked for,
so the reader is never blocked and the projects' state has one owner. A check covers every open
document at once, through one index of the project built over the editors' texts: editing a
base class in one buffer re-checks its subclasses in the others, and a document whose
diagnostics changed is published again.

When: `didOpen` and `didSave` check at once; `didChange` checks `debounce` ms (100 by default)
after the last change, unless the `run` setting is "onSave". Indexing the workspace (bringing
the summary cache up to date for every project file) runs in small steps between checks, with
`$/progress` when the client supports it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from kvref.audit.discover.paths import absolute_path
from kvref.audit.rules import rule_catalogue
from kvref.errors import KVRefError
from kvref.server.code_actions import ActionRequest, code_actions
from kvref.server.diagnostics import RuleLinks
from kvref.server.documents import OpenDocument, updated_diagnostics
from kvref.server.positions import Encoding, document_bytes
from kvref.server.project import DocumentFindings, ProjectSession, project_root_of
from kvref.server.settings import ServerSettings, parse_settings

__all__ = ["KvrefLanguageServer"]

T = TypeVar("T")
_LOG = logging.getLogger("kvref.server")
_Snapshot = dict[str, tuple[Path, int | None, str]]


class KvrefLanguageServer(LanguageServer):
    """`kvref server`: the audit's diagnostics and fixes over the Language Server Protocol.

    Args:
        settings: the command line's settings (the editor's apply on top).
        cwd: the directory relative settings are taken from.
    """

    def __init__(self, settings: ServerSettings, cwd: Path) -> None:
        from kvref import __version__

        super().__init__(  # pyright: ignore[reportUnknownMemberType] - pygls leaves *args untyped
            "kvref", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental
        )
        self.command_line = settings
        self.settings = settings
        self.cwd = cwd
        self.rules = rule_catalogue()
        self.links = RuleLinks(self.rules, settings.rule_docs)
        self.documents: dict[str, OpenDocument] = {}
        self._analysis = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvref-analysis")
        # Owned by the analysis thread.
        self._sessions: dict[Path, ProjectSession] = {}
        self._roots: dict[Path, Path] = {}
        self._reported_problems: set[str] = set()
        # Owned by the event loop (set when the client has initialized).
        self.loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._checking: asyncio.Task[None] | None = None

    # --- running work on the analysis thread ---

    async def on_analysis_thread(self, work: Callable[[], T]) -> T:
        """Run `work` on the analysis thread (a cancelled request stops waiting for it)."""
        return await asyncio.get_running_loop().run_in_executor(self._analysis, work)

    def close(self) -> None:
        """Save what the projects learned and stop the analysis thread (at `shutdown`)."""
        def save() -> None:
            for session in self._sessions.values():
                session.save()

        self._analysis.submit(save)
        self._analysis.shutdown(wait=True, cancel_futures=False)

    @property
    def encoding(self) -> Encoding:
        """The position encoding agreed at `initialize`."""
        encoding = str(self.workspace.position_encoding or "utf-16")
        return "utf-8" if encoding == "utf-8" else "utf-32" if encoding == "utf-32" else "utf-16"

    def _problem(self, message: str) -> None:
        """Tell the user once (from any thread) about a configuration they must fix."""
        if message in self._reported_problems:
            return
        self._reported_problems.add(message)
        params = types.ShowMessageParams(type=types.MessageType.Error, message=f"kvref: {message}")
        _LOG.error("kvref: %s", message)
        if self.loop is not None:  # the protocol is written from the event loop only
            self.loop.call_soon_threadsafe(self.window_show_message, params)

    def session_for(self, path: Path) -> ProjectSession:
        """The project `path` belongs to, read on first use (analysis thread only).

        Raises:
            KVRefError: its configuration is invalid or `python` names no interpreter.
        """
        directory = path.parent
        root = self._roots.get(directory)
        if root is None:
            root = self._roots[directory] = project_root_of(path, self.cwd)
        session = self._sessions.get(root)
        if session is None:
            session = self._sessions[root] = ProjectSession(path, self.settings, self.rules, self.cwd)
        return session

    def forget_projects(self) -> None:
        """Read every project again on next use (settings or configuration changed)."""
        def forget() -> None:
            for session in self._sessions.values():
                session.save()
            self._sessions.clear()
            self._roots.clear()
            self._reported_problems.clear()

        self._analysis.submit(forget)

    # --- checking ---

    def check_soon(self, uris: set[str] | None = None, *, delay: float = 0.0) -> None:
        """Check the open documents `delay` seconds from now (a later call restarts the wait);
        `uris` are published even if their diagnostics did not change."""
        self._pending.update(self.documents if uris is None else uris)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._start_check)

    def _start_check(self) -> None:
        self._timer = None
        if self._checking is None or self._checking.done():
            self._checking = asyncio.ensure_future(self._check())

    async def _check(self) -> None:
        while self._pending:
            requested, self._pending = self._pending, set()
            snapshot: _Snapshot = {uri: (doc.path, doc.version, doc.text) for uri, doc in self.documents.items()}
            try:
                outcomes = await self.on_analysis_thread(lambda: self._analyze(snapshot))
            except Exception:  # noqa: BLE001 - one failed check must not stop the next
                _LOG.exception("kvref: a check failed")
                continue
            self._publish(snapshot, outcomes, requested)
            if self._timer is not None:
                break  # more typing: the timer starts the next check

    def _analyze(self, snapshot: _Snapshot) -> dict[str, DocumentFindings]:
        """Every open document's findings, project by project (analysis thread)."""
        by_session: dict[int, tuple[ProjectSession, dict[str, Path]]] = {}
        texts: dict[Path, bytes] = {}
        for uri, (path, _, text) in snapshot.items():
            try:
                session = self.session_for(path)
            except (KVRefError, OSError) as error:
                self._problem(str(error))
                continue
            by_session.setdefault(id(session), (session, {}))[1][uri] = path
            texts[path] = document_bytes(text)
        outcomes: dict[str, DocumentFindings] = {}
        for session, uris in by_session.values():
            mine = {path: texts[path] for path in uris.values()}
            try:
                found = session.analyze(mine, list(mine))
            except (KVRefError, OSError) as error:
                self._problem(str(error))
                continue
            outcomes.update((uri, found[absolute_path(path)]) for uri, path in uris.items())
        return outcomes

    def _publish(self, snapshot: _Snapshot, outcomes: Mapping[str, DocumentFindings], requested: set[str]) -> None:
        for uri, outcome in outcomes.items():
            document = self.documents.get(uri)
            _, version, text = snapshot[uri]
            if document is None or document.version != version or document.text != text:
                continue  # closed, or changed since: a later check publishes it
            diagnostics = updated_diagnostics(document, text, outcome, self.encoding, self.links)
            if uri in requested or diagnostics != document.published:
                document.published = diagnostics
                self.text_document_publish_diagnostics(
                    types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics, version=version)
                )

    # --- documents ---

    def opened(self, uri: str, version: int | None, text: str) -> None:
        """`didOpen`: check it (and the others: this buffer may be a base of theirs)."""
        path = _file_path(uri)
        if path is None:
            return
        self.documents[uri] = OpenDocument(uri, path, version, text)
        self.check_soon({uri})

    def changed(self, uri: str, version: int | None, text: str) -> None:
        """`didChange`: check after the debounce, unless checking only on save."""
        document = self.documents.get(uri)
        if document is None:
            return
        document.version, document.text = version, text
        if self.settings.run == "onType":
            self.check_soon({uri}, delay=self.settings.debounce_ms / 1000)

    def saved(self, uri: str) -> None:
        """`didSave`: check at once."""
        if uri in self.documents:
            self.check_soon({uri})

    def closed(self, uri: str) -> None:
        """`didClose`: clear its diagnostics; the others now see the file on disk."""
        if self.documents.pop(uri, None) is None:
            return
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))
        if self.documents:
            self.check_soon(set(), delay=self.settings.debounce_ms / 1000)

    def configure(self, raw: object) -> None:
        """New settings from the editor (`initializationOptions`, `didChangeConfiguration`)."""
        try:
            settings = parse_settings(raw, self.command_line)
        except ValueError as error:
            self._problem(str(error))
            return
        changed = settings.analysis_key() != self.settings.analysis_key()
        if settings.rule_docs != self.settings.rule_docs:
            self.links = RuleLinks(self.rules, settings.rule_docs)
        self.settings = settings
        if changed:
            self.forget_projects()

    async def files_changed(self, changes: list[types.FileEvent]) -> None:
        """`workspace/didChangeWatchedFiles`: the index follows the disk, then the open
        documents are checked again."""
        paths = [path for change in changes if (path := _file_path(change.uri)) is not None]
        configuration = any(path.suffix == ".toml" for path in paths)
        listed = any(
            change.type != types.FileChangeType.Changed for change in changes if change.uri.endswith((".py", ".pyi"))
        )

        def update() -> None:
            if configuration:
                for session in self._sessions.values():
                    session.save()
                self._sessions.clear()
                self._roots.clear()
                return
            for session in self._sessions.values():
                if listed:
                    session.refresh_files()
                session.forget(paths)

        await self.on_analysis_thread(update)
        self.check_soon()

    # --- indexing ---

    async def index_workspace(self) -> None:
        """Index every workspace folder's project, reporting `$/progress` when the client
        supports it (indexing runs between checks, a few files at a time)."""
        folders = [path for folder in self.workspace.folders.values() if (path := _file_path(folder.uri))]
        if not folders and self.workspace.root_path:
            folders = [Path(self.workspace.root_path)]

        def sessions() -> list[ProjectSession]:
            found: dict[int, ProjectSession] = {}
            for folder in folders:
                try:
                    session = self.session_for(folder / "__init__.py")
                except (KVRefError, OSError) as error:
                    self._problem(str(error))
                    continue
                found[id(session)] = session
            return list(found.values())

        projects = await self.on_analysis_thread(sessions)
        total = sum(session.unindexed for session in projects)
        if total == 0:
            return
        token: str | None = None
        capabilities = self.client_capabilities.window
        if capabilities is not None and capabilities.work_done_progress:
            token = f"kvref-index-{uuid.uuid4()}"
            try:
                await self.work_done_progress.create_async(token)  # pyright: ignore[reportUnknownMemberType]
            except Exception:  # noqa: BLE001 - a client that refuses the token gets no bar
                token = None
        if token is not None:
            self.work_done_progress.begin(
                token, types.WorkDoneProgressBegin(title="kvref: indexing", percentage=0, message=f"0/{total} files")
            )
        done, shown = 0, 0
        for session in projects:
            left = session.unindexed
            while left:
                try:
                    now = await self.on_analysis_thread(session.index_step)
                except RuntimeError:
                    return  # shut down while indexing: the analysis thread is gone
                except (KVRefError, OSError) as error:
                    self._problem(f"indexing stopped: {error}")
                    break
                done += left - now
                left = now
                percentage = done * 100 // total
                if token is not None and percentage > shown:
                    shown = percentage
                    self.work_done_progress.report(
                        token, types.WorkDoneProgressReport(percentage=percentage, message=f"{done}/{total} files")
                    )
        if token is not None:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=f"{total} files indexed"))

    # --- code actions ---

    async def actions(self, params: types.CodeActionParams) -> list[types.CodeAction] | None:
        """`textDocument/codeAction` for the current text of the document."""
        document = self.documents.get(params.text_document.uri)
        if document is None:
            return None
        capabilities = self.client_capabilities.workspace
        edit = capabilities.workspace_edit if capabilities is not None else None
        request = ActionRequest(
            uri=document.uri,
            version=document.version,
            path=document.path,
            text=document.text,
            texts={doc.path: document_bytes(doc.text) for doc in self.documents.values()},
            first_line=params.range.start.line,
            last_line=params.range.end.line,
            only=list(params.context.only) if params.context.only else None,
            encoding=self.encoding,
            document_changes=bool(edit is not None and edit.document_changes),
        )
        settings = self.settings

        def compute() -> list[types.CodeAction]:
            try:
                session = self.session_for(request.path)
                outcome = session.analyze({**request.texts, request.path: document_bytes(request.text)}, [request.path])
            except (KVRefError, OSError) as error:
                self._problem(str(error))
                return []
            found = outcome[absolute_path(request.path)]
            if found.error is not None or not found.audited:
                return []  # no fixes for a text that does not parse
            return code_actions(
                request, found.findings, session, unsafe_fixes=settings.unsafe_fixes,
                fix_all=settings.fix_all, noqa=settings.disable_rule_comment, links=self.links,
            )  # fmt: skip

        return await self.on_analysis_thread(compute)


def _file_path(uri: str) -> Path | None:
    """The file a `file:` URI names (None for `untitled:` and other schemes)."""
    if not uri.startswith("file:"):
        return None
    path = to_fs_path(uri)
    return Path(path) if path else None
