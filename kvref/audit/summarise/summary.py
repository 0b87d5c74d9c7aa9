"""One module's facts for the audit, extracted in a single parse and one targeted walk.

`summarize(path, source)` turns a file into a `ModuleSummary`: its import bindings, classes
(with bases as dotted names, methods, decorators, parameters and their annotations), module
functions, the KVR102 multi-pass facts of every parameter annotated `Iterable`/`Iterator`,
and where the fixer may add the `override` import. A summary holds only frozen dataclasses,
tuples, strings, ints and bools (no `ast` objects), so it pickles and can be cached on disk.

Positions: lines are 1-based, `Span` columns 0-based characters (not UTF-8 bytes), end
exclusive, the convention of `kvref.audit.model.Edit`.

Only what runs when the module is imported is walked: module and class bodies, through
`if`/`try`/`with` blocks. Function bodies are entered only for KVR102, and only when a
parameter is annotated `Iterable`/`Iterator`, and for the classes they define (a class inside a
function is indexed as `f.<locals>.Cls`, its bases resolved from the module's names, as the
type checkers check it; names bound locally in the function are not followed).
"""

from __future__ import annotations

import ast
import bisect
import builtins
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

from kvref.audit.source import SummaryError, decode_source, detect_newline, line_char_col, split_lines
from kvref.audit.summarise.imports import OVERRIDE_MODULES, canonical_type_name, dotted_name, import_facts
from kvref.audit.summarise.records import (
    BaseRef,
    Binding,
    ClassSummary,
    FunctionSummary,
    ImportFacts,
    ModuleSummary,
    MultiPass,
    Param,
    ParamRow,
    Span,
    TypeExpr,
)
from kvref.audit.summarise.suppress import candidate_lines

__all__ = [
    "OVERRIDE_MODULES",
    "BaseRef",
    "Binding",
    "ClassSummary",
    "FunctionSummary",
    "ImportFacts",
    "ModuleSummary",
    "MultiPass",
    "Param",
    "ParamRow",
    "Span",
    "SummaryError",
    "TypeExpr",
    "canonical_type_name",
    "dotted_name",
    "decode_source",
    "detect_newline",
    "import_facts",
    "split_lines",
    "summarize",
    "target_names",
]

_ABSTRACT_DECORATORS = frozenset(
    {"abstractmethod", "abstractproperty", "abstractclassmethod", "abstractstaticmethod"}
)
_BUILTIN_NAMES = frozenset(dir(builtins))
_ITERATION_HEADS = frozenset({"collections.abc.Iterable", "collections.abc.Iterator"})
_DEF_NAME = re.compile(r"(?:async\s+)?def\s+|class\s+")
_CLASS_WORD = re.compile(r"class\b")


_OTHER: Final = Binding("other")
_OTHER_TYPE_ONLY: Final = Binding("other", type_only=True)


def summarize(path: str, source: bytes) -> ModuleSummary:
    """Summarize one file's source.

    Args:
        path: the path recorded in the summary (the engine passes it project-relative).
        source: the file's bytes, decoded per PEP 263.

    Returns:
        The module's summary.

    Raises:
        SummaryError: the source cannot be decoded or does not parse (with its position).
    """
    text, _, _ = decode_source(source)
    try:
        try:
            tree = ast.parse(text, filename=path, type_comments=False)
        except SyntaxError:
            # Maybe syntax newer than this Python: parsed by a newer interpreter if one is
            # at hand (imported only here: most runs never need it).
            from kvref.audit.summarise.newer_syntax import parse_source

            tree = parse_source(text, path)
    except SyntaxError as error:
        # "uses Python 3.12 syntax (...)" (from `parse_source`) is not a mistake in the file.
        message = error.msg if error.msg.startswith("uses Python ") else f"syntax error: {error.msg}"
        raise SummaryError(message, error.lineno or 1, error.offset or 1) from None
    except (ValueError, RecursionError) as error:  # NUL bytes, absurd nesting
        raise SummaryError(f"cannot parse: {error}") from None
    newline = detect_newline(text)
    lines = split_lines(text)
    walker = _ModuleWalker(lines, path.endswith(".pyi"), text.isascii(), _indented_class_lines(text))
    walker.walk_body(tree.body, "", None)
    return walker.finish(
        path,
        newline,
        import_facts(tree, lines, with_block=bool(walker.classes)),
        candidate_lines(text),
    )


@dataclass(slots=True)
class _ClassBuilder:
    node: ast.ClassDef
    qualname: str
    scope: str
    methods: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]] = field(
        default_factory=lambda: []
    )
    attributes: list[str] = field(default_factory=lambda: [])


