"""How an override's parameter annotation relates to its base's (shared by KVR101 and KVR103).

The collection ABCs and builtins form a lattice (`list` < `MutableSequence` < `Sequence` <
`Collection` < `Iterable`...). An override parameter whose annotation is below or beside the
base's in that lattice accepts fewer values than the base promises (narrowed); one above it
accepts more (widened, legal); the same class spelled differently (`List` vs `list`) is
drift. Only the outer collection is compared; `X | None` is unwrapped when both sides have it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from kvref.audit.fixes.annotation_imports import required_imports
from kvref.audit.fixes.import_edits import import_edits
from kvref.audit.model import CONSTRUCTOR_NAMES, Applicability, Edit, Fix
from kvref.audit.resolve.targets import ClassInfo, MemberHit
from kvref.audit.rules.context import ModuleContext, is_private_name, param_symbol, primary_definition
from kvref.audit.summarise.records import FunctionSummary, Param, Span, TypeExpr

__all__ = [
    "ParamPair",
    "Relation",
    "annotation_fix",
    "compare_annotations",
    "overridden_parameters",
    "paired_parameters",
]

_ABC = "collections.abc."


def _abc(*names: str) -> tuple[str, ...]:
    return tuple(_ABC + name for name in names)


# Each collection class -> its direct supertypes (the space-separated names are ABCs).
_SUPERTYPES: dict[str, tuple[str, ...]] = {
    **{_ABC + k: _abc(*v.split()) for k, v in {
        "Iterator": "Iterable", "Generator": "Iterator", "Reversible": "Iterable",
        "Collection": "Iterable Container Sized", "Sequence": "Collection Reversible",
        "MutableSequence": "Sequence", "Set": "Collection", "MutableSet": "Set",
        "Mapping": "Collection", "MutableMapping": "Mapping", "MappingView": "Sized",
        "KeysView": "MappingView Set", "ItemsView": "MappingView Set",
        "ValuesView": "MappingView Collection",
    }.items()},
    **{"builtins." + k: _abc(v) for k, v in {
        "list": "MutableSequence", "tuple": "Sequence", "str": "Sequence", "bytes": "Sequence",
        "range": "Sequence", "set": "MutableSet", "frozenset": "Set", "dict": "MutableMapping",
    }.items()},
    "collections.deque": _abc("MutableSequence"),
    "collections.OrderedDict": ("builtins.dict",),
    "collections.defaultdict": ("builtins.dict",),
}
_STARRED = ("vararg", "kwarg")
_LATTICE = frozenset(_SUPERTYPES) | {t for ts in _SUPERTYPES.values() for t in ts}


class Relation(enum.Enum):
    """How an override's collection annotation relates to the base's."""

    SAME = "same"
    NARROWED = "narrowed"  # a subclass of the base's collection: accepts fewer values
    INCOMPATIBLE = "incompatible"  # neither sub- nor superclass (Set where Sequence was)
    WIDENED = "widened"  # a superclass: legal, accepts more
    RESPELLED = "respelled"  # the same class under another name (List / list)
    UNKNOWN = "unknown"  # not both known collections


@dataclass(frozen=True, slots=True)
class ParamPair:
    """An override's parameter with the base parameter it corresponds to.

    `owner` is the override's class, `base_owner` the class whose method the base parameter
    belongs to (the names of `base_annotation` are looked up in its scope).
    """

    method: FunctionSummary
    param: Param
    annotation: TypeExpr
    base_name: str
    base_annotation: TypeExpr
    relation: Relation
    owner: ClassInfo
    base_owner: ClassInfo

    @property
    def span(self) -> Span:
        """Where a finding about the parameter points: its annotation."""
        return self.param.annotation_span or self.param.span

    @property
    def symbol(self) -> str:
        """The finding's baseline symbol."""
        return param_symbol(self.method, self.param.name)

    def fields(self) -> dict[str, str]:
        """The message fields: param, method, base, annotation, base_annotation."""
        return {
            "param": self.param.name,
            "method": self.method.qualname,
            "base": self.base_name,
            "annotation": self.annotation.text,
            "base_annotation": self.base_annotation.text,
        }


def _ancestors(head: str) -> set[str]:
    seen = {head}
    stack = [head]
    while stack:
        for parent in _SUPERTYPES.get(stack.pop(), ()):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def _unwrap_optional(expr: TypeExpr) -> TypeExpr | None:
    if expr.head != "typing.Union":
        return None
    rest = [a for a in expr.args if a.head != "None"]
    return rest[0] if len(rest) == 1 and len(rest) < len(expr.args) else None


