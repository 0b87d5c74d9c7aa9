"""analyze: file errors, report selection, ordering, the summarize_many hook, positions."""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.audit import AnalysisOptions, FileError, ModuleSummary, analyze, summarize, summarize_file
from kvref.audit.source import SummaryError
from kvref.audit.summarise.records import Param, Span
from kvref.audit.summarise.summary import _indented_class_lines  # pyright: ignore[reportPrivateUsage]

BASE = "class Base:\n    def run(self) -> None: ...\n"
CHILD = "from base import Base\n\n\nclass Child(Base):\n    def run(self) -> None: ...\n"


def write(root: Path, files: Mapping[str, str | bytes]) -> list[Path]:
    paths: list[Path] = []
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        paths.append(path)
    return paths


def test_cross_file_override_is_found_with_relative_path_and_1_based_columns(tmp_path: Path) -> None:
    files = write(tmp_path, {"base.py": BASE, "child.py": CHILD})
    result = analyze(files, root=tmp_path)
    [finding] = result.findings
    assert (finding.path, finding.line, finding.col, finding.end_col) == ("child.py", 5, 9, 12)
    assert finding.symbol == "Child.run"
    assert result.files_analyzed == 2


def test_broken_files_become_errors_and_the_rest_is_audited(tmp_path: Path) -> None:
    files = write(
        tmp_path,
        {
            "base.py": BASE,
            "child.py": CHILD,
            "syntax.py": "def f(:\n",
            "bytes.py": b"x = '\xff\xfe'\n",
            "cookie.py": b"# -*- coding: klingon -*-\nx = 1\n",
        },
    )
    missing = tmp_path / "missing.py"
    result = analyze([*files, missing], root=tmp_path)
    errors = {e.path: e for e in result.errors}
    assert sorted(errors) == ["bytes.py", "cookie.py", "missing.py", "syntax.py"]
    assert (errors["syntax.py"].line, errors["syntax.py"].col) == (1, 7)
    assert (errors["bytes.py"].line, errors["bytes.py"].col) == (1, 6)
    assert "cannot read" in errors["missing.py"].message
    assert [f.code for f in result.findings] == ["KVR001"]
    assert result.files_analyzed == 2


def test_errors_are_reported_only_for_report_files(tmp_path: Path) -> None:
    files = write(tmp_path, {"base.py": BASE, "child.py": CHILD, "broken.py": "def (\n"})
    result = analyze(files, root=tmp_path, report_files=[tmp_path / "child.py"])
    assert result.errors == []
    assert [f.path for f in result.findings] == ["child.py"]


def test_findings_are_sorted_by_path_line_col_code(tmp_path: Path) -> None:
    body = "class A(Base):\n    def run(self) -> None: ...\n"
    files = write(
        tmp_path,
        {"base.py": BASE, "z.py": "from base import Base\n" + body, "a.py": "from base import Base\n" + body * 2},
    )
    findings = analyze(files, root=tmp_path).findings
    keys = [(f.path, f.line, f.col, f.code) for f in findings]
    assert keys == sorted(keys) and len(keys) == 3


def test_summarize_many_is_used_for_every_file(tmp_path: Path) -> None:
    files = write(tmp_path, {"base.py": BASE, "child.py": CHILD})
    seen: list[Path] = []

    def many(paths: Sequence[Path]) -> Mapping[Path, ModuleSummary | FileError]:
        seen.extend(paths)
        return {p: summarize_file(p, tmp_path) for p in paths}

    result = analyze(files, root=tmp_path, summarize_many=many)
    assert sorted(seen) == sorted(Path(os.path.abspath(p)) for p in files)
    assert len(result.findings) == 1


def test_summaries_pickle_and_compare_equal() -> None:
    summary = summarize("child.py", CHILD.encode())
    assert pickle.loads(pickle.dumps(summary)) == summary


def test_bom_and_cookie_decode_and_columns_count_characters() -> None:
    source = "\ufeffclass Ünïcode(Base):\n    def rün(self): ...\n".encode("utf-8")
    summary = summarize("u.py", source)
    assert [cls.name for cls in summary.classes] == ["Ünïcode"]  # the BOM is not a character
    method = summary.classes[0].methods[0]
    assert (method.name_span.col, method.name_span.end_col) == (8, 11)
    latin = "# coding: latin-1\nclass É: pass\n".encode("latin-1")
    assert summarize("l.py", latin).classes[0].name == "É"


