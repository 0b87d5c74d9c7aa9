"""What the fixer must know about the project it edits: its Python floor and its dependencies.

A fix is correct code only for the project it is applied to: `typing.override` exists from
Python 3.12 on, and `typing_extensions` is importable only where the project depends on it.
Both facts are read once per run from the project root:

- the floor: `[tool.kvref] target-version` ("py312", ruff's spelling) when set, else the lowest
  version `[project] requires-python` allows (Poetry's `python` dependency likewise); unknown
  when neither says, which the fixer treats as "below 3.12";
- where `typing_extensions` is installed (`TypingExtensions`): wherever the project runs when
  a run-time dependency names it without an environment marker (`[project] dependencies`,
  Poetry's `dependencies`, `install_requires` in `setup.cfg` or as a literal in `setup.py`, a
  `requirements*.txt` or `requirements/*.txt` at the root whose name does not say dev, test,
  docs... and, in a package, that its packaging reads); only where its tests and tools run
  when only a group, an extra or a development requirements file names it (a user who
  installs the package does not get those); under some markers only (`; python_version <
  "3.13"`: missing on 3.13, unless other markers cover it). A project that declares nothing
  at all (a loose directory of scripts) has not declared it either: nothing says it is
  installed;
- how ruff's isort sorts the imports a fix adds: `[tool.ruff] line-length` and the project's
  first-party top-level names (ruff's `src` defaults, `.` and `src`, plus
  `known-first-party`).
"""

from __future__ import annotations

import ast
import configparser
import operator
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from kvref.audit.model import TypingExtensions

__all__ = [
    "ProjectFacts",
    "is_build_file",
    "is_development_file",
    "python_minors",
    "load_project_facts",
    "parse_target_version",
    "requires_python_floor",
    "normalize_name",
]

_TARGET_VERSION = re.compile(r"py3(\d{1,2})")
_VERSION = re.compile(r"(\d+)(?:\.(\d+))?")
_SPECIFIER = re.compile(r"^\s*(~=|===|==|>=|<=|!=|>|<|\^|~)?\s*v?(\d+(?:\.\d+)*)(\.\*)?\s*$")
_MARKER_CLAUSE = re.compile(r"""(python_version|python_full_version)\s*(<=|>=|==|!=|<|>)\s*['"](\d+(?:\.\d+){1,2})['"]""")
_OPERATORS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne
}
_LAST_MINOR = 40  # Python 3.40: far enough that `python_version < "3.N"` never covers the future
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")
_WORDS = re.compile(r"[A-Za-z]+")
_TYPING_EXTENSIONS = "typing-extensions"
_DEFAULT_LINE_LENGTH = 88


# Requirements files with one of these words in their name install what tests and tools need.
_DEVELOPMENT_WORDS = frozenset(
    {"dev", "develop", "development", "test", "tests", "testing", "doc", "docs", "lint", "typing",
     "mypy", "ci", "bench", "benchmark", "benchmarks", "check", "style"}
)
# Files in these top-level directories, in a `tests`/`test` directory anywhere, or named like a
# test module are run by the project's developers only, never by a user of the package.
_DEVELOPMENT_TOPS = frozenset(
    {"tests", "test", "testing", "docs", "doc", "examples", "example", "benchmarks", "benchmark",
     "bench", "scripts", "tools", "ci"}
)
_DEVELOPMENT_FILES = frozenset({"conftest.py", "noxfile.py", "tasks.py", "fabfile.py"})
# Run by the build backend, where only `[build-system] requires` is installed.
_BUILD_FILES = frozenset({"setup.py", "hatch_build.py"})
_SCOPE_RANK: dict[TypingExtensions, int] = {
    "undeclared": 0, "conditional": 1, "development": 2, "before-3.12": 3, "runtime": 4
}


@dataclass(frozen=True, slots=True)
class ProjectFacts:
    """The project facts a fix depends on.

    Attributes:
        python_floor: the lowest (major, minor) the project supports; None when unknown.
        typing_extensions: where the project's declarations install `typing_extensions`.
        build_typing_extensions: `[build-system] requires` names it without a marker (the
            build backend runs `setup.py` where only those are installed).
        line_length: ruff's line length (88 unless `[tool.ruff] line-length` says otherwise).
        first_party: top-level module names ruff's isort files as first-party.
    """

    python_floor: tuple[int, int] | None = None
    typing_extensions: TypingExtensions = "undeclared"
    build_typing_extensions: bool = False
    line_length: int = _DEFAULT_LINE_LENGTH
    first_party: frozenset[str] = frozenset()


