"""apply_fixes keeps bytes, encodings and line endings, shares import edits, refuses bad output;
import_edits puts imports where ruff's isort does."""

from __future__ import annotations

import ast

import pytest

from kvref.audit import Applicability, Edit, Fix, FixError, RequiredImport, apply_fixes
from kvref.audit.fixes.import_edits import import_edits, member_sort_key
from kvref.audit.source import decode_source, detect_newline, split_lines
from kvref.audit.summarise.imports import import_facts
from kvref.audit.summarise.summary import summarize

OVERRIDE = RequiredImport("typing_extensions", "override")
COLLECTION = RequiredImport("collections.abc", "Collection")


def imports_for(source: bytes, *imports: RequiredImport, line_length: int = 88) -> tuple[Edit, ...]:
    # The facts as a module with classes gets them (modules without classes never get fixes,
    # and their summaries leave the import block out).
    text = decode_source(source)[0]
    facts = import_facts(ast.parse(text), split_lines(text))
    return import_edits(
        facts,
        imports,
        newline=detect_newline(text),
        line_length=line_length,
        first_party=frozenset({"mypkg"}),
    )


def add_override(source: bytes, line: int, indent: str = "    ", newline: str = "\n") -> Fix:
    """A KVR001-like fix: the decorator plus the import edits the summary places."""
    decorator = Edit(line, 0, line, 0, f"{indent}@override{newline}")
    return Fix(Applicability.SAFE, (decorator, *imports_for(source, OVERRIDE)))


def rewrite(source: bytes, line: int, start: int, end: int, text: str, *imports: RequiredImport) -> Fix:
    """An annotation rewrite on one line that needs `imports`."""
    edit = Edit(line, start, line, end, text)
    return Fix(Applicability.UNSAFE, (edit, *imports_for(source, *imports)))


def add(source: bytes, *imports: RequiredImport, line_length: int = 88) -> bytes:
    fix = Fix(Applicability.SAFE, imports_for(source, *imports, line_length=line_length))
    return apply_fixes(source, [fix])


def test_no_fixes_returns_the_same_bytes() -> None:
    source = b"x = 1\r\n\xef"
    assert apply_fixes(source, []) is source


def test_crlf_and_bom_are_kept() -> None:
    source = b'\xef\xbb\xbf"""Doc."""\r\n\r\n\r\nclass A(B):\r\n    def f(self): ...\r\n'
    fixed = apply_fixes(source, [add_override(source, 5, newline="\r\n")])
    assert fixed == (
        b'\xef\xbb\xbf"""Doc."""\r\n\r\nfrom typing_extensions import override\r\n\r\n\r\n'
        b"class A(B):\r\n    @override\r\n    def f(self): ...\r\n"
    )


def test_latin1_cookie_and_non_ascii_text_survive() -> None:
    source = "# -*- coding: latin-1 -*-\nimport os\n\n\nclass A(B):\n    def f(self): return 'é'\n".encode(
        "latin-1"
    )
    fixed = apply_fixes(source, [add_override(source, 6)])
    assert fixed.decode("latin-1") == (
        "# -*- coding: latin-1 -*-\nimport os\n\nfrom typing_extensions import override\n\n\n"
        "class A(B):\n    @override\n    def f(self): return 'é'\n"
    )


def test_fixes_sharing_their_import_edit_apply_it_once() -> None:
    source = b"from typing_extensions import Self\n\n\nclass A(B):\n    def f(self): ...\n    def g(self): ...\n"
    fixed = apply_fixes(source, [add_override(source, 5), add_override(source, 6)])
    assert fixed.count(b"override") == 3
    assert fixed.startswith(b"from typing_extensions import Self, override\n")


def test_overlapping_fix_is_skipped_whole() -> None:
    source = b"x: list[int] = []\n"
    first = Fix(Applicability.UNSAFE, (Edit(1, 3, 1, 12, "Sequence[int]"),))
    second = Fix(Applicability.UNSAFE, (Edit(1, 3, 1, 7, "tuple"),))
    assert apply_fixes(source, [first, second]) == b"x: Sequence[int] = []\n"


