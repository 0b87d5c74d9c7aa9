"""The imports an override's module needs before it can spell a base method's annotation.

The KVR101/KVR103 fixes copy the base's annotation text into the override. Every name in that
text must then mean in the override's module what it means in the base's: a name already bound
to the same thing needs nothing; an unbound one is imported the way the base's module binds it
(`from collections.abc import Collection` where the base module has that line, `from <base
module> import Key` for a name the base module defines), spelled like an import the override's
module already has from that module when there is one. Where that is not safe the fix is not
offered: the name is bound to something else in the override's module (or would shadow a
builtin there), it lives in a class body or a function scope, it is a type parameter of the
base class, it comes from a `TYPE_CHECKING`-only import outside the standard library or from a
definition that only a stub makes.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from collections.abc import Iterator, Sequence

from kvref.audit.model import RequiredImport
from kvref.audit.resolve.hierarchy import ProjectIndex
from kvref.audit.resolve.targets import ClassInfo, ModuleTarget
from kvref.audit.summarise.imports import dotted_name
from kvref.audit.summarise.records import Binding, ModuleSummary

__all__ = ["annotation_names", "required_imports"]

_BUILTIN_NAMES = frozenset(dir(builtins))
# Subscript forms whose arguments are not all types: `Literal["a"]`, `Annotated[T, "meta"]`.
_LITERAL = "Literal"
_ANNOTATED = "Annotated"


class _Unsafe(Exception):
    """A name of the annotation cannot be made to mean the same in the override's module."""


def annotation_names(text: str) -> tuple[tuple[str, ...], ...] | None:
    """The dotted names an annotation uses, as tuples of parts (`("collections", "abc", "Set")`).

    String forward references are read as annotations too; `Literal` arguments and
    `Annotated` metadata are not names. None when the text (or a forward reference in it)
    does not parse as an expression.
    """
    chains: dict[tuple[str, ...], None] = {}
    try:
        _collect(ast.parse(text.strip(), mode="eval").body, chains)
    except (SyntaxError, ValueError, RecursionError):
        return None
    return tuple(chains)


def _collect(node: ast.AST, chains: dict[tuple[str, ...], None]) -> None:
    if isinstance(node, ast.Name | ast.Attribute) and (dotted := dotted_name(node)):
        chains.setdefault(tuple(dotted.split(".")), None)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        _collect(ast.parse(node.value.strip(), mode="eval").body, chains)
    elif isinstance(node, ast.Subscript):
        _collect(node.value, chains)
        head = dotted_name(node.value).rpartition(".")[2]
        if head == _LITERAL:
            return
        elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for element in elements[:1] if head == _ANNOTATED else elements:
            _collect(element, chains)
    else:
        for child in ast.iter_child_nodes(node):
            _collect(child, chains)


def required_imports(
    index: ProjectIndex,
    module: str,
    summary: ModuleSummary,
    owner: ClassInfo,
    base: ClassInfo,
    text: str,
) -> tuple[RequiredImport, ...] | None:
    """What `module` must import so that `text`, written in `base`'s class, means the same there.

    Args:
        index: the project index.
        module: the override's module (primary dotted name) and `summary` its summary.
        owner: the override's class.
        base: the class whose method's annotation `text` is.
        text: the annotation as the base's source spells it.

    Returns:
        The imports to add (none when every name is already bound alike), or None when
        some name cannot be imported safely (the fix must not be offered).
    """
    chains = annotation_names(text)
    if chains is None or base.module_summary is None:
        return None
    imports: dict[RequiredImport, None] = {}
    try:
        for name in dict.fromkeys(chain[0] for chain in chains):
            rooted = [chain for chain in chains if chain[0] == name]
            for needed in _imports_for(index, module, summary, owner, base, name, rooted):
                imports.setdefault(needed, None)
    except _Unsafe:
        return None
    return tuple(imports)


