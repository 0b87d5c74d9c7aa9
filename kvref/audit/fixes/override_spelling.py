"""How a fix spells the `override` decorator in a module, and the import that makes it so.

The decorator must mean `typing_extensions.override` (or `typing.override`) wherever the fix
puts it: a module that binds `override` to something else (a translation context manager, a
local function, a star import) or a class body that does keeps that binding, and the fix
imports the decorator under a free alias instead. `typing.override` is written only where the
project's Python floor is 3.12+; `typing_extensions` only counts as safe to import where the
project's declarations install it for the file (a run-time dependency; a development one for
tests and tools; `[build-system] requires` for `setup.py`), or where the module imports it
already.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvref.audit.discover.project import is_build_file, is_development_file
from kvref.audit.fixes.import_edits import parse_block
from kvref.audit.model import AnalysisOptions, RequiredImport, TypingExtensions
from kvref.audit.summarise.imports import OVERRIDE_MODULES
from kvref.audit.summarise.records import Binding, ClassSummary, ModuleSummary

__all__ = ["override_spelling"]


@dataclass(frozen=True, slots=True)
class _ModuleFacts:
    """What a module binds, as far as spelling `override` goes (computed once per module)."""

    candidates: tuple[tuple[str, str], ...]  # (bound name, spelling), in order of preference
    names: frozenset[str]
    imports_typing_extensions: bool
    sys_state: str  # "bound" (by the leading import block), "importable" there, or "taken"


def _module_facts(summary: ModuleSummary, modern: bool) -> _ModuleFacts:
    plain: list[tuple[str, str]] = []
    qualified: list[tuple[str, str]] = []
    # Only an import in the leading block runs wherever the module does: one under
    # `if sys.version_info < (3, 13):` or in a `try` says nothing about newer Pythons.
    block = parse_block(summary.import_facts)
    imports_te = any(statement.module == "typing_extensions" for statement in block)
    for name, bindings in summary.symbols:
        runtime = True
        all_override = all_module = True
        for binding in bindings:
            runtime = runtime and not binding.type_only
            kind = binding.kind
            all_override = all_override and _is_override_import(binding)
            all_module = all_module and kind == "module" and (
                binding.target == "typing_extensions" or (modern and binding.target == "typing")
            )
        if not runtime:
            continue
        if all_override:
            plain.append((name, name))
        elif all_module:
            qualified.append((name, f"{name}.override"))
    plain.sort(key=lambda item: (item[0] != "override", item[0]))
    qualified.sort()
    names = frozenset(name for name, _ in summary.symbols)
    # The version check goes right after the leading block: `sys` must be bound there already,
    # else imported there (harmless where every other binding of `sys` is the module too).
    sys_bindings = dict(summary.symbols).get("sys", ())
    only_the_module = all(b.kind == "module" and b.target == "sys" and not b.type_only for b in sys_bindings)
    if only_the_module and any(statement.module == "sys" and not statement.is_from for statement in block):
        sys_state = "bound"
    elif only_the_module and (sys_bindings or not summary.star_imports):
        sys_state = "importable"
    else:
        sys_state = "taken"
    return _ModuleFacts((*plain, *qualified), names, imports_te, sys_state)


def override_spelling(
    summary: ModuleSummary,
    cls: ClassSummary | None,
    options: AnalysisOptions,
    cache: dict[str, object] | None = None,
) -> tuple[str, tuple[RequiredImport, ...], str]:
    """How the decorator is spelled in a class of `summary`, and the import that makes it so.

    A name the module already binds to `typing.override` / `typing_extensions.override` (or a
    module `typing_extensions`, or `typing` on a 3.12+ floor, for `te.override`) is reused.
    Otherwise the decorator is imported from `typing` where the project's floor is 3.12+ and
    it prefers `typing` or does not declare `typing_extensions`, else from
    `typing_extensions`; as `override` when nothing else binds that name in the module or the
    class body (a star import may bind any public name), else under a free alias. Where
    `typing_extensions` is installed below Python 3.12 only, the import is a version check:
    `typing`'s from 3.12 on, `typing_extensions`' before.

    Args:
        summary: the module; cls: the class the decorator goes in (None: module level).
        options: the project's floor, declarations and `override-import`.
        cache: a per-module dict to keep the module's part of the answer in.

    Returns:
        (spelling, imports to add, unsafe reason): why the fix is unsafe ("" when it is
        safe): it would import `typing_extensions`, which the project's declarations may not
        install where this file runs.
    """
    modern = options.python_floor is not None and options.python_floor >= _TYPING_OVERRIDE_SINCE
    facts = cache.get(_CACHE_KEY) if cache is not None else None
    if not isinstance(facts, _ModuleFacts):
        facts = _module_facts(summary, modern)
        if cache is not None:
            cache[_CACHE_KEY] = facts
    in_class: set[str] = set()
    if cls is not None:
        in_class = set(cls.attributes) | {method.name for method in cls.methods}
    for name, spelling in facts.candidates:
        if name not in in_class:
            return spelling, (), ""
    module = (
        "typing"
        if modern and (options.override_import == "typing" or options.typing_extensions != "runtime")
        else "typing_extensions"
    )

    def free(name: str) -> bool:
        public = not name.startswith("_")
        return name not in facts.names and name not in in_class and not (public and summary.star_imports)

    alias = next(name for name in _ALIASES if free(name))
    as_name = "" if alias == "override" else alias
    declared = options.typing_extensions
    caveat = ""
    if module == "typing_extensions" and is_build_file(summary.path) and not facts.imports_typing_extensions:
        if not options.build_typing_extensions:
            caveat = _BUILD_CAVEAT
    elif (
        module == "typing_extensions"
        and declared != "runtime"
        and not (declared == "development" and is_development_file(summary.path))
        and not facts.imports_typing_extensions
    ):
        if declared == "before-3.12" and facts.sys_state != "taken":
            versioned = RequiredImport("typing", "override", as_name, older=module, since=_TYPING_OVERRIDE_SINCE)
            return alias, (versioned,) if facts.sys_state == "bound" else (RequiredImport("sys"), versioned), ""
        caveat = _CAVEATS[declared]
    return alias, (RequiredImport(module, "override", as_name),), caveat


_CACHE_KEY = "override_spelling.module"
# Short: a large project repeats them on thousands of findings in a JSON report.
_CAVEATS: dict[TypingExtensions, str] = {
    "undeclared": 'typing_extensions is undeclared; add it to the dependencies or set target-version = "py312"',
    "development": 'typing_extensions is only a development dependency; add it to the dependencies or set target-version = "py312"',
    "conditional": 'typing_extensions is a dependency under a marker only; drop the marker or set target-version = "py312"',
    "before-3.12": 'typing_extensions is a dependency below Python 3.12 only, and "sys" is taken',
    "runtime": "",
}
_BUILD_CAVEAT = 'setup.py runs where only [build-system] requires is installed; add typing_extensions there'
_TYPING_OVERRIDE_SINCE = (3, 12)
# The names the decorator is imported under, in order of preference (the first that is free).
_ALIASES = ("override", "typing_override", "_typing_override", *(f"_typing_override{n}" for n in range(2, 100)))


def _is_override_import(binding: Binding) -> bool:
    return (
        binding.kind == "import"
        and binding.level == 0
        and binding.module in OVERRIDE_MODULES
        and binding.target == "override"
    )
