"""The project index: module names, import resolution, classes and their C3 MROs.

`ProjectIndex` answers "which class does this base expression name?" across the project,
then the extra search roots (installed packages, `.pyi` stubs preferred), then the running
interpreter's standard library source (parsed lazily with `summarize`, cached per process),
and `builtins` plus already-loaded C modules by introspection (nothing is imported).

Anything that cannot be followed to a class (an uninstalled package, a base computed by a
call) is `Unresolved`; a class whose MRO contains one has an unresolved MRO, and the rules
report nothing on it. MROs and member lookups are computed on demand and cached.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import sysconfig
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kvref.audit.source import TYPING_RUNTIME_CLASSES
from kvref.audit.summarise.summary import (
    Binding,
    ClassSummary,
    FunctionSummary,
    ModuleSummary,
    SummaryError,
    summarize,
)

__all__ = [
    "BUILTINS",
    "ClassInfo",
    "ClassKey",
    "MemberHit",
    "ModuleTarget",
    "ProjectIndex",
    "Unresolved",
    "module_names_for",
    "standard_library_files",
]

BUILTINS = "builtins"
_STDLIB = Path(sysconfig.get_paths()["stdlib"])
_STDLIB_NAMES = frozenset(sys.stdlib_module_names)
_DOTTED_NAME = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*")
_OBJECT_RUNTIME_ONLY = frozenset({"__lt__", "__le__", "__gt__", "__ge__"})
_TYPING_REDIRECTS: dict[str, tuple[str, str]] = {
    name: (target.rpartition(".")[0], target.rpartition(".")[2]) for name, target in TYPING_RUNTIME_CLASSES.items()
}
_PROTOCOL = ("typing", "Protocol")
# Special forms to type checkers: their runtime helpers (`__class_getitem__`...) are no
# members a user class overrides.
_SPECIAL_FORMS = frozenset({("typing", "Protocol"), ("typing", "Generic")})
# Process-wide cache of parsed standard-library and search-path files (they do not change).
_FILE_CACHE: dict[str, ModuleSummary | None] = {}


class ClassKey(NamedTuple):
    """A class by the module that defines it and its qualified name there.

    A named tuple rather than a dataclass: keys are hashed millions of times on big trees.
    """

    module: str
    qualname: str

    @property
    def dotted(self) -> str:
        """The class's full dotted name."""
        return f"{self.module}.{self.qualname}"


@dataclass(frozen=True, slots=True)
class ModuleTarget:
    """A name that resolved to a module."""

    name: str


@dataclass(frozen=True, slots=True)
class Unresolved:
    """Something that could not be followed to a class; `names` are dotted, for the summary."""

    names: frozenset[str]


@dataclass(frozen=True, slots=True)
class _NotAClass:
    """A name bound to something other than a class or module (a function, a value)."""

    dotted: str


_Target = ClassKey | ModuleTarget | Unresolved | _NotAClass


@dataclass(slots=True)
class ClassInfo:
    """A class as the rules see it.

    Attributes:
        key: its identity.
        summary: its source summary, or None for an introspected (C-implemented) class.
        members: every name its body binds (methods and attributes).
        methods: each method name's definitions in source order (several with overloads,
            property accessors or conditional definitions).
        bases: the resolved direct bases (ClassKey) or what failed (Unresolved).
        is_protocol: it lists `typing.Protocol` among its bases.
        module_summary: the summary of its module (None for introspected classes).
    """

    key: ClassKey
    summary: ClassSummary | None
    members: frozenset[str]
    methods: dict[str, list[FunctionSummary]]
    bases: tuple[ClassKey | Unresolved, ...]
    is_protocol: bool
    module_summary: ModuleSummary | None


