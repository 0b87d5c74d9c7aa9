"""The project index: the classes base expressions lead to, their C3 MROs and members.

`ProjectIndex` answers "which class does this base expression name?" across the project,
then the extra search roots (installed packages, `.pyi` stubs preferred), then the running
interpreter's standard library source (parsed lazily with `summarize`, cached per process),
and `builtins` plus already-loaded C modules by introspection (nothing is imported). Names are
followed by `NameResolver` (`names.py`); this module builds each class's `ClassInfo` from its
summary (or the live class), linearises its bases and finds the members it overrides.

Anything that cannot be followed to a class (an uninstalled package, a base computed by a
call) is `Unresolved`; a class whose MRO contains one has an unresolved MRO, and the rules
report nothing on it. MROs and member lookups are computed on demand and cached.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from kvref.audit.resolve.modules import ModuleTable
from kvref.audit.resolve.names import NameResolver
from kvref.audit.resolve.reachability import Reachability
from kvref.audit.resolve.targets import BUILTINS, ClassInfo, ClassKey, MemberHit, Target, Unresolved
from kvref.audit.summarise.records import FunctionSummary, ModuleSummary

__all__ = ["ProjectIndex"]

_OBJECT_RUNTIME_ONLY = frozenset({"__lt__", "__le__", "__gt__", "__ge__"})
_PROTOCOL = ("typing", "Protocol")
_GENERIC = ("typing", "Generic")
# Special forms to type checkers: their runtime helpers (`__class_getitem__`...) are no
# members a user class overrides.
_SPECIAL_FORMS = frozenset({("typing", "Protocol"), ("typing", "Generic")})


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
        stubs: Mapping[str, str] | None = None,
        search_paths: Sequence[Path] = (),
        package_roots: Sequence[tuple[str, Path]] = (),
        summarize_external: Callable[[Path], ModuleSummary | None] | None = None,
        reach: Reachability | None = None,
        namespaces: frozenset[str] | None = None,
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
            stubs: a project module's name -> the indexed name of its `.pyi` stub, where a
                `.py` claimed the name: a name the module's source does not resolve (a star
                import from an unbuilt C extension, numpy's `multiarray`) is looked up there.
            search_paths: extra roots for installed packages, searched after the project.
            package_roots: (dotted package name, its directory or module file) for editable
                installs made through an import hook, searched after `search_paths`.
            summarize_external: summarizes a standard-library or installed file (the engine
                passes its cached summarizer); by default the file is read and summarized.
            reach: the Python version and platform that decide version and platform checks
                (default: the running interpreter's); what they exclude is no class, member
                or binding, as to the type checkers.
            namespaces: `namespace_names` of every module name and alias above, when the
                caller has it already (one index per edit of a big project: `kvref server`).
        """
        self._table = ModuleTable(
            modules, deferred or {}, aliases or {}, packages, scripts, search_paths,
            package_roots, summarize_external, reach=reach, namespaces=namespaces,
        )
        self.reach = self._table.reach
        self._names = NameResolver(self._table, stubs or {})
        self._names.ancestors = self.known_ancestors
        self._infos: dict[ClassKey, ClassInfo | None] = {}
        self._mros: dict[ClassKey, tuple[ClassKey, ...] | Unresolved] = {}
        self._in_progress: set[ClassKey] = set()
        self._base_infos: dict[ClassKey, list[ClassInfo]] = {}
        self._hits: dict[tuple[ClassKey, str], MemberHit | None] = {}
        self._known_ancestors: dict[ClassKey, tuple[ClassKey, ...]] = {}

    def module(self, name: str) -> ModuleSummary | None:
        """The summary of a module by dotted name (project, search paths, stdlib)."""
        return self._table.module(name)

    def module_exists(self, name: str) -> bool:
        """Whether a module (or namespace package) of that dotted name can be found."""
        return self._table.exists(name)

    def absolute_module(self, module: str, imported: str, level: int) -> str:
        """The absolute name of `from <level dots><imported> import ...` inside `module`."""
        return self._table.absolute_module(module, imported, level)

    # --- names (names.py) -----------------------------------------------------------------

    def resolve(self, module: str, dotted: str, scope: str = "") -> Target:
        """What a dotted expression written in `module` (inside class `scope`) refers to."""
        return self._names.resolve(module, dotted, scope)

    def resolve_class(self, module: str, dotted: str, scope: str = "") -> ClassKey | Unresolved:
        """Like `resolve`, but anything that is not a class becomes `Unresolved`."""
        return self._names.resolve_class(module, dotted, scope)

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
        cls = self._table.class_table(key.module, summary).get(key.qualname)
        if cls is None:
            return self._introspected_info(key)
        methods: dict[str, list[FunctionSummary]] = {}
        reaches = self.reach.reaches
        for method in cls.methods:
            if not method.guard or reaches(method.guard):
                methods.setdefault(method.name, []).append(method)
        attributes = frozenset(cls.attributes) | frozenset(cls.instance_attributes)
        if cls.guarded_attributes:
            attributes |= {name for name, guard in cls.guarded_attributes if reaches(guard)}
        bases: list[ClassKey | Unresolved] = [
            self._names.resolve_base(key, cls, base.dotted) if base.dotted
            else Unresolved(frozenset({base.text}))
            for base in cls.bases
        ]
        if not bases and key != ClassKey(BUILTINS, "object"):
            bases.append(ClassKey(BUILTINS, "object"))
        return ClassInfo(
            key=key,
            summary=cls,
            members=frozenset(methods) | attributes,
            methods=methods,
            bases=tuple(bases),
            is_protocol=any(b == ClassKey(*_PROTOCOL) for b in bases),
            module_summary=summary,
        )

    def _introspected_info(self, key: ClassKey) -> ClassInfo | None:
        value: object = self._names.live_class(key)
        if value is None:
            value = builtins if key.module == BUILTINS else sys.modules.get(key.module)
            for part in key.qualname.split(".") if value is not None else ():
                value = getattr(value, part, None)
        if not isinstance(value, type):
            return None
        bases = tuple(self._names.live_key(b) for b in value.__bases__)
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
        local = [b for b in info.bases if isinstance(b, ClassKey)]
        merged = _c3_merge([*sequences, local])
        if merged is None and _GENERIC in local:
            # `class V(Generic[T], Base[T])`: `Generic[T].__mro_entries__` drops it when a
            # later base is subscripted too (mypy's NodeVisitor), and the later bases'
            # MROs place it.
            kept = [(base, sequence) for base, sequence in zip(local, sequences, strict=True) if base != _GENERIC]
            merged = _c3_merge([*(sequence for _, sequence in kept), [base for base, _ in kept]])
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
