"""How a fix spells the `override` decorator in a module, and the import that makes it so.

The decorator must mean `typing_extensions.override` (or `typing.override`) wherever the fix
puts it: a module that binds `override` to something else (a translation context manager, a
local function, a star import) or a class body that does keeps that binding, and the fix
imports the decorator under a free alias instead. `typing.override` is written only where the
project's Python floor is 3.12+; `typing_extensions` only counts as safe to import where the
project declares it (or the module imports it already).
"""

from __future__ import annotations

from kvref.audit.model import AnalysisOptions, RequiredImport
from kvref.audit.summary import OVERRIDE_MODULES, Binding, ClassSummary, ModuleSummary

__all__ = ["override_spelling"]


def override_spelling(
    summary: ModuleSummary, cls: ClassSummary | None, options: AnalysisOptions
) -> tuple[str, RequiredImport | None, str]:
    """How the decorator is spelled in a class of `summary`, and the import that makes it so.

    A name the module already binds to `typing.override` / `typing_extensions.override` (or a
    module `typing_extensions`, or `typing` on a 3.12+ floor, for `te.override`) is reused.
    Otherwise the decorator is imported from `typing` where the project's floor is 3.12+ and
    it prefers `typing` or does not declare `typing_extensions`, else from
    `typing_extensions`; as `override` when nothing else binds that name in the module or the
    class body (a star import may bind any public name), else under a free alias.

    Returns:
        (spelling, import to add or None, caveat): the caveat says why the fix is unsafe
        ("" when it is safe): it would import `typing_extensions`, which the project does
        not declare.
    """
    symbols = dict(summary.symbols)
    in_class: set[str] = set()
    if cls is not None:
        in_class = set(cls.attributes) | {method.name for method in cls.methods}
    modern = options.python_floor is not None and options.python_floor >= _TYPING_OVERRIDE_SINCE
    plain: list[str] = []
    qualified: list[str] = []
    for name, bindings in symbols.items():
        if name in in_class or any(binding.type_only for binding in bindings):
            continue
        if all(_is_override_import(binding) for binding in bindings):
            plain.append(name)
        elif all(
            binding.kind == "module"
            and (binding.target == "typing_extensions" or (modern and binding.target == "typing"))
            for binding in bindings
        ):
            qualified.append(f"{name}.override")
    if plain or qualified:
        found = sorted(plain, key=lambda name: name != "override") + sorted(qualified)
        return found[0], None, ""
    module = (
        "typing"
        if modern and (options.override_import == "typing" or not options.typing_extensions_declared)
        else "typing_extensions"
    )

    def free(name: str) -> bool:
        public = not name.startswith("_")
        return name not in symbols and name not in in_class and not (public and summary.star_imports)

    alias = next(name for name in _ALIASES if free(name))
    caveat = ""
    if module == "typing_extensions" and not options.typing_extensions_declared and not any(
        _binds_from_typing_extensions(bindings) for bindings in symbols.values()
    ):
        # Short: a large project repeats it on thousands of findings in a JSON report.
        caveat = (
            "unsafe: typing_extensions is undeclared; add it to the dependencies or set "
            'target-version = "py312"'
        )

    needed = RequiredImport(module, "override", "" if alias == "override" else alias)
    return alias, needed, caveat


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


def _binds_from_typing_extensions(bindings: tuple[Binding, ...]) -> bool:
    """The module imports `typing_extensions` at run time already (so it is installed)."""
    return any(
        not binding.type_only
        and (
            (binding.kind == "import" and binding.level == 0 and binding.module == "typing_extensions")
            or (binding.kind == "module" and binding.target == "typing_extensions")
        )
        for binding in bindings
    )