def test_summary_error_carries_the_position() -> None:
    with pytest.raises(SummaryError) as raised:
        summarize("x.py", b"x = 1\n  y = 2\n")
    assert raised.value.line == 2


def test_kvref_itself_has_no_findings() -> None:
    package = Path(__file__).resolve().parents[2] / "kvref"
    result = analyze(sorted(package.rglob("*.py")), root=package.parent)
    assert result.errors == []
    assert result.findings == [], [f"{f.path}:{f.line} {f.code}" for f in result.findings]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_classes_defined_in_function_bodies_are_found_with_any_line_ending(newline: str) -> None:
    # Function bodies are walked only around lines that start with indentation and `class`;
    # the line numbers of those candidates must agree with ast's for every line ending.
    source = (
        "import x\n"
        "def f():\n"
        "    y = 1\n"
        "    class A(B):\n"
        "        def g(self): ...\n"
        "    return A\n"
        "\n"
        "def h():\n"
        "    '''Docs that say\n"
        "    class is a keyword.'''\n"
        "    if y:\n"
        "        class C(D): pass\n"
        "def k():\n"
        "    return 'class'\n"
    ).replace("\n", newline)
    summary = summarize("m.py", source.encode())
    assert [(c.qualname, c.name_span.line) for c in summary.classes] == [
        ("f.<locals>.A", 4),
        ("h.<locals>.C", 12),
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["class", "class ", "classy", "dataclass", " ", "\t", "\f", "x", "#", "\n", "\r\n", "\r"]),
        max_size=30,
    ).map("".join)
)
def test_indented_class_lines_are_the_lines_an_indented_class_statement_can_start(text: str) -> None:
    # The reference: split on the line breaks Python knows, keep lines that are indentation
    # followed by the word `class` (never the first: no function body starts there).
    expected = [
        number
        for number, line in enumerate(re.split(r"\r\n|\r|\n", text), start=1)
        if number > 1 and re.match(r"[ \t\f]+class\b", line)
    ]
    assert _indented_class_lines(text) == expected


def test_summary_records_compare_and_hash_by_value() -> None:
    # Frozen to the type checker only (see summary._record): they must still behave as values.
    first, second = summarize("child.py", CHILD.encode()), summarize("child.py", CHILD.encode())
    assert first == second and hash(first) == hash(second)
    assert len({first, second}) == 1
    method = first.classes[0].methods[0]
    assert method.params == tuple(Param(*row) for row in method.parameters)
    receiver = method.params[0]
    assert receiver.span == Span(method.def_line, 12, method.def_line, 16)  # `self`


def test_a_dependent_found_through_a_relative_import_is_indexed_once(tmp_path: Path) -> None:
    # Reporting only the base's file: the subclass elsewhere, reached by `from .base import`
    # inside a package, is reported against it, and every file counts once.
    files = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/base.py": BASE,
            "pkg/child.py": CHILD.replace("from base", "from .base"),
        },
    )
    options = AnalysisOptions(report_dependents=True)
    result = analyze(files, root=tmp_path, report_files=[files[1]], options=options)
    assert [(f.path, f.symbol) for f in result.findings] == [("pkg/child.py", "Child.run")]
    assert result.files_analyzed == 3 and not result.unresolved_bases


def test_unresolved_bases_are_named_on_one_line(tmp_path: Path) -> None:
    source = (
        "import collections, typing\n\n"
        'class Pair(collections.namedtuple("Pair", ["a", "b"])):\n    pass\n\n'
        "class Url(\n    typing.NamedTuple(\n        'Url',\n        [('scheme', typing.Optional[str])],\n    )\n):\n    pass\n\n"
        "class Long(collections.namedtuple('Long', ['first_field', 'second_field', 'third'])):\n    pass\n\n"
        "class Subscript(typing.Dict[\n    str, int\n], undefined_name):\n    pass\n"
    )
    files = write(tmp_path, {"mod.py": source})
    result = analyze(files, root=tmp_path)
    # A call with a short one-line text is shown whole; longer or multi-line calls as
    # `function(...)`; anything else that spans lines, on one line.
    assert set(result.unresolved_bases) == {
        'collections.namedtuple("Pair", ["a", "b"])',
        "typing.NamedTuple(...)",
        "collections.namedtuple(...)",
        "mod.undefined_name",
    }