def parse_target_version(value: object, *, where: str) -> tuple[int, int]:
    """`"py312"` -> (3, 12).

    Raises:
        ValueError: not a string of ruff's form `py3NN` (the message names `where`).
    """
    match = _TARGET_VERSION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"{where}: target-version must be a string like 'py311' or 'py312', not {value!r}"
        )
    return 3, int(match.group(1))


def requires_python_floor(specifiers: str) -> tuple[int, int] | None:
    """The lowest (major, minor) a `requires-python` string admits; None when it sets none.

    `>=3.11` and `~=3.11` -> (3, 11); `>3.11` -> (3, 11) (3.11.1 is greater than 3.11);
    `==3.12.*` -> (3, 12); Poetry's `^3.10` -> (3, 10); `<4` alone -> None.
    """
    floor: tuple[int, int] | None = None
    for part in specifiers.replace("||", ",").replace("|", ",").split(","):
        match = _SPECIFIER.match(part)
        if match is None:
            continue
        operator = match.group(1) or "=="
        if operator in ("<", "<=", "!="):
            continue
        numbers = [int(n) for n in match.group(2).split(".")]
        bound = (numbers[0], numbers[1] if len(numbers) > 1 else 0)
        floor = bound if floor is None else max(floor, bound)
    return floor


def is_development_file(relative: str) -> bool:
    """Whether a project file (`/`-separated, relative to the root) runs only where the
    project's developers run it: tests, docs, examples, benchmarks, scripts, task files."""
    *directories, name = relative.split("/")
    return (
        bool(directories) and directories[0] in _DEVELOPMENT_TOPS
        or "tests" in directories
        or "test" in directories
        or name in _DEVELOPMENT_FILES and not directories
        or name == "conftest.py"
        or name.startswith("test_")
        or name.endswith("_test.py")
    )


def is_build_file(relative: str) -> bool:
    """Whether a project file runs in the build environment (`setup.py`, `hatch_build.py`)."""
    return relative in _BUILD_FILES


