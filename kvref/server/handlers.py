"""The protocol's messages, each handed to `KvrefLanguageServer` (`create_server`).

The server declares incremental `textDocument/didChange`, `didSave` without text, code
actions of the kinds `quickfix` and `source.fixAll.kvref`, and registers a watcher for Python
files and `pyproject.toml` when the client can register one dynamically.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from lsprotocol import types

from kvref.server.code_actions import FIX_ALL_KIND
from kvref.server.language_server import KvrefLanguageServer
from kvref.server.settings import ServerSettings

__all__ = ["create_server"]

_WATCHED = ("**/*.py", "**/*.pyi", "**/pyproject.toml", "**/kvref.toml")


def create_server(settings: ServerSettings, cwd: Path) -> KvrefLanguageServer:
    """A language server with every feature registered (started by `start_io`)."""
    server = KvrefLanguageServer(settings, cwd)

    @server.feature(types.INITIALIZE)
    def initialize(params: types.InitializeParams) -> None:
        server.loop = asyncio.get_running_loop()  # a bad setting is shown from here on
        server.configure(params.initialization_options)

    @server.feature(types.INITIALIZED)
    async def initialized(params: types.InitializedParams) -> None:
        server.loop = asyncio.get_running_loop()
        watched = server.client_capabilities.workspace
        dynamic = watched is not None and watched.did_change_watched_files is not None and bool(
            watched.did_change_watched_files.dynamic_registration
        )
        if dynamic:
            watchers = [types.FileSystemWatcher(glob_pattern=pattern) for pattern in _WATCHED]
            registration = types.Registration(
                id="kvref-watched-files",
                method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                register_options=types.DidChangeWatchedFilesRegistrationOptions(watchers=watchers),
            )
            try:
                await server.client_register_capability_async(types.RegistrationParams(registrations=[registration]))
            except Exception:  # noqa: BLE001 - a client that refuses still sends what it watches
                pass
        await server.index_workspace()

    @server.feature(types.SHUTDOWN)
    def shutdown(params: None) -> None:
        server.close()

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: types.DidOpenTextDocumentParams) -> None:
        document = params.text_document
        server.loop = server.loop or asyncio.get_running_loop()
        server.opened(document.uri, document.version, server.workspace.get_text_document(document.uri).source)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(params: types.DidChangeTextDocumentParams) -> None:
        document = params.text_document
        server.changed(document.uri, document.version, server.workspace.get_text_document(document.uri).source)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
    def did_save(params: types.DidSaveTextDocumentParams) -> None:
        server.saved(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: types.DidCloseTextDocumentParams) -> None:
        server.closed(params.text_document.uri)

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(
        params: types.DidChangeConfigurationParams,
    ) -> None:
        server.configure(params.settings)
        server.check_soon()

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    async def did_change_watched_files(
        params: types.DidChangeWatchedFilesParams,
    ) -> None:
        await server.files_changed(list(params.changes))

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND]),
    )
    async def code_action(params: types.CodeActionParams) -> list[types.CodeAction] | None:
        return await server.actions(params)

    return server
