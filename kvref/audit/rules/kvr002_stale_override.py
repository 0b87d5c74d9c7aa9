"""KVR002 stale-override: `@override` on a method that no base class defines."""

from __future__ import annotations

from collections.abc import Iterator

from typing_extensions import override

from kvref.audit.rules.context import ModuleContext, is_private_name
from kvref.audit.model import Finding
from kvref.audit.rules.base import Rule
from kvref.audit.rules._override import marks_override

__all__ = ["StaleOverride"]


class StaleOverride(Rule):
    """Reports `@override` on a method whose name no class in the MRO binds.

    What it does:
        Finds methods decorated `@override` (typing's or typing_extensions', under any
        alias or re-exported by a project module under that name; a decorator that is merely
        named `override` is something else) when no base class (in the project, the
        standard library or `builtins`) binds that name. Classes with a base
        that cannot be resolved are skipped: the name may well come from there.

    Why is this bad?
        This is the rename case: the base method was renamed or removed and the subclass
        kept the old name, so the "override" is never called by code that uses the base.

    Example:
        class Base:
            def on_finished(self, req): ...

        class Tier(Base):
            @override
            def on_request_finished(self, req): ...

    Use instead:
        class Tier(Base):
            @override
            def on_finished(self, req): ...

    Fix safety:
        No fix: deleting the decorator would hide the bug; the method needs its new name
        (or the base needs the method), which only the author can choose.
    """

    code = "KVR002"
    name = "stale-override"
    summary = "Reports `@override` on a method whose name no class in the MRO binds."
    message = 'Method "{method}" is decorated with @override but no base class of "{cls}" defines "{name}"'

    @override
    def check(self, context: ModuleContext) -> Iterator[Finding]:
        for cls in context.classes:
            for name, definitions in cls.info.methods.items():
                module = cls.info.key.module
                decorated = [d for d in definitions if marks_override(context.index, module, d)]
                if not decorated or is_private_name(name):
                    continue
                if context.index.find_member(cls.info.key, name) is None:
                    target = decorated[0]
                    yield self.report(
                        context,
                        target.name_span,
                        target.qualname,
                        method=target.qualname,
                        cls=cls.info.key.qualname,
                        name=name,
                    )
