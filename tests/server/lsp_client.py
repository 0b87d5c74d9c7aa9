"""Driving `kvref server` as a subprocess with pytest-lsp's client, for the server's tests.

`started(root)` starts the server, initializes a session with the workspace folder `root`, and
shuts it down afterwards; the client records every `publishDiagnostics` in order (with the
document version it was for), so a test can wait for the next one and tell republishing apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

__all__ = ["KvrefClient", "Published", "started", "wait_until"]

CHECKOUT = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Published:
    """One `textDocument/publishDiagnostics` as received."""

    uri: str
    version: int | None
    diagnostics: Sequence[types.Diagnostic]


@dataclass(slots=True)
class Record:
    """What the server sent besides responses."""

    published: list[Published] = field(default_factory=lambda: [])
    registrations: list[types.Registration] = field(default_factory=lambda: [])


class KvrefClient(LanguageClient):
    """pytest-lsp's client, recording every publication."""

    record: Record
    initialized_with: types.InitializeResult | None = None

    def latest(self, uri: str) -> Published | None:
        """The last publication for `uri`."""
        return next((p for p in reversed(self.record.published) if p.uri == uri), None)

    def published_version(self, uri: str) -> int | None:
        """The document version of the last publication for `uri` (None: none yet)."""
        latest = self.latest(uri)
        return None if latest is None else latest.version

    def published_diagnostics(self, uri: str) -> Sequence[types.Diagnostic]:
        """The last diagnostics published for `uri` (none yet: empty)."""
        latest = self.latest(uri)
        return () if latest is None else latest.diagnostics

    def codes(self, uri: str) -> list[tuple[int, str]]:
        """(0-based line, code) of the last diagnostics published for `uri`."""
        latest = self.latest(uri)
        return sorted((d.range.start.line, str(d.code)) for d in (latest.diagnostics if latest else ()))

    def open(self, path: Path, text: str | None = None, version: int = 1) -> str:
        uri = path.as_uri()
        self.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=uri, language_id="python", version=version,
                    text=path.read_text(encoding="utf-8") if text is None else text,
                )
            )
        )  # fmt: skip
        return uri

    def replace_all(self, uri: str, text: str, version: int) -> None:
        """A full-text `didChange`."""
        self.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
            )
        )


def _factory() -> KvrefClient:
    client = KvrefClient()
    client.record = Record()

    def published(params: types.PublishDiagnosticsParams) -> None:
        client.diagnostics[params.uri] = params.diagnostics
        client.record.published.append(Published(params.uri, params.version, params.diagnostics))

    def register(params: types.RegistrationParams) -> None:
        client.record.registrations.extend(params.registrations)

    features: dict[str, Any] = dict(DEFAULT_CLIENT_FEATURES)
    features.pop(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    register_lsp_features(client, features)
    client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)(published)
    client.feature(types.CLIENT_REGISTER_CAPABILITY)(register)
    return client


async def wait_until(condition: Callable[[], object], what: str, timeout: float = TIMEOUT) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def started(
    root: Path,
    *,
    settings: dict[str, Any] | None = None,
    capabilities: types.ClientCapabilities | None = None,
    args: Sequence[str] = (),
    cache_dir: Path | None = None,
    python: str = sys.executable,
) -> AsyncGenerator[KvrefClient]:
    """A `kvref server` with one workspace folder, `root`, initialized and later shut down."""
    env = {
        **os.environ,
        "PYTHONPATH": str(CHECKOUT),
        "KVREF_CACHE_DIR": str(cache_dir or root / ".kvref_cache"),
        "XDG_CACHE_HOME": str((cache_dir or root / ".kvref_cache") / "xdg"),
    }
    config = ClientServerConfig(
        server_command=[python, "-m", "kvref", "server", *args], server_env=env, client_factory=_factory
    )
    client = await config.start()
    assert isinstance(client, KvrefClient)
    try:
        client.initialized_with = await client.initialize_session(
            types.InitializeParams(
                capabilities=capabilities or client_capabilities("visual-studio-code"),
                root_uri=root.as_uri(),
                workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)],
                initialization_options=settings,
            )
        )
        yield client
        await client.shutdown_session()
    except BaseException:
        # The test failed: stop the server rather than wait for an exit it was never asked for.
        server: asyncio.subprocess.Process | None = getattr(client, "_server", None)
        if server is not None and server.returncode is None:
            server.kill()
        raise
    finally:
        await client.stop()
