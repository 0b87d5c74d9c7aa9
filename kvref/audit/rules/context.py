"""What a rule sees of one module: its summary, its resolved classes, the project index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvref.audit.model import AnalysisOptions
from kvref.audit.resolve.hierarchy import ProjectIndex
from kvref.audit.resolve.targets import ClassInfo, ClassKey
from kvref.audit.summarise.records import FunctionSummary, ModuleSummary

__all__ = [
    "ClassContext",
    "ModuleContext",
    "is_private_name",
    "param_symbol",
    "primary_definition",
]


@dataclass(frozen=True, slots=True)
class ClassContext:
    """A class of the module whose MRO resolved completely (others get no override findings)."""

    info: ClassInfo
    mro: tuple[ClassKey, ...]


@dataclass(frozen=True, slots=True)
class ModuleContext:
    """One reported module.

    Attributes:
        path: project-relative, `/`-separated.
        module: its primary dotted name.
        summary: its summary.
        classes: its classes with a resolved MRO, in source order.
        index: the project index (for base-class lookups).
        options: the analysis policy.
        partial_classes: its classes whose MRO does not resolve (a base from an uninstalled
            package): only a rule that a known base proves (KVR001) looks at them, through
            `ProjectIndex.find_known_member`.
        derived: facts about the module that several rules need, computed by the first rule
            that asks and kept here for the others (see `kvref.audit.rules._collection_lattice`).
    """

    path: str
    module: str
    summary: ModuleSummary
    classes: Sequence[ClassContext]
    index: ProjectIndex
    options: AnalysisOptions
    partial_classes: Sequence[ClassInfo] = ()
    derived: dict[str, object] = field(default_factory=lambda: {})


def is_private_name(name: str) -> bool:
    """A class-private (mangled) name: `__x` but not `__x__`. It never overrides anything."""
    return name.startswith("__") and not name.endswith("__")


def primary_definition(definitions: Sequence[FunctionSummary]) -> FunctionSummary:
    """The definition a type checker judges for a name defined several times in a class.

    The implementation of an overload group (the first overload in a stub), the getter of a
    property with accessors, otherwise the last definition (a conditional redefinition).
    """
    candidates = [d for d in definitions if not d.is_accessor] or list(definitions)
    implementations = [d for d in candidates if not d.is_overload]
    if implementations:
        getters = [d for d in implementations if d.is_property]
        return getters[0] if getters else implementations[-1]
    return candidates[0]


def param_symbol(function: FunctionSummary, param: str) -> str:
    """The baseline symbol of a parameter finding: `Class.method.param`."""
    return f"{function.qualname}.{param}"
