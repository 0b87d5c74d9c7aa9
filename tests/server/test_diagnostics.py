"""`kvref server` publishes the audit's findings as diagnostics: on open, on change after the
debounce, on save; with code, message, range, severity and a link to the rule's documentation;
honouring `# noqa`, per-file ignores and the editor's settings; in UTF-16 unless the client
offers UTF-8; and it never goes down on text that does not parse."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import pytest
from lsprotocol import types
from pytest_lsp import client_capabilities

from tests.server.lsp_client import started, wait_until
from tests.server.projects import BASE, SUB, UNICODE, write_project

pytestmark = pytest.mark.asyncio


def _project(tmp_path: Path, kvref: str = "", sub: str = SUB) -> Path:
    return write_project(tmp_path / "proj", {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/sub.py": sub}, kvref)


async def test_open_publishes_the_finding_with_code_range_severity_and_documentation(tmp_path: Path) -> None:
    root = _project(tmp_path)
    async with started(root) as client:
        uri = client.open(root / "pkg" / "sub.py")
        await wait_until(lambda: client.latest(uri) is not None, "diagnostics after didOpen")
        published = client.latest(uri)
        assert published is not None and published.version == 1
        [diagnostic] = published.diagnostics
        assert diagnostic.code == "KVR001"
        assert diagnostic.severity == types.DiagnosticSeverity.Warning
        assert diagnostic.source == "kvref"
        assert diagnostic.message.startswith('Method "Cached.load" overrides "pkg.base.Base.load"')
        # `    def load(` : the name `load` on line 7 (0-based 6), columns 8 to 12.
        assert diagnostic.range == types.Range(
            start=types.Position(line=6, character=8), end=types.Position(line=6, character=12)
        )
        assert diagnostic.code_description is not None
        page = Path(url2pathname(urlparse(diagnostic.code_description.href).path))
        assert "missing-override" in page.read_text(encoding="utf-8")


async def test_change_is_checked_after_the_debounce_and_save_at_once(tmp_path: Path) -> None:
    root = _project(tmp_path)
    async with started(root, settings={"debounce": 300}) as client:
        uri = client.open(root / "pkg" / "sub.py")
        await wait_until(lambda: client.codes(uri) == [(6, "KVR001")], "the first diagnostics")
        fixed = SUB.replace("    def load", "    @override\n    def load")
        client.replace_all(uri, fixed, version=2)
        await asyncio.sleep(0.1)
        assert client.latest(uri) is not None and client.published_version(uri) == 1  # still waiting
        await wait_until(lambda: client.published_version(uri) == 2, "diagnostics after the debounce")
        assert client.codes(uri) == []
        before = len(client.record.published)
        client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
        await wait_until(lambda: len(client.record.published) > before, "diagnostics after didSave")
        client.text_document_did_close(types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
        await wait_until(lambda: len(client.record.published) > before + 1 and not client.published_diagnostics(uri), "cleared on didClose")


async def test_on_save_mode_checks_only_on_open_and_save(tmp_path: Path) -> None:
    root = _project(tmp_path)
    async with started(root, settings={"run": "onSave", "debounce": 0}) as client:
        uri = client.open(root / "pkg" / "sub.py")
        await wait_until(lambda: client.codes(uri) == [(6, "KVR001")], "diagnostics on open")
        client.replace_all(uri, SUB.replace("    def load", "    @override\n    def load"), version=2)
        await asyncio.sleep(0.5)
        assert client.published_version(uri) == 1
        client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
        await wait_until(lambda: client.published_version(uri) == 2, "diagnostics on save")
        assert client.codes(uri) == []


async def test_noqa_per_file_ignores_and_editor_settings_apply(tmp_path: Path) -> None:
    suppressed = SUB.replace("    def load(self, key: str) -> bytes:", "    def load(self, key: str) -> bytes:  # noqa: KVR001")
    root = _project(tmp_path, kvref='per-file-ignores = {"pkg/other.py" = ["KVR001"]}', sub=suppressed)
    (root / "pkg" / "other.py").write_text(SUB.replace("Cached", "Other"), encoding="utf-8")
    (root / "pkg" / "third.py").write_text(SUB.replace("Cached", "Third"), encoding="utf-8")
    async with started(root) as client:
        sub, other, third = (client.open(root / "pkg" / name) for name in ("sub.py", "other.py", "third.py"))
        await wait_until(lambda: all(client.latest(uri) for uri in (sub, other, third)), "three publications")
        assert client.codes(sub) == []  # noqa on the line
        assert client.codes(other) == []  # per-file-ignores
        assert client.codes(third) == [(6, "KVR001")]
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"kvref": {"ignore": ["KVR001"]}}))
        await wait_until(lambda: client.codes(third) == [], "the editor's ignore applied")
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"kvref": {"bogus": 1}}))
        await wait_until(lambda: client.messages, "a message naming the bad setting")
        assert "bogus" in client.messages[-1].message


@pytest.mark.parametrize(
    ("offered", "starts"),
    [
        # KVR101's range starts after `def touch(self, 𐐀: int, keys: `, 34 characters with one
        # outside the BMP: 35 UTF-16 units, 37 UTF-8 bytes. KVR001's name `𐐀𐐀` is 4 / 8 units.
        (None, {"KVR101": (35, 50), "KVR001": (8, 12)}),
        ([types.PositionEncodingKind.Utf8], {"KVR101": (37, 52), "KVR001": (8, 16)}),
    ],
)
async def test_positions_count_utf16_units_unless_utf8_is_offered(
    tmp_path: Path, offered: list[types.PositionEncodingKind] | None, starts: dict[str, tuple[int, int]]
) -> None:
    root = write_project(tmp_path / "proj", {"m.py": UNICODE}, 'select = ["ALL"]')
    capabilities = client_capabilities("visual-studio-code")
    capabilities.general = types.GeneralClientCapabilities(position_encodings=offered)
    async with started(root, capabilities=capabilities) as client:
        uri = client.open(root / "m.py")
        await wait_until(lambda: client.latest(uri) is not None, "diagnostics")
        got = {str(d.code): (d.range.start.character, d.range.end.character) for d in client.published_diagnostics(uri)}
        assert got == starts


async def test_text_that_does_not_parse_keeps_the_last_findings_inside_the_document(tmp_path: Path) -> None:
    root = _project(tmp_path)
    async with started(root, settings={"debounce": 0}) as client:
        uri = client.open(root / "pkg" / "sub.py")
        await wait_until(lambda: client.codes(uri) == [(6, "KVR001")], "diagnostics")
        client.replace_all(uri, "class (", version=2)  # mid-typing, one short line
        await wait_until(lambda: client.published_version(uri) == 2, "diagnostics for the broken text")
        [kept] = client.published_diagnostics(uri)
        assert kept.code == "KVR001"
        assert kept.range.start.line == 0 and kept.range.end.line == 0
        assert kept.range.end.character <= len("class (")
        client.replace_all(uri, SUB.replace("    def load", "    @override\n    def load"), version=3)
        await wait_until(lambda: client.published_version(uri) == 3, "diagnostics once it parses")
        assert client.codes(uri) == []


async def test_a_bad_initialization_option_is_shown_and_the_defaults_apply(tmp_path: Path) -> None:
    root = _project(tmp_path)
    async with started(root, settings={"run": "sometimes"}) as client:
        uri = client.open(root / "pkg" / "sub.py")
        await wait_until(lambda: client.codes(uri) == [(6, "KVR001")], "diagnostics with the defaults")
        assert any("run must be 'onType' or 'onSave'" in message.message for message in client.messages)