def normalize_name(name: str) -> str:
    """A distribution name as PEP 503 compares them: `Typing_Extensions` -> `typing-extensions`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def load_project_facts(root: Path, *, target_version: tuple[int, int] | None = None) -> ProjectFacts:
    """Read the facts from the project root (`pyproject.toml`, requirements files, setup.cfg).

    Args:
        root: the project root (the directory of its `pyproject.toml`, if any).
        target_version: `[tool.kvref] target-version`, which overrides `requires-python`.

    Returns:
        The facts; an unreadable or invalid file counts as saying nothing.
    """
    document = _read_toml(root / "pyproject.toml")
    project = _table(document.get("project"))
    tool = _table(document.get("tool"))
    poetry = _table(tool.get("poetry"))
    ruff = _table(tool.get("ruff"))

    floor = target_version
    if floor is None:
        requires = project.get("requires-python")
        poetry_python = _table(poetry.get("dependencies")).get("python")
        for text in (requires, poetry_python):
            if isinstance(text, str) and (found := requires_python_floor(text)) is not None:
                floor = found
                break

    typing_extensions: TypingExtensions = "undeclared"
    # Run-time declarations under markers install it on these Python 3 minor versions: mypy's
    # `python_version<'3.15'` and `python_version>='3.15'` together cover every one.
    # Covering every minor version below 3.12 is enough for a version-checked import
    # (`typing.override` from 3.12 on): Starlette's `python_version < '3.13'`.
    needed = frozenset(range(floor[1] if floor is not None and floor[0] == 3 else 0, _LAST_MINOR + 1))
    below_3_12 = frozenset(minor for minor in needed if minor < 12)
    covered: set[int] = set()
    for name, scope, minors in _declared(root, document, project, poetry, tool):
        if normalize_name(name) != _TYPING_EXTENSIONS:
            continue
        if scope == "runtime" and minors is not None:
            covered |= minors
            scope = "runtime" if covered >= needed else "before-3.12" if covered >= below_3_12 else "conditional"
        if _SCOPE_RANK[scope] > _SCOPE_RANK[typing_extensions]:
            typing_extensions = scope
    line_length = ruff.get("line-length", _DEFAULT_LINE_LENGTH)
    isort = _table(_table(ruff.get("lint")).get("isort")) or _table(ruff.get("isort"))
    build_requires = _table(document.get("build-system")).get("requires")
    return ProjectFacts(
        python_floor=floor,
        typing_extensions=typing_extensions,
        build_typing_extensions=any(
            normalize_name(name) == _TYPING_EXTENSIONS and minors is None
            for name, _, minors in _requirements(_strings(build_requires), "runtime")
        ),
        line_length=line_length if isinstance(line_length, int) and line_length > 0 else _DEFAULT_LINE_LENGTH,
        first_party=frozenset(_first_party(root, ruff, isort)),
    )


def _read_toml(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _table(value: object) -> Mapping[str, object]:
    return cast(dict[str, object], value) if isinstance(value, dict) else {}


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, list):
        yield from (item for item in cast(list[object], value) if isinstance(item, str))


Declaration = tuple[str, TypingExtensions, frozenset[int] | None]
"""(distribution name, where it is installed, the Python 3 minor versions a run-time
declaration's marker admits: None without a marker, empty when kvref cannot tell)."""


def _requirements(lines: Iterable[str], scope: TypingExtensions) -> Iterator[Declaration]:
    """The names PEP 508 requirement lines declare, with their markers' Python versions."""
    for line in lines:
        match = _REQUIREMENT_NAME.match(line)
        if match is not None and not line.lstrip().startswith(("-", "#")):
            _, marked, marker = line.partition(" #")[0].partition(";")
            yield match.group(1), scope, python_minors(marker) if marked else None


def python_minors(marker: str) -> frozenset[int]:
    """The Python 3 minor versions a PEP 508 marker admits, when it only compares
    `python_version` / `python_full_version` (joined by `and` / `or`, no parentheses);
    empty for any other marker. `python_full_version` must hold for a whole minor version."""
    admitted: set[int] = set()
    for alternative in re.split(r"\s+or\s+", marker.strip()):
        clauses = [_MARKER_CLAUSE.fullmatch(clause.strip()) for clause in re.split(r"\s+and\s+", alternative)]
        if not all(clauses):
            return frozenset()
        for minor in range(_LAST_MINOR + 1):
            if all(_admits(clause, minor) for clause in clauses if clause is not None):
                admitted.add(minor)
    return frozenset(admitted)


def _admits(clause: re.Match[str], minor: int) -> bool:
    variable, comparison, quoted = clause.groups()
    bound = tuple(int(part) for part in quoted.split("."))
    low, high = ((3, minor), (3, minor)) if variable == "python_version" else ((3, minor, 0), (3, minor, 999))
    compare = _OPERATORS[comparison]
    return compare(low, bound) and compare(high, bound)


def _poetry(table: Mapping[str, object], scope: TypingExtensions) -> Iterator[Declaration]:
    """Poetry's `name = "^1.0"`, `name = {version = ..., optional = true, python = ...}` or a
    list of such tables (one per environment)."""
    for name, value in table.items():
        spec = _table(value)
        if scope == "runtime" and spec.get("optional") is True:
            yield name, "development", None  # an extra's
        elif scope == "runtime" and ("python" in spec or "markers" in spec or isinstance(value, list)):
            yield name, scope, frozenset()  # Poetry's constraint syntax: not read
        else:
            yield name, scope, None


def _declared(
    root: Path,
    document: Mapping[str, object],
    project: Mapping[str, object],
    poetry: Mapping[str, object],
    tool: Mapping[str, object],
) -> Iterator[Declaration]:
    """Every distribution name the project declares, in any group or extra, with where it is
    installed: at run time (perhaps under a marker) or for development only."""
    yield from _requirements(_strings(project.get("dependencies")), "runtime")
    for extra in _table(project.get("optional-dependencies")).values():
        yield from _requirements(_strings(extra), "development")
    for group in _table(document.get("dependency-groups")).values():
        yield from _requirements(_strings(group), "development")  # `{include-group = ...}` tables skip
    yield from _requirements(_strings(_table(tool.get("uv")).get("dev-dependencies")), "development")
    yield from _poetry(_table(poetry.get("dependencies")), "runtime")
    yield from _poetry(_table(poetry.get("dev-dependencies")), "development")
    for group_name, group in _table(poetry.get("group")).items():
        yield from _poetry(_table(_table(group).get("dependencies")), "runtime" if group_name == "main" else "development")
    requirement_files = list(_requirement_files(root))
    package_files = _package_requirement_files(root, requirement_files, project, poetry, tool)
    for path in requirement_files:
        relative = path.relative_to(root).as_posix()
        words = {word.lower() for word in _WORDS.findall(relative[: -len(".txt")])}
        development = words & _DEVELOPMENT_WORDS or (package_files is not None and relative not in package_files)
        scope: TypingExtensions = "development" if development else "runtime"
        try:
            yield from _requirements(path.read_text(encoding="utf-8", errors="replace").splitlines(), scope)
        except OSError:
            continue
    yield from _setup_cfg_requirements(root / "setup.cfg")
    yield from _setup_py_requirements(root / "setup.py")


def _package_requirement_files(
    root: Path,
    requirement_files: Iterable[Path],
    project: Mapping[str, object],
    poetry: Mapping[str, object],
    tool: Mapping[str, object],
) -> frozenset[str] | None:
    """None when the project is no package (its requirements files are what it runs with);
    else the requirements files its packaging reads as run-time dependencies (setuptools'
    dynamic `dependencies`, a file name that `setup.py` mentions). A package's other
    requirements files pin its developers' tools (tornado's `requirements.txt`): `pip install`
    of the package does not read them."""
    try:
        setup_py = (root / "setup.py").read_text(encoding="utf-8", errors="replace")
    except OSError:
        setup_py = None
    try:
        setup_cfg = (root / "setup.cfg").read_text(encoding="utf-8", errors="replace")
    except OSError:
        setup_cfg = ""
    if not project and not poetry and setup_py is None and "[metadata]" not in setup_cfg:
        return None
    dynamic = _table(_table(_table(tool.get("setuptools")).get("dynamic")).get("dependencies")).get("file")
    named = {dynamic} if isinstance(dynamic, str) else set(_strings(dynamic))
    files = {path.relative_to(root).as_posix() for path in requirement_files}
    return frozenset(
        name for name in files if name in named or (setup_py is not None and name.rpartition("/")[2] in setup_py)
    )


def _requirement_files(root: Path) -> Iterator[Path]:
    try:
        yield from sorted(root.glob("requirements*.txt"))
        yield from sorted((root / "requirements").glob("*.txt"))
    except OSError:
        return


def _setup_py_requirements(path: Path) -> Iterator[Declaration]:
    """`install_requires=[...]` and `extras_require={...}` of `setup(...)` calls, where literal."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError, RecursionError):
        return
    calls = (node for node in ast.walk(tree) if isinstance(node, ast.Call))
    for call in calls:
        function = call.func
        name = function.id if isinstance(function, ast.Name) else function.attr if isinstance(function, ast.Attribute) else ""
        if name != "setup":
            continue
        for keyword in call.keywords:
            if keyword.arg == "install_requires":
                yield from _requirements(_literal_strings(keyword.value), "runtime")
            elif keyword.arg == "extras_require" and isinstance(keyword.value, ast.Dict):
                for extra in keyword.value.values:
                    yield from _requirements(_literal_strings(extra), "development")


def _literal_strings(node: ast.expr) -> list[str]:
    elements = node.elts if isinstance(node, ast.List | ast.Tuple) else []
    return [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _setup_cfg_requirements(path: Path) -> Iterator[Declaration]:
    if not path.is_file():
        return
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error, UnicodeDecodeError):
        return
    if parser.has_option("options", "install_requires"):
        yield from _requirements(parser.get("options", "install_requires").splitlines(), "runtime")
    if parser.has_section("options.extras_require"):
        for _, value in parser.items("options.extras_require"):
            yield from _requirements(value.splitlines(), "development")


def _first_party(root: Path, ruff: Mapping[str, object], isort: Mapping[str, object]) -> set[str]:
    """Top-level names under ruff's `src` directories, plus `known-first-party`."""
    names = set(_strings(isort.get("known-first-party")))
    sources = list(_strings(ruff.get("src"))) or [".", "src"]
    for source in sources:
        directory = root / source
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if name.endswith((".py", ".pyi")):
                names.add(name.rpartition(".")[0])
            elif name.isidentifier():
                try:
                    if entry.is_dir():
                        names.add(name)
                except OSError:  # a symlink loop, a vanished entry: not a package
                    continue
    return names