def _spelling(expr: TypeExpr) -> str:
    """The outer class's name as written (quotes and module prefixes do not count)."""
    return expr.text.strip().strip("\"'").partition("[")[0].strip().rpartition(".")[2]


def compare_annotations(base: TypeExpr, override: TypeExpr) -> Relation:
    """Classify `override` against `base` (UNKNOWN when either is not a known collection)."""
    base_inner, override_inner = _unwrap_optional(base), _unwrap_optional(override)
    if base_inner is not None and override_inner is not None:
        base, override = base_inner, override_inner
    if base.head not in _LATTICE or override.head not in _LATTICE:
        return Relation.UNKNOWN
    if base.head == override.head:
        if _spelling(base) != _spelling(override):
            return Relation.RESPELLED
        return Relation.SAME
    if override.head in _ancestors(base.head):
        return Relation.WIDENED
    if base.head in _ancestors(override.head):
        return Relation.NARROWED
    return Relation.INCOMPATIBLE


def paired_parameters(
    override: FunctionSummary, hit: MemberHit
) -> Iterator[tuple[FunctionSummary, Param, Param]]:
    """Each annotated override parameter with the base parameter it corresponds to.

    Parameters pair by name, else by position among the positional ones; the receiver
    (`self`/`cls`) is skipped. Properties and attribute bases pair nothing.
    """
    if not hit.definitions or override.is_property:
        return
    base = primary_definition(hit.definitions)
    if base.is_property:
        return
    receiver = 0 if override.is_staticmethod else 1
    base_receiver = 0 if base.is_staticmethod else 1
    candidates = base.params[base_receiver:]
    base_params = {p.name: p for p in candidates}
    base_positional: Sequence[Param] = [p for p in candidates if p.kind in ("posonly", "arg")]
    position = 0
    for param in override.params[receiver:]:
        match = base_params.get(param.name)
        if param.kind in ("posonly", "arg"):
            if match is None and position < len(base_positional):
                match = base_positional[position]
            position += 1
        if match is None or param.annotation is None or match.annotation is None:
            continue
        if (match.kind in _STARRED or param.kind in _STARRED) and match.kind != param.kind:
            continue
        yield base, param, match


def overridden_parameters(context: ModuleContext, *relations: Relation) -> Iterator[ParamPair]:
    """Every override parameter in the module whose relation to the base's is in `relations`.

    SAME and UNKNOWN (the vast majority) are never asked for; the other pairs are found once
    per module and shared by the rules that report them (KVR101 and KVR103).
    """
    found = context.derived.get(_PAIRS_KEY)
    if found is None:
        found = context.derived[_PAIRS_KEY] = list(_related_parameters(context))
    return (pair for pair in cast(list[ParamPair], found) if pair.relation in relations)


_PAIRS_KEY = "annotations.related_parameters"
_UNRELATED = frozenset({Relation.SAME, Relation.UNKNOWN})


def _related_parameters(context: ModuleContext) -> Iterator[ParamPair]:
    for cls in context.classes:
        for name, definitions in cls.info.methods.items():
            if is_private_name(name) or name in CONSTRUCTOR_NAMES:
                continue
            hit = context.index.find_member(cls.info.key, name)
            if hit is None:
                continue
            method = primary_definition(definitions)
            for _, param, base_param in paired_parameters(method, hit):
                assert param.annotation is not None and base_param.annotation is not None
                relation = compare_annotations(base_param.annotation, param.annotation)
                if relation not in _UNRELATED:
                    yield ParamPair(
                        method, param, param.annotation, hit.dotted(name), base_param.annotation,
                        relation, cls.info, hit.owner,
                    )


def annotation_fix(context: ModuleContext, pair: ParamPair, title: str, unsafe_reason: str) -> Fix | None:
    """The unsafe fix that rewrites the override's annotation to the base's spelling.

    It also imports what the new text names and the module lacks; None (no fix) when a
    name cannot be imported safely (see `kvref.audit.fixes.annotation_imports`).
    """
    span = pair.param.annotation_span
    text = pair.base_annotation.text
    if span is None or "\n" in text:
        return None
    imports = required_imports(
        context.index, context.module, context.summary, pair.owner, pair.base_owner, text
    )
    if imports is None:
        return None
    edit = Edit(span.line, span.col, span.end_line, span.end_col, text)
    options = context.options
    added = import_edits(
        context.summary.import_facts, imports, newline=context.summary.newline,
        line_length=options.import_line_length, first_party=options.first_party,
    )
    return Fix(Applicability.UNSAFE, (edit, *added), description=title, unsafe_reason=unsafe_reason)
