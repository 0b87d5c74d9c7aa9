"""KVR101 narrowed-collection-parameter: an override accepts a narrower collection."""

from __future__ import annotations

from collections.abc import Iterator

from typing_extensions import override

from kvref.audit.catalogue import FixSafety
from kvref.audit.model import Finding
from kvref.audit.rules._collection_lattice import Relation, annotation_fix, overridden_parameters
from kvref.audit.rules.base import Rule
from kvref.audit.rules.context import ModuleContext

__all__ = ["NarrowedCollectionParameter"]


class NarrowedCollectionParameter(Rule):
    """Reports an override parameter annotated with a narrower collection than the base's.

    What it does:
        Compares each parameter of an overriding method with the base method's (the nearest
        in the MRO; paired by name, else by position). It reports when the base accepts a
        collection ABC (`Iterable[X]`, `Collection[X]`, `Sequence[X]`...) and the override
        asks for something narrower or unrelated: `Sequence[X]`, `list[X]`, `set[X]`,
        `tuple[X, ...]`, `AbstractSet[X]`, `Mapping[X, V]`...

    Why is this bad?
        Callers that only know the base pass any value the base accepts: a set where the
        override indexes a sequence, a generator where it takes `len`. The override breaks
        the Liskov substitution principle and fails only for some callers.

    Example:
        class Base:
            def touch(self, keys: Collection[Key]) -> None: ...

        class Tier(Base):
            @override
            def touch(self, keys: Sequence[Key]) -> None: ...

    Use instead:
        class Tier(Base):
            @override
            def touch(self, keys: Collection[Key]) -> None: ...

    Fix safety:
        Unsafe: the annotation is rewritten to the base's spelling, but the body may rely on
        the narrower type (indexing, `len`). Names of the base's annotation that the
        override's module lacks are imported as the base's module imports them; when one
        cannot be (bound to something else there, local to the base), no fix is offered.
    """

    code = "KVR101"
    reads_parameters = True
    name = "narrowed-collection-parameter"
    summary = "Reports an override parameter annotated with a narrower collection than the base's."
    message = (
        'Parameter "{param}" of "{method}" narrows "{base_annotation}" of "{base}" to '
        '"{annotation}": callers of the base may pass values the override cannot take'
    )
    fix_safety = FixSafety.UNSAFE
    fix_title = "Annotate the parameter as the base method does"
    unsafe_fix_reason = "the function body may rely on the narrower type (indexing, len)"

    @override
    def check(self, context: ModuleContext) -> Iterator[Finding]:
        # Narrower or unrelated: callers of the base may pass what the override cannot take.
        for pair in overridden_parameters(context, Relation.NARROWED, Relation.INCOMPATIBLE):
            fix = annotation_fix(context, pair, self.fix_title, self.unsafe_fix_reason)
            yield self.report(context, pair.span, pair.symbol, fix, **pair.fields())
