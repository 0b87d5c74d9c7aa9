"""Files in syntax newer than the running Python are audited, not rejected.

Most tests need a real newer interpreter (pyenv's 3.12/3.13 on the CI image); they skip, with
the reason, only outside CI when none exists. The down-conversion of node types this Python
does not know and the one-line message without any newer interpreter need none.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvref.audit.summarise.newer_syntax as newer_syntax
from kvref.audit import analyze
from kvref.audit.summarise.newer_syntax import (
    candidate_interpreters,
    parse_source,
    parse_with_newer_interpreter,
    use_interpreter,
)
from kvref.audit.summarise.summary import summarize

from .test_fixtures import expected_counts

RUNNING = sys.version_info[:2]


@pytest.fixture(autouse=True)
def fresh_helper() -> Iterator[None]:
    """Each test starts without a helper process or a configured interpreter."""
    use_interpreter(None)
    yield
    use_interpreter(None)


@pytest.fixture
def newer_python() -> Path:
    found = candidate_interpreters()
    if not found:
        if os.environ.get("CI"):
            pytest.fail("CI must have a Python newer than the one running the tests (pyenv)")
        pytest.skip(f"no Python newer than {RUNNING[0]}.{RUNNING[1]} under pyenv or on PATH")
    return found[0]


@pytest.fixture
def no_newer_python(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert candidate_interpreters() == []


PEP_695 = textwrap.dedent(
    """\
    from collections.abc import Iterable

    from typing_extensions import override

    type Pair[T] = tuple[T, T]


    class Base[T]:
        def load(self, item: T) -> None: ...


    class Child[T](Base[T]):
        def load(self, item: T) -> None:  # KVR001 at 13:9
            print(f"{item!r:>{10}}")

        @override
        def gone(self) -> None: ...  # KVR002 at 17:9


    def twice[T](items: Iterable[T]) -> int:  # KVR102 at 20:14
        return len(list(items)) + sum(1 for _ in items)
    """
)


# --- with a newer interpreter ----------------------------------------------------------------


def test_pep_695_file_is_audited_with_positions(newer_python: Path, tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(PEP_695, encoding="utf-8")
    result = analyze([tmp_path / "m.py"], root=tmp_path)
    assert result.errors == []
    found = [(f.code, f.line, f.col) for f in result.findings]
    assert found == [("KVR001", 13, 9), ("KVR002", 17, 9), ("KVR102", 20, 14)]


NEWER_FIXTURES = Path(__file__).parent / "fixtures" / "newer_syntax"


@pytest.mark.parametrize("path", sorted(NEWER_FIXTURES.glob("*.py")), ids=lambda p: p.stem)
def test_newer_syntax_fixture_findings_match_markers(newer_python: Path, path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    result = analyze([path], root=path.parent)
    assert result.errors == []
    assert sorted((f.line, f.code) for f in result.findings) == expected_counts(source)


def test_pep_701_f_string_is_audited(newer_python: Path) -> None:
    source = 'class Base:\n    def f(self) -> str:\n        return f"{ {"a": 1}["a"]}"\n\n\nclass Child(Base):\n    def f(self) -> str:\n        return f"{"nested"}"\n'
    summary = summarize("m.py", source.encode())
    assert [c.name for c in summary.classes] == ["Base", "Child"]
    assert summary.classes[1].methods[0].name_span.line == 7


def test_tree_matches_a_native_parse_apart_from_f_string_parts(newer_python: Path) -> None:
    # A file this Python parses too: the rebuilt tree is the same, positions included,
    # except inside f-strings, whose parts only newer Pythons place exactly (PEP 701).
    text = Path(newer_syntax.__file__).read_text(encoding="utf-8")
    tree, version = parse_with_newer_interpreter(text, "newer_syntax.py")
    assert tree is not None and version > RUNNING
    native = ast.parse(text)
    assert ast.dump(tree) == ast.dump(native)
    for rebuilt, original in zip(ast.walk(tree), ast.walk(native), strict=True):
        if isinstance(original, ast.stmt | ast.arg | ast.Name | ast.Attribute | ast.Call):
            assert isinstance(rebuilt, type(original))
            assert (rebuilt.lineno, rebuilt.col_offset) == (original.lineno, original.col_offset)


def test_one_helper_process_parses_every_such_file(newer_python: Path) -> None:
    sources = ["type A = int\n", "class C[T]: ...\n", "def f[T](x: T) -> T:\n    return x\n"]
    trees = [parse_source(text) for text in sources]
    assert [type(tree.body[0]).__name__ for tree in trees] == ["Assign", "ClassDef", "FunctionDef"]
    helper = newer_syntax._server  # pyright: ignore[reportPrivateUsage]
    assert helper is not None
    parse_source("type B = str\n")
    assert newer_syntax._server is helper  # pyright: ignore[reportPrivateUsage]


def test_the_configured_interpreter_comes_first(newer_python: Path) -> None:
    use_interpreter(newer_python, (3, 99, 0))
    assert candidate_interpreters()[0] == newer_python
    use_interpreter(Path(sys.executable), sys.version_info[:3])  # not newer: not preferred
    assert Path(sys.executable) not in candidate_interpreters()


def test_a_real_syntax_error_keeps_this_pythons_message(newer_python: Path) -> None:
    with pytest.raises(SyntaxError) as raised:
        parse_source("def f(:\n    pass\n")
    assert raised.value.lineno == 1
    assert not raised.value.msg.startswith("uses Python")


def test_syntax_newer_than_every_interpreter_at_hand_names_the_version(
    newer_python: Path,
) -> None:
    source = 'name = "x"\ngreeting = t"hello {name}"\n'
    tree, version = parse_with_newer_interpreter(source)
    if version >= (3, 14):
        assert tree is not None
        assert isinstance(tree.body[1], ast.Assign)
        assert isinstance(tree.body[1].value, ast.JoinedStr)  # a template string, down-converted
    else:
        with pytest.raises(SyntaxError, match=r"uses Python 3\.14 syntax \(PEP 750"):
            parse_source(source)


def _kvref(root: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvref", "audit", *argv],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_audits_newer_syntax_and_the_cache_follows_the_interpreters(
    newer_python: Path, tmp_path: Path
) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "m.py").write_text(PEP_695, encoding="utf-8")
    # First without any newer interpreter: one clear error line, exit 2.
    bare = {**os.environ, "PYENV_ROOT": str(tmp_path / "none"), "PATH": str(Path(sys.executable).parent)}
    outcome = _kvref(root, ".", env=bare)
    assert outcome.returncode == 2, outcome.stdout + outcome.stderr
    assert (
        "m.py:5:6: error: uses Python 3.12 syntax (PEP 695 type aliases); run kvref with "
        "Python >= 3.12 or pass --python"
    ) in outcome.stdout + outcome.stderr
    # The cached error is not served once an interpreter is at hand.
    outcome = _kvref(root, ".", "--python", str(newer_python), env=bare)
    assert outcome.returncode == 1, outcome.stdout + outcome.stderr
    codes = [line.split()[1] for line in outcome.stdout.splitlines() if ": KVR" in line]
    assert codes == ["KVR001", "KVR002", "KVR102"]


# --- without one ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("class C[T]:\n    pass\n", "uses Python 3.12 syntax (PEP 695 type parameters)"),
        ("def f[T](x: T) -> T:\n    return x\n", "uses Python 3.12 syntax (PEP 695 type parameters)"),
        ("type X = int\n", "uses Python 3.12 syntax (PEP 695 type aliases)"),
        ('d = {"a": 1}\nx = f"{d["a"]}"\n', "uses Python 3.12 syntax (PEP 701 f-strings)"),
        ('x = t"{1}"\n', "uses Python 3.14 syntax (PEP 750 template strings)"),
        ("try:\n    pass\nexcept ValueError, TypeError:\n    pass\n", "uses Python 3.14 syntax (PEP 758"),
    ],
)
def test_without_a_newer_python_one_line_says_which(
    no_newer_python: None, source: str, expected: str
) -> None:
    try:
        ast.parse(source)
    except SyntaxError:
        pass
    else:
        pytest.skip("this Python parses it natively")
    with pytest.raises(SyntaxError) as raised:
        parse_source(source)
    message = raised.value.msg
    assert message.startswith(expected)
    assert "run kvref with Python >= 3.1" in message and "or pass --python" in message
    assert "\n" not in message


def test_without_a_newer_python_a_plain_error_stays_plain(no_newer_python: None) -> None:
    with pytest.raises(SyntaxError) as raised:
        parse_source("x = (\n")
    assert not raised.value.msg.startswith("uses Python")


# --- down-conversion of node types this Python does not know -------------------------------


def _pos(line: int, col: int, end_col: int) -> dict[str, object]:
    return {"@lineno": line, "@col_offset": col, "@end_lineno": line, "@end_col_offset": end_col}


def _name(identifier: str, ctx: str, col: int) -> dict[str, object]:
    return {"_": "Name", "~": "e", "id": identifier, "ctx": {"_": ctx}, **_pos(1, col, col + len(identifier))}


def _module(*body: dict[str, object]) -> ast.Module:
    tree = newer_syntax._build({"_": "Module", "body": list(body), "type_ignores": []})  # pyright: ignore[reportPrivateUsage]
    assert isinstance(tree, ast.Module)
    return tree


def test_type_alias_becomes_an_assignment_of_its_name() -> None:
    alias = {
        "_": "TypeAlias", "~": "s", "name": _name("X", "Store", 5),
        "type_params": [{"_": "TypeVar", "name": "T", "bound": None, **_pos(1, 7, 8)}],
        "value": _name("int", "Load", 12), **_pos(1, 0, 15),
    }  # fmt: skip
    (statement,) = _module(alias).body
    assert isinstance(statement, ast.Assign)
    assert ast.unparse(statement) == "X = int"
    assert (statement.lineno, statement.col_offset, statement.end_col_offset) == (1, 0, 15)


def test_type_params_are_dropped() -> None:
    cls = {
        "_": "ClassDef", "~": "s", "name": "C", "bases": [], "keywords": [],
        "body": [{"_": "Pass", "~": "s", **_pos(1, 12, 16)}], "decorator_list": [],
        "type_params": [{"_": "TypeVar", "name": "T", "bound": None, **_pos(1, 8, 9)}],
        **_pos(1, 0, 16),
    }  # fmt: skip
    (statement,) = _module(cls).body
    assert isinstance(statement, ast.ClassDef)
    assert ast.unparse(statement) == "class C:\n    pass"


def test_template_string_becomes_an_f_string() -> None:
    template = {
        "_": "TemplateStr", "~": "e",
        "values": [
            {"_": "Constant", "~": "e", "value": "hi ", "kind": None, **_pos(1, 6, 9)},
            {"_": "Interpolation", "~": "e", "value": _name("name", "Load", 10), "str": "name",
             "conversion": -1, "format_spec": None, **_pos(1, 9, 15)},
        ],
        **_pos(1, 4, 16),
    }  # fmt: skip
    assign = {"_": "Assign", "~": "s", "targets": [_name("x", "Store", 0)], "value": template, **_pos(1, 0, 16)}
    (statement,) = _module(assign).body
    assert ast.unparse(statement) == "x = f'hi {name}'"


def test_unknown_nodes_become_placeholders_at_their_position() -> None:
    future_expr: dict[str, object] = {"_": "FutureExpr", "~": "e", "payload": [], **_pos(1, 4, 9)}
    future_stmt = {"_": "FutureStmt", "~": "s", **_pos(2, 0, 3)}
    assign: dict[str, object] = {
        "_": "Assign", "~": "s", "targets": [_name("x", "Store", 0)], "value": future_expr, **_pos(1, 0, 9)
    }
    first, second = _module(assign, future_stmt).body
    assert isinstance(first, ast.Assign) and isinstance(first.value, ast.Constant)
    assert first.value.value is None and first.value.col_offset == 4
    assert isinstance(second, ast.Pass) and second.lineno == 2


def test_constants_survive_the_trip() -> None:
    values: list[dict[str, object] | object] = [
        {"$f": "inf"}, {"$j": ["0.0", "2.0"]}, {"$b": "00ff"}, {"$e": 0}, 10**40, "é", True,
    ]
    assert [newer_syntax._build(v) for v in values] == [  # pyright: ignore[reportPrivateUsage]
        float("inf"), 2j, b"\x00\xff", ..., 10**40, "é", True,
    ]
