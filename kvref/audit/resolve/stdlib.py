"""The standard library as the type checkers see it: typeshed's stubs, as bundled by the
`typeshed_client` package (a dependency of kvref: data only, nothing of it is imported), with
the running interpreter's source files and C extension modules where those stubs are absent.

pyright, mypy and ty read typeshed, not the runtime: a member typeshed declares and the source
class lacks (`ast.NodeVisitor.visit_Name`, `io.IOBase.read`, an attribute assigned in
`__init__`) is one they see, a private member the runtime has and the stub omits
(`http.client.HTTPConnection._tunnel`) one they do not, and a class implemented in C
(`sqlite3.Cursor`) has its members spelled out. A module typeshed does not list for the
project's Python version is one the checkers cannot find, and neither does kvref.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import types
from pathlib import Path

from kvref.audit.resolve.reachability import Reachability

from kvref.audit.source import TYPING_RUNTIME_CLASSES
from kvref.audit.summarise.records import ModuleSummary

__all__ = [
    "STDLIB",
    "STDLIB_NAMES",
    "TYPESHED",
    "TYPING_REDIRECTS",
    "in_typeshed",
    "stdlib_roots",
    "candidate_files",
    "import_stdlib_extension",
    "is_loaded_stdlib",
    "loaded_extension",
    "standard_library_files",
]

STDLIB = Path(sysconfig.get_paths()["stdlib"])
STDLIB_NAMES = frozenset(sys.stdlib_module_names)


def _typeshed_directory() -> Path | None:
    """typeshed's `stdlib` directory as `typeshed_client` ships it (found, not imported)."""
    try:
        spec = importlib.util.find_spec("typeshed_client")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(location) / "typeshed"
        if (candidate / "VERSIONS").is_file():
            return candidate
    return None


TYPESHED = _typeshed_directory()
"""typeshed's standard-library stubs (None when `typeshed_client` is not installed: then the
running interpreter's standard library stands in, as kvref read it before)."""


def _read_versions(directory: Path | None) -> dict[str, tuple[tuple[int, int], tuple[int, int] | None]]:
    """typeshed's `VERSIONS`: module -> (first version, last version or None)."""
    if directory is None:
        return {}
    ranges: dict[str, tuple[tuple[int, int], tuple[int, int] | None]] = {}
    for line in (directory / "VERSIONS").read_text(encoding="utf-8").splitlines():
        module, _, span = line.partition("#")[0].partition(":")
        first, _, last = span.strip().partition("-")
        if not module.strip() or not first:
            continue
        try:
            low = tuple(int(part) for part in first.split("."))
            high = tuple(int(part) for part in last.split(".")) if last.strip() else None
        except ValueError:
            continue
        ranges[module.strip()] = (
            (low[0], low[1] if len(low) > 1 else 0),
            None if high is None else (high[0], high[1] if len(high) > 1 else 0),
        )
    return ranges


_VERSIONS = _read_versions(TYPESHED)
_TYPESHED_TOPS = frozenset(name.partition(".")[0] for name in _VERSIONS)


def in_typeshed(name: str, reach: Reachability) -> bool | None:
    """Whether typeshed has module `name` for the version decided: None when typeshed does
    not cover the module's top-level name at all (or is not installed)."""
    if name.partition(".")[0] not in _TYPESHED_TOPS:
        return None
    parts = name.split(".")
    for end in range(len(parts), 0, -1):  # the most specific entry decides
        span = _VERSIONS.get(".".join(parts[:end]))
        if span is not None:
            low, high = span
            return low <= reach.version and (high is None or reach.version <= high)
    return False


def stdlib_roots(name: str, reach: Reachability) -> tuple[Path, ...] | None:
    """Where a standard-library module is read from: typeshed alone where it covers the name
    (empty: not there for this version), the interpreter's library where typeshed is missing;
    None for a module that is not the standard library's."""
    covered = in_typeshed(name, reach)
    if covered is not None and TYPESHED is not None:
        return (TYPESHED,) if covered else ()
    if name.partition(".")[0] in STDLIB_NAMES:
        return (STDLIB,) if TYPESHED is None else ()
    return None

