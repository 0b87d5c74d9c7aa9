"""The server's settings (the editor's spelling, errors naming the key) and its positions
(UTF-16 by default, clamped into the document, one replacement between two texts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvref.server.positions import Place, client_column, document_bytes, server_column, text_change
from kvref.server.settings import ServerSettings, parse_settings


def test_editor_settings_override_the_command_line() -> None:
    base = ServerSettings(python=Path("/usr/bin/python3"), cache=False)
    settings = parse_settings({"kvref": {"select": ["KVR0"], "run": "onSave", "debounce": 0, "unsafeFixes": True}}, base)
    assert settings == ServerSettings(
        python=Path("/usr/bin/python3"), cache=False, select=("KVR0",), run="onSave", debounce_ms=0, unsafe_fixes=True
    )
    assert parse_settings(None, base) is base
    assert parse_settings({"python": ".venv"}, base).python == Path(".venv")


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"run": "sometimes"}, "run"),
        ({"debounce": -1}, "debounce"),
        ({"debounce": True}, "debounce"),
        ({"select": "KVR001"}, "select"),
        ({"unsafeFixes": "yes"}, "unsafeFixes"),
        ({"ruleDocs": "https://example.org/rules"}, "ruleDocs"),
        ({"lint": {}}, "lint"),
        (["python"], "must be a table"),
    ],
)
def test_a_bad_setting_is_a_value_error_naming_it(raw: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_settings(raw, ServerSettings())


def test_columns_count_utf16_units_and_clamp_into_the_document() -> None:
    lines = ["a\U0001f600b", "é"]
    assert client_column(lines, 0, 2, "utf-16") == Place(0, 3)
    assert client_column(lines, 0, 2, "utf-8") == Place(0, 5)
    assert client_column(lines, 0, 2, "utf-32") == Place(0, 2)
    assert client_column(lines, 0, 99, "utf-16") == Place(0, 4)  # past the end of the line
    assert client_column(lines, 7, 3, "utf-16") == Place(1, 1)  # past the last line
    assert server_column(lines, Place(0, 3), "utf-16") == (0, 2)
    assert server_column(lines, Place(9, 0), "utf-16") == (1, 1)


def test_document_bytes_follow_a_coding_cookie() -> None:
    assert document_bytes("x = 'é'\n") == "x = 'é'\n".encode()
    latin = "# -*- coding: latin-1 -*-\nx = 'é'\n"
    assert document_bytes(latin) == latin.encode("latin-1")


def _apply(old: str, new: str) -> str:
    change = text_change(old, new, "utf-32")
    if change is None:
        return old
    lines = old.splitlines(keepends=True) or [""]

    def offset(place: Place) -> int:
        return sum(len(line) for line in lines[: place.line]) + place.character

    return old[: offset(change.start)] + change.text + old[offset(change.end) :]


@given(st.text(st.sampled_from("ab\n\r\U0001f600"), max_size=12), st.text(st.sampled_from("ab\n\r\U0001f600"), max_size=12))
def test_one_replacement_turns_one_text_into_the_other(old: str, new: str) -> None:
    assert _apply(old, new) == new
    assert (text_change(old, new, "utf-16") is None) == (old == new)
