"""Fixes are correct code for the project they are applied to.

The decorator always means `typing.override` / `typing_extensions.override` (never a name the
module or class binds to something else); `typing.override` only on a 3.12+ floor (and such a
fixed file imports on 3.12 and 3.13); a project below 3.12 that does not declare
typing_extensions gets no KVR001 fix from plain `--fix`; imports go where ruff's isort puts
them; JSON and SARIF fixes carry the import edit; every fixed file runs; a second fix is a
no-op.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvref.audit import AnalysisOptions, analyze, apply_fixes
from kvref.audit.model import TypingExtensions
from kvref.audit.discover.config import ConfigError, parse_config_table
from kvref.audit.command import EXIT_CLEAN, EXIT_FINDINGS
from kvref.cli import audit_main as main
from kvref.audit.discover.project import (
    is_development_file,
    load_project_facts,
    parse_target_version,
    python_minors,
    requires_python_floor,
)
from tests.audit.test_fixtures import FIXTURES, SUPPORT, fixture_files
from tests.pythons import find_python

IN_CI = os.environ.get("CI") == "true"


def _ruff() -> list[str]:
    """The ruff command, or a skip (a failure in CI, where the dev extra installs it)."""
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        if IN_CI:
            pytest.fail("ruff is not installed: `pip install -e .[dev]` installs it")
        pytest.skip("ruff is not installed (pip install -e .[dev])")
    return [found, "check", "--isolated", "--select", "I,F401", "--quiet", "--no-cache"]


def _ruff_clean(*paths: Path) -> bool:
    return subprocess.run([*_ruff(), *map(str, paths)], capture_output=True).returncode == 0


def _interpreter(version: str) -> str:
    """A CPython `version` (e.g. "3.12"), or a skip (a failure in CI)."""
    found = find_python(version)
    if found is not None:
        return str(found)
    if IN_CI:
        pytest.fail(f"no Python {version} found (pyenv's versions, or python{version} on PATH)")
    pytest.skip(f"no Python {version} found (pyenv's versions, or python{version} on PATH)")


# --- fixture twins ----------------------------------------------------------------------------


TWINS = [p for p in fixture_files() if p.with_name(p.stem + ".fixed.py").exists()]


@pytest.mark.parametrize("path", TWINS, ids=lambda p: p.stem)
def test_a_twin_of_a_ruff_clean_fixture_is_ruff_clean(path: Path) -> None:
    twin = path.with_name(path.stem + ".fixed.py")
    if not _ruff_clean(path):
        assert path.stem == "KVR001_merge", "every other fixture is isort-clean; keep it so"
        return
    result = subprocess.run([*_ruff(), str(twin)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


RUNNABLE = ["KVR001_shadowed", "KVR001_class_binding", "KVR001_typing_module", "KVR001_new_section"]


@pytest.mark.parametrize("name", RUNNABLE)
def test_the_fixed_decorator_is_typing_extensions_override(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import typing_extensions

    monkeypatch.setattr(sys, "path", [str(SUPPORT), *sys.path])
    source = (FIXTURES / f"{name}.fixed.py").read_text(encoding="utf-8")
    if "from .sibling" in source:  # a relative import the fixture only names
        source = source.replace("from .sibling import helper", "helper = None")
    namespace: dict[str, object] = {"__name__": f"{name}_fixed"}
    exec(compile(source, name, "exec"), namespace)
    child = namespace["Child"]
    assert isinstance(child, type)
    methods = [value for key, value in vars(child).items() if callable(value) and not key.startswith("__")]
    assert methods and all(getattr(method, "__override__", False) for method in methods)
    # The decorator name the fix used is bound to the real thing, not the module's `override`.
    spelled = [line.strip()[1:] for line in source.splitlines() if line.strip().startswith("@")]
    assert all(namespace[spelling] is typing_extensions.override for spelling in spelled)
    for method in methods:
        method(child())  # the translation context manager would raise TypeError here


def test_the_shadowed_module_keeps_its_own_override() -> None:
    fixed = (FIXTURES / "KVR001_shadowed.fixed.py").read_text(encoding="utf-8")
    assert "from translation import override\n" in fixed
    assert "from typing_extensions import override as typing_override\n" in fixed
    assert "    @typing_override\n    def greet" in fixed


@pytest.mark.parametrize("version", ["3.12", "3.13"])
@pytest.mark.parametrize("name", ["KVR001_typing_py312", "KVR001_py312_sections"])
def test_a_py312_fix_imports_on_newer_pythons(name: str, version: str, tmp_path: Path) -> None:
    python = _interpreter(version)
    shutil.copy(FIXTURES / f"{name}.fixed.py", tmp_path / "fixed_module.py")
    check = (
        "import fixed_module as m; "
        "assert all(getattr(v, '__override__', False) for k, v in vars(m.Child).items() "
        "if callable(v) and not k.startswith('__')); print('ok')"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SUPPORT)])}
    result = subprocess.run([python, "-c", check], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.stdout.strip() == "ok", result.stderr


# --- project facts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("specifiers", "floor"),
    [
        (">=3.11", (3, 11)),
        (">=3.8,<4", (3, 8)),
        ("~=3.10", (3, 10)),
        (">3.11", (3, 11)),  # 3.11.1 is greater than 3.11
        ("==3.12.*", (3, 12)),
        ("^3.10", (3, 10)),
        ("<4", None),
        ("!=3.9.*, >= 3.12", (3, 12)),
        ("", None),
    ],
)
def test_requires_python_floor(specifiers: str, floor: tuple[int, int] | None) -> None:
    assert requires_python_floor(specifiers) == floor


def test_target_version_is_validated_naming_the_field(tmp_path: Path) -> None:
    assert parse_target_version("py312", where="x") == (3, 12)
    for bad in ("3.12", "py2", 312):
        with pytest.raises(ValueError, match="target-version must be a string like 'py311'"):
            parse_target_version(bad, where="x")
    with pytest.raises(ConfigError, match=r"\[tool.kvref\]: target-version"):
        parse_config_table({"target-version": "python3.12"}, root=tmp_path)
    assert parse_config_table({"target-version": "py313"}, root=tmp_path).target_version == (3, 13)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("files", "scope"),
    [
        ({"pyproject.toml": '[project]\nname = "p"\ndependencies = ["typing-extensions>=4"]\n'}, "runtime"),
        ({"pyproject.toml": '[project]\nname = "p"\n[project.optional-dependencies]\nx = ["Typing_Extensions"]\n'}, "development"),
        ({"pyproject.toml": '[tool.poetry.dependencies]\npython = "^3.10"\ntyping-extensions = "*"\n'}, "runtime"),
        ({"pyproject.toml": '[tool.poetry.dependencies]\ntyping-extensions = {version = "*", optional = true}\n'}, "development"),
        ({"pyproject.toml": '[tool.poetry.dependencies]\ntyping-extensions = {version = "*", python = "<3.13"}\n'}, "conditional"),
        ({"pyproject.toml": '[tool.poetry.group.main.dependencies]\ntyping-extensions = "*"\n'}, "runtime"),
        ({"pyproject.toml": '[tool.poetry.group.dev.dependencies]\ntyping_extensions = "*"\n'}, "development"),
        ({"pyproject.toml": '[tool.poetry.dev-dependencies]\ntyping_extensions = ">=4.0.0, <5.0"\n'}, "development"),  # rich 15
        ({"pyproject.toml": '[dependency-groups]\ndev = ["typing_extensions"]\n'}, "development"),
        # starlette 1.10: missing on 3.13, where the fixed module would still import it
        ({"pyproject.toml": '[project]\nname = "p"\ndependencies = ["typing_extensions>=4.10.0; python_version < \'3.13\'"]\n'}, "before-3.12"),
        ({"pyproject.toml": '[project]\nname = "p"\ndependencies = ["typing_extensions; python_version < \'3.10\'"]\n'}, "conditional"),
        ({"requirements.txt": "# pinned\nattrs==23.1\ntyping_extensions==4.12.2 ; python_version < '3.12'\n"}, "before-3.12"),
        ({"requirements.txt": "typing_extensions==4.12.2  # for override\n"}, "runtime"),
        (  # mypy 2.4: two markers that together cover every Python
            {"pyproject.toml": '[project]\nname = "p"\nrequires-python = ">=3.9"\ndependencies = [\n'
             '  "typing_extensions>=4.6.0; python_version<\'3.15\'",\n'
             '  "typing_extensions>=4.14.0; python_version>=\'3.15\'",\n]\n'},
            "runtime",
        ),
        ({"pyproject.toml": '[project]\nname = "p"\nrequires-python = ">=3.9"\ndependencies = ["typing_extensions; python_version >= \'3.8\'"]\n'}, "runtime"),
        ({"pyproject.toml": '[project]\nname = "p"\ndependencies = ["typing_extensions; python_version >= \'3.8\'"]\n'}, "conditional"),  # floor unknown
        ({"requirements.txt": "typing_extensions; sys_platform == 'linux'\n"}, "conditional"),
        ({"requirements/base.txt": "typing-extensions\n"}, "runtime"),  # no package: what it runs with
        # tornado 6.6: a package whose requirements.txt pins its developers' tools
        ({"setup.py": "setup(name='t')\n", "requirements.txt": "typing-extensions==4.16.0\n"}, "development"),
        ({"pyproject.toml": '[project]\nname = "p"\n', "requirements.txt": "typing-extensions\n"}, "development"),
        ({"setup.py": "setup(install_requires=open('requirements.txt').read().split())\n", "requirements.txt": "typing-extensions\n"}, "runtime"),
        ({"setup.py": "from setuptools import setup\nsetup(name='t', install_requires=['attrs', 'typing_extensions>=4.4'])\n"}, "runtime"),
        ({"setup.py": "import setuptools\nsetuptools.setup(install_requires=('typing_extensions; python_version<\"3.12\"',))\n"}, "before-3.12"),
        ({"setup.py": "setup(extras_require={'test': ['typing_extensions']})\n"}, "development"),
        ({"setup.py": "setup(install_requires=REQUIREMENTS)\n"}, "undeclared"),
        ({"setup.py": "setup(install_requires=['typing_extensions'\n"}, "undeclared"),  # does not parse
        (
            {"pyproject.toml": '[project]\nname = "p"\ndynamic = ["dependencies"]\n[tool.setuptools.dynamic]\ndependencies = {file = ["requirements/run.txt"]}\n',
             "requirements/run.txt": "typing-extensions\n"},
            "runtime",
        ),
        ({"requirements-dev.txt": "typing-extensions\n"}, "development"),
        ({"requirements/test.txt": "typing-extensions\n"}, "development"),
        ({"setup.cfg": "[options]\ninstall_requires =\n    typing_extensions>=4\n"}, "runtime"),
        ({"setup.cfg": "[options.extras_require]\ntest =\n    typing_extensions>=4\n"}, "development"),
        (  # a run-time declaration wins over a development one
            {"pyproject.toml": '[project]\nname = "p"\ndependencies = ["typing-extensions"]\n', "requirements-dev.txt": "typing-extensions\n"},
            "runtime",
        ),
        ({"pyproject.toml": '[project]\nname = "p"\ndependencies = ["typing-inspect"]\n'}, "undeclared"),
        ({"requirements.txt": "-r other.txt\n# typing_extensions\n"}, "undeclared"),
        ({"script.py": "print()\n"}, "undeclared"),  # a loose directory declares nothing
    ],
)
def test_typing_extensions_declarations(files: dict[str, str], scope: str, tmp_path: Path) -> None:
    assert load_project_facts(_write(tmp_path, files)).typing_extensions == scope


@pytest.mark.parametrize(
    ("marker", "minors"),
    [
        ("python_version < '3.13'", set(range(13))),
        ('python_version >= "3.38"', {38, 39, 40}),
        ("python_version >= '3.10' and python_version < '3.12'", {10, 11}),
        ("python_version < '3.2' or python_version == '3.39'", {0, 1, 39}),
        ("python_full_version >= '3.8.1' and python_version < '3.10'", {9}),  # 3.8.0 is left out
        ("python_version != '3.5' and python_version <= '3.6'", {0, 1, 2, 3, 4, 6}),
        ("sys_platform == 'linux'", set[int]()),
        ("python_version < '3.13' and sys_platform == 'linux'", set[int]()),
        ("(python_version < '3.13')", set[int]()),
    ],
)
def test_python_minors_of_markers(marker: str, minors: set[int]) -> None:
    assert python_minors(marker) == minors


@pytest.mark.parametrize(
    ("path", "development"),
    [
        ("tests/test_console.py", True),
        ("docs/source/conf.py", True),
        ("examples/app.py", True),
        ("src/pkg/tests/helpers.py", True),
        ("pkg/test_thing.py", True),
        ("pkg/thing_test.py", True),
        ("pkg/conftest.py", True),
        ("setup.py", False),  # a build file: see test_setup_py_imports_only_what_the_build_installs
        ("rich/console.py", False),
        ("src/pkg/testing/fixtures.py", False),  # shipped: sqlalchemy.testing
        ("pkg/setup.py", False),
        ("pkg/latest.py", False),
    ],
)
def test_development_files(path: str, development: bool) -> None:
    assert is_development_file(path) is development


def test_facts_read_floor_line_length_and_first_party(tmp_path: Path) -> None:
    pyproject = (
        '[project]\nname = "p"\nrequires-python = ">=3.10"\n'
        "[tool.ruff]\nline-length = 100\n[tool.ruff.lint.isort]\nknown-first-party = ['shared']\n"
    )
    root = _write(tmp_path, {"pyproject.toml": pyproject, "pkg/__init__.py": "", "src/lib/__init__.py": "", "tool.py": ""})
    facts = load_project_facts(root)
    assert facts.python_floor == (3, 10) and facts.line_length == 100
    assert {"pkg", "lib", "tool", "shared"} <= facts.first_party
    assert load_project_facts(root, target_version=(3, 12)).python_floor == (3, 12)


# --- the command line on real projects ----------------------------------------------------------

BASE = """\
class Base:
    def run(self) -> int:
        return 1
