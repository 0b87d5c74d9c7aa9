"""apply_fixes keeps bytes, encodings and line endings, adds imports once, refuses bad output."""

from __future__ import annotations

import ast

import pytest

from kvref.audit import Applicability, Edit, Fix, FixError, RequiredImport, apply_fixes
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


def rewrite(line: int, start: int, end: int, text: str, *imports: RequiredImport) -> Fix:
    """An annotation rewrite on one line that needs `imports`."""
    return Fix(Applicability.UNSAFE, (Edit(line, start, line, end, text),), imports=imports)


COLLECTION = RequiredImport("collections.abc", "Collection")


def test_required_import_merges_into_the_existing_from_import_of_its_module() -> None:
    source = b"from collections.abc import Sequence, Set\n\ndef f(keys: Sequence[int]) -> None: ...\n"
    fixed = apply_fixes(source, [rewrite(3, 12, 25, "Collection[int]", COLLECTION)])
    assert fixed == (
        b"from collections.abc import Sequence, Set, Collection\n\n"
        b"def f(keys: Collection[int]) -> None: ...\n"
    )


def test_required_import_merges_into_a_parenthesized_import() -> None:
    source = b"from collections.abc import (\n    Sequence,\n    Set,\n)\nx: Sequence[int]\n"
    fixed = apply_fixes(source, [rewrite(5, 3, 16, "Collection[int]", COLLECTION)])
    assert fixed == b"from collections.abc import (\n    Sequence,\n    Set, Collection,\n)\nx: Collection[int]\n"


def test_required_imports_go_after_docstring_and_future_keeping_bom_and_crlf() -> None:
    source = (
        b'\xef\xbb\xbf"""Doc."""\r\nfrom __future__ import annotations\r\n\r\nimport os\r\n'
        b"class A(B):\r\n    def f(self, x: list[int]): ...\r\n"
    )
    imports = (RequiredImport("typing", "", "t"), RequiredImport("..keys", "Key"))
    fix = rewrite(6, 19, 28, "t.Collection[Key]", *imports)
    fixed = apply_fixes(source, [fix, add_override(6, newline="\r\n")])
    assert fixed == (
        b'\xef\xbb\xbf"""Doc."""\r\nfrom __future__ import annotations\r\n'
        b"import typing as t\r\nfrom typing_extensions import override\r\nfrom ..keys import Key\r\n"
        b"\r\nimport os\r\nclass A(B):\r\n    @override\r\n"
        b"    def f(self, x: t.Collection[Key]): ...\r\n"
    )


def test_the_override_import_and_a_required_import_share_one_statement() -> None:
    source = b"class A(B):\n    def f(self, x: list[int]): ...\n"
    fix = rewrite(2, 19, 28, "Sequence[int]", RequiredImport("typing", "Sequence"))
    fixed = apply_fixes(source, [fix, add_override(2)], override_import="typing")
    assert fixed == (
        b"from typing import override, Sequence\n"
        b"class A(B):\n    @override\n    def f(self, x: Sequence[int]): ...\n"
    )


def test_a_required_import_is_added_once_and_never_when_present() -> None:
    source = b"x: list[int] = []\ny: list[int] = []\n"
    fixes = [rewrite(1, 3, 12, "Collection[int]", COLLECTION), rewrite(2, 3, 12, "Collection[int]", COLLECTION)]
    fixed = apply_fixes(source, fixes)
    assert fixed == (
        b"from collections.abc import Collection\nx: Collection[int] = []\ny: Collection[int] = []\n"
    )
    # Fixing again with the same fixes' imports adds nothing more (the file binds them now).
    assert apply_fixes(fixed, [rewrite(2, 3, 18, "Collection[int]", COLLECTION)]) == fixed


def test_plain_module_imports_count_a_submodule_import_as_binding_the_package() -> None:
    source = b"import collections.abc\nimport typing as t\nx: list[int] = []\n"
    fix = rewrite(
        3, 3, 12, "collections.abc.Set[t.Any]",
        RequiredImport("collections"), RequiredImport("collections.abc"), RequiredImport("typing", "", "t"),
    )
    assert apply_fixes(source, [fix]) == source.replace(b"list[int]", b"collections.abc.Set[t.Any]")


def test_a_fix_whose_import_binds_a_name_differently_from_an_accepted_one_is_skipped() -> None:
    source = b"x: list[int] = []\ny: list[int] = []\n"
    first = rewrite(1, 3, 12, "Collection[Key]", COLLECTION, RequiredImport("a", "Key"))
    second = rewrite(2, 3, 12, "Collection[Key]", COLLECTION, RequiredImport("b", "Key"))
    fixed = apply_fixes(source, [first, second])
    assert fixed == (
        b"from a import Key\nfrom collections.abc import Collection\n"
        b"x: Collection[Key] = []\ny: list[int] = []\n"
    )


def test_relative_imports_merge_by_their_spelling() -> None:
    source = b"from .base import Base\nfrom base import Other\nx: list[int] = []\n"
    fixed = apply_fixes(source, [rewrite(3, 3, 12, "Keys", RequiredImport(".base", "Keys"))])
    assert fixed.startswith(b"from .base import Base, Keys\nfrom base import Other\n")


def test_an_import_inside_a_conditional_is_not_a_merge_point() -> None:
    source = b"if True:\n    from collections.abc import Set\nx: list[int] = []\n"
    fixed = apply_fixes(source, [rewrite(3, 3, 12, "Collection[int]", COLLECTION)])
    assert fixed == b"from collections.abc import Collection\n" + source.replace(b"list", b"Collection")