STUB_USER = (
    "from typing_extensions import override\n\nfrom pkg.core import Array\n\n\n"
    "class Sub(Array):\n    def sum(self) -> int:\n        return 1\n\n"
    "    @override\n    def gone(self) -> None: ...\n"
)


@pytest.mark.parametrize(
    "sources",
    [
        {"pkg/core.pyi": "class Array:\n    def sum(self) -> int: ...\n"},  # pandas' `_libs`: no .py at all
        {  # numpy's `multiarray`: a .py re-exporting an unbuilt C extension, and its stub
            "pkg/core.py": "from pkg._core_ext import *\n",
            "pkg/core.pyi": "class Array:\n    def sum(self) -> int: ...\n",
        },
    ],
)
def test_project_stubs_resolve_bases_and_are_never_reported(sources: dict[str, str], tmp_path: Path) -> None:
    # The stub's own class lacks an @override a checked file would need: never reported.
    stub = "class Base:\n    def sum(self) -> int: ...\n\nclass Array(Base):\n    def sum(self) -> int: ...\n"
    sources = {name: stub if name.endswith(".pyi") else text for name, text in sources.items()}
    files = write(tmp_path, {"pkg/__init__.py": "", "pkg/user.py": STUB_USER, **sources})
    result = analyze(files, root=tmp_path)
    assert [(f.path, f.code, f.message) for f in result.findings] == [
        ("pkg/user.py", "KVR001", 'Method "Sub.sum" overrides "pkg.core.Array.sum" but is not decorated with @override'),
        ("pkg/user.py", "KVR002", 'Method "Sub.gone" is decorated with @override but no base class of "Sub" defines "gone"'),
    ]
    assert not result.unresolved_bases


def test_a_project_directory_does_not_shadow_an_installed_package(tmp_path: Path) -> None:
    # celery 5.7: `examples/pydantic/__init__.py` is importable as `pydantic` only with
    # `examples/` on sys.path; its tests' `from pydantic import BaseModel` is the installed one.
    project, site = tmp_path / "project", tmp_path / "site-packages"
    write(site, {"pydantic/__init__.py": "class BaseModel:\n    def model_dump(self) -> dict: ...\n"})
    user = (
        "from typing_extensions import override\n\nfrom pydantic import BaseModel\n\n\n"
        "class Model(BaseModel):\n    @override\n    def model_dump(self) -> dict: ...\n\n"
        "    @override\n    def gone(self) -> None: ...\n"
    )
    files = write(project, {"examples/pydantic/__init__.py": "", "examples/pydantic/tasks.py": "", "tests/test_models.py": user})
    result = analyze(files, root=project, search_paths=[site])
    assert [(f.path, f.code, f.symbol) for f in result.findings] == [("tests/test_models.py", "KVR002", "Model.gone")]
    assert not result.unresolved_bases


def test_summarize_file_reads_like_the_runner(tmp_path: Path) -> None:
    # The pipeline's one-file path and the runner's cached, parallel one read through the
    # same function: neither hangs on a FIFO nor parses a file over the size limit.
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    assert summarize_file(fifo, tmp_path) == FileError("pipe.py", 1, 1, "cannot read: not a regular file")
    big = tmp_path / "big.py"
    big.write_text(CHILD)
    error = summarize_file(big, tmp_path, max_bytes=10)
    assert isinstance(error, FileError) and error.message.startswith("skipped: ")
    assert isinstance(summarize_file(big, tmp_path), ModuleSummary)
    broken = tmp_path / "broken.py"
    broken.write_text("class (:\n")
    error = summarize_file(broken, tmp_path)
    assert isinstance(error, FileError) and error.path == "broken.py" and error.line == 1