class _ModuleWalker:
    """Collects bindings, classes and functions from the statements that run at import."""

    def __init__(
        self, lines: list[str], is_stub: bool, ascii_only: bool, local_class_lines: list[int]
    ) -> None:
        self.lines = lines
        # Lines that may hold a class statement inside a function; a function body with none
        # of them in its range is not walked (most are not, and walking them all is costly).
        self.local_class_lines = local_class_lines
        self.types: dict[str, TypeExpr] = {}
        self.ascii_only = ascii_only  # byte columns are character columns: no conversion
        self.is_stub = is_stub
        self.primary: dict[str, list[Binding]] = {}
        self.fallback: dict[str, list[Binding]] = {}
        self.stars: list[tuple[str, int]] = []
        self.all_names: tuple[str, ...] | None = None
        self.classes: list[_ClassBuilder] = []
        self.functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        self.symbols: dict[str, tuple[Binding, ...]] = {}

    # --- walking --------------------------------------------------------------------------

    def walk_body(
        self, body: Sequence[ast.stmt], mode: str, owner: _ClassBuilder | None
    ) -> None:
        """Walk statements; mode is "" (runs), "type" (TYPE_CHECKING) or "fallback"."""
        for statement in body:
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                if owner is not None:
                    owner.methods.append((statement, mode))
                    qualname = f"{owner.qualname}.{statement.name}"
                else:
                    self.functions.append(statement)
                    self._bind(statement.name, _OTHER, mode)
                    qualname = statement.name
                if self._may_define_classes(statement):
                    self._walk_local_classes(statement.body, f"{qualname}.<locals>")
            elif isinstance(statement, ast.ClassDef):
                self._walk_class(statement, mode, owner)
            elif isinstance(statement, ast.If):
                body_mode, else_mode = mode, mode
                checking = _type_checking_test(statement.test)
                if checking is True:
                    body_mode, else_mode = "type", "fallback"
                elif checking is False:
                    body_mode, else_mode = "fallback", "type"
                self.walk_body(statement.body, body_mode, owner)
                self.walk_body(statement.orelse, else_mode, owner)
            elif isinstance(statement, ast.Try | ast.TryStar):
                self.walk_body(statement.body, mode, owner)
                for handler in statement.handlers:
                    self.walk_body(handler.body, "fallback", owner)
                self.walk_body(statement.orelse, mode, owner)
                self.walk_body(statement.finalbody, mode, owner)
            elif isinstance(statement, ast.With | ast.AsyncWith):
                self.walk_body(statement.body, mode, owner)
            elif owner is not None:
                owner.attributes.extend(_assigned_names(statement, slots=True))
            else:
                self._module_statement(statement, mode)

    def _walk_class(self, node: ast.ClassDef, mode: str, owner: _ClassBuilder | None) -> None:
        scope = owner.qualname if owner is not None else ""
        qualname = f"{scope}.{node.name}" if scope else node.name
        builder = _ClassBuilder(node, qualname, scope)
        self.classes.append(builder)
        if owner is not None:
            owner.attributes.append(node.name)
        else:
            self._bind(node.name, Binding("class", qualname), mode)
        self.walk_body(node.body, "", builder)

    def _may_define_classes(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        candidates = self.local_class_lines
        if not candidates:
            return False
        first = bisect.bisect_left(candidates, node.lineno)
        return first < len(candidates) and candidates[first] <= (node.end_lineno or node.lineno)

    def _walk_local_classes(self, body: Sequence[ast.stmt], scope: str) -> None:
        """Index the classes a function body defines (statements only, never expressions)."""
        for statement in body:
            if isinstance(statement, ast.ClassDef):
                builder = _ClassBuilder(statement, f"{scope}.{statement.name}", scope)
                self.classes.append(builder)
                self.walk_body(statement.body, "", builder)
            elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                self._walk_local_classes(statement.body, f"{scope}.{statement.name}.<locals>")
            elif isinstance(statement, ast.If | ast.For | ast.AsyncFor | ast.While):
                self._walk_local_classes(statement.body, scope)
                self._walk_local_classes(statement.orelse, scope)
            elif isinstance(statement, ast.Try | ast.TryStar):
                self._walk_local_classes(statement.body, scope)
                for handler in statement.handlers:
                    self._walk_local_classes(handler.body, scope)
                self._walk_local_classes(statement.orelse, scope)
                self._walk_local_classes(statement.finalbody, scope)
            elif isinstance(statement, ast.With | ast.AsyncWith):
                self._walk_local_classes(statement.body, scope)
            elif isinstance(statement, ast.Match):
                for case in statement.cases:
                    self._walk_local_classes(case.body, scope)

    def _module_statement(self, statement: ast.stmt, mode: str) -> None:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.asname:
                    self._bind(alias.asname, Binding("module", alias.name), mode)
                else:
                    head = alias.name.partition(".")[0]
                    self._bind(head, Binding("module", head), mode)
        elif isinstance(statement, ast.ImportFrom):
            module = statement.module or ""
            for alias in statement.names:
                if alias.name == "*":
                    self.stars.append((module, statement.level))
                else:
                    binding = Binding("import", alias.name, module, statement.level)
                    self._bind(alias.asname or alias.name, binding, mode)
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            value = statement.value
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                if not isinstance(target, ast.Name):
                    for name in target_names(target):
                        self._bind(name, _OTHER, mode)
                elif target.id == "__all__":
                    self.all_names = _literal_strings(value)
                elif value is not None:  # a bare `x: int` binds nothing at run time
                    # `Base = pkg.Base` and `IntStore = Store[int]` alias a class.
                    aliased = isinstance(value, ast.Name | ast.Attribute | ast.Subscript)
                    dotted = dotted_name(value) if aliased else ""
                    binding = Binding("alias", dotted) if dotted else _OTHER
                    self._bind(target.id, binding, mode)
        elif (
            isinstance(statement, ast.AugAssign)
            and isinstance(statement.target, ast.Name)
            and statement.target.id == "__all__"
        ):
            added = _literal_strings(statement.value)
            if self.all_names is not None and added is not None:
                self.all_names = (*self.all_names, *added)
        else:
            for name in _assigned_names(statement, slots=False):
                self._bind(name, _OTHER, mode)

    def _bind(self, name: str, binding: Binding, mode: str) -> None:
        if mode == "type":
            binding = (
                _OTHER_TYPE_ONLY
                if binding is _OTHER
                else Binding(binding.kind, binding.target, binding.module, binding.level, True)
            )
        if mode == "fallback":
            self.fallback.setdefault(name, []).append(binding)
        else:
            self.primary.setdefault(name, []).append(binding)

    # --- freezing -------------------------------------------------------------------------

    def finish(
        self,
        path: str,
        newline: str,
        facts: ImportFacts,
        suppression_lines: tuple[int, ...],
    ) -> ModuleSummary:
        symbols: dict[str, tuple[Binding, ...]] = {}
        for name in {**self.primary, **self.fallback}:
            # The latest unconditional binding wins; except-handler and TYPE_CHECKING-else
            # alternatives are only tried after it.
            ordered = [*reversed(self.primary.get(name, ())), *self.fallback.get(name, ())]
            symbols[name] = tuple(ordered)
        self.symbols = symbols
        # A class defined twice (`if`/`else`, `try`/`except`): the last definition keeps its
        # name (names resolve to it); earlier ones get a unique `Name@line` qualname.
        last_line = {builder.qualname: builder.node.lineno for builder in self.classes}
        for builder in self.classes:
            if last_line[builder.qualname] != builder.node.lineno:
                builder.qualname = f"{builder.qualname}@{builder.node.lineno}"
        classes = tuple(self._freeze_class(builder) for builder in self.classes)
        # Module functions matter only to KVR102: skip those with no Iterable/Iterator hint.
        functions = tuple(
            summary
            for node in self.functions
            if _mentions_iteration(node.args)
            and (summary := self._freeze_function(node, node.name, False)).multi_pass
        )
        return ModuleSummary(
            path=path,
            newline=newline,
            is_stub=self.is_stub,
            symbols=tuple(sorted(symbols.items())),
            star_imports=tuple(self.stars),
            all_names=self.all_names,
            classes=classes,
            functions=functions,
            import_facts=facts,
            suppression_lines=suppression_lines,
        )

    def _freeze_class(self, builder: _ClassBuilder) -> ClassSummary:
        node = builder.node
        bases = tuple(
            BaseRef(dotted_name(base) if not isinstance(base, ast.Call) else "", self._text(base))
            for base in node.bases
        )
        display = builder.qualname.split("@")[0]
        methods = tuple(
            self._freeze_function(method, f"{display}.{method.name}", True)
            for method, _ in builder.methods
        )
        return ClassSummary(
            name=node.name,
            qualname=builder.qualname,
            scope=builder.scope,
            name_span=self._name_span(node),
            bases=bases,
            methods=methods,
            attributes=tuple(dict.fromkeys(builder.attributes)),
        )

    def _freeze_function(
        self, node: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str, is_method: bool
    ) -> FunctionSummary:
        # The hottest code of a cold run (one call per `def` of the project): written for
        # speed, with the common cases (no decorator, ASCII line) taking the short paths.
        line = node.lineno
        line_text = self.lines[line - 1]
        col = node.col_offset if self.ascii_only else self._char_col(line, node.col_offset)
        prefix = line_text[:col]
        name_match = _DEF_NAME.match(line_text, col)
        name_col = name_match.end() if name_match else col
        params = self._params(node.args)
        multi: tuple[MultiPass, ...] = ()
        for _, _, _, _, annotation, _ in params:
            if annotation is not None and annotation.head in _ITERATION_HEADS:
                multi = _multi_pass_facts(node, params)
                break
        indent = None if prefix.strip() else prefix
        if not node.decorator_list:
            return FunctionSummary(
                node.name, qualname, name_col, line, indent, (),
                False, False, False, False, False, False, params, multi,
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

    def _col(self, node: ast.expr | ast.arg) -> int:
        return node.col_offset if self.ascii_only else self._char_col(node.lineno, node.col_offset)

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
        match = _DEF_NAME.match(self.lines[node.lineno - 1], col)
        return match.end() if match else col

    def _name_span(self, node: ast.ClassDef) -> Span:
        start = self._name_col(node)
        return Span(node.lineno, start, node.lineno, start + len(node.name))

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


def _indented_class_lines(text: str) -> list[int]:
    """The lines that start with indentation and `class`: a superset of where a function body
    can define a class (a class statement always begins a line, and inside a function that
    line is indented; matches inside strings only cost a needless walk)."""
    if "\r" in text:  # line numbers count every line break Python's tokenizer knows
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines: list[int] = []
    line, position = 1, 0
    rfind = text.rfind
    # Finding the word and looking back is twice as fast as a pattern tried at every line.
    for match in _CLASS_WORD.finditer(text):
        start = match.start()
        begin = rfind("\n", 0, start) + 1
        if begin == 0 or begin == start or text[begin:start].strip(" \t\f"):
            continue
        line += text.count("\n", position, start)
        position = start
        lines.append(line)
    return lines


def _mentions_iteration(args: ast.arguments) -> bool:
    """A cheap pre-check: some parameter annotation names `...Iter...` (maybe quoted)."""
    for argument in (*args.posonlyargs, *args.args, *args.kwonlyargs):
        annotation = argument.annotation
        if isinstance(annotation, ast.Subscript):
            annotation = annotation.value
        if isinstance(annotation, ast.Name) and "Iter" in annotation.id:
            return True
        if isinstance(annotation, ast.Attribute) and "Iter" in annotation.attr:
            return True
        if isinstance(annotation, ast.Constant) and "Iter" in str(annotation.value):
            return True
    return False


def _multi_pass_facts(
    node: ast.FunctionDef | ast.AsyncFunctionDef, params: tuple[ParamRow, ...]
) -> tuple[MultiPass, ...]:
    # KVR102 owns this analysis; imported on first use, since the rules import this module.
    from kvref.audit.rules._kvr102_passes import multi_pass_facts

    return multi_pass_facts(node, params)


def target_names(target: ast.expr) -> Iterator[str]:
    """The names an assignment target binds (through tuples, lists and starred targets)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from target_names(element)
    elif isinstance(target, ast.Starred):
        yield from target_names(target.value)


def _flatten_union(members: list[TypeExpr]) -> tuple[TypeExpr, ...]:
    flat: list[TypeExpr] = []
    for member in members:
        flat.extend(member.args if member.head == "typing.Union" else (member,))
    return tuple(flat)


def _type_checking_test(test: ast.expr) -> bool | None:
    """True for `if TYPE_CHECKING:`, False for `if not TYPE_CHECKING:`, else None."""
    negated = False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        negated, test = True, test.operand
    if dotted_name(test).rpartition(".")[2] == "TYPE_CHECKING" and not isinstance(
        test, ast.Call | ast.Subscript
    ):
        return not negated
    return None


def _literal_strings(node: ast.expr | None) -> tuple[str, ...] | None:
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        names = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        strings = tuple(n for n in names if isinstance(n, str))
        return strings if len(strings) == len(node.elts) else None
    return None


def _assigned_names(statement: ast.stmt, *, slots: bool) -> Iterator[str]:
    """Names a simple statement binds (in a class body, `__slots__` entries too)."""
    if isinstance(statement, ast.Assign):
        for target in statement.targets:
            yield from target_names(target)
            if slots and isinstance(target, ast.Name) and target.id == "__slots__":
                yield from _literal_strings(statement.value) or ()
    elif isinstance(statement, ast.AnnAssign | ast.AugAssign):
        yield from target_names(statement.target)
    elif isinstance(statement, ast.Import | ast.ImportFrom):
        for alias in statement.names:
            if alias.name != "*":
                yield alias.asname or alias.name.partition(".")[0]
    elif isinstance(statement, ast.For | ast.AsyncFor):
        yield from target_names(statement.target)
