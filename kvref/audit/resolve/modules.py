"""Modules by dotted name: what a file is importable as, and where the index finds a module."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from kvref.audit.resolve.reachability import Reachability
from kvref.audit.resolve.stdlib import STDLIB_NAMES, candidate_files, loaded_extension, stdlib_roots
from kvref.audit.source import read_source, summary_or_error
from kvref.audit.summarise.records import Binding, ClassSummary, ModuleSummary
from kvref.audit.summarise.summary import summarize

__all__ = ["FILE_CACHE", "ModuleTable", "module_names_for", "namespace_names"]

_DOTTED_NAME = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*")
# Process-wide cache of parsed standard-library and search-path files (they do not change).
FILE_CACHE: dict[str, ModuleSummary | None] = {}


def module_names_for(
    path: str, roots: Sequence[str], is_package: Callable[[str], bool]
) -> tuple[str, ...]:
    """The dotted names a file is importable as, the primary (used for relative imports) first.

    As the import system names it: the dotted path from an import root, where every
    directory below the root is a package, regular (with `__init__.py`) or namespace (PEP 420,
    without). `roots` are tried in order (a src layout's `src/` before the project root); a
    root that is itself a regular package is no import root (its parent is), so its files are
    named by following the `__init__.py` chain up, beyond the root. A module of a regular
    package is also importable by the name that chain gives alone (its top directory on
    `sys.path`, as pytest's rootdir-relative imports and installed plugins do), an alias.

    Args:
        path: the file (absolute, normalized; plain strings, since the engine names every
            file of a big project and `pathlib` arithmetic was most of that cost).
        roots: the import roots (absolute, normalized), preferred first.
        is_package: whether a directory holds an `__init__.py`/`.pyi`.
    """
    directory, filename = os.path.split(path)
    stem = filename.rsplit(".", 1)[0]
    own = "" if stem == "__init__" else stem
    chain: list[str] = [own] if own else []
    current = directory
    while True:
        parent, name = os.path.split(current)
        if parent == current or not is_package(current):
            break
        chain.insert(0, name)
        current = parent
    names: list[str] = []
    for root in roots:
        if directory == root:
            dotted = own
        elif directory.startswith(root) and directory[len(root)] == os.sep:
            relative = directory[len(root) + 1 :].replace(os.sep, ".")
            dotted = f"{relative}.{own}" if own else relative
        else:
            continue
        if dotted and not is_package(root):
            names.append(dotted)
    # Not when it would shadow the standard library (`examples/x/json/` is not `json`).
    if chain and (not names or is_package(directory) and chain[0] not in STDLIB_NAMES):
        names.append(".".join(chain))
    if not names:
        last_directory = os.path.basename(directory)
        names.append(".".join([last_directory, stem] if last_directory else [stem]))
    # A name that cannot be written in an import statement is kept only as the last resort.
    importable = [name for name in names if _DOTTED_NAME.fullmatch(name)]
    return tuple(dict.fromkeys(importable or names))


def namespace_names(modules: Iterable[str]) -> frozenset[str]:
    """Every proper prefix of the project's module names: each is importable (a namespace
    package at least)."""
    return frozenset(
        name.rsplit(".", depth)[0] for name in modules for depth in range(1, name.count(".") + 1)
    )


class ModuleTable:
    """The modules a `ProjectIndex` can read, by dotted name, summarised on first use.

    The arguments are `ProjectIndex`'s (see there); `namespaces` is `namespace_names` of every
    project module name and alias, when the caller has it already. Bindings and classes under
    version or platform guards that `reach` finds false are left out, as the checkers leave them
    out.
    """

    def __init__(
        self,
        modules: Mapping[str, ModuleSummary],
        deferred: Mapping[str, Callable[[], ModuleSummary | None]],
        aliases: Mapping[str, str],
        packages: Iterable[str],
        scripts: Iterable[str],
        search_paths: Sequence[Path],
        package_roots: Sequence[tuple[str, Path]],
        summarize_external: Callable[[Path], ModuleSummary | None] | None,
        reach: Reachability | None = None,
        namespaces: frozenset[str] | None = None,
    ) -> None:
        self.reach = reach or Reachability()
        self._modules: dict[str, ModuleSummary | None] = dict(modules)
        self._deferred = dict(deferred)
        self.aliases = dict(aliases)
        if namespaces is None:
            namespaces = namespace_names([*modules, *self._deferred, *self.aliases])
        self._namespaces = namespaces
        self._packages = set(packages)
        self.scripts = frozenset(scripts)
        self._search_paths = tuple(search_paths)
        self._package_roots = dict(reversed(package_roots))  # the first mapping of a name wins
        self._installed_namespaces: dict[str, bool] = {}
        self._summarize_external = summarize_external or _summarize_path
        self._symbols: dict[str, dict[str, tuple[Binding, ...]]] = {}
        self._classes: dict[str, dict[str, ClassSummary]] = {}

    # --- modules --------------------------------------------------------------------------

    def module(self, name: str) -> ModuleSummary | None:
        """The summary of a module by dotted name (project, search paths, stdlib)."""
        name = self.aliases.get(name, name)
        if name in self._modules:
            return self._modules[name]
        load = self._deferred.pop(name, None)
        found = load() if load is not None else None
        if found is not None:
            self._modules[name] = found
            return found
        # A project file that does not parse is absent, as if it were not there: the name may
        # still come from an installed package.
        standard = stdlib_roots(name, self.reach)
        roots = (*self._search_paths,) if standard is None else standard
        for root in roots:
            found = _summarize_from(root, name, self._summarize_external)
            if found is not None:
                break
        if found is None and self._package_roots:
            found = self._from_package_roots(name)
        if found is not None and found.path.endswith(("__init__.py", "__init__.pyi")):
            self._packages.add(name)
        self._modules[name] = found
        return found

    def _from_package_roots(self, name: str) -> ModuleSummary | None:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            where = self._package_roots.get(".".join(parts[:end]))
            if where is None:
                continue
            base = where.joinpath(*parts[end:])
            if base.suffix in (".py", ".pyi") and not parts[end:]:
                candidates = [base.with_suffix(".pyi"), base]  # a single-module distribution
            else:
                candidates = [
                    base / "__init__.pyi", base / "__init__.py",
                    base.with_name(base.name + ".pyi"), base.with_name(base.name + ".py"),
                ]
            for candidate in candidates:
                key = str(candidate)
                if key not in FILE_CACHE:
                    FILE_CACHE[key] = (
                        self._summarize_external(candidate) if os.path.isfile(key) else None
                    )
                if FILE_CACHE[key] is not None:
                    return FILE_CACHE[key]
            return None
        return None

    def exists(self, name: str) -> bool:
        """Whether a module (or namespace package) of that dotted name can be found."""
        return (
            name in self._namespaces
            or self.module(name) is not None
            or loaded_extension(name) is not None
            or self._installed_namespace(name)
        )

    def _installed_namespace(self, name: str) -> bool:
        """An installed namespace package (PEP 420): a directory without `__init__.py`."""
        found = self._installed_namespaces.get(name)
        if found is None:
            parts = name.split(".")
            found = all(part.isidentifier() for part in parts) and (
                any(os.path.isdir(root.joinpath(*parts)) for root in self._search_paths)
                or name in self._package_roots
            )
            self._installed_namespaces[name] = found
        return found

    def symbol_table(self, name: str, summary: ModuleSummary) -> dict[str, tuple[Binding, ...]]:
        table = self._symbols.get(name)
        if table is None:
            table = dict(summary.symbols)
            classes = {c.qualname: c for c in summary.classes}
            if summary.guarded:
                reaches = self.reach.reaches
                for symbol, bindings in summary.symbols:
                    if any(binding.guard for binding in bindings):
                        kept = tuple(binding for binding in bindings if reaches(binding.guard))
                        if kept:
                            table[symbol] = kept
                        else:
                            del table[symbol]
            self._symbols[name] = table
            self._classes[name] = classes
        return table

    def class_table(self, name: str, summary: ModuleSummary) -> dict[str, ClassSummary]:
        self.symbol_table(name, summary)
        return self._classes[name]

    def absolute_module(self, module: str, imported: str, level: int) -> str:
        """The absolute name of `from <level dots><imported> import ...` inside `module`."""
        if level == 0:
            return imported
        module = self.aliases.get(module, module)
        parts = module.split(".")
        if module not in self._packages:
            parts = parts[:-1]
        if level > 1:
            parts = parts[: len(parts) - (level - 1)] if level - 1 <= len(parts) else []
        base = ".".join(parts)
        return f"{base}.{imported}" if base and imported else base or imported

def _summarize_path(path: Path) -> ModuleSummary | None:
    source, _ = read_source(path, str(path))
    summary = summary_or_error(str(path), source, summarize) if isinstance(source, bytes) else None
    return summary if isinstance(summary, ModuleSummary) else None


def _summarize_from(
    root: Path, name: str, summarize_file: Callable[[Path], ModuleSummary | None]
) -> ModuleSummary | None:
    """Find `name` under one search root (stubs first, PEP 561 `-stubs` packages too)."""
    for candidate in candidate_files(root, name):
        key = str(candidate)
        if key in FILE_CACHE:
            if FILE_CACHE[key] is not None:
                return FILE_CACHE[key]
            continue
        if not os.path.isfile(key):
            FILE_CACHE[key] = None
            continue
        summary = summarize_file(candidate)
        FILE_CACHE[key] = summary
        if summary is not None:
            return summary
    return None