def test_untouched_bytes_are_identical() -> None:
    source = b"import os\n\n\nclass A(B):\n\tdef f(self): ...  # tab \x0c form feed\n\n\n# trailing   \n"
    fixed = apply_fixes(source, [add_override(source, 5, indent="\t")])
    without = fixed.replace(b"\nfrom typing_extensions import override\n", b"").replace(b"\t@override\n", b"")
    assert without == source


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
    fixed = apply_fixes(source, [add_override(source, 2)])
    ast.parse(fixed)
    assert fixed.startswith(b"from typing_extensions import override\n\n\nclass A(B):")
    assert summarize("a.py", fixed).classes[0].methods[0].has_override


# --- where imports go (ruff's isort, default settings) -----------------------------------


def test_a_merged_name_is_sorted_constants_classes_then_functions() -> None:
    source = b"from typing_extensions import TYPE_CHECKING, Self, deprecated\n\nx = deprecated\n"
    assert add(source, OVERRIDE).startswith(
        b"from typing_extensions import TYPE_CHECKING, Self, deprecated, override\n"
    )
    assert member_sort_key("TYPE_CHECKING") < member_sort_key("Self") < member_sort_key("override")


def test_a_merged_line_longer_than_the_limit_is_wrapped_one_name_per_line() -> None:
    source = b"from collections.abc import Iterable, Sequence\n"
    assert add(source, COLLECTION, line_length=40) == (
        b"from collections.abc import (\n    Collection,\n    Iterable,\n    Sequence,\n)\n"
    )


def test_a_parenthesized_import_keeps_one_name_per_line() -> None:
    source = b"from collections.abc import (\n    Sequence,\n    Set,\n)\nx: Sequence[int]\n"
    assert add(source, COLLECTION) == (
        b"from collections.abc import (\n    Collection,\n    Sequence,\n    Set,\n)\nx: Sequence[int]\n"
    )


def test_an_import_with_a_comment_gets_the_name_beside_its_neighbour() -> None:
    source = b"from collections.abc import Iterable, Sequence  # noqa: F401\n"
    assert add(source, COLLECTION) == b"from collections.abc import Collection, Iterable, Sequence  # noqa: F401\n"


def test_a_third_party_import_joins_its_section_in_module_order() -> None:
    source = b"import os\n\nimport attr\nimport zlib_ng\nfrom attr import define\n\nfrom mypkg import x\n"
    assert add(source, OVERRIDE) == (
        b"import os\n\nimport attr\nimport zlib_ng\nfrom attr import define\n"
        b"from typing_extensions import override\n\nfrom mypkg import x\n"
    )


def test_a_missing_section_is_added_between_its_neighbours_with_blank_lines() -> None:
    source = b"from __future__ import annotations\n\nimport os\n\nfrom mypkg import x\n\nx = 1\n"
    assert add(source, OVERRIDE) == (
        b"from __future__ import annotations\n\nimport os\n\nfrom typing_extensions import override\n"
        b"\nfrom mypkg import x\n\nx = 1\n"
    )


def test_a_section_before_all_others_goes_first() -> None:
    source = b"from mypkg import x\nfrom .sibling import y\n"
    assert add(source, OVERRIDE) == (
        b"from typing_extensions import override\n\nfrom mypkg import x\nfrom .sibling import y\n"
    )


def test_a_standard_library_import_and_a_third_party_one_keep_their_sections() -> None:
    source = b'"""Doc."""\n\nfrom mypkg import x\n'
    assert add(source, OVERRIDE, COLLECTION) == (
        b'"""Doc."""\n\nfrom collections.abc import Collection\n\n'
        b"from typing_extensions import override\n\nfrom mypkg import x\n"
    )