# typing names that stand for a class elsewhere: at run time every alias object
# (`typing.Mapping`); in typeshed, where most are classes of `typing` itself (which
# `collections.abc` re-exports), only the `_Alias()` and special-form spellings.
_TYPESHED_ALIASES = frozenset(
    {"List", "Dict", "DefaultDict", "Set", "FrozenSet", "Counter", "Deque", "ChainMap", "OrderedDict",
     "Tuple", "Type", "Text", "TypedDict"}
)  # fmt: skip
TYPING_REDIRECTS: dict[str, tuple[str, str]] = {
    name: (target.rpartition(".")[0], target.rpartition(".")[2])
    for name, target in TYPING_RUNTIME_CLASSES.items()
    if TYPESHED is None or name in _TYPESHED_ALIASES
}


def candidate_files(root: Path, name: str) -> list[Path]:
    """The files that may hold module `name` under `root`, in the order they are tried."""
    parts = name.split(".")
    candidates: list[Path] = []
    for top, suffixes in ((f"{parts[0]}-stubs", (".pyi",)), (parts[0], (".pyi", ".py"))):
        base = root.joinpath(top, *parts[1:])
        for suffix in suffixes:
            candidates.append(base / f"__init__{suffix}")
            if len(parts) > 1 or top == parts[0]:
                candidates.append(base.with_name(base.name + suffix))
    return candidates


def is_loaded_stdlib(name: str) -> bool:
    """A standard-library module this process already imported (introspecting it is free)."""
    return name.partition(".")[0] in STDLIB_NAMES and name in sys.modules


def loaded_extension(name: str) -> types.ModuleType | None:
    """An imported module without Python source (a C extension or builtin module).

    A top-level standard-library extension module (`_pickle`, `_ctypes`...) is imported on
    demand: such modules run no Python code, so importing one has no side effect, while
    anything else is only introspected if the process has already imported it.
    """
    module = sys.modules.get(name)
    if module is None:
        module = import_stdlib_extension(name)
    if module is None:
        return None
    file = getattr(module, "__file__", None)
    if file is None or not str(file).endswith((".py", ".pyc")):
        return module
    return None


@functools.cache
def import_stdlib_extension(name: str) -> types.ModuleType | None:
    """A top-level standard-library module implemented in C, imported (None for others)."""
    if "." in name or name not in sys.stdlib_module_names:
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not isinstance(
        spec.loader, importlib.machinery.ExtensionFileLoader | importlib.machinery.BuiltinImporter
    ):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


@functools.cache
def _standard_library_file(name: str) -> str | None:
    for root in stdlib_roots(name, Reachability()) or ():
        for candidate in candidate_files(root, name):
            if os.path.isfile(candidate):
                return str(candidate)
    return None


def standard_library_files(summary: ModuleSummary) -> tuple[str, ...]:
    """The standard-library source files the module's class bases are imported from, and
    those its `*` imports read.

    The checkers look those modules up (`typing`, `abc`, `enum`...) in every process that
    checks a class deriving from them; summarising them along with the project's files, in
    the same pool, makes them cache hits instead. A file named needlessly costs one parse; a
    module missed is summarised when a lookup reaches it, as before.
    """
    symbols = dict(summary.symbols)
    modules: dict[str, None] = {}
    for cls in summary.classes:
        for base in cls.bases:
            head, _, rest = base.dotted.partition(".")
            bindings = symbols.get(head) if head else None
            if not bindings:
                continue
            binding = bindings[0]
            if binding.kind == "import" and binding.level == 0 and binding.module:
                modules[binding.module] = None
                modules[f"{binding.module}.{binding.target}"] = None  # a submodule, maybe
            elif binding.kind == "module":
                # `import collections.abc` binds `collections`; `collections.abc.Mapping`
                # names the module `collections.abc`.
                parts = [binding.target, *rest.split(".")[:-1]] if rest else [binding.target]
                for end in range(1, len(parts) + 1):
                    modules[".".join(parts[:end])] = None
    for module, level in summary.star_imports:
        if level == 0:
            modules[module] = None
    found: list[str] = []
    for module in modules:
        if module.partition(".")[0] in STDLIB_NAMES or module.partition(".")[0] in _TYPESHED_TOPS:
            path = _standard_library_file(module)
            if path is not None:
                found.append(path)
    return tuple(dict.fromkeys(found))