"""

CHILD = """\
import typing

from pkg.base import Base


class Child(Base):
    def run(self) -> int:
        return typing.cast(int, 2)
"""


def _project(root: Path, pyproject: str, extra: dict[str, str] | None = None) -> Path:
    files = {"pyproject.toml": pyproject, "pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/child.py": CHILD}
    return _write(root, {**files, **(extra or {})})


Run = Callable[..., tuple[int, str]]


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVREF_CACHE_DIR", str(tmp_path / ".cache"))

    def invoke(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(["pkg", *argv])
        return code, capsys.readouterr().out

    return invoke


def test_below_3_12_without_typing_extensions_plain_fix_leaves_kvr001(tmp_path: Path, run: Run) -> None:
    _project(tmp_path, '[project]\nname = "p"\nrequires-python = ">=3.11"\n')
    code, out = run("--output-format", "json")
    assert code == EXIT_FINDINGS
    (finding,) = json.loads(out)["findings"]
    assert finding["fixable"] is False
    assert finding["fix"]["applicability"] == "unsafe"
    assert "typing_extensions is undeclared; add it to the dependencies" in finding["fix"]["description"]
    assert 'target-version = "py312"' in finding["fix"]["description"]
    before = (tmp_path / "pkg/child.py").read_text()
    assert run("--fix")[0] == EXIT_FINDINGS
    assert (tmp_path / "pkg/child.py").read_text() == before
    # Opting in applies it, and writes `typing_extensions`, never `typing.override`.
    assert run("--fix", "--unsafe-fixes")[0] == EXIT_CLEAN
    fixed = (tmp_path / "pkg/child.py").read_text()
    assert "import typing\n\nfrom typing_extensions import override\n\nfrom pkg.base import Base\n" in fixed
    assert "    @override\n    def run" in fixed


def test_the_summary_says_what_a_withheld_kvr001_fix_needs(
    tmp_path: Path, run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    _project(tmp_path, '[project]\nname = "p"\nrequires-python = ">=3.11"\n', {"pkg/other.py": CHILD})
    assert main(["pkg"]) == EXIT_FINDINGS  # `run` set the directory and the cache
    assert capsys.readouterr().err.splitlines()[:2] == [
        "Found 2 findings (2 more with --unsafe-fixes).",
        '2 KVR001 fixes need --unsafe-fixes: typing_extensions is undeclared; add it to the '
        'dependencies or set target-version = "py312".',
    ]


def test_a_development_only_typing_extensions_is_imported_by_tests_alone(tmp_path: Path, run: Run) -> None:
    # rich 15 declares typing-extensions only among Poetry's dev-dependencies: `pip install
    # rich` does not install it, so `rich/` may not import it; its tests may.
    pyproject = '[tool.poetry.dependencies]\npython = ">=3.9"\n[tool.poetry.dev-dependencies]\ntyping-extensions = ">=4"\n'
    test_child = CHILD.replace("class Child", "class TestChild")
    _project(tmp_path, pyproject, {"pkg/tests/__init__.py": "", "pkg/tests/test_child.py": test_child})
    code, out = run("--output-format", "json")
    findings = {f["path"]: f for f in json.loads(out)["findings"]}
    assert code == EXIT_FINDINGS and set(findings) == {"pkg/child.py", "pkg/tests/test_child.py"}
    assert findings["pkg/tests/test_child.py"]["fixable"] is True
    assert findings["pkg/child.py"]["fixable"] is False
    assert "typing_extensions is only a development dependency" in findings["pkg/child.py"]["fix"]["description"]
    assert run("--fix")[0] == EXIT_FINDINGS
    assert (tmp_path / "pkg/child.py").read_text() == CHILD
    assert "from typing_extensions import override\n" in (tmp_path / "pkg/tests/test_child.py").read_text()


GUARDED = (
    "import sys\n\nfrom pkg.base import Base\n\n"
    "if sys.version_info >= (3, 13):\n    from typing import TypeVar\nelse:\n    from typing_extensions import TypeVar\n\n"
    'T = TypeVar("T")\n\n\nclass Guarded(Base):\n    def run(self) -> int:\n        return 3\n'
)
VERSION_CHECK = (
    "if sys.version_info >= (3, 12):\n    from typing import override\nelse:\n    from typing_extensions import override\n"
)


def test_typing_extensions_below_3_12_only_is_imported_behind_a_version_check(tmp_path: Path, run: Run) -> None:
    # Starlette 1.10: `typing_extensions>=4.10.0; python_version < '3.13'`, and modules that
    # import it only in the `else` of `if sys.version_info >= (3, 13):`. On 3.13 a plain
    # `from typing_extensions import override` would fail; typing's exists from 3.12 on.
    pyproject = '[project]\nname = "p"\nrequires-python = ">=3.11"\ndependencies = ["typing_extensions; python_version < \'3.13\'"]\n'
    _project(tmp_path, pyproject, {"pkg/guarded.py": GUARDED})
    code, out = run("--output-format", "json")
    findings = json.loads(out)["findings"]
    assert code == EXIT_FINDINGS and len(findings) == 2 and all(f["fixable"] is True for f in findings)
    assert run("--fix")[0] == EXIT_CLEAN
    child, guarded = ((tmp_path / "pkg" / name).read_text() for name in ("child.py", "guarded.py"))
    assert child == (
        "import sys\nimport typing\n\nfrom pkg.base import Base\n\n" + VERSION_CHECK
        + "\n\nclass Child(Base):\n    @override\n    def run(self) -> int:\n        return typing.cast(int, 2)\n"
    )
    assert guarded.count("import sys\n") == 1 and "from pkg.base import Base\n\n" + VERSION_CHECK + "\nif sys" in guarded
    assert _ruff_clean(tmp_path / "pkg/child.py", tmp_path / "pkg/guarded.py")
    assert run("--fix")[0] == EXIT_CLEAN  # nothing left, nothing added twice
    assert (tmp_path / "pkg/child.py").read_text() == child
    # It runs here (3.11: typing_extensions'), and on a bare 3.12, which has no
    # typing_extensions (typing's; guarded.py's own TypeVar import needs it there).
    for python, modules in ((sys.executable, "pkg.child, pkg.guarded"), (_interpreter("3.12"), "pkg.child")):
        program = f"import {modules}; assert pkg.child.Child.run.__override__"
        completed = subprocess.run([python, "-c", program], cwd=tmp_path, capture_output=True, text=True)
        assert completed.returncode == 0, completed.stderr


@pytest.mark.parametrize(
    ("module", "fixable"),
    [
        # `sys` imported late: imported again in the block, where the version check needs it
        ("from pkg.base import Base\n\n\nclass Late(Base):\n    def run(self) -> int:\n        return 3\n\n\nimport sys\n", True),
        # `sys` names something else: no version check can be written
        ("from pkg.base import Base\n\nsys = None\n\n\nclass Taken(Base):\n    def run(self) -> int:\n        return 3\n", False),
    ],
)
def test_the_version_check_needs_sys_bound_to_the_module_where_it_runs(
    module: str, fixable: bool, tmp_path: Path, run: Run
) -> None:
    pyproject = '[project]\nname = "p"\nrequires-python = ">=3.11"\ndependencies = ["typing_extensions; python_version < \'3.13\'"]\n'
    _project(tmp_path, pyproject, {"pkg/other.py": module})
    _, out = run("--output-format", "json")
    (finding,) = [f for f in json.loads(out)["findings"] if f["path"] == "pkg/other.py"]
    assert finding["fixable"] is fixable
    if not fixable:
        assert '"sys" is taken' in finding["fix"]["description"]
        return
    assert run("--fix")[0] == EXIT_CLEAN
    fixed = (tmp_path / "pkg/other.py").read_text()
    assert fixed.startswith("import sys\n\nfrom pkg.base import Base\n\n" + VERSION_CHECK)
    completed = subprocess.run([sys.executable, "-c", "import pkg.other"], cwd=tmp_path, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr


def test_typing_extensions_under_other_markers_or_a_version_guard_is_not_everywhere(tmp_path: Path, run: Run) -> None:
    pyproject = '[project]\nname = "p"\nrequires-python = ">=3.9"\ndependencies = ["typing_extensions; python_version < \'3.10\'"]\n'
    _project(tmp_path, pyproject, {"pkg/guarded.py": GUARDED})
    code, out = run("--output-format", "json")
    findings = json.loads(out)["findings"]
    assert code == EXIT_FINDINGS and len(findings) == 2
    assert all(f["fixable"] is False for f in findings)
    assert all("a dependency under a marker only" in f["fix"]["description"] for f in findings)
    # A module that imports it unconditionally has it wherever it runs.
    (tmp_path / "pkg/guarded.py").write_text("import typing_extensions\n\n" + GUARDED)
    assert run("--fix")[0] == EXIT_FINDINGS
    assert "@typing_extensions.override\n    def run" in (tmp_path / "pkg/guarded.py").read_text()
    assert (tmp_path / "pkg/child.py").read_text() == CHILD


def test_setup_py_imports_only_what_the_build_installs(tmp_path: Path, run: Run) -> None:
    # aiohttp 3.14: `pip install` of the sdist runs setup.py where only [build-system]
    # requires is installed; a run-time typing_extensions is not there on 3.10 and 3.11.
    setup_py = (
        "from setuptools import setup\nfrom setuptools.command.build_ext import build_ext\n\n\n"
        "class ParallelBuildExt(build_ext):\n    def build_extensions(self) -> None:\n        pass\n\n\n"
        "setup(cmdclass={'build_ext': ParallelBuildExt})\n"
    )
    pyproject = '[build-system]\nrequires = ["setuptools"]\n[project]\nname = "p"\ndependencies = ["typing_extensions"]\n'
    _project(tmp_path, pyproject, {"setup.py": setup_py})
    code, out = run("--output-format", "json", "--select", "KVR001", ".")
    findings = {f["path"]: f for f in json.loads(out)["findings"]}
    assert code == EXIT_FINDINGS and set(findings) == {"setup.py", "pkg/child.py"} and findings["pkg/child.py"]["fixable"] is True
    assert findings["setup.py"]["fixable"] is False
    assert "only [build-system] requires is installed" in findings["setup.py"]["fix"]["description"]
    (tmp_path / "pyproject.toml").write_text(pyproject.replace('["setuptools"]', '["setuptools", "typing_extensions>=4.4"]'))
    code, out = run("--output-format", "json", "--select", "KVR001", ".")
    assert code == EXIT_FINDINGS and all(f["fixable"] is True for f in json.loads(out)["findings"])


def test_a_3_12_floor_without_typing_extensions_uses_typing_override(tmp_path: Path, run: Run) -> None:
    _project(tmp_path, '[project]\nname = "p"\nrequires-python = ">=3.12"\n')
    assert run("--fix")[0] == EXIT_CLEAN
    fixed = (tmp_path / "pkg/child.py").read_text()
    assert "    @typing.override\n    def run" in fixed  # the module's own `import typing`
    assert "typing_extensions" not in fixed


def test_target_version_overrides_requires_python(tmp_path: Path, run: Run) -> None:
    pyproject = (
        '[project]\nname = "p"\nrequires-python = ">=3.12"\ndependencies = ["typing_extensions"]\n'
        '[tool.kvref]\ntarget-version = "py311"\n'
    )
    _project(tmp_path, pyproject)
    assert run("--fix")[0] == EXIT_CLEAN
    fixed = (tmp_path / "pkg/child.py").read_text()
    assert "from typing_extensions import override\n" in fixed and "@override\n" in fixed


def test_json_and_sarif_fixes_carry_the_import_edit_and_match_fix(tmp_path: Path, run: Run) -> None:
    _project(tmp_path, '[project]\nname = "p"\ndependencies = ["typing_extensions"]\n')
    code, out = run("--output-format", "json")
    assert code == EXIT_FINDINGS
    (finding,) = json.loads(out)["findings"]
    edits: list[dict[str, Any]] = finding["fix"]["edits"]
    assert any("from typing_extensions import override" in edit["content"] for edit in edits)
    _, sarif_out = run("--output-format", "sarif")
    (result,) = json.loads(sarif_out)["runs"][0]["results"]
    replacements = result["fixes"][0]["artifactChanges"][0]["replacements"]
    assert [r["insertedContent"]["text"] for r in replacements] == [e["content"] for e in edits]
    # An editor applying the JSON edits alone gets what --fix writes.
    lines = (tmp_path / "pkg/child.py").read_text().splitlines(keepends=True)
    for edit in sorted(edits, key=lambda e: (e["line"], e["col"]), reverse=True):
        line, col, end_line, end_col = (int(edit[k]) for k in ("line", "col", "end_line", "end_col"))
        assert line == end_line  # insertions and one-line rewrites
        text = lines[line - 1]
        lines[line - 1] = text[: col - 1] + str(edit["content"]) + text[end_col - 1 :]
    by_editor = "".join(lines)
    assert run("--fix")[0] == EXIT_CLEAN
    assert (tmp_path / "pkg/child.py").read_text() == by_editor
    assert _ruff_clean(tmp_path / "pkg/child.py")


def test_kvref_itself_keeps_its_safe_fix(tmp_path: Path) -> None:
    repository = Path(__file__).resolve().parents[2]
    facts = load_project_facts(repository)
    assert facts.typing_extensions == "runtime" and "kvref" in facts.first_party


def test_api_defaults_keep_the_typing_extensions_fix(tmp_path: Path) -> None:
    path = _write(tmp_path, {"m.py": "class A:\n    def __repr__(self) -> str:\n        return ''\n"}) / "m.py"
    (finding,) = analyze([path], root=tmp_path, options=AnalysisOptions()).findings
    assert finding.fix is not None and finding.fix.applicability.value == "safe"
    fixed = apply_fixes(path.read_bytes(), [finding.fix]).decode()
    assert fixed.startswith("from typing_extensions import override\n\n\nclass A:")
    namespace: dict[str, object] = {}
    exec(fixed, namespace)
    repr_method = vars(namespace["A"])["__repr__"]
    assert getattr(repr_method, "__override__", False)


# --- generated programs ------------------------------------------------------------------------


@dataclass(frozen=True)
class Program:
    docstring: bool
    future: bool
    import_os: bool
    import_typing: bool
    from_abc: bool
    translation: str  # "", "override" or "override as translated"
    te_module: bool
    te_self: bool
    class_attribute: bool
    methods: int
    floor: tuple[int, int] | None
    te_declared: TypingExtensions
    test_module: bool  # named test_generated.py: a development file

    def render(self) -> str:
        """The module, isort-clean and F401-clean (`__all__` names every import)."""
        sections: list[list[str]] = []
        if self.future:
            sections.append(["from __future__ import annotations"])
        stdlib = [line for flag, line in ((self.import_os, "import os"), (self.import_typing, "import typing")) if flag]
        if self.from_abc:
            stdlib.append("from collections.abc import Sequence")
        third = ["import typing_extensions"] if self.te_module else []
        if self.translation:
            third.append(f"from translation import {self.translation}")
        if self.te_self:
            third.append("from typing_extensions import Self")
        sections += [section for section in (stdlib, third) if section]
        names = [
            name
            for flag, name in (
                (self.import_os, "os"),
                (self.import_typing, "typing"),
                (self.from_abc, "Sequence"),
                (self.te_module, "typing_extensions"),
                (bool(self.translation), self.translation.rpartition(" ")[2]),
                (self.te_self, "Self"),
            )
            if flag
        ]
        parts = ['"""Generated."""'] if self.docstring else []
        parts += ["\n".join(section) for section in sections]
        head = "\n\n".join(parts)
        body = f"__all__ = {sorted(names)!r}\n\n\n" if names else ""
        body += "class Base:\n" + "".join(f"    def m{i}(self) -> int:\n        return {i}\n\n" for i in range(self.methods))
        body += "\nclass Child(Base):\n"
        if self.class_attribute:
            body += "    override = 'a setting'\n\n"
        body += "\n".join(f"    def m{i}(self) -> int:\n        return -{i}\n" for i in range(self.methods))
        if not head:
            return body
        return head + ("\n\n" if names else "\n\n\n") + body


programs = st.builds(
    Program,
    docstring=st.booleans(),
    future=st.booleans(),
    import_os=st.booleans(),
    import_typing=st.booleans(),
    from_abc=st.booleans(),
    translation=st.sampled_from(["", "override", "override as translated"]),
    te_module=st.booleans(),
    te_self=st.booleans(),
    class_attribute=st.booleans(),
    methods=st.integers(1, 3),
    floor=st.sampled_from([None, (3, 11), (3, 12)]),
    te_declared=st.sampled_from(["runtime", "before-3.12", "development", "conditional", "undeclared"]),
    test_module=st.booleans(),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=programs)
def test_generated_programs_fix_to_correct_clean_idempotent_code(program: Program, tmp_path: Path) -> None:
    import typing_extensions

    source = program.render()
    directory = Path(tempfile.mkdtemp(dir=tmp_path))  # hypothesis may replay one program
    path = directory / ("test_generated.py" if program.test_module else "generated.py")
    path.write_text(source, encoding="utf-8")
    assert _ruff_clean(path), source
    options = AnalysisOptions(python_floor=program.floor, typing_extensions=program.te_declared)
    findings = [f for f in analyze([path], root=directory, options=options).findings if f.code == "KVR001"]
    assert len(findings) == program.methods and all(f.fix is not None for f in findings)
    modern = program.floor == (3, 12)
    imports_te_already = program.te_module or program.te_self
    installed = program.te_declared in ("runtime", "before-3.12") or (
        program.te_declared == "development" and program.test_module
    )
    unsafe = not modern and not installed and not imports_te_already
    assert {f.fix.applicability.value for f in findings if f.fix} == {"unsafe" if unsafe else "safe"}
    fixed = apply_fixes(path.read_bytes(), [f.fix for f in findings if f.fix is not None])
    compile(fixed, "generated.py", "exec")
    path.write_bytes(fixed)
    assert _ruff_clean(path), fixed.decode()
    # A second fix changes nothing.
    again = [f for f in analyze([path], root=directory, options=options).findings if f.fix is not None]
    assert again == [] and apply_fixes(fixed, []) == fixed
    text = fixed.decode()
    # Below 3.12 typing's override is imported only behind a version check.
    unchecked = re.sub(
        r"if sys\.version_info >= \(3, 12\):\n    from typing import (override( as \w+)?)\n"
        r"else:\n    from typing_extensions import \1\n",
        "",
        text,
    )
    if not modern:
        assert "typing.override" not in unchecked and "from typing import override" not in unchecked
    if "typing.override" in unchecked or "from typing import override" in unchecked:
        return  # needs Python 3.12 to run (test_a_py312_fix_imports_on_newer_pythons)
    namespace: dict[str, object] = {"__name__": "generated"}
    sys.path.insert(0, str(SUPPORT))
    try:
        exec(compile(text, "generated.py", "exec"), namespace)
    finally:
        sys.path.remove(str(SUPPORT))
    child = namespace["Child"]
    assert isinstance(child, type)
    for index in range(program.methods):
        assert getattr(vars(child)[f"m{index}"], "__override__", False) is True
    decorators = {line.strip()[1:] for line in text.splitlines() if line.strip().startswith("@")}
    for spelling in decorators:
        owner, _, attribute = spelling.rpartition(".")
        bound = getattr(namespace[owner], attribute) if owner else namespace[spelling]
        assert bound is typing_extensions.override
