"""Name resolution: what a dotted expression written in a module refers to.

`NameResolver.resolve` follows a name through the module's bindings (imports, class
definitions, aliases, star imports, a `__getattr__` that imports it lazily), `typing`'s
redirects, a `.pyi` stub beside its `.py`, and, for `builtins` and loaded C modules, the live
objects by introspection (nothing is imported). The answer is a `Target`: a class (`ClassKey`),
a module, something else (`NotAClass`), or `Unresolved` naming what could not be followed.
Classes and their MROs are `hierarchy.py`'s (`ProjectIndex`, which resolves through this).
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence

from kvref.audit.resolve.modules import ModuleTable
from kvref.audit.resolve.stdlib import TYPING_REDIRECTS, is_loaded_stdlib, loaded_extension
from kvref.audit.resolve.targets import (
    BUILTINS,
    ClassKey,
    ModuleTarget,
    NotAClass,
    Target,
    Unresolved,
)
from kvref.audit.summarise.records import Binding, ClassSummary, ModuleSummary

__all__ = ["NameResolver"]


class NameResolver:
    """Resolves names across the modules of a `ModuleTable`; see the module docstring.

    Answers are cached per (module, name, scope), and the live classes met by introspection are
    remembered by key, so `ProjectIndex` can read their bases and members.
    """

    def __init__(self, table: ModuleTable, stubs: Mapping[str, str]) -> None:
        """Resolve names over `table`.

        Args:
            table: the modules, by dotted name.
            stubs: a project module's name -> the indexed name of its `.pyi` stub, where a
                `.py` claimed the name (see `ProjectIndex`).
        """
        self.table = table
        self._stubs = stubs
        self._names: dict[tuple[str, str, str], Target] = {}
        self._live: dict[ClassKey, type] = {}
        self._resolving: set[tuple[str, str]] = set()
        # A class's resolvable ancestors (`ProjectIndex.known_ancestors`), for the nested
        # classes it inherits (`String.Comparator` defined in a base of `String`).
        self.ancestors: Callable[[ClassKey], Sequence[ClassKey]] | None = None

    def module(self, name: str) -> ModuleSummary | None:
        """The summary of a module by dotted name (project, search paths, stdlib)."""
        return self.table.module(name)

    def absolute_module(self, module: str, imported: str, level: int) -> str:
        """The absolute name of `from <level dots><imported> import ...` inside `module`."""
        return self.table.absolute_module(module, imported, level)

    def resolve(self, module: str, dotted: str, scope: str = "") -> Target:
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
        name = target.dotted if isinstance(target, NotAClass) else target.name
        return Unresolved(frozenset({name}))

    def _resolve_name(self, module: str, name: str, scope: str) -> Target:
        module = self.table.aliases.get(module, module)
        cache_key = (module, name, scope)
        cached = self._names.get(cache_key)
        if cached is None:
            cached = self._resolve_name_uncached(module, name, scope)
            self._names[cache_key] = cached
        return cached

    def _resolve_name_uncached(
        self, module: str, name: str, scope: str, defining: str = ""
    ) -> Target:
        if module == BUILTINS or (summary := self.module(module)) is None:
            return self._introspected_member(module, name)
        classes = self.table.class_table(module, summary)
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
        stub = self._stubs.get(module)
        if isinstance(found, Unresolved) and stub is not None:
            in_stub = self._resolve_name(stub, name, "")
            if isinstance(in_stub, ClassKey | ModuleTarget):
                return in_stub
        if not isinstance(found, ClassKey | ModuleTarget) and is_loaded_stdlib(module):
            # `types.ModuleType = type(sys)`: the source cannot tell, the loaded module can.
            live = self._introspected_member(module, name, sys.modules[module])
            if isinstance(live, ClassKey):
                return live
        return found

    def resolve_base(self, key: ClassKey, cls: ClassSummary, dotted: str) -> ClassKey | Unresolved:
        """A base expression of `cls`, with the name bound where the class statement runs:
        `class Thread(Thread):` means the name bound before, and so does a name that a class
        statement further down the module rebinds (Django's `Transform`, imported, then
        defined after the classes that derive from the imported one)."""
        head, _, rest = dotted.partition(".")
        defining = key.qualname if head == cls.name else self._defined_later(key.module, head, cls)
        if not defining:
            return self.resolve_class(key.module, dotted, cls.scope)
        target = self._resolve_name_uncached(key.module, head, cls.scope, defining=defining)
        for attribute in rest.split(".") if rest else ():
            target = self._member(target, attribute)
        if isinstance(target, ClassKey | Unresolved):
            return target
        return Unresolved(frozenset({dotted}))

    def _defined_later(self, module: str, name: str, cls: ClassSummary) -> str:
        """The qualname of the module-level class statement that binds `name` first to the
        checkers, when it comes after `cls`'s own (then not yet run there); else ""."""
        summary = self.module(module)
        if cls.scope or summary is None:
            return ""
        bindings = self.table.symbol_table(module, summary).get(name, ())
        if not bindings or bindings[0].kind != "class" or len(bindings) < 2:
            return ""
        later = self.table.class_table(module, summary).get(bindings[0].target)
        return bindings[0].target if later is not None and later.name_span.line > cls.name_span.line else ""

    def _resolve_global(
        self, module: str, summary: ModuleSummary, name: str, defining: str = ""
    ) -> Target:
        bindings = self.table.symbol_table(module, summary).get(name, ())
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
            if exported is None and loaded_extension(source) is not None:
                target = self._introspected_member(source, name)
                if not isinstance(target, Unresolved):
                    return target
        if hasattr(builtins, name):
            return self._introspected_member(BUILTINS, name)
        return Unresolved(frozenset({f"{module}.{name}"}))

    def _exports(self, module: str, summary: ModuleSummary, name: str) -> bool:
        if summary.all_names is not None:
            return name in summary.all_names
        table = self.table.symbol_table(module, summary)
        return not name.startswith("_") and (
            name in table or any(self._star_exports(module, summary, name))
        )

    def _star_exports(self, module: str, summary: ModuleSummary, name: str) -> Iterable[bool]:
        for star_module, level in summary.star_imports:
            source = self.absolute_module(module, star_module, level)
            exported = self.module(source)
            yield exported is not None and source != module and self._exports(source, exported, name)

    def _follow(self, module: str, binding: Binding, name: str) -> Target:
        if binding.kind == "class":
            return ClassKey(module, binding.target)
        if binding.kind == "module":
            target = self._script_sibling(module, binding.target)
            if self.table.exists(target):
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
            if not self.table.exists(source):
                submodule = f"{source}.{binding.target}" if source else binding.target
                if self.table.exists(submodule):
                    return ModuleTarget(submodule)
                return Unresolved(frozenset({f"{source}.{binding.target}"}))
            return self._member(ModuleTarget(source), binding.target)
        if binding.kind == "alias" and binding.target == name and hasattr(builtins, name):
            # `TimeoutError = TimeoutError` (asyncio.exceptions): the builtin, read before the
            # module binds its own name.
            return self._introspected_member(BUILTINS, name)
        if binding.kind == "alias" and binding.target:
            return self.resolve(module, binding.target)
        return NotAClass(f"{module}.{name}")

    def _script_sibling(self, module: str, imported: str) -> str:
        """`imported` as a script sees it: a module next to it wins when nothing else exists.

        A file outside any regular package (a script, a test directory without
        `__init__.py`) runs with its own directory on `sys.path`.
        """
        if module not in self.table.scripts or "." not in module or self.table.exists(imported):
            return imported
        sibling = f"{module.rpartition('.')[0]}.{imported}"
        return sibling if self.table.exists(sibling) else imported

    def _typing_member(self, name: str) -> Target | None:
        if name in TYPING_REDIRECTS:
            module, attribute = TYPING_REDIRECTS[name]
            return self._resolve_name(module, attribute, "")
        if name in ("Protocol", "Generic"):
            return self._resolve_name("typing", name, "") if self.module("typing") else None
        if name == "Any":
            return Unresolved(frozenset({"typing.Any"}))
        return None

    def _member(self, target: Target, attribute: str) -> Target:
        if isinstance(target, ModuleTarget):
            target = ModuleTarget(self.table.aliases.get(target.name, target.name))
            if target.name in ("typing", "typing_extensions"):
                redirected = self._typing_member(attribute)
                if redirected is not None:
                    return redirected
            summary = self.module(target.name)
            submodule = f"{target.name}.{attribute}"
            if summary is not None:
                table = self.table.symbol_table(target.name, summary)
                if attribute in table or any(self._star_exports(target.name, summary, attribute)):
                    found = self._resolve_name(target.name, attribute, "")
                    # `from torch import nn` inside torch/__init__.py: the submodule.
                    if isinstance(found, ClassKey | ModuleTarget) or not self.table.exists(
                        submodule
                    ):
                        return found
                    return ModuleTarget(submodule)
                if self.table.exists(submodule):
                    return ModuleTarget(submodule)
                if target.name in self._stubs:
                    return self._resolve_name(target.name, attribute, "")  # through the stub
                return Unresolved(frozenset({submodule}))
            if self.table.exists(submodule):
                return ModuleTarget(submodule)
            return self._introspected_member(target.name, attribute)
        if isinstance(target, ClassKey):
            # A class nested in a class the sources define (`Outer.Inner`), or in one of its
            # bases (`String.Comparator`, where a base of `String` defines `Comparator`).
            nested = self._nested_class(target, attribute)
            if nested is None and self.ancestors is not None:
                for ancestor in self.ancestors(target):
                    nested = self._nested_class(ancestor, attribute)
                    if nested is not None:
                        break
            return nested or NotAClass(f"{target.dotted}.{attribute}")
        if isinstance(target, Unresolved):
            return Unresolved(frozenset(f"{n}.{attribute}" for n in target.names))
        return NotAClass(f"{target.dotted}.{attribute}")

    def _nested_class(self, owner: ClassKey, attribute: str) -> ClassKey | None:
        summary = None if owner.module == BUILTINS else self.module(owner.module)
        if summary is None:
            return None
        classes = self.table.class_table(owner.module, summary)
        nested = f"{owner.qualname}.{attribute}"
        return ClassKey(owner.module, nested) if owner.qualname in classes and nested in classes else None

    def _introspected_member(
        self, module: str, name: str, loaded: types.ModuleType | None = None
    ) -> Target:
        if loaded is None:
            loaded = builtins if module == BUILTINS else loaded_extension(module)
        value = getattr(loaded, name, None) if loaded is not None else None
        if isinstance(value, type):
            return self.live_key(value)
        if isinstance(value, types.ModuleType):
            return ModuleTarget(value.__name__)
        if value is not None:
            return NotAClass(f"{module}.{name}")
        return Unresolved(frozenset({f"{module}.{name}"}))

    def live_key(self, value: type) -> ClassKey:
        """The key of a live class, remembered: `types.ModuleType` says it is `builtins.module`."""
        key = ClassKey(value.__module__, value.__qualname__)
        self._live.setdefault(key, value)
        return key

    def live_class(self, key: ClassKey) -> type | None:
        """The live class met by introspection under `key`, if any."""
        return self._live.get(key)
