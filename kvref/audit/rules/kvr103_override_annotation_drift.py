"""KVR103 override-annotation-drift: an override spells a parameter's collection differently."""

from __future__ import annotations

from collections.abc import Iterator

from typing_extensions import override

from kvref.audit.catalogue import FixSafety
from kvref.audit.model import Finding
from kvref.audit.rules._collection_lattice import Relation, annotation_fix, overridden_parameters
from kvref.audit.rules.base import Rule
from kvref.audit.rules.context import ModuleContext

__all__ = ["OverrideAnnotationDrift"]


class OverrideAnnotationDrift(Rule):
    """Reports an override parameter whose collection annotation legally differs from the base's.

    What it does:
        Compares each parameter of an overriding method with the base method's and reports
        when the override widens the collection (`Iterable[X]` where the base says
        `Collection[X]`) or names the same class differently (`List[X]` against `list[X]`).
        Off by default: select it with `--select KVR103`.

    Why is this bad?
        It is type-correct, but the family of signatures is no longer uniform: readers
        cannot tell which contract holds, and the next override copies the odd one out
        (vLLM's `CachePolicy.touch(Iterable)` against `OffloadingManager.touch(Collection)`).

    Example:
        class Base:
            def touch(self, keys: Collection[Key]) -> None: ...

        class Tier(Base):
            @override
            def touch(self, keys: Iterable[Key]) -> None: ...

    Use instead:
        class Tier(Base):
            @override
            def touch(self, keys: Collection[Key]) -> None: ...

    Fix safety:
        Unsafe: rewriting a widened annotation to the base's narrows what direct callers of
        the override may pass. Names the module lacks are imported as the base's module
        imports them; when one cannot be, no fix is offered.
    """

    code = "KVR103"
    reads_parameters = True
    name = "override-annotation-drift"
    summary = "Reports an override parameter whose collection annotation legally differs from the base's."
    message = (
        'Parameter "{param}" of "{method}" is annotated "{annotation}" but "{base}" '
        'declares "{base_annotation}"'
    )
    default_enabled = False
    fix_safety = FixSafety.UNSAFE
    fix_title = "Annotate the parameter as the base method does"
    unsafe_fix_reason = "direct callers of the override may pass what only the wider annotation allows"

    @override
    def check(self, context: ModuleContext) -> Iterator[Finding]:
        # Legal but not uniform: a wider collection, or the same one spelled differently.
        for pair in overridden_parameters(context, Relation.WIDENED, Relation.RESPELLED):
            fix = annotation_fix(context, pair, self.fix_title, self.unsafe_fix_reason)
            yield self.report(context, pair.span, pair.symbol, fix, **pair.fields())
