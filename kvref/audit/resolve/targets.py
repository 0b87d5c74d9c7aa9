"""What a name resolves to: a class (`ClassKey`), a module, something else, or nothing known."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvref.audit.summarise.records import ClassSummary, FunctionSummary, ModuleSummary

__all__ = ["BUILTINS", "ClassInfo", "ClassKey", "MemberHit", "ModuleTarget", "NotAClass", "Target", "Unresolved"]

BUILTINS = "builtins"


class ClassKey(NamedTuple):
    """A class by the module that defines it and its qualified name there.

    A named tuple rather than a dataclass: keys are hashed millions of times on big trees.
    """

    module: str
    qualname: str

    @property
    def dotted(self) -> str:
        """The class's full dotted name (a stub indexed beside its module, `m@m.pyi`, as `m`)."""
        module = self.module.partition("@")[0] if self.module.endswith(".pyi") else self.module
        return f"{module}.{self.qualname}"


@dataclass(frozen=True, slots=True)
class ModuleTarget:
    """A name that resolved to a module."""

    name: str


@dataclass(frozen=True, slots=True)
class Unresolved:
    """Something that could not be followed to a class; `names` are dotted, for the summary."""

    names: frozenset[str]


@dataclass(frozen=True, slots=True)
class NotAClass:
    """A name bound to something other than a class or module (a function, a value)."""

    dotted: str


Target = ClassKey | ModuleTarget | Unresolved | NotAClass


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
    def is_abstract(self) -> bool:
        """The base declares it abstract."""
        return any(d.is_abstract for d in self.definitions)

    def dotted(self, name: str) -> str:
        """The member's full dotted name, e.g. `kvref.base.OffloadingManager.lookup`."""
        return f"{self.owner.key.dotted}.{name}"