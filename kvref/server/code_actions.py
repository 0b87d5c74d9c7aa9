"""Code actions on a document's findings: a quick fix per fixable finding, `# noqa: CODE` on
the finding's line, and `source.fixAll.kvref` for the whole file.

A quick fix and the fix-all action are what `kvref audit --fix` would write for the same text:
the fixes are chosen by `kvref.audit.fixes.plan.plan_fixes` (safe ones; unsafe ones only when
the `unsafeFixes` setting allows them, and then titled as unsafe) and applied by the audit's
fixer, so imports, line endings and every untouched byte are kept as `--fix` keeps them. Each
fixed text is sent as the one replacement between the two texts.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lsprotocol import types

from kvref.audit.model import Applicability, Finding
from kvref.audit.source import decode_lenient, split_lines
from kvref.server.diagnostics import RuleLinks, diagnostic
from kvref.server.positions import Encoding, TextChange, client_column, document_bytes, text_change
from kvref.server.project import ProjectSession

__all__ = ["FIX_ALL_KIND", "ActionRequest", "code_actions", "noqa_change"]

FIX_ALL_KIND = "source.fixAll.kvref"
_NOQA = re.compile(r"#\s*noqa\s*:\s*[A-Za-z]+[0-9]+(?:[\s,]+[A-Za-z]+[0-9]+)*", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class ActionRequest:
    """One `textDocument/codeAction` request, with the document it is about.

    Attributes:
        uri, version, path: the document.
        text: its text now; `texts` every open document's bytes (the fixes' analyses see them).
        first_line, last_line: the 0-based lines of the requested range.
        only: the kinds the client asked for (None: any).
        encoding: the negotiated position encoding.
        document_changes: whether the client takes versioned `documentChanges`.
    """

    uri: str
    version: int | None
    path: Path
    text: str
    texts: Mapping[Path, bytes]
    first_line: int
    last_line: int
    only: Collection[str] | None
    encoding: Encoding
    document_changes: bool


def _wanted(kind: str, only: Collection[str] | None) -> bool:
    return only is None or any(kind == asked or kind.startswith(asked + ".") for asked in only)


def _workspace_edit(request: ActionRequest, change: TextChange) -> types.WorkspaceEdit:
    edit = types.TextEdit(
        range=types.Range(
            start=types.Position(line=change.start.line, character=change.start.character),
            end=types.Position(line=change.end.line, character=change.end.character),
        ),
        new_text=change.text,
    )
    if request.document_changes:
        document = types.OptionalVersionedTextDocumentIdentifier(uri=request.uri, version=request.version)
        return types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(text_document=document, edits=[edit])])
    return types.WorkspaceEdit(changes={request.uri: [edit]})


def noqa_change(finding: Finding, lines: Sequence[str], encoding: Encoding) -> TextChange | None:
    """The edit that suppresses `finding` on its line: its code added to the line's
    `# noqa: ...`, or a new `  # noqa: CODE` at the end of the line."""
    index = finding.line - 1
    if not 0 <= index < len(lines):
        return None
    line = lines[index]
    match = _NOQA.search(line)
    if match is not None:
        if finding.code.upper() in re.split(r"[\s,:]+", match.group().upper()):
            return None
        at, text = match.end(), f", {finding.code}"
    else:
        at = len(line.rstrip())
        text = f"  # noqa: {finding.code}"
    place = client_column(lines, index, at, encoding)
    return TextChange(place, place, text)


def _action(
    title: str,
    kind: str,
    request: ActionRequest,
    change: TextChange,
    diagnostics: Sequence[types.Diagnostic],
    preferred: bool,
) -> types.CodeAction:
    return types.CodeAction(
        title=title,
        kind=kind,
        diagnostics=list(diagnostics) or None,
        edit=_workspace_edit(request, change),
        is_preferred=preferred or None,
    )


def code_actions(
    request: ActionRequest,
    findings: Sequence[Finding],
    session: ProjectSession,
    *,
    unsafe_fixes: bool,
    fix_all: bool,
    noqa: bool,
    links: RuleLinks,
) -> list[types.CodeAction]:
    """The actions for the findings on the requested lines, and the fix-all action.

    Args:
        request: the request and its document.
        findings: the document's findings for `request.text`.
        session: the document's project (the fixes are planned and checked there).
        unsafe_fixes: offer unsafe fixes too (marked unsafe).
        fix_all: offer `source.fixAll.kvref`.
        noqa: offer the `# noqa: CODE` action.
        links: the rules' documentation links (for the diagnostics the actions resolve).
    """
    lines = split_lines(request.text)
    source = document_bytes(request.text)
    texts = {**request.texts, request.path: source}
    actions: list[types.CodeAction] = []
    on_lines = [
        finding
        for finding in findings
        if finding.line - 1 <= request.last_line and finding.end_line - 1 >= request.first_line
    ]
    for finding in on_lines:
        diagnostics = [diagnostic(finding, lines, request.encoding, links)]
        fix = finding.fix
        allowed = fix is not None and (unsafe_fixes or fix.applicability is Applicability.SAFE)
        if fix is not None and allowed and _wanted(types.CodeActionKind.QuickFix, request.only):
            fixed = session.fixed_text(request.path, texts, [finding], unsafe=unsafe_fixes)
            change = text_change(request.text, decode_lenient(fixed), request.encoding) if fixed else None
            if change is not None:
                unsafe = fix.applicability is Applicability.UNSAFE
                title = f"kvref ({finding.code}): {fix.description or 'Fix'}" + (" (unsafe)" if unsafe else "")
                actions.append(_action(title, types.CodeActionKind.QuickFix, request, change, diagnostics, not unsafe))
        if noqa and _wanted(types.CodeActionKind.QuickFix, request.only):
            change = noqa_change(finding, lines, request.encoding)
            if change is not None:
                title = f"kvref ({finding.code}): Disable for this line (# noqa: {finding.code})"
                actions.append(_action(title, types.CodeActionKind.QuickFix, request, change, diagnostics, False))
    fixable = [
        finding
        for finding in findings
        if finding.fix is not None and (unsafe_fixes or finding.fix.applicability is Applicability.SAFE)
    ]
    if fix_all and fixable and _wanted(FIX_ALL_KIND, request.only):
        fixed = session.fix_all(request.path, texts, unsafe=unsafe_fixes)
        change = text_change(request.text, decode_lenient(fixed), request.encoding) if fixed else None
        if change is not None:
            title = "kvref: Fix all auto-fixable problems" + (" (unsafe fixes included)" if unsafe_fixes else "")
            actions.append(_action(title, FIX_ALL_KIND, request, change, (), False))
    return actions
