"""Freezing: the records (`kvref.audit.summarise.records`) of what the walker collected.

`summary.py` walks the statements that run at import and collects the module's names and its
class and function nodes; a `Freezer` then turns those nodes into records, given the names:
what a decorator or an annotation means here (`typing.Optional[X]` and `X | None` both become
a `typing.Union`), and where each name and annotation is, in character columns.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvref.audit.source import line_char_col
from kvref.audit.summarise.assignments import instance_attributes
from kvref.audit.summarise.imports import OVERRIDE_MODULES, canonical_type_name, dotted_name
from kvref.audit.summarise.passes import multi_pass_facts
from kvref.audit.summarise.records import (
    BaseRef,
    Binding,
    ClassSummary,
    FunctionSummary,
    MultiPass,
    ParamRow,
    Span,
    TypeExpr,
)

__all__ = ["ClassBuilder", "Freezer"]

_ABSTRACT_DECORATORS = frozenset(
    {"abstractmethod", "abstractproperty", "abstractclassmethod", "abstractstaticmethod"}
)
_BUILTIN_NAMES = frozenset(dir(builtins))
_ITERATION_HEADS = frozenset({"collections.abc.Iterable", "collections.abc.Iterator"})
DEF_NAME = re.compile(r"(?:async\s+)?def\s+|class\s+")


@dataclass(slots=True)
class ClassBuilder:
    """A class statement as the walker found it: its methods and the names its body binds."""

    node: ast.ClassDef
    qualname: str
    scope: str
    methods: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]] = field(
        default_factory=lambda: []
    )
    """Each method with its guard (`kvref.audit.summarise.guards`)."""
    attributes: list[str] = field(default_factory=lambda: [])
    guarded_attributes: list[tuple[str, str]] = field(default_factory=lambda: [])
    guard: str = ""


_LONG_BASE = 60  # characters of a base call shown whole

class Freezer:
    """Builds the records of one module's classes and functions, given its names."""

    def __init__(
        self,
        lines: list[str],
        ascii_only: bool,
        symbols: Mapping[str, tuple[Binding, ...]],
        stars: Sequence[tuple[str, int]],
        with_parameters: bool = True,
        assignments: tuple[list[int], list[str]] = ([], []),
    ) -> None:
        self.lines = lines
        self.assignments = assignments  # `instance_assignments` of the module's text
        self.with_parameters = with_parameters  # False: functions are frozen without them
        self.ascii_only = ascii_only  # byte columns are character columns: no conversion
        self.symbols = symbols
        self.stars = stars
        self.types: dict[str, TypeExpr] = {}

    def freeze_class(self, builder: ClassBuilder) -> ClassSummary:
        node = builder.node
        bases = tuple(
            BaseRef(dotted_name(base) if not isinstance(base, ast.Call) else "", self._base_text(base))
            for base in node.bases
        )
        display = builder.qualname.split("@")[0]
        methods = tuple(
            self.freeze_function(method, f"{display}.{method.name}", guard)
            for method, guard in builder.methods
        )
        unguarded = set(builder.attributes)
        return ClassSummary(
            name=node.name,
            qualname=builder.qualname,
            scope=builder.scope,
            name_span=self._name_span(node),
            bases=bases,
            methods=methods,
            attributes=tuple(dict.fromkeys(builder.attributes)),
            instance_attributes=(
                instance_attributes(self.assignments, [method for method, _ in builder.methods])
                if self.assignments[0] and builder.methods
                else ()
            ),
            guard=builder.guard,
            guarded_attributes=tuple(
                dict.fromkeys(item for item in builder.guarded_attributes if item[0] not in unguarded)
            ),
        )

    def freeze_function(
        self, node: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str, guard: str = ""
    ) -> FunctionSummary:
        # The hottest code of a cold run (one call per `def` of the project): written for
        # speed, with the common cases (no decorator, ASCII line) taking the short paths.
        line = node.lineno
        line_text = self.lines[line - 1]
        col = node.col_offset if self.ascii_only else self._char_col(line, node.col_offset)
        prefix = line_text[:col]
        name_match = DEF_NAME.match(line_text, col)
        name_col = name_match.end() if name_match else col
        params = self._params(node.args) if self.with_parameters else ()
        multi: tuple[MultiPass, ...] = ()
        for _, _, _, _, annotation, _ in params:
            if annotation is not None and annotation.head in _ITERATION_HEADS:
                multi = multi_pass_facts(node, params)
                break
        indent = None if prefix.strip() else prefix
        if not node.decorator_list:
            return FunctionSummary(
                node.name, qualname, name_col, line, indent, (),
                False, False, False, False, False, False, params, multi, guard,
            )  # fmt: skip
        decorators = tuple(dotted_name(d) for d in node.decorator_list)
        lasts = {d.rpartition(".")[2] for d in decorators}
        return FunctionSummary(
            name=node.name,
            qualname=qualname,
            name_col=name_col,
            def_line=line,
            indent=indent,
            decorators=decorators,
            has_override=any(self._is_override(d) for d in decorators),
            is_overload=any(self._resolves_to(d, "overload") for d in decorators),
            is_property="property" in lasts or "cached_property" in lasts,
            is_accessor=any(d.endswith((".setter", ".deleter", ".getter")) for d in decorators),
            is_staticmethod="staticmethod" in decorators,
            is_abstract=bool(lasts & _ABSTRACT_DECORATORS),
            parameters=params,
            multi_pass=multi,
            guard=guard,
        )

    def _params(self, args: ast.arguments) -> tuple[ParamRow, ...]:
        result: list[ParamRow] = []
        self._add_params(result, "posonly", args.posonlyargs)
        self._add_params(result, "arg", args.args)
        if args.vararg is not None:
            self._add_params(result, "vararg", (args.vararg,))
        self._add_params(result, "kwonly", args.kwonlyargs)
        if args.kwarg is not None:
            self._add_params(result, "kwarg", (args.kwarg,))
        return tuple(result)

    def _add_params(
        self, result: list[ParamRow], kind: str, arguments: Sequence[ast.arg]
    ) -> None:
        ascii_only = self.ascii_only
        for argument in arguments:
            annotation = argument.annotation
            line = argument.lineno
            col = argument.col_offset if ascii_only else self._char_col(line, argument.col_offset)
            if annotation is None:
                result.append((argument.arg, kind, line, col, None, None))
            else:
                result.append(
                    (
                        argument.arg,
                        kind,
                        line,
                        col,
                        self._type(annotation),
                        self._position(annotation),
                    )
                )

    # --- names and types ------------------------------------------------------------------

    def _lookup(self, name: str) -> Binding | None:
        bindings = self.symbols.get(name)
        return bindings[0] if bindings else None

    def _qualify(self, dotted: str) -> str:
        """The absolute dotted name of a local spelling, as far as this module knows it."""
        head, _, rest = dotted.partition(".")
        binding = self._lookup(head)
        if binding is None:
            if head in _BUILTIN_NAMES or head == "None":
                return f"builtins.{dotted}" if head != "None" else "None"
            for module, level in self.stars:
                if level == 0 and module in OVERRIDE_MODULES:
                    return f"{module}.{dotted}"
            return dotted
        if binding.kind == "import":
            base = "." * binding.level + binding.module
            qualified = f"{base}.{binding.target}" if base and not base.endswith(".") else base + binding.target
        elif binding.kind == "module":
            qualified = binding.target
        else:
            return dotted
        return f"{qualified}.{rest}" if rest else qualified

    def _resolves_to(self, dotted: str, name: str) -> bool:
        """Whether `dotted` names typing(_extensions).`name` here."""
        module, _, last = self._qualify(dotted).rpartition(".")
        return last == name and module in OVERRIDE_MODULES

    def _is_override(self, dotted: str) -> bool:
        """`override` from typing(_extensions) under any alias, or as a module attribute.

        Only these two count: another object named `override` (Django's translation context
        manager, a local no-op) does not mark an override. A project module that re-exports
        typing's `override` is followed later, by the rules through the index (see
        `kvref.audit.rules._override`): this module alone cannot see where it leads.
        """
        return bool(dotted) and self._resolves_to(dotted, "override")

    def _type(self, node: ast.expr, depth: int = 0, quoted: bool = False) -> TypeExpr:
        """Normalize an annotation; `quoted` parts come from a string (no usable positions).

        Only the annotation and its direct arguments (union members) keep their text: the
        rules never look deeper, and slicing every nested name costs time on big trees.
        """
        text = "" if depth > 1 else ast.unparse(node) if quoted else self._text(node)
        if depth == 0 and not quoted:
            # A module spells the same annotations over and over (`torch.Tensor`, `int`); their
            # meaning depends only on the text and the module's names, so one object serves
            # them all (and pickles once per file).
            known = self.types.get(text)
            if known is None:
                known = self.types[text] = self._type_uncached(node, text, depth, quoted)
            return known
        return self._type_uncached(node, text, depth, quoted)

    def _type_uncached(self, node: ast.expr, text: str, depth: int, quoted: bool) -> TypeExpr:
        if depth > 8:
            return TypeExpr("", (), text)
        if isinstance(node, ast.Constant):
            if node.value is None:
                return TypeExpr("None", (), text)
            if isinstance(node.value, str) and not quoted:
                try:
                    inner = ast.parse(node.value.strip(), mode="eval").body
                except SyntaxError:
                    return TypeExpr("", (), text)
                parsed = self._type(inner, depth + 1, quoted=True)
                return TypeExpr(parsed.head, parsed.args, text)
            if node.value is Ellipsis:
                return TypeExpr("...", (), text)
            return TypeExpr("", (), text)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            members = [self._type(node.left, depth + 1, quoted), self._type(node.right, depth + 1, quoted)]
            return TypeExpr("typing.Union", _flatten_union(members), text)
        if isinstance(node, ast.Subscript):
            head = self._head(node.value)
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            args = tuple(self._type(item, depth + 1, quoted) for item in items)
            if head == "typing.Optional":
                return TypeExpr("typing.Union", _flatten_union([*args, TypeExpr("None")]), text)
            if head == "typing.Union":
                return TypeExpr(head, _flatten_union(list(args)), text)
            return TypeExpr(head, args, text)
        if isinstance(node, ast.Name | ast.Attribute):
            return TypeExpr(self._head(node), (), text)
        if isinstance(node, ast.List):
            return TypeExpr("", tuple(self._type(e, depth + 1, quoted) for e in node.elts), text)
        return TypeExpr("", (), text)

    def _head(self, node: ast.expr) -> str:
        dotted = dotted_name(node) if isinstance(node, ast.Name | ast.Attribute) else ""
        return canonical_type_name(self._qualify(dotted)) if dotted else ""

    # --- positions ------------------------------------------------------------------------

    def _char_col(self, line: int, byte_col: int) -> int:
        return byte_col if self.ascii_only else line_char_col(self.lines, line, byte_col)

    def _position(self, node: ast.expr) -> tuple[int, int, int, int]:
        end_line = node.end_lineno or node.lineno
        if self.ascii_only:
            return (node.lineno, node.col_offset, end_line, node.end_col_offset or 0)
        return (
            node.lineno,
            self._char_col(node.lineno, node.col_offset),
            end_line,
            self._char_col(end_line, node.end_col_offset or 0),
        )

    def _name_col(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> int:
        col = self._char_col(node.lineno, node.col_offset)
        match = DEF_NAME.match(self.lines[node.lineno - 1], col)
        return match.end() if match else col

    def _name_span(self, node: ast.ClassDef) -> Span:
        start = self._name_col(node)
        return Span(node.lineno, start, node.lineno, start + len(node.name))

    def _base_text(self, base: ast.expr) -> str:
        """How an unresolved base is named in a one-line summary: its source, on one line; a
        long or multi-line call as `function(...)` (urllib3's `typing.NamedTuple("Url", [...])`)."""
        one_line = base.lineno == base.end_lineno
        text = self._text(base) if one_line else ast.unparse(base)
        if isinstance(base, ast.Call) and (not one_line or len(text) > _LONG_BASE):
            return f"{ast.unparse(base.func)}(...)"
        return text

    def _text(self, node: ast.expr) -> str:
        line, end_line = node.lineno, node.end_lineno or node.lineno
        if self.ascii_only:
            if line == end_line:
                return self.lines[line - 1][node.col_offset : node.end_col_offset or 0]
            col, end_col = node.col_offset, node.end_col_offset or 0
        else:
            col = self._char_col(line, node.col_offset)
            end_col = self._char_col(end_line, node.end_col_offset or 0)
        if line == end_line:
            return self.lines[line - 1][col:end_col]
        parts = [self.lines[line - 1][col:]]
        parts.extend(self.lines[line : end_line - 1])
        parts.append(self.lines[end_line - 1][:end_col])
        return "\n".join(parts)


def _flatten_union(members: list[TypeExpr]) -> tuple[TypeExpr, ...]:
    flat: list[TypeExpr] = []
    for member in members:
        flat.extend(member.args if member.head == "typing.Union" else (member,))
    return tuple(flat)
