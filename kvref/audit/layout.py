"""What each file of a project is importable as, and the project index built over that.

Naming the files (`module_names_for` over every file) depends only on the file list and where
names are looked up, and is most of indexing a big project; `Layout` keeps it, so a caller that
indexes the same files again and again (`kvref server`, on each edit) names them once and
only builds a new `ProjectIndex` over the changed summaries (`build_index`).
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvref.audit.discover.paths import relative_path
from kvref.audit.resolve.hierarchy import ProjectIndex
from kvref.audit.resolve.modules import module_names_for, namespace_names
from kvref.audit.resolve.reachability import Reachability
from kvref.audit.resolve.stdlib import candidate_files
from kvref.audit.summarise.records import ModuleSummary

__all__ = ["Layout", "Load", "SearchRoots", "build_index", "name_files"]

Load = Callable[[Path], ModuleSummary | None]
_NAMED: dict[tuple[object, ...], dict[Path, tuple[str, ...]]] = {}  # the last files named


@dataclass(frozen=True, slots=True)
class SearchRoots:
    """Where names outside the project are looked up (see `analyze`)."""

    search_paths: Sequence[Path] = ()
    package_roots: Sequence[tuple[str, Path]] = ()
    import_roots: Sequence[Path] = ()


@dataclass(frozen=True, slots=True)
class Layout:
    """What every indexed project file is importable as: the part of indexing that depends
    only on the file list (naming a big project's files is most of indexing it), so a caller
    that indexes the same files again and again (`kvref server`, on each edit) passes it back
    to `kvref.audit.pipeline.index_project` and only the changed files' summaries are new."""

    files: tuple[Path, ...]
    """The project's files it was made for (`Project.files`)."""
    failed: frozenset[Path]
    """The eager files left out because they could not be summarised."""
    roots: SearchRoots
    primary: dict[Path, str]
    """Each indexed file's module name (a duplicate's is `name@path`)."""
    aliases: dict[str, str]
    packages: frozenset[str]
    scripts: frozenset[str]
    stubs: dict[str, str]
    unreadable_tops: frozenset[str]
    namespaces: frozenset[str]
    """Every proper prefix of a module name or alias (see `namespace_names`)."""

    def fits(self, files: tuple[Path, ...], failed: Collection[Path], roots: SearchRoots) -> bool:
        """Whether it describes these files (cheap when `files` is the tuple it was made for)."""
        return (self.files is files or self.files == files) and self.failed == failed and self.roots == roots


def name_files(root: Path, files: tuple[Path, ...], failed: frozenset[Path], roots: SearchRoots) -> Layout:
    """Name every file of `files` but the `failed` ones (see `Layout`).

    Args:
        root: the project root (absolute).
        files: the project's files (absolute).
        failed: files that could not be summarised: left out, as if they were not there.
        roots: where names outside the project are looked up.
    """
    paths = [path for path in files if path not in failed]
    package_dirs = {
        os.path.dirname(str(path)) for path in paths if path.name in ("__init__.py", "__init__.pyi")
    }
    known: dict[str, bool] = {}

    def is_package(directory: str) -> bool:
        if directory in package_dirs:
            return True
        if directory not in known:
            known[directory] = os.path.isfile(
                os.path.join(directory, "__init__.py")
            ) or os.path.isfile(os.path.join(directory, "__init__.pyi"))
        return known[directory]

    root_text = str(root)
    # The import roots, the deepest first: those the interpreter imports from, a src layout's
    # `src/`, then the root (`module_names_for` skips any that is a package itself).
    source = os.path.join(root_text, "src")
    extra = {str(path) for path in roots.import_roots}
    if os.path.isdir(source):
        extra.add(source)
    extra.discard(root_text)
    search = [*sorted(extra, key=lambda path: (-path.count(os.sep), path)), root_text]
    # Same files, same roots, same names: `--fix`'s rounds name them once.
    key = (tuple(paths), tuple(search), frozenset(package_dirs))
    if key not in _NAMED:
        _NAMED.clear()
        _NAMED[key] = {path: module_names_for(str(path), search, is_package) for path in paths}
    names = _NAMED[key]
    unreadable_tops = frozenset(
        name.partition(".")[0] for path in failed for name in module_names_for(str(path), search, is_package)
    )
    claimed: set[str] = set()
    primary: dict[Path, str] = {}
    stubs: dict[str, str] = {}
    # Implementations before stubs, then path order: the first claim of a name wins.
    ordered = sorted(paths, key=lambda p: (p.suffix == ".pyi", str(p)))
    for path in ordered:
        name = names[path][0]
        if name in claimed:
            duplicate = f"{name}@{relative_path(path, root)}"  # indexed, not importable
            if path.suffix == ".pyi":
                stubs.setdefault(name, duplicate)  # what the module's source cannot tell
            name = duplicate
        claimed.add(name)
        primary[path] = name
    aliases: dict[str, str] = {}
    installed = _installed_tops(roots)
    for path in ordered:
        for alias in names[path][1:]:
            # celery's `examples/pydantic/` is no `pydantic` to the rest of the project when the
            # environment has the real one: `from pydantic import BaseModel` in its tests.
            if alias not in claimed and alias not in aliases and not installed(alias.partition(".")[0]):
                aliases[alias] = primary[path]
    return Layout(
        files=files,
        failed=failed,
        roots=roots,
        primary=primary,
        aliases=aliases,
        packages=frozenset(primary[path] for path in paths if path.name in ("__init__.py", "__init__.pyi")),
        scripts=frozenset(primary[path] for path in paths if not is_package(os.path.dirname(str(path)))),
        stubs=stubs,
        unreadable_tops=unreadable_tops,
        namespaces=namespace_names([*primary.values(), *aliases]),
    )


def build_index(
    layout: Layout, summaries: Mapping[Path, ModuleSummary], load: Load, reach: Reachability | None = None
) -> ProjectIndex:
    """The index over `layout`'s files: `summaries` as given, every other file summarised by
    `load` when a lookup first reaches it; `reach` decides version and platform checks."""
    primary = layout.primary
    # Built at C speed: this runs on every edit in the editor, over every file of the project.
    loaders: dict[str, Callable[[], ModuleSummary | None]] = dict(
        zip(primary.values(), map(functools.partial, itertools.repeat(load), primary), strict=True)
    )
    modules: dict[str, ModuleSummary] = {}
    for path, summary in summaries.items():
        name = primary.get(path)
        if name is not None:
            modules[name] = summary
            del loaders[name]
    roots = layout.roots
    return ProjectIndex(
        modules,
        deferred=loaders,
        aliases=layout.aliases,
        packages=layout.packages,
        scripts=layout.scripts,
        stubs=layout.stubs,
        search_paths=roots.search_paths,
        package_roots=roots.package_roots,
        summarize_external=load,
        reach=reach,
        namespaces=layout.namespaces,
    )


def _installed_tops(roots: SearchRoots) -> Callable[[str], bool]:
    """Whether a top-level name is importable from the target environment's search paths."""
    editable = {name.partition(".")[0] for name, _ in roots.package_roots}
    known: dict[str, bool] = {}

    def installed(top: str) -> bool:
        if top not in known:
            known[top] = top in editable or any(
                (root / top).is_dir() or any(path.is_file() for path in candidate_files(root, top))
                for root in roots.search_paths
            )
        return known[top]

    return installed