def test_an_unsorted_block_gets_the_import_after_its_last_statement() -> None:
    source = b"from mypkg import x\nimport os\n\ny = 1\n"
    assert add(source, OVERRIDE) == b"from mypkg import x\nimport os\nfrom typing_extensions import override\n\ny = 1\n"


def test_imports_sharing_a_line_get_blank_lines_only_where_sections_change() -> None:
    # `sys` continues the standard-library section; `typing_extensions` opens a new one after it.
    source = b"import os\n\nfrom mypkg import x\n"
    assert add(source, OVERRIDE, RequiredImport("sys")) == (
        b"import os\nimport sys\n\nfrom typing_extensions import override\n\nfrom mypkg import x\n"
    )
    # `__future__` opens a section before the block; `abc` goes before `os` in its own.
    source = b"import os\n"
    assert add(source, RequiredImport("__future__", "annotations"), RequiredImport("abc")) == (
        b"from __future__ import annotations\n\nimport abc\nimport os\n"
    )


VERSIONED = RequiredImport("typing", "override", older="typing_extensions", since=(3, 12))
IF_BLOCK = (
    b"if sys.version_info >= (3, 12):\n    from typing import override\n"
    b"else:\n    from typing_extensions import override\n"
)


@pytest.mark.parametrize(
    ("source", "fixed"),
    [
        (  # after the block, one blank line before; what followed the block keeps its gap
            b"import sys\n\nfrom mypkg import x\n\n\nclass A(x):\n    pass\n",
            b"import sys\n\nfrom mypkg import x\n\n" + IF_BLOCK + b"\n\nclass A(x):\n    pass\n",
        ),
        (  # `import sys` joins the block, the version check follows it
            b"from __future__ import annotations\n\nfrom mypkg import x\n\ny = 1\n",
            b"from __future__ import annotations\n\nimport sys\n\nfrom mypkg import x\n\n" + IF_BLOCK + b"\ny = 1\n",
        ),
        (  # no block: a new one after the docstring, then the version check
            b'"""Doc."""\n\n\nclass A:\n    pass\n',
            b'"""Doc."""\n\nimport sys\n\n' + IF_BLOCK + b"\n\nclass A:\n    pass\n",
        ),
    ],
)
def test_a_versioned_import_is_a_version_check_after_the_import_block(source: bytes, fixed: bytes) -> None:
    needed = (VERSIONED,) if b"import sys" in source else (VERSIONED, RequiredImport("sys"))
    assert add(source, *needed) == fixed
    compile(fixed, "fixed.py", "exec")


# --- imports a fix leaves unused ------------------------------------------------------------


def test_an_import_the_rewrite_leaves_unused_is_removed() -> None:
    source = b"from collections.abc import Sequence, Set\n\n\ndef f(keys: Sequence[int], s: Set[int]) -> None: ...\n"
    fixed = apply_fixes(source, [rewrite(source, 4, 12, 25, "Collection[int]", COLLECTION)])
    assert fixed == (
        b"from collections.abc import Collection, Set\n\n\n"
        b"def f(keys: Collection[int], s: Set[int]) -> None: ...\n"
    )


def test_a_whole_statement_left_unused_is_removed_and_other_unused_imports_stay() -> None:
    source = (
        b"import json\nfrom typing import List\n\nfrom mypkg import x\n\n\n"
        b"def f(keys: List[int]) -> None: ...\n"
    )
    fixed = apply_fixes(source, [rewrite(source, 7, 12, 21, "list[int]")])
    assert fixed == b"import json\n\nfrom mypkg import x\n\n\ndef f(keys: list[int]) -> None: ...\n"


def test_a_name_still_used_elsewhere_is_kept() -> None:
    source = b"from collections.abc import Sequence\n\nS = Sequence\n\n\ndef f(keys: Sequence[int]) -> None: ...\n"
    fixed = apply_fixes(source, [rewrite(source, 6, 12, 25, "Collection[int]", COLLECTION)])
    assert b"import Collection, Sequence\n" in fixed