def _imports_for(
    index: ProjectIndex,
    module: str,
    summary: ModuleSummary,
    owner: ClassInfo,
    base: ClassInfo,
    name: str,
    chains: Sequence[tuple[str, ...]],
) -> Iterator[RequiredImport]:
    base_module, base_summary = base.key.module, base.module_summary
    assert base_summary is not None
    if _scope_binds(base, name) or _scope_binds(owner, name):
        raise _Unsafe(name)
    if _type_parameters(base, name) and not _type_parameters(owner, name):
        raise _Unsafe(name)
    here = dict(summary.symbols).get(name, ())
    if index.resolve(base_module, name) == index.resolve(module, name):
        if here and here[0].type_only and not _lazy_annotations(summary):
            raise _Unsafe(name)  # bound only for the type checker, evaluated at run time
        return
    if here or summary.star_imports or name in _BUILTIN_NAMES:
        raise _Unsafe(name)  # bound to something else, possibly, or shadowing a builtin
    there = dict(base_summary.symbols).get(name, ())
    if not there:
        raise _Unsafe(name)  # a builtin the base module shadows, a star import, unbound
    binding = there[0]
    if binding.kind == "import":
        source = index.absolute_module(base_module, binding.module, binding.level)
        _check_source(source, binding)
        spelling = _existing_spelling(index, module, summary, source) or source
        yield RequiredImport(spelling, binding.target, "" if binding.target == name else name)
    elif binding.kind == "module":
        _check_source(binding.target, binding)
        if binding.target.partition(".")[0] != name:  # `import numpy.linalg as la`
            yield RequiredImport(binding.target, "", name)
            return
        for chain in chains:  # `collections.abc.Set`: import `collections.abc`
            prefix = _module_prefix(index, base_module, chain)
            yield RequiredImport(".".join(prefix))
    elif binding.kind == "class" or (
        binding.kind in ("alias", "other") and not base_summary.is_stub
    ):
        if binding.type_only:
            raise _Unsafe(name)  # defined under `if TYPE_CHECKING:`: absent at run time
        spelling = _existing_spelling(index, module, summary, base_module) or base_module
        yield RequiredImport(spelling, name)
    else:
        raise _Unsafe(name)


def _check_source(source: str, binding: Binding) -> None:
    if not source or source == "__future__" or source.partition(".")[0] == "_typeshed":
        raise _Unsafe(source)
    if binding.type_only and source.partition(".")[0] not in sys.stdlib_module_names:
        raise _Unsafe(source)  # may be unimportable at run time, or import in a cycle


def _module_prefix(index: ProjectIndex, module: str, chain: tuple[str, ...]) -> tuple[str, ...]:
    """The longest leading part of a dotted name that is a module (at least its first name)."""
    for length in range(len(chain), 1, -1):
        if isinstance(index.resolve(module, ".".join(chain[:length])), ModuleTarget):
            return chain[:length]
    return chain[:1]


def _existing_spelling(
    index: ProjectIndex, module: str, summary: ModuleSummary, source: str
) -> str:
    """How `module` already spells a run-time `from ... import` of `source` ("" if it does not)."""
    for _, bindings in summary.symbols:
        binding = bindings[0]
        if binding.kind != "import" or binding.type_only:
            continue
        spelled = index.absolute_module(module, binding.module, binding.level)
        # A script imports its sibling `x.py` as plain `x` (its directory is on sys.path).
        sibling = f"{module.rpartition('.')[0]}.{spelled}" if binding.level == 0 else ""
        if source in (spelled, sibling):
            return "." * binding.level + binding.module
    return ""


def _scope_binds(info: ClassInfo, name: str) -> bool:
    """The class body (or an enclosing function) may bind `name`, shadowing the module's."""
    cls = info.summary
    if cls is None:
        return False  # an introspected class: no annotations of its own to copy
    if "<locals>" in info.key.qualname:
        return True  # the function's local names are not summarized
    nested = f"{cls.qualname}.{name}"
    classes = info.module_summary.classes if info.module_summary is not None else ()
    return (
        name in cls.attributes
        or any(method.name == name for method in cls.methods)
        or any(c.qualname == nested for c in classes)
    )


def _type_parameters(info: ClassInfo, name: str) -> bool:
    """`name` appears in a subscripted base of the class (`Generic[T]`, `Base[T]`)."""
    if info.summary is None:
        return False
    pattern = re.compile(rf"\[.*\b{re.escape(name)}\b")
    return any(pattern.search(base.text) for base in info.summary.bases)


def _lazy_annotations(summary: ModuleSummary) -> bool:
    """Annotations are not evaluated at run time: a stub, or `from __future__ import annotations`."""
    if summary.is_stub:
        return True
    bindings = dict(summary.symbols).get("annotations", ())
    return any(b.kind == "import" and b.module == "__future__" for b in bindings)
