"""KVR001 missing-override: a method overrides a base class's member without `@override`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

from typing_extensions import override

from kvref.audit.catalogue import FixSafety
from kvref.audit.rules.context import ModuleContext, is_private_name, primary_definition
from kvref.audit.fixes.import_edits import import_edits
from kvref.audit.model import AnalysisOptions, Applicability, Edit, Finding, Fix, RequiredImport
from kvref.audit.fixes.override_spelling import override_spelling
from kvref.audit.resolve.targets import BUILTINS, MemberHit
from kvref.audit.rules.base import Rule
from kvref.audit.rules._override import marks_override
from kvref.audit.summarise.records import ClassSummary, FunctionSummary

__all__ = ["MissingOverride"]


class MissingOverride(Rule):
    """Reports a method that overrides a base-class member but is not decorated `@override`.

    What it does:
        Finds every method whose name is bound by a class later in the MRO (anywhere in the
        project, the standard library or `builtins`) and that carries no `@override`
        (`typing.override` or `typing_extensions.override`, under any alias, as a module
        attribute, or re-exported by a project module). Another decorator that happens to be
        named `override` (Django's translation context manager) is not the marker.

    Why is this bad?
        Without the decorator nothing connects the method to the one it replaces: when the
        base method is renamed or removed, the override silently becomes dead code and
        callers get the base behaviour. With `@override` a type checker (and KVR002) flags
        the rename.

    Policy (the defaults follow pyright's `reportImplicitOverride` and mypy's
    `explicit-override`): `__init__`, `__new__`, `__init_subclass__` and `__post_init__` are
    exempt; overrides of `object`'s methods (`__repr__`, `__eq__`), implementations of
    abstract methods and members of Protocol bases are reported; class-private `__names`
    never override. A class with a base that cannot be resolved (an uninstalled package) is
    still checked against the bases that do resolve, as the type checkers do, and what they
    never analyse is not reported (docs/AUDIT_AGREEMENT.md).

    Example:
        class Tier(Base):
            def lookup(self, keys): ...

    Use instead:
        class Tier(Base):
            @override
            def lookup(self, keys): ...

    Fix safety:
        Safe: `@override` (which only sets `__override__`) becomes the innermost decorator
        and its import is merged where ruff's isort puts it: `typing_extensions.override`, or
        `typing.override` on a Python 3.12+ floor (`target-version`, `requires-python`),
        aliased (`override as typing_override`) when the name is bound to something else.
        Unsafe where it would import `typing_extensions` and the project does not declare
        it; the fix's description says what to add.
    """

    code = "KVR001"
    name = "missing-override"
    summary = "Reports a method that overrides a base-class member but is not decorated `@override`."
    message = 'Method "{method}" overrides "{base}" but is not decorated with @override'
    fix_safety = FixSafety.SAFE
    fix_title = "Add @override"

    @override
    def check(self, context: ModuleContext) -> Iterator[Finding]:
        options = context.options
        infos = [cls.info for cls in context.classes]
        infos.extend(context.partial_classes)
        infos.sort(key=lambda info: info.summary.name_span.line if info.summary else 0)
        for info in infos:  # a `def` the body rebinds after it is still judged, as it is to them
            for name, definitions in info.methods.items():
                if is_private_name(name) or name in options.exempt_names:
                    continue
                if any(d.has_override for d in definitions):
                    continue
                hit = context.index.find_known_member(info.key, name)
                if hit is None or not _required(hit, options):
                    continue
                if any(
                    marks_override(context.index, info.key.module, d, any_spelling=True)
                    for d in definitions
                ):
                    continue  # a project module's re-export of typing_extensions' override
                target = primary_definition(definitions)
                if target.def_line in context.summary.type_ignore_lines:
                    continue  # hidden from the type checkers by a bare `# type: ignore`
                yield self.report(
                    context,
                    target.name_span,
                    target.qualname,
                    _insert_override(context, info.summary, target),
                    method=target.qualname,
                    base=hit.dotted(name),
                )


def _required(hit: MemberHit, options: AnalysisOptions) -> bool:
    if hit.owner.key.module == BUILTINS and hit.owner.key.qualname == "object":
        return options.object_dunders
    if hit.is_abstract and not options.abstract_implementations:
        return False
    return options.protocol_members or not hit.owner.is_protocol


_FIX_CACHE = "kvr001.fixes"
_IMPORT_CACHE = "kvr001.import_edits"


def _insert_override(context: ModuleContext, cls: ClassSummary | None, target: FunctionSummary) -> Fix | None:
    if target.indent is None:  # `class A: def f(self): ...` on one line: no room for a line
        return None
    summary = context.summary
    # One spelling and one import edit per class (a large project has ten thousand findings).
    cache = cast(dict[int, tuple[str, tuple[Edit, ...], str]], context.derived.setdefault(_FIX_CACHE, {}))
    known = cache.get(id(cls))
    if known is None:
        options = context.options
        spelling, needed, caveat = override_spelling(summary, cls, options, context.derived)
        imports: tuple[Edit, ...] = ()
        if needed:
            edits = cast(dict[tuple[RequiredImport, ...], tuple[Edit, ...]], context.derived.setdefault(_IMPORT_CACHE, {}))
            if needed not in edits:
                edits[needed] = import_edits(
                    summary.import_facts,
                    needed,
                    newline=summary.newline,
                    line_length=options.import_line_length,
                    first_party=options.first_party,
                )
            imports = edits[needed]
        known = cache[id(cls)] = (spelling, imports, caveat)
    spelling, imports, caveat = known
    decorator = Edit(target.def_line, 0, target.def_line, 0, f"{target.indent}@{spelling}{summary.newline}")
    return Fix(
        applicability=Applicability.UNSAFE if caveat else Applicability.SAFE,
        edits=tuple(sorted((decorator, *imports), key=lambda edit: (edit.start_line, edit.start_col))),
        description=f"{MissingOverride.fix_title} (unsafe: {caveat})" if caveat else MissingOverride.fix_title,
        unsafe_reason=caveat,
    )
