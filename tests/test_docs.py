"""The README and docs/EDITORS.md: the API map lists only public names, and every main public
name; every relative link leads to a file and heading; every snippet parses, runs or is valid
for what it configures.

Each row of the table under "### API map" names a module and some of its names. A name listed
there must be in that module's `__all__` and importable from it, so the table cannot drift from
the code; every name `kvref` re-exports must appear somewhere in the table.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
# Names `kvref.__all__` exports that the map leaves out on purpose.
NOT_IN_MAP = frozenset({"__version__"})


def api_rows(text: str) -> list[tuple[str, list[str]]]:
    """Return (module, names) for each row of the README's API map table.

    Args:
        text: the README's text.

    Returns:
        One entry per table row, names stripped of any call signature.
    """
    section = text.split("### API map", 1)[1].split("\n#", 1)[0]
    rows: list[tuple[str, list[str]]] = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or not cells[0].startswith("`"):
            continue  # not a row, or the header and its rule
        module = cells[0].strip("`")
        names = [re.split(r"[(\[]", code, maxsplit=1)[0] for code in re.findall(r"`([^`]+)`", cells[1])]
        rows.append((module, names))
    return rows


ROWS = api_rows(README.read_text(encoding="utf-8"))


def test_the_map_has_rows() -> None:
    assert len(ROWS) >= 10
    assert all(names for _, names in ROWS)


@pytest.mark.parametrize(("module_name", "names"), ROWS, ids=[module for module, _ in ROWS])
def test_listed_names_are_public_and_importable(module_name: str, names: list[str]) -> None:
    module = importlib.import_module(module_name)
    exported: list[str] = list(getattr(module, "__all__", []))
    missing = [name for name in names if name not in exported]
    assert not missing, f"{module_name}.__all__ lacks {missing}"
    for name in names:
        assert getattr(module, name) is not None


def test_every_main_public_name_is_listed() -> None:
    import kvref

    listed = {name for _, names in ROWS for name in names}
    unlisted = sorted(set(kvref.__all__) - NOT_IN_MAP - listed)
    assert not unlisted, f"README's API map lacks {unlisted}"


def test_the_parser_reads_a_row() -> None:
    text = "### API map\n\n| module | names | what |\n|---|---|---|\n| `m.n` | `A(x=1)`, `b` | d |\n"
    assert api_rows(text) == [("m.n", ["A", "b"])]


# --- every page's snippets and links (the README and docs/EDITORS.md) ----------------------

EDITORS = README.parent / "docs" / "EDITORS.md"
PAGES = (README, EDITORS)
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def code_blocks(text: str, language: str) -> list[str]:
    """The bodies of the page's fenced code blocks in `language`."""
    return [body for lang, body in _FENCE.findall(text) if lang == language]


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the page's headings (lower case, punctuation dropped, spaces
    to hyphens)."""
    prose = _FENCE.sub("", text)
    headings = re.findall(r"^#+ (.+)$", prose, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_anchors_follow_github() -> None:
    assert anchors("## `kvref audit`\n### Redis tier\n```sh\n# not a heading\n```\n") == {"kvref-audit", "redis-tier"}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_lead_to_files_and_headings(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    targets = _LINK.findall(_FENCE.sub("", text))
    assert targets
    for target in targets:
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.is_file(), f"{page.name}: {target} leads nowhere"
        if anchor:
            assert anchor in anchors(linked.read_text(encoding="utf-8")), f"{page.name}: no heading for {target}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_python_snippets_compile_and_those_without_machine_paths_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for snippet in code_blocks(page.read_text(encoding="utf-8"), "python"):
        code = compile(snippet, f"<{page.name}>", "exec")
        if not re.search(r"[\"']/", snippet):  # "/mnt/nvme/kv": the reader's machine
            exec(code, {"__name__": "snippet"})  # noqa: S102 - the page's own snippet


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_data_snippets_parse(page: Path) -> None:
    import json
    import tomllib

    import yaml

    text = page.read_text(encoding="utf-8")
    for snippet in code_blocks(text, "toml"):
        tomllib.loads(snippet)
    for snippet in code_blocks(text, "json"):
        json.loads(snippet)
    for snippet in code_blocks(text, "yaml"):
        yaml.safe_load(snippet)


def test_the_readme_configuration_snippet_is_a_valid_tool_kvref_table(tmp_path: Path) -> None:
    import tomllib

    from kvref.audit.discover.config import parse_config_table

    tables = [tomllib.loads(snippet) for snippet in code_blocks(README.read_text(encoding="utf-8"), "toml")]
    configured = [table["tool"]["kvref"] for table in tables if "kvref" in table.get("tool", {})]
    assert len(configured) == 1
    config = parse_config_table(configured[0], root=tmp_path)
    assert config.options.override_import == "typing_extensions"


def test_the_helix_snippet_starts_the_server_with_valid_settings() -> None:
    import tomllib

    from kvref.server.settings import ServerSettings, parse_settings

    (snippet,) = code_blocks(EDITORS.read_text(encoding="utf-8"), "toml")
    server = tomllib.loads(snippet)["language-server"]["kvref"]
    assert (server["command"], server["args"]) == ("kvref", ["server"])
    assert parse_settings(server["config"], ServerSettings()) == ServerSettings(unsafe_fixes=False)


def test_the_editors_page_names_only_options_of_kvref_server() -> None:
    import typer.main

    from kvref.cli import app

    command = getattr(typer.main.get_command(app), "commands")["server"]
    options = {opt for param in command.params for opt in param.opts if opt.startswith("--")}
    (snippet,) = code_blocks(EDITORS.read_text(encoding="utf-8"), "sh")
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", snippet))
    assert named and named <= options


# A value other than the default for every key; the table must document each key, and together
# they must reach every setting.
_SAMPLES: dict[str, object] = {
    "python": "/usr/bin/python3", "configuration": "kvref.toml", "select": ["KVR0"],
    "extendSelect": ["KVR103"], "ignore": ["KVR102"], "run": "onSave", "debounce": 250,
    "unsafeFixes": True, "fixAll": False, "disableRuleComment": False, "cache": False,
    "ruleDocs": "https://example.org/{code}",
}  # fmt: skip


def test_the_settings_table_documents_every_setting() -> None:
    from dataclasses import fields

    from kvref.server.settings import ServerSettings, parse_settings

    section = EDITORS.read_text(encoding="utf-8").split("## Settings", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {key for row in rows for key in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert documented == set(_SAMPLES)
    default = ServerSettings()
    changed: set[str] = set()
    for key in documented:
        settings = parse_settings({key: _SAMPLES[key]}, default)
        changed |= {field.name for field in fields(ServerSettings) if getattr(settings, field.name) != getattr(default, field.name)}
    assert changed == {field.name for field in fields(ServerSettings)}


def test_the_readme_stays_a_page_for_users() -> None:
    # Issue 43: editor set-ups and settings live in docs/EDITORS.md, the rest of the detail in docs/.
    assert len(README.read_text().splitlines()) <= 350
