"""Whether a method carries `@override`: typing's or typing_extensions', and nothing else.

The summary already knows the decorators that name `override` through the module's own imports
(`from typing_extensions import override as ovr`, `te.override`, the `try`/`except ImportError`
fallback between the two). A decorator named `override` bound some other way is followed here
through the project index: a project's `compat` module that re-exports typing_extensions'
`override` marks overrides, while Django's `django.utils.translation.override` (a context
manager) or a local `def override(f)` does not. Shared by KVR001 and KVR002.
"""

from __future__ import annotations

from typing import Final

from kvref.audit.resolve.hierarchy import ProjectIndex
from kvref.audit.resolve.targets import ClassKey, ModuleTarget, Unresolved
from kvref.audit.summarise.records import FunctionSummary

__all__ = ["OVERRIDE_FUNCTIONS", "marks_override"]

OVERRIDE_FUNCTIONS: Final = frozenset({"typing.override", "typing_extensions.override"})


def marks_override(
    index: ProjectIndex, module: str, function: FunctionSummary, *, any_spelling: bool = False
) -> bool:
    """Whether one of `function`'s decorators is `typing(_extensions).override`.

    Args:
        index: the project index (follows re-exports through project modules).
        module: the module that defines `function` (its decorators are written there).
        function: the method.
        any_spelling: follow every decorator, not only those spelled `...override`
            (`marker = typing_extensions.override` in another module). Following a decorator
            may summarise the module it comes from (`functools`, say): KVR001 asks this only
            of a method it is about to report, KVR002 of every method, so it does not.

    Returns:
        True when a decorator refers to typing's or typing_extensions' `override`.
    """
    if function.has_override:
        return True
    for decorator in function.decorators:
        if not decorator or (not any_spelling and decorator.rpartition(".")[2] != "override"):
            continue
        if _refers_to_override(index, module, decorator):
            return True
    return False


def _refers_to_override(index: ProjectIndex, module: str, dotted: str) -> bool:
    target = index.resolve(module, dotted)
    if isinstance(target, ClassKey | ModuleTarget):
        return False
    if isinstance(target, Unresolved):  # typing_extensions itself need not be installed
        return bool(target.names & OVERRIDE_FUNCTIONS)
    return target.dotted in OVERRIDE_FUNCTIONS