@dataclass(frozen=True, slots=True)
class MemberHit:
    """The nearest base class (in MRO order) that binds a name."""

    owner: ClassInfo
    definitions: tuple[FunctionSummary, ...]

    @property
    def is_method(self) -> bool:
        """The base binds the name with `def` (not an attribute)."""
        return bool(self.definitions)

    @property
    def is_abstract(self) -> bool:
        """The base declares it abstract."""
        return any(d.is_abstract for d in self.definitions)

    def dotted(self, name: str) -> str:
        """The member's full dotted name, e.g. `kvref.base.OffloadingManager.lookup`."""
        return f"{self.owner.key.dotted}.{name}"


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
    if chain and (not names or is_package(directory) and chain[0] not in _STDLIB_NAMES):
        names.append(".".join(chain))
    if not names:
        last_directory = os.path.basename(directory)
        names.append(".".join([last_directory, stem] if last_directory else [stem]))
    # A name that cannot be written in an import statement is kept only as the last resort.
    importable = [name for name in names if _DOTTED_NAME.fullmatch(name)]
    return tuple(dict.fromkeys(importable or names))


class ProjectIndex:
    """Resolves names and classes across the project's modules; see the module docstring."""

    def __init__(
        self,
        modules: Mapping[str, ModuleSummary],
        *,
        deferred: Mapping[str, Callable[[], ModuleSummary | None]] | None = None,
        aliases: Mapping[str, str] | None = None,
        packages: Iterable[str] = (),
        scripts: Iterable[str] = (),
        search_paths: Sequence[Path] = (),
        package_roots: Sequence[tuple[str, Path]] = (),
        summarize_external: Callable[[Path], ModuleSummary | None] | None = None,
    ) -> None:
        """Build the index.

        Args:
            modules: primary dotted module name -> summary, for the project files already
                summarized.
            deferred: primary dotted module name -> a loader, for the other project files:
                each is summarized the first time a name is looked up in it (None when it
                cannot be read or parsed), so files no reported class leads to cost nothing.
            aliases: every other name a project file is importable as -> its primary name
                (see `module_names_for`), so one class never gets two identities.
            packages: the names of the project modules that are packages (`__init__` files),
                so their relative imports resolve from the package itself.
            scripts: the project modules outside any regular package: their absolute
                imports also find modules in their own directory (as `python script.py`).
            search_paths: extra roots for installed packages, searched after the project.
            package_roots: (dotted package name, its directory or module file) for editable
                installs made through an import hook, searched after `search_paths`.
            summarize_external: summarizes a standard-library or installed file (the engine
                passes its cached summarizer); by default the file is read and summarized.
        """
        self._modules: dict[str, ModuleSummary | None] = dict(modules)
        self._deferred = dict(deferred or {})
        self._aliases = dict(aliases or {})
        # Every proper prefix of a project module is importable (a namespace package at least).
        self._namespaces = {
            name.rsplit(".", depth)[0]
            for name in [*modules, *self._deferred, *self._aliases]
            for depth in range(1, name.count(".") + 1)
        }
        self._packages = set(packages)
        self._scripts = frozenset(scripts)
        self._search_paths = tuple(search_paths)
        self._package_roots = dict(reversed(package_roots))  # the first mapping of a name wins
        self._installed_namespaces: dict[str, bool] = {}
        self._summarize_external = summarize_external or _summarize_path
        self._symbols: dict[str, dict[str, tuple[Binding, ...]]] = {}
        self._classes: dict[str, dict[str, ClassSummary]] = {}
        self._infos: dict[ClassKey, ClassInfo | None] = {}
        self._mros: dict[ClassKey, tuple[ClassKey, ...] | Unresolved] = {}
        self._in_progress: set[ClassKey] = set()
        self._names: dict[tuple[str, str, str], _Target] = {}
        self._live: dict[ClassKey, type] = {}
        self._base_infos: dict[ClassKey, list[ClassInfo]] = {}
        self._hits: dict[tuple[ClassKey, str], MemberHit | None] = {}
        self._known_ancestors: dict[ClassKey, tuple[ClassKey, ...]] = {}
        self._resolving: set[tuple[str, str]] = set()

    # --- modules --------------------------------------------------------------------------

    def module(self, name: str) -> ModuleSummary | None:
        """The summary of a module by dotted name (project, search paths, stdlib)."""
        name = self._aliases.get(name, name)
        if name in self._modules:
            return self._modules[name]
        load = self._deferred.pop(name, None)
        found = load() if load is not None else None
        if found is not None:
            self._modules[name] = found
            return found
        # A project file that does not parse is absent, as if it were not there: the name may
        # still come from an installed package.
        top = name.partition(".")[0]
        roots = (_STDLIB, *self._search_paths) if top in _STDLIB_NAMES else (*self._search_paths, _STDLIB)
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

    def module_exists(self, name: str) -> bool:
        """Whether a module (or namespace package) of that dotted name can be found."""
        return self._module_exists(name)

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
                if key not in _FILE_CACHE:
                    _FILE_CACHE[key] = (
                        self._summarize_external(candidate) if os.path.isfile(key) else None
                    )
                if _FILE_CACHE[key] is not None:
                    return _FILE_CACHE[key]
            return None
        return None

    def _module_exists(self, name: str) -> bool:
        return (
            name in self._namespaces
            or self.module(name) is not None
            or _loaded_extension(name) is not None
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

    def _symbol_table(self, name: str, summary: ModuleSummary) -> dict[str, tuple[Binding, ...]]:
        table = self._symbols.get(name)
        if table is None:
            table = dict(summary.symbols)
            self._symbols[name] = table
            self._classes[name] = {c.qualname: c for c in summary.classes}
        return table

    def _class_table(self, name: str, summary: ModuleSummary) -> dict[str, ClassSummary]:
        self._symbol_table(name, summary)
        return self._classes[name]

    def absolute_module(self, module: str, imported: str, level: int) -> str:
        """The absolute name of `from <level dots><imported> import ...` inside `module`."""
        if level == 0:
            return imported
        module = self._aliases.get(module, module)
        parts = module.split(".")
        if module not in self._packages:
            parts = parts[:-1]
        if level > 1:
            parts = parts[: len(parts) - (level - 1)] if level - 1 <= len(parts) else []
        base = ".".join(parts)
        return f"{base}.{imported}" if base and imported else base or imported

    # --- names ----------------------------------------------------------------------------

    def resolve(self, module: str, dotted: str, scope: str = "") -> _Target:
        """What a dotted expression written in `module` (inside class `scope`) refers to."""
        head, *rest = dotted.split(".")
        target = self._resolve_name(module, head, scope)
        for attribute in rest:
            target = self._member(target, attribute)
        return target

    def resolve_class(self, module: str, dotted: str, scope: str = "") -> ClassKey | Unresolved:
        """Like `resolve`, but anything that is not a class becomes `Unresolved`."""
        if not dotted:
            return Unresolved(frozenset({"<expression>"}))
        target = self.resolve(module, dotted, scope)
        if isinstance(target, ClassKey | Unresolved):
            return target
        name = target.dotted if isinstance(target, _NotAClass) else target.name
        return Unresolved(frozenset({name}))

    def _resolve_name(self, module: str, name: str, scope: str) -> _Target:
        module = self._aliases.get(module, module)
        cache_key = (module, name, scope)
        cached = self._names.get(cache_key)
        if cached is None:
            cached = self._resolve_name_uncached(module, name, scope)
            self._names[cache_key] = cached
        return cached

    def _resolve_name_uncached(
        self, module: str, name: str, scope: str, defining: str = ""
    ) -> _Target:
        if module == BUILTINS or (summary := self.module(module)) is None:
            return self._introspected_member(module, name)
        classes = self._class_table(module, summary)
        while scope:
            if f"{scope}.{name}" in classes and f"{scope}.{name}" != defining:
                return ClassKey(module, f"{scope}.{name}")
            scope = classes[scope].scope if scope in classes else ""
        guard = (module, name)
        if guard in self._resolving:
            return Unresolved(frozenset({f"{module}.{name}"}))
        self._resolving.add(guard)
        try:
            found = self._resolve_global(module, summary, name, defining)
        finally:
            self._resolving.discard(guard)
        if not isinstance(found, ClassKey | ModuleTarget) and _is_loaded_stdlib(module):
            # `types.ModuleType = type(sys)`: the source cannot tell, the loaded module can.
            live = self._introspected_member(module, name, sys.modules[module])
            if isinstance(live, ClassKey):
                return live
        return found

    def _resolve_base(self, key: ClassKey, cls: ClassSummary, dotted: str) -> ClassKey | Unresolved:
        """A base expression of `cls`; `class Thread(Thread):` means the name bound before."""
        head, _, rest = dotted.partition(".")
        if head != cls.name:
            return self.resolve_class(key.module, dotted, cls.scope)
        target = self._resolve_name_uncached(key.module, head, cls.scope, defining=key.qualname)
        for attribute in rest.split(".") if rest else ():
            target = self._member(target, attribute)
        if isinstance(target, ClassKey | Unresolved):
            return target
        return Unresolved(frozenset({dotted}))

    def _resolve_global(
        self, module: str, summary: ModuleSummary, name: str, defining: str = ""
    ) -> _Target:
        bindings = self._symbol_table(module, summary).get(name, ())
        if defining:
            bindings = tuple(b for b in bindings if not (b.kind == "class" and b.target == defining))
        if bindings:
            # The binding a type checker sees first decides, even when it cannot be
            # resolved: `except ImportError: Base = object` must not stand in for an
            # uninstalled base (that would invent KVR002s).
            return self._follow(module, bindings[0], name)
        for star_module, level in summary.star_imports:
            source = self.absolute_module(module, star_module, level)
            exported = self.module(source)
            if exported is not None and self._exports(source, exported, name):
                return self._resolve_name(source, name, "")
            if exported is None and _loaded_extension(source) is not None:
                target = self._introspected_member(source, name)
                if not isinstance(target, Unresolved):
                    return target
        if hasattr(builtins, name):
            return self._introspected_member(BUILTINS, name)
        return Unresolved(frozenset({f"{module}.{name}"}))

    def _exports(self, module: str, summary: ModuleSummary, name: str) -> bool:
        if summary.all_names is not None:
            return name in summary.all_names
        table = self._symbol_table(module, summary)
        return not name.startswith("_") and (
            name in table or any(self._star_exports(module, summary, name))
        )

    def _star_exports(self, module: str, summary: ModuleSummary, name: str) -> Iterable[bool]:
        for star_module, level in summary.star_imports:
            source = self.absolute_module(module, star_module, level)
            exported = self.module(source)
            yield exported is not None and source != module and self._exports(source, exported, name)

    def _follow(self, module: str, binding: Binding, name: str) -> _Target:
        if binding.kind == "class":
            return ClassKey(module, binding.target)
        if binding.kind == "module":
            target = self._script_sibling(module, binding.target)
            if self._module_exists(target):
                return ModuleTarget(target)
            return Unresolved(frozenset({binding.target}))
        if binding.kind == "import":
            source = self.absolute_module(module, binding.module, binding.level)
            if binding.level == 0:
                source = self._script_sibling(module, source)
            if source in ("typing", "typing_extensions"):
                redirected = self._typing_member(binding.target)
                if redirected is not None:
                    return redirected
            if not self._module_exists(source):
                submodule = f"{source}.{binding.target}" if source else binding.target
                if self._module_exists(submodule):
                    return ModuleTarget(submodule)
                return Unresolved(frozenset({f"{source}.{binding.target}"}))
            return self._member(ModuleTarget(source), binding.target)
        if binding.kind == "alias" and binding.target:
            return self.resolve(module, binding.target)
        return _NotAClass(f"{module}.{name}")

    def _script_sibling(self, module: str, imported: str) -> str:
        """`imported` as a script sees it: a module next to it wins when nothing else exists.

        A file outside any regular package (a script, a test directory without
        `__init__.py`) runs with its own directory on `sys.path`.
        """
        if module not in self._scripts or "." not in module or self._module_exists(imported):
            return imported
        sibling = f"{module.rpartition('.')[0]}.{imported}"
        return sibling if self._module_exists(sibling) else imported

    def _typing_member(self, name: str) -> _Target | None:
        if name in _TYPING_REDIRECTS:
            module, attribute = _TYPING_REDIRECTS[name]
            return self._resolve_name(module, attribute, "")
        if name in ("Protocol", "Generic"):
            return self._resolve_name("typing", name, "") if self.module("typing") else None
        if name == "Any":
            return Unresolved(frozenset({"typing.Any"}))
        return None

    def _member(self, target: _Target, attribute: str) -> _Target:
        if isinstance(target, ModuleTarget):
            target = ModuleTarget(self._aliases.get(target.name, target.name))
            if target.name in ("typing", "typing_extensions"):
                redirected = self._typing_member(attribute)
                if redirected is not None:
                    return redirected
            summary = self.module(target.name)
            submodule = f"{target.name}.{attribute}"
            if summary is not None:
                table = self._symbol_table(target.name, summary)
                if attribute in table or any(self._star_exports(target.name, summary, attribute)):
                    found = self._resolve_name(target.name, attribute, "")
                    # `from torch import nn` inside torch/__init__.py: the submodule.
                    if isinstance(found, ClassKey | ModuleTarget) or not self._module_exists(
                        submodule
                    ):
                        return found
                    return ModuleTarget(submodule)
                if self._module_exists(submodule):
                    return ModuleTarget(submodule)
                return Unresolved(frozenset({submodule}))
            if self._module_exists(submodule):
                return ModuleTarget(submodule)
            return self._introspected_member(target.name, attribute)
        if isinstance(target, ClassKey):
            info = self.class_info(target)
            nested = f"{target.qualname}.{attribute}"
            if info is not None and info.module_summary is not None:
                if nested in self._class_table(target.module, info.module_summary):
                    return ClassKey(target.module, nested)
            return _NotAClass(f"{target.dotted}.{attribute}")
        if isinstance(target, Unresolved):
            return Unresolved(frozenset(f"{n}.{attribute}" for n in target.names))
        return _NotAClass(f"{target.dotted}.{attribute}")

    def _introspected_member(
        self, module: str, name: str, loaded: types.ModuleType | None = None
    ) -> _Target:
        if loaded is None:
            loaded = builtins if module == BUILTINS else _loaded_extension(module)
        value = getattr(loaded, name, None) if loaded is not None else None
        if isinstance(value, type):
            return self._live_key(value)
        if isinstance(value, types.ModuleType):
            return ModuleTarget(value.__name__)
        if value is not None:
            return _NotAClass(f"{module}.{name}")
        return Unresolved(frozenset({f"{module}.{name}"}))

    # --- classes --------------------------------------------------------------------------

    def class_info(self, key: ClassKey) -> ClassInfo | None:
        """The class behind a key (None when the key names no class)."""
        if key in self._infos:
            return self._infos[key]
        self._infos[key] = None  # a cycle through bases resolves to "unknown"
        info = self._build_info(key)
        self._infos[key] = info
        return info

    def _build_info(self, key: ClassKey) -> ClassInfo | None:
        summary = None if key.module == BUILTINS else self.module(key.module)
        if summary is None:
            return self._introspected_info(key)
        cls = self._class_table(key.module, summary).get(key.qualname)
        if cls is None:
            return self._introspected_info(key)
        methods: dict[str, list[FunctionSummary]] = {}
        for method in cls.methods:
            methods.setdefault(method.name, []).append(method)
        bases: list[ClassKey | Unresolved] = [
            self._resolve_base(key, cls, base.dotted) if base.dotted
            else Unresolved(frozenset({base.text}))
            for base in cls.bases
        ]
        if not bases and key != ClassKey(BUILTINS, "object"):
            bases.append(ClassKey(BUILTINS, "object"))
        return ClassInfo(
            key=key,
            summary=cls,
            members=frozenset(methods) | frozenset(cls.attributes),
            methods=methods,
            bases=tuple(bases),
            is_protocol=any(b == ClassKey(*_PROTOCOL) for b in bases),
            module_summary=summary,
        )

    def _live_key(self, value: type) -> ClassKey:
        """The key of a live class, remembered: `types.ModuleType` says it is `builtins.module`."""
        key = ClassKey(value.__module__, value.__qualname__)
        self._live.setdefault(key, value)
        return key

    def _introspected_info(self, key: ClassKey) -> ClassInfo | None:
        value: object = self._live.get(key)
        if value is None:
            value = builtins if key.module == BUILTINS else sys.modules.get(key.module)
            for part in key.qualname.split(".") if value is not None else ():
                value = getattr(value, part, None)
        if not isinstance(value, type):
            return None
        bases = tuple(self._live_key(b) for b in value.__bases__)
        members = frozenset(value.__dict__)
        if value is object:
            # At runtime object has slot wrappers for every rich comparison; the type checkers
            # read typeshed, whose `object` declares only __eq__ and __ne__, so a class's own
            # __lt__ overrides nothing for them.
            members -= _OBJECT_RUNTIME_ONLY
        return ClassInfo(
            key=key,
            summary=None,
            members=members,
            methods={},
            bases=bases,
            is_protocol=False,
            module_summary=None,
        )

    def mro(self, key: ClassKey) -> tuple[ClassKey, ...] | Unresolved:
        """The C3 linearization, or `Unresolved` naming what blocked it."""
        cached = self._mros.get(key)
        if cached is not None:
            return cached
        if key in self._in_progress:
            return Unresolved(frozenset({f"{key.dotted} (circular bases)"}))
        self._in_progress.add(key)
        try:
            result = self._compute_mro(key)
        finally:
            self._in_progress.discard(key)
        self._mros[key] = result
        return result

    def _compute_mro(self, key: ClassKey) -> tuple[ClassKey, ...] | Unresolved:
        info = self.class_info(key)
        if info is None:
            return Unresolved(frozenset({key.dotted}))
        missing: set[str] = set()
        sequences: list[list[ClassKey]] = []
        for base in info.bases:
            base_mro = base if isinstance(base, Unresolved) else self.mro(base)
            if isinstance(base_mro, Unresolved):
                missing |= base_mro.names
            else:
                sequences.append(list(base_mro))
        if missing:
            return Unresolved(frozenset(missing))
        sequences.append([b for b in info.bases if isinstance(b, ClassKey)])
        merged = _c3_merge(sequences)
        if merged is None:
            return Unresolved(frozenset({f"{key.dotted} (inconsistent MRO)"}))
        return (key, *merged)

    def known_ancestors(self, key: ClassKey) -> tuple[ClassKey, ...]:
        """The ancestors of `key` that resolve, nearest first, `object` last.

        The MRO when it resolves; otherwise a depth-first, left-to-right walk that skips the
        bases which cannot be followed (an uninstalled package), which is what the type
        checkers do with an unknown base: its own members are unknown, the rest is not.
        """
        known = self._known_ancestors.get(key)
        if known is not None:
            return known
        linearization = self.mro(key)
        if not isinstance(linearization, Unresolved):
            return linearization[1:]
        seen: dict[ClassKey, None] = {}

        def visit(current: ClassKey) -> None:
            info = self.class_info(current)
            for base in info.bases if info is not None else ():
                if isinstance(base, ClassKey) and base not in seen and base != key:
                    seen[base] = None
                    visit(base)

        visit(key)
        everything = ClassKey(BUILTINS, "object")
        # Asked once per method of the class: remembered like the MROs it stands in for.
        known = self._known_ancestors[key] = (
            *(base for base in seen if base != everything),
            everything,
        )
        return known

    def find_known_member(self, key: ClassKey, name: str) -> MemberHit | None:
        """Like `find_member`, but through `known_ancestors` when the MRO does not resolve.

        A hit proves that `name` overrides something even if an unknown base sits earlier
        in the real MRO; None proves nothing then (the unknown base may bind `name`).
        """
        for base in self.known_ancestors(key):
            if base in _SPECIAL_FORMS:
                continue  # typing's special forms are no bases to the type checkers
            info = self.class_info(base)
            if info is not None and name in info.members:
                return MemberHit(info, tuple(info.methods.get(name, ())))
        return None

    def find_member(self, key: ClassKey, name: str) -> MemberHit | None:
        """The nearest class after `key` in its MRO that binds `name` (None: none does).

        The MRO must be resolved (callers check `mro` first).
        """
        cache_key = (key, name)
        if cache_key in self._hits:
            return self._hits[cache_key]
        bases = self._base_infos.get(key)
        if bases is None:
            linearization = self.mro(key)
            bases = [] if isinstance(linearization, Unresolved) else [
                info
                for base in linearization[1:]
                if base not in _SPECIAL_FORMS and (info := self.class_info(base)) is not None
            ]
            self._base_infos[key] = bases
        hit = None
        for info in bases:
            if name in info.members:
                hit = MemberHit(info, tuple(info.methods.get(name, ())))
                break
        self._hits[cache_key] = hit
        return hit


def _c3_merge(sequences: list[list[ClassKey]]) -> list[ClassKey] | None:
    result: list[ClassKey] = []
    sequences = [s for s in sequences if s]
    while sequences:
        for sequence in sequences:
            candidate = sequence[0]
            if not any(candidate in other[1:] for other in sequences):
                break
        else:
            return None
        result.append(candidate)
        sequences = [[c for c in s if c != candidate] for s in sequences]
        sequences = [s for s in sequences if s]
    return result


def _is_loaded_stdlib(name: str) -> bool:
    """A standard-library module this process already imported (introspecting it is free)."""
    return name.partition(".")[0] in _STDLIB_NAMES and name in sys.modules


def _loaded_extension(name: str) -> types.ModuleType | None:
    """An imported module without Python source (a C extension or builtin module).

    A top-level standard-library extension module (`_pickle`, `_ctypes`...) is imported on
    demand: such modules run no Python code, so importing one has no side effect, while
    anything else is only introspected if the process has already imported it.
    """
    module = sys.modules.get(name)
    if module is None:
        module = _import_stdlib_extension(name)
    if module is None:
        return None
    file = getattr(module, "__file__", None)
    if file is None or not str(file).endswith((".py", ".pyc")):
        return module
    return None


def _summarize_path(path: Path) -> ModuleSummary | None:
    try:
        return summarize(str(path), path.read_bytes())
    except (OSError, SummaryError):
        return None


def _summarize_from(
    root: Path, name: str, summarize_file: Callable[[Path], ModuleSummary | None]
) -> ModuleSummary | None:
    """Find `name` under one search root (stubs first, PEP 561 `-stubs` packages too)."""
    for candidate in _candidate_files(root, name):
        key = str(candidate)
        if key in _FILE_CACHE:
            if _FILE_CACHE[key] is not None:
                return _FILE_CACHE[key]
            continue
        if not os.path.isfile(key):
            _FILE_CACHE[key] = None
            continue
        summary = summarize_file(candidate)
        _FILE_CACHE[key] = summary
        if summary is not None:
            return summary
    return None


def _candidate_files(root: Path, name: str) -> list[Path]:
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


@functools.cache
def _standard_library_file(name: str) -> str | None:
    for candidate in _candidate_files(_STDLIB, name):
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
        if module.partition(".")[0] in _STDLIB_NAMES:
            path = _standard_library_file(module)
            if path is not None:
                found.append(path)
    return tuple(dict.fromkeys(found))


@functools.cache
def _import_stdlib_extension(name: str) -> types.ModuleType | None:
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
