"""`tools/_checker_runs.py` reads each checker's missing-override report back as raw findings
(what `tools/compare_checkers.py` builds recall and precision on)."""

from __future__ import annotations

import json

from tools._audit_corpus import parse_spec
from tools._checker_runs import POPULAR, TOOLS, parse_output


def test_every_pinned_checker_has_a_reader() -> None:
    assert [tool.name for tool in TOOLS] == ["pyright", "mypy", "ty"]
    assert [tool.version for tool in TOOLS] == ["1.1.414", "2.4.1", "1.0.0"]


def test_the_popular_corpus_is_ten_pinned_distinct_packages_or_more() -> None:
    names = [parse_spec(package.spec)[0] for package in POPULAR]
    assert len(names) >= 10 and len(set(names)) == len(names)
    assert all(package.subdir and package.exercises for package in POPULAR)


def test_pyright_json_keeps_only_the_override_rule() -> None:
    document = {
        "generalDiagnostics": [
            {
                "file": "/corpus/pkg/m.py",
                "rule": "reportImplicitOverride",
                "message": 'Method "run" is not marked as override but is overriding a method in class "Base"',
                "range": {"start": {"line": 9, "character": 8}},
            },
            {
                "file": "/corpus/pkg/m.py",
                "rule": "reportSyntaxError",
                "message": "bad",
                "range": {"start": {"line": 1, "character": 0}},
            },
        ]
    }
    assert parse_output("pyright", json.dumps(document)) == [("/corpus/pkg/m.py", 10, "Base")]


def test_mypy_and_ty_lines() -> None:
    mypy = (
        'pkg/m.py:10:5: error: Method "run" is not using @override but is overriding a method '
        'in class "pkg.base.Base"  [explicit-override]\n'
        "pkg/m.py:12:5: error: Something else  [misc]\n"
    )
    ty = (
        "pkg/m.py:10:9: error[missing-override-decorator] Method `run` overrides "
        "`pkg.base.Base.run` without @override\n"
    )
    assert parse_output("mypy", mypy) == [("pkg/m.py", 10, "pkg.base.Base")]
    assert parse_output("ty", ty) == [("pkg/m.py", 10, "pkg.base.Base")]
