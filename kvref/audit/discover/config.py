"""The `[tool.kvref]` table of `pyproject.toml`, and rule selection.

The project root is the directory of the nearest `pyproject.toml` above the given paths (or
the current directory); without one it is the paths' common parent. Every key is optional:

    [tool.kvref]
    select = ["KVR0", "KVR1"]          # codes, prefixes, or "ALL"; replaces the default set
    extend-select = ["KVR103"]         # added to the selection
    ignore = ["KVR102"]                # removed from it
    exclude = [...]                    # globs never indexed; replaces the built-in list
    extend-exclude = ["tests/fixtures"]  # globs added to the built-in list
    per-file-ignores = {"tests/**" = ["KVR001"]}
    respect-gitignore = true
    force-exclude = false              # apply excludes to files named on the command line too
    override-import = "typing_extensions"   # or "typing" (needs a 3.12+ floor)
    target-version = "py312"           # the Python floor fixes write for (else requires-python)
    baseline = ".kvref-baseline.json"  # relative to the directory of pyproject.toml
    object-dunders = true              # require @override on __repr__, __eq__, ...
    abstract-implementations = true    # ... on implementations of abstract methods
    protocol-members = true            # ... on members of Protocol subclasses
    exempt-names = ["__init__", "__new__", "__init_subclass__", "__post_init__"]
    max-file-size = "16 MiB"           # larger files are reported as skipped, not parsed

Selection follows ruff: within one layer (the config file, then the command line) selectors
apply from least to most specific, so `select = ["ALL"], ignore = ["KVR1"], extend-select =
["KVR102"]` keeps KVR102; a `select` on the command line replaces the configured selection,
an `ignore` there removes from it. Rules that are off by default (KVR103) are only turned on by
their exact code or `ALL`, never by a shorter prefix.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

from kvref.audit.catalogue import RuleInfo
from kvref.audit.discover.files import DEFAULT_EXCLUDES
from kvref.audit.model import DEFAULT_EXEMPT_NAMES, AnalysisOptions
from kvref.audit.discover.project import load_project_facts, parse_target_version
from kvref.errors import KVRefError

__all__ = [
    "ConfigError",
    "AuditConfig",
    "SelectionLayer",
    "CONFIG_KEYS",
    "find_project_root",
    "load_config",
    "parse_config_table",
    "validate_selector",
    "resolve_selection",
    "codes_matching",
    "configure",
    "with_project_facts",
]

CONFIG_KEYS: tuple[str, ...] = (
    "select",
    "extend-select",
    "ignore",
    "exclude",
    "extend-exclude",
    "per-file-ignores",
    "respect-gitignore",
    "force-exclude",
    "override-import",
    "target-version",
    "baseline",
    "object-dunders",
    "abstract-implementations",
    "protocol-members",
    "exempt-names",
    "max-file-size",
)


class ConfigError(KVRefError, ValueError):
    """The configuration (file or command line) names an unknown key or an invalid value."""


@dataclass(frozen=True, slots=True)
class SelectionLayer:
    """Rule selectors from one source; `select=None` keeps the selection of the layer below."""

    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AuditConfig:
    """The resolved `[tool.kvref]` settings of one project.

    Attributes:
        root: the project root; reported paths are relative to it.
        source: the file the settings came from, or None when there is none.
        selection: the config file's selectors (the command line adds a layer on top).
        excludes: globs never indexed (built-in defaults plus `extend-exclude`, or `exclude`).
        per_file_ignores: (glob, selectors) pairs.
        respect_gitignore: skip files that git ignores.
        force_exclude: apply `excludes` to explicitly named files too.
        baseline: the configured baseline file (absolute), if any.
        options: the analysis policy switches and `override-import` (the project facts a
            fix depends on are added by `with_project_facts`).
        target_version: `target-version` as (3, minor), None when not set.
    """

    root: Path
    source: Path | None = None
    selection: SelectionLayer = field(default_factory=SelectionLayer)
    excludes: tuple[str, ...] = DEFAULT_EXCLUDES
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    respect_gitignore: bool = True
    force_exclude: bool = False
    baseline: Path | None = None
    options: AnalysisOptions = field(default_factory=AnalysisOptions)
    target_version: tuple[int, int] | None = None


def find_project_root(paths: Sequence[Path], cwd: Path) -> tuple[Path, Path | None]:
    """The project root and its `pyproject.toml` (None when there is none above).

    The search starts at the common parent of `paths` (directories themselves, files' parents),
    or at `cwd` when no paths are given, and goes upward.
    """
    absolute = [Path(os.path.abspath(cwd / path)) for path in paths]
    starts = [path if path.is_dir() else path.parent for path in absolute]
    start = Path(os.path.commonpath(starts)) if starts else Path(os.path.abspath(cwd))
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return directory, candidate
    return start, None


def load_config(
    pyproject: Path | None, root: Path, *, relative_to: Path | None = None
) -> AuditConfig:
    """Read `[tool.kvref]` from `pyproject` (a `pyproject.toml`, or any TOML file whose
    top-level table holds the keys, such as `kvref.toml`).

    Args:
        pyproject: the file, or None for the defaults.
        root: the project root the settings apply to.
        relative_to: the directory that paths inside the file are relative to (default
            `root`; `--config` passes the file's own directory).

    Raises:
        ConfigError: the file cannot be read or parsed, or the table is invalid.
    """
    if pyproject is None:
        return AuditConfig(root=root)
    try:
        with pyproject.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"{pyproject}: cannot read: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{pyproject}: invalid TOML: {exc}") from exc
    if pyproject.name == "pyproject.toml" or "tool" in document:
        tool: object = document.get("tool", {})
        table: object = cast(dict[str, object], tool).get("kvref", {}) if isinstance(tool, dict) else {}
        where = f"{pyproject} [tool.kvref]"
    else:
        table = document
        where = str(pyproject)
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    config = parse_config_table(
        cast(dict[str, object], table), root=root, where=where, relative_to=relative_to
    )
    return replace(config, source=pyproject)


def _string_list(where: str, key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ConfigError(f'{where}: {key} must be a list of strings, e.g. ["{value}"]')
    if not isinstance(value, list) or not all(
        isinstance(item, str) for item in cast(list[object], value)
    ):
        raise ConfigError(f"{where}: {key} must be a list of strings")
    return tuple(cast(list[str], value))


_SIZE_UNITS: dict[str, int] = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}


def _byte_size(where: str, key: str, value: object) -> int:
    """A positive size: a number of bytes, or a string such as "32 MiB" or "512KiB"."""
    number: float | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        text = value.strip().upper()
        digits = text.rstrip("KMGIB ").strip()
        unit = text[len(digits) :].strip()
        try:
            number = float(digits) * _SIZE_UNITS[unit] if digits else None
        except (ValueError, KeyError):
            number = None
    if number is None or number < 1:
        raise ConfigError(
            f'{where}: {key} must be a positive number of bytes or a size such as "32 MiB", '
            f"not {value!r}"
        )
    return int(number)


def _bool(where: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false, not {value!r}")
    return value


def parse_config_table(
    table: Mapping[str, object],
    *,
    root: Path,
    where: str = "[tool.kvref]",
    relative_to: Path | None = None,
) -> AuditConfig:
    """Validate a `[tool.kvref]` table (selectors are validated later, against the rules).

    Raises:
        ConfigError: an unknown key, or a value of the wrong type or outside its choices.
    """
    unknown = sorted(set(table) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(CONFIG_KEYS)})"
        )
    select = (
        tuple(s.strip().upper() for s in _string_list(where, "select", table["select"]))
        if "select" in table
        else None
    )
    extend_select = tuple(
        s.strip().upper() for s in _string_list(where, "extend-select", table.get("extend-select", []))
    )
    ignore = tuple(s.strip().upper() for s in _string_list(where, "ignore", table.get("ignore", [])))
    excludes = (
        _string_list(where, "exclude", table["exclude"]) if "exclude" in table else DEFAULT_EXCLUDES
    )
    excludes += _string_list(where, "extend-exclude", table.get("extend-exclude", []))

    raw_pfi = table.get("per-file-ignores", {})
    if not isinstance(raw_pfi, dict):
        raise ConfigError(f'{where}: per-file-ignores must be a table of glob = ["CODE", ...]')
    per_file_ignores = tuple(
        (glob, tuple(s.strip().upper() for s in _string_list(where, f"per-file-ignores.{glob!r}", codes)))
        for glob, codes in cast(dict[str, object], raw_pfi).items()
    )

    override_import = table.get("override-import", "typing_extensions")
    if override_import not in ("typing_extensions", "typing"):
        raise ConfigError(
            f"{where}: override-import must be one of 'typing_extensions', 'typing', "
            f"not {override_import!r}"
        )
    target_version: tuple[int, int] | None = None
    if "target-version" in table:
        try:
            target_version = parse_target_version(table["target-version"], where=where)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    baseline_value = table.get("baseline")
    if baseline_value is not None and (not isinstance(baseline_value, str) or not baseline_value):
        raise ConfigError(f"{where}: baseline must be a path string, not {baseline_value!r}")
    defaults = AnalysisOptions()
    exempt = (
        frozenset(_string_list(where, "exempt-names", table["exempt-names"]))
        if "exempt-names" in table
        else DEFAULT_EXEMPT_NAMES
    )
    options = AnalysisOptions(
        object_dunders=_bool(where, "object-dunders", table.get("object-dunders", defaults.object_dunders)),
        abstract_implementations=_bool(
            where,
            "abstract-implementations",
            table.get("abstract-implementations", defaults.abstract_implementations),
        ),
        protocol_members=_bool(
            where, "protocol-members", table.get("protocol-members", defaults.protocol_members)
        ),
        exempt_names=exempt,
        override_import=override_import,
        max_file_bytes=_byte_size(where, "max-file-size", table.get("max-file-size", defaults.max_file_bytes)),
    )
    return AuditConfig(
        root=root,
        source=None,
        selection=SelectionLayer(select=select, extend_select=extend_select, ignore=ignore),
        excludes=excludes,
        per_file_ignores=per_file_ignores,
        respect_gitignore=_bool(where, "respect-gitignore", table.get("respect-gitignore", True)),
        force_exclude=_bool(where, "force-exclude", table.get("force-exclude", False)),
        baseline=((relative_to or root) / baseline_value) if isinstance(baseline_value, str) else None,
        options=options,
        target_version=target_version,
    )


def codes_matching(selector: str, rules: Sequence[RuleInfo], *, enabling: bool) -> set[str]:
    """The codes a selector names; when enabling, off-by-default rules need their exact code."""
    selector = selector.strip().upper()
    matched: set[str] = set()
    for rule in rules:
        exact = selector in ("ALL", rule.code)
        if not (exact or rule.code.startswith(selector)):
            continue
        if enabling and not rule.default_enabled and not exact:
            continue
        matched.add(rule.code)
    return matched


def validate_selector(selector: str, rules: Sequence[RuleInfo], *, where: str) -> str:
    """The normalised selector, or ConfigError naming `where` and the allowed values."""
    normalised = selector.strip().upper()
    if normalised == "ALL" or any(rule.code.startswith(normalised) for rule in rules if normalised):
        return normalised
    codes = ", ".join(rule.code for rule in rules)
    raise ConfigError(
        f"{where}: unknown rule selector {selector!r} "
        f"(allowed: ALL, a rule code ({codes}), or a prefix of one such as KVR0)"
    )


def _specificity(selector: str) -> int:
    return 0 if selector == "ALL" else len(selector)


def resolve_selection(
    rules: Sequence[RuleInfo], layers: Sequence[tuple[SelectionLayer, str]]
) -> frozenset[str]:
    """The enabled codes after applying each (layer, where) in order over the defaults.

    Raises:
        ConfigError: a selector matches no rule (naming `where`).
    """
    enabled = {rule.code for rule in rules if rule.default_enabled}
    for layer, where in layers:
        entries: list[tuple[str, bool]] = []
        for selector in (*(layer.select or ()), *layer.extend_select):
            entries.append((validate_selector(selector, rules, where=where), True))
        for selector in layer.ignore:
            entries.append((validate_selector(selector, rules, where=where), False))
        if layer.select is not None:
            enabled = set[str]()
        # Least specific first so "ignore KVR1, select KVR102" keeps KVR102; at equal
        # specificity the ignore (sorted last) wins.
        for selector, enable in sorted(entries, key=lambda entry: (_specificity(entry[0]), not entry[1])):
            codes = codes_matching(selector, rules, enabling=enable)
            if enable:
                enabled |= codes
            else:
                enabled -= codes
    return frozenset(enabled)


def with_project_facts(config: AuditConfig) -> AuditConfig:
    """`config` with the project's facts in its analysis options (read once per run).

    Raises:
        ConfigError: `override-import = "typing"` where the floor is not known to be 3.12+.
    """
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
            typing_extensions=facts.typing_extensions,
            build_typing_extensions=facts.build_typing_extensions,
            import_line_length=facts.line_length,
            first_party=facts.first_party,
        ),
    )


def configure(
    cwd: Path,
    paths: Sequence[Path],
    config_file: Path | None,
    rules: Sequence[RuleInfo],
    command_line: SelectionLayer,
) -> tuple[AuditConfig, frozenset[str]]:
    """The run's settings and enabled codes: `[tool.kvref]` (or `config_file`), then the
    command line's selection on top.

    Like ruff, a `config_file` applies to the tree being audited wherever it lives (the
    project root is still found from the paths); only the paths written inside it
    (`baseline`) are relative to its own directory.

    Raises:
        ConfigError: the file is missing or invalid, or a selector is unknown.
    """
    root, pyproject = find_project_root([cwd / path for path in paths], cwd)
    if config_file is not None:
        named = Path(os.path.abspath(cwd / config_file))
        if not named.is_file():
            raise ConfigError(f"--config {config_file}: no such file")
        config = load_config(named, root, relative_to=named.parent)
    else:
        config = load_config(pyproject, root)
    config = with_project_facts(config)
    where = f"{config.source} [tool.kvref]" if config.source else "[tool.kvref]"
    for glob, selectors in config.per_file_ignores:
        for selector in selectors:
            validate_selector(selector, rules, where=f"{where} per-file-ignores {glob!r}")
    selected = resolve_selection(
        rules,
        [(config.selection, where), (command_line, "--select/--ignore/--extend-select/--extend-ignore")],
    )
    return config, selected
