"""apply_fixes keeps bytes, encodings and line endings, adds the import once, refuses bad output."""

from __future__ import annotations

import ast

import pytest

from kvref.audit import Applicability, Edit, Fix, FixError, apply_fixes
from kvref.audit.summary import summarize


def add_override(line: int, indent: str = "    ", newline: str = "\n") -> Fix:
    text = f"{indent}@override{newline}"
    return Fix(Applicability.SAFE, (Edit(line, 0, line, 0, text),), needs_override_import=True)


def test_no_fixes_returns_the_same_bytes() -> None:
    source = b"x = 1\r\n\xef"
    assert apply_fixes(source, []) is source


def test_crlf_and_bom_are_kept() -> None:
    source = b'\xef\xbb\xbf"""Doc."""\r\nclass A(B):\r\n    def f(self): ...\r\n'
    fixed = apply_fixes(source, [add_override(3, newline="\r\n")])
    assert fixed == (
        b'\xef\xbb\xbf"""Doc."""\r\nfrom typing_extensions import override\r\n'
        b"class A(B):\r\n    @override\r\n    def f(self): ...\r\n"
    )


def test_latin1_cookie_and_non_ascii_text_survive() -> None:
    source = "# -*- coding: latin-1 -*-\nclass A(B):\n    def f(self): return 'é'\n".encode(
        "latin-1"
    )
    fixed = apply_fixes(source, [add_override(3)], override_import="typing")
    assert fixed.decode("latin-1") == (
        "# -*- coding: latin-1 -*-\nfrom typing import override\nclass A(B):\n"
        "    @override\n    def f(self): return 'é'\n"
    )


def test_import_is_added_once_and_merged_when_a_statement_exists() -> None:
    source = b"from typing_extensions import Self\nclass A(B):\n    def f(self): ...\n    def g(self): ...\n"
    fixed = apply_fixes(source, [add_override(3), add_override(4)])
    assert fixed.count(b"override") == 3
    assert fixed.startswith(b"from typing_extensions import Self, override\n")


def test_existing_override_import_is_not_duplicated() -> None:
    source = b"from typing_extensions import override\nclass A(B):\n    def f(self): ...\n"
    fixed = apply_fixes(source, [add_override(3)])
    assert fixed.count(b"import override") == 1


def test_module_without_final_newline_gets_the_import_at_its_end_when_empty_body() -> None:
    source = b'"""Only a docstring."""'
    fix = Fix(Applicability.SAFE, (), needs_override_import=True)
    assert apply_fixes(source, [fix]) == b'"""Only a docstring."""\nfrom typing_extensions import override\n'


def test_overlapping_fix_is_skipped_whole() -> None:
    source = b"x: list[int] = []\n"
    first = Fix(Applicability.UNSAFE, (Edit(1, 3, 1, 12, "Sequence[int]"),))
    second = Fix(Applicability.UNSAFE, (Edit(1, 3, 1, 7, "tuple"),))
    assert apply_fixes(source, [first, second]) == b"x: Sequence[int] = []\n"


def test_untouched_bytes_are_identical() -> None:
    source = b"class A(B):\n\tdef f(self): ...  # tab \x0c form feed\n\n\n# trailing   \n"
    fixed = apply_fixes(source, [add_override(2, indent="\t")])
    assert fixed.replace(b"from typing_extensions import override\n", b"").replace(
        b"\t@override\n", b""
    ) == source


def test_a_result_that_does_not_parse_raises_fix_error() -> None:
    source = b"class A(B):\n    def f(self): ...\n"
    broken = Fix(Applicability.SAFE, (Edit(2, 0, 2, 0, "@override\n"),))
    with pytest.raises(FixError, match="does not parse"):
        apply_fixes(source, [broken])


def test_edit_outside_the_file_raises_fix_error() -> None:
    with pytest.raises(FixError):
        apply_fixes(b"x = 1\n", [Fix(Applicability.SAFE, (Edit(9, 0, 9, 0, "y"),))])


def test_fixed_source_still_summarizes() -> None:
    source = b"class A(B):\n    def f(self): ...\n"
    fixed = apply_fixes(source, [add_override(2)])
    ast.parse(fixed)
    assert summarize("a.py", fixed).classes[0].methods[0].has_override
