"""The running interpreter's standard library: its source files and its C extension modules."""

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

from kvref.audit.source import TYPING_RUNTIME_CLASSES
from kvref.audit.summarise.records import ModuleSummary

__all__ = [
    "STDLIB",
    "STDLIB_NAMES",
    "TYPING_REDIRECTS",
    "candidate_files",
    "import_stdlib_extension",
    "is_loaded_stdlib",
    "loaded_extension",
    "standard_library_files",
]

STDLIB = Path(sysconfig.get_paths()["stdlib"])
STDLIB_NAMES = frozenset(sys.stdlib_module_names)
# typing names whose runtime class lives elsewhere (`typing.Mapping` is an alias object).
TYPING_REDIRECTS: dict[str, tuple[str, str]] = {
    name: (target.rpartition(".")[0], target.rpartition(".")[2]) for name, target in TYPING_RUNTIME_CLASSES.items()
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
    for candidate in candidate_files(STDLIB, name):
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
        if module.partition(".")[0] in STDLIB_NAMES:
            path = _standard_library_file(module)
            if path is not None:
                found.append(path)
    return tuple(dict.fromkeys(found))
