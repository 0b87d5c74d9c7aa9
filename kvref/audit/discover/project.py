"""What the fixer must know about the project it edits: its Python floor and its dependencies.

A fix is correct code only for the project it is applied to: `typing.override` exists from
Python 3.12 on, and `typing_extensions` is importable only where the project depends on it.
Both facts are read once per run from the project root:

- the floor: `[tool.kvref] target-version` ("py312", ruff's spelling) when set, else the lowest
  version `[project] requires-python` allows (Poetry's `python` dependency likewise); unknown
  when neither says, which the fixer treats as "below 3.12";
- whether `typing_extensions` is declared: `[project] dependencies` and
  `optional-dependencies`, `[dependency-groups]`, Poetry's dependencies and groups, uv's
  dev-dependencies, `requirements*.txt` and `requirements/*.txt` at the root, and
  `setup.cfg`'s `install_requires` / `extras_require`. A project that declares nothing at all
  (a loose directory of scripts) has not declared it either: nothing says it is installed;
- how ruff's isort sorts the imports a fix adds: `[tool.ruff] line-length` and the project's
  first-party top-level names (ruff's `src` defaults, `.` and `src`, plus
  `known-first-party`).
"""

from __future__ import annotations

import configparser
import os
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from kvref.audit.discover.config import AuditConfig

__all__ = [
    "ProjectFacts",
    "with_project_facts",
    "load_project_facts",
    "parse_target_version",
    "requires_python_floor",
    "normalize_name",
]

_TARGET_VERSION = re.compile(r"py3(\d{1,2})")
_VERSION = re.compile(r"(\d+)(?:\.(\d+))?")
_SPECIFIER = re.compile(r"^\s*(~=|===|==|>=|<=|!=|>|<|\^|~)?\s*v?(\d+(?:\.\d+)*)(\.\*)?\s*$")
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")
_TYPING_EXTENSIONS = "typing-extensions"
_DEFAULT_LINE_LENGTH = 88


@dataclass(frozen=True, slots=True)
class ProjectFacts:
    """The project facts a fix depends on.

    Attributes:
        python_floor: the lowest (major, minor) the project supports; None when unknown.
        typing_extensions_declared: the project declares `typing_extensions` as a dependency.
        line_length: ruff's line length (88 unless `[tool.ruff] line-length` says otherwise).
        first_party: top-level module names ruff's isort files as first-party.
    """

    python_floor: tuple[int, int] | None = None
    typing_extensions_declared: bool = False
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

    names = {normalize_name(name) for name in _declared(root, document, project, poetry, tool)}
    line_length = ruff.get("line-length", _DEFAULT_LINE_LENGTH)
    isort = _table(_table(ruff.get("lint")).get("isort")) or _table(ruff.get("isort"))
    return ProjectFacts(
        python_floor=floor,
        typing_extensions_declared=_TYPING_EXTENSIONS in names,
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


def _requirement_names(lines: Iterable[str]) -> Iterator[str]:
    for line in lines:
        match = _REQUIREMENT_NAME.match(line)
        if match is not None and not line.lstrip().startswith(("-", "#")):
            yield match.group(1)


def _declared(
    root: Path,
    document: Mapping[str, object],
    project: Mapping[str, object],
    poetry: Mapping[str, object],
    tool: Mapping[str, object],
) -> Iterator[str]:
    """Every distribution name the project declares, in any group or extra."""
    yield from _requirement_names(_strings(project.get("dependencies")))
    for extra in _table(project.get("optional-dependencies")).values():
        yield from _requirement_names(_strings(extra))
    for group in _table(document.get("dependency-groups")).values():
        yield from _requirement_names(_strings(group))  # `{include-group = ...}` tables skip
    yield from _requirement_names(_strings(_table(tool.get("uv")).get("dev-dependencies")))
    yield from _table(poetry.get("dependencies"))
    yield from _table(poetry.get("dev-dependencies"))
    for group in _table(poetry.get("group")).values():
        yield from _table(_table(group).get("dependencies"))
    for path in _requirement_files(root):
        try:
            yield from _requirement_names(path.read_text(encoding="utf-8", errors="replace").splitlines())
        except OSError:
            continue
    yield from _setup_cfg_requirements(root / "setup.cfg")


def _requirement_files(root: Path) -> Iterator[Path]:
    try:
        yield from sorted(root.glob("requirements*.txt"))
        yield from sorted((root / "requirements").glob("*.txt"))
    except OSError:
        return


def _setup_cfg_requirements(path: Path) -> Iterator[str]:
    if not path.is_file():
        return
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error, UnicodeDecodeError):
        return
    if parser.has_option("options", "install_requires"):
        yield from _requirement_names(parser.get("options", "install_requires").splitlines())
    if parser.has_section("options.extras_require"):
        for _, value in parser.items("options.extras_require"):
            yield from _requirement_names(value.splitlines())


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


def with_project_facts(config: AuditConfig) -> AuditConfig:
    """`config` with the project's facts in its analysis options (read once per run).

    Raises:
        ConfigError: `override-import = "typing"` where the floor is not known to be 3.12+.
    """
    from kvref.audit.discover.config import ConfigError

    facts = load_project_facts(config.root, target_version=config.target_version)
    options = config.options
    floor = facts.python_floor
    if options.override_import == "typing" and (floor is None or floor < (3, 12)):
        where = f"{config.source} [tool.kvref]" if config.source else "[tool.kvref]"
        said = "unknown" if floor is None else f"{floor[0]}.{floor[1]}"
        raise ConfigError(
            f"{where}: override-import = 'typing' needs Python 3.12+, but the project's floor is "
            f"{said}: set target-version = 'py312' (or requires-python = '>=3.12')"
        )
    return replace(
        config,
        options=replace(
            options,
            python_floor=floor,
            typing_extensions_declared=facts.typing_extensions_declared,
            import_line_length=facts.line_length,
            first_party=facts.first_party,
        ),
    )
