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
type checkers check it; names bound locally in the function are not followed). The walk
collects names and nodes; `freeze.py` turns the nodes into records.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterator, Sequence
from typing import Final, cast

from kvref.audit.source import SummaryError, decode_source, detect_newline, split_lines
from kvref.audit.summarise.assignments import instance_assignments, target_names
from kvref.audit.summarise.freeze import ClassBuilder, Freezer
from kvref.audit.summarise.guards import NEVER, branch_guards, join_guards
from kvref.audit.summarise.imports import dotted_name, import_facts
from kvref.audit.summarise.records import Binding, ImportFacts, ModuleSummary
from kvref.audit.summarise.suppress import candidate_lines, type_ignore_lines

__all__ = ["summarize", "summarize_without_parameters"]

_CLASS_WORD = re.compile(r"class\b")


_SIMPLE, _FUNCTION, _CLASS, _BLOCK = range(4)
# The statements `walk_body` looks into; any other is a simple statement (it may bind names).
_STATEMENT_KINDS: Final[dict[type[ast.stmt], int]] = {
    ast.FunctionDef: _FUNCTION,
    ast.AsyncFunctionDef: _FUNCTION,
    ast.ClassDef: _CLASS,
    ast.If: _BLOCK,
    ast.Try: _BLOCK,
    ast.TryStar: _BLOCK,
    ast.With: _BLOCK,
    ast.AsyncWith: _BLOCK,
}

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
    return _summarize(path, source, with_parameters=True)


def summarize_without_parameters(path: str, source: bytes) -> ModuleSummary:
    """`summarize`, less what only the rules that read parameters use (`Rule.reads_parameters`):
    every function's `parameters` and `multi_pass` are empty, and the module's `functions`
    (kept for KVR102 alone) too. For a run whose summaries are not kept beyond it.
    """
    return _summarize(path, source, with_parameters=False)


def _summarize(path: str, source: bytes, *, with_parameters: bool) -> ModuleSummary:
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
    walker = _ModuleWalker(
        lines, path.endswith(".pyi"), text.isascii(), _indented_class_lines(text), with_parameters
    )
    walker.walk_body(tree.body, "", None)
    if walker.classes:
        walker.assignments = instance_assignments(text)
    return walker.finish(
        path,
        newline,
        import_facts(tree, lines, with_block=bool(walker.classes)),
        candidate_lines(text),
        type_ignore_lines(text) if walker.classes else (),
    )


class _ModuleWalker:
    """Collects bindings, classes and functions from the statements that run at import."""

    def __init__(
        self,
        lines: list[str],
        is_stub: bool,
        ascii_only: bool,
        local_class_lines: list[int],
        with_parameters: bool = True,
    ) -> None:
        self.lines = lines
        self.with_parameters = with_parameters
        # Lines that may hold a class statement inside a function; a function body with none
        # of them in its range is not walked (most are not, and walking them all is costly).
        self.local_class_lines = local_class_lines
        self.ascii_only = ascii_only  # byte columns are character columns: no conversion
        self.is_stub = is_stub
        self.primary: dict[str, list[Binding]] = {}
        self.fallback: dict[str, list[Binding]] = {}
        self.stars: list[tuple[str, int]] = []
        self.all_names: tuple[str, ...] | None = None
        self.classes: list[ClassBuilder] = []
        self.functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        # How many `if` branches enclose the statement walked, and the names a class statement
        # outside any binds: a type checker resolves such a name to the class even where a
        # branch rebinds it (`if not ssl: HTTPSConnection = DummyConnection`).
        self.conditional = 0
        self.declared_classes: set[str] = set()
        self.never: dict[str, list[Binding]] = {}
        self.assignments: tuple[list[int], list[str]] = ([], [])
        self.guarded = False

    # --- walking --------------------------------------------------------------------------

    def walk_body(
        self, body: Sequence[ast.stmt], mode: str, owner: ClassBuilder | None, guard: str = ""
    ) -> None:
        """Walk statements; mode is "" (runs), "type" (TYPE_CHECKING) or "fallback"; `guard`
        is what the checkers need to hold to analyse them (`guards.py`)."""
        if guard:
            self.guarded = True
        for statement in body:
            if type(statement) is ast.Assert:
                # `assert sys.platform == "win32"`: the checkers stop analysing the rest of the
                # block where it is false (click's _winconsole module).
                asserted = branch_guards(statement.test)
                if asserted is not None and asserted[0]:
                    guard = join_guards(guard, asserted[0])
                    self.guarded = True
                continue
            # Dispatched on the exact node type (the parser makes no subclasses): one lookup
            # per statement instead of a chain of `isinstance` calls.
            kind = _STATEMENT_KINDS.get(type(statement), _SIMPLE)
            if kind == _SIMPLE:
                if owner is not None:
                    if guard:
                        owner.guarded_attributes.extend(
                            (name, guard) for name in _assigned_names(statement, slots=True)
                        )
                    else:
                        owner.attributes.extend(_assigned_names(statement, slots=True))
                else:
                    self._module_statement(statement, mode, guard)
            elif kind == _FUNCTION:
                function = cast("ast.FunctionDef | ast.AsyncFunctionDef", statement)
                if owner is not None:
                    owner.methods.append((function, guard))
                    qualname = f"{owner.qualname}.{function.name}"
                else:
                    self.functions.append(function)
                    self._bind(function.name, _OTHER, mode, guard)
                    qualname = function.name
                    if function.name == "__getattr__":
                        self._lazy_attributes(function)
                if self._may_define_classes(function):
                    self._walk_local_classes(function.body, f"{qualname}.<locals>")
            elif kind == _CLASS:
                self._walk_class(cast(ast.ClassDef, statement), mode, owner, guard)
            elif isinstance(statement, ast.If):
                body_mode, else_mode = mode, mode
                checking = _type_checking_test(statement.test)
                if checking is True:
                    body_mode, else_mode = "type", "fallback"
                elif checking is False:
                    body_mode, else_mode = "fallback", "type"
                guards = branch_guards(statement.test) or ("", "")
                self.conditional += 1
                self.walk_body(statement.body, body_mode, owner, join_guards(guard, guards[0]))
                self.walk_body(statement.orelse, else_mode, owner, join_guards(guard, guards[1]))
                self.conditional -= 1
            elif isinstance(statement, ast.Try | ast.TryStar):
                self.walk_body(statement.body, mode, owner, guard)
                for handler in statement.handlers:
                    self.walk_body(handler.body, "fallback", owner, guard)
                self.walk_body(statement.orelse, mode, owner, guard)
                self.walk_body(statement.finalbody, mode, owner, guard)
            elif isinstance(statement, ast.With | ast.AsyncWith):
                self.walk_body(statement.body, mode, owner, guard)

    def _lazy_attributes(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """PEP 562: the names a module's `__getattr__` imports on first access become fallback
        bindings (`unittest.IsolatedAsyncioTestCase`, `concurrent.futures.ThreadPoolExecutor`).

        An import counts when the name it binds is declared `global` or compared with the
        attribute name (`if name == "Foo": from .foo import Foo`); `global Foo; from .foo import
        Foo as f; Foo = f` binds `Foo` too.
        """
        nodes = list(ast.walk(function))
        named = {name for node in nodes if isinstance(node, ast.Global) for name in node.names}
        named |= {
            constant.value
            for node in nodes
            if isinstance(node, ast.Compare)
            for constant in ast.walk(node)
            if isinstance(constant, ast.Constant) and isinstance(constant.value, str)
        }
        imported = {
            alias.asname or alias.name: Binding("import", alias.name, node.module or "", node.level)
            for node in nodes
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if alias.name != "*"
        }
        for node in nodes:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in imported:
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id in named:
                        self._bind(target.id, imported[node.value.id], "fallback")
        for name, binding in imported.items():
            if name in named:
                self._bind(name, binding, "fallback")

    def _walk_class(
        self, node: ast.ClassDef, mode: str, owner: ClassBuilder | None, guard: str = ""
    ) -> None:
        scope = owner.qualname if owner is not None else ""
        qualname = f"{scope}.{node.name}" if scope else node.name
        builder = ClassBuilder(node, qualname, scope, guard=guard)
        self.classes.append(builder)
        if owner is not None:
            if guard:
                owner.guarded_attributes.append((node.name, guard))
            else:
                owner.attributes.append(node.name)
        else:
            self._bind(node.name, Binding("class", qualname), mode, guard)
        self.walk_body(node.body, "", builder, guard)

    def _may_define_classes(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        candidates = self.local_class_lines
        if not candidates:
            return False
        first = bisect.bisect_left(candidates, node.lineno)
        return first < len(candidates) and candidates[first] <= (node.end_lineno or node.lineno)

    def _walk_local_classes(self, body: Sequence[ast.stmt], scope: str) -> None:
        """Index the classes a function body defines (statements only, never expressions)."""
        for statement in body:
            if isinstance(statement, ast.Import | ast.ImportFrom):
                # The class's bases may name what the function imports (`import sqlite3` in
                # the function, then `class Cursor(sqlite3.Cursor)`): an alternative binding
                # of the module's, tried after any the module makes itself.
                self._module_statement(statement, "fallback", "")
            elif isinstance(statement, ast.ClassDef):
                builder = ClassBuilder(statement, f"{scope}.{statement.name}", scope)
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

    def _module_statement(self, statement: ast.stmt, mode: str, guard: str) -> None:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.asname:
                    self._bind(alias.asname, Binding("module", alias.name), mode, guard)
                else:
                    head = alias.name.partition(".")[0]
                    self._bind(head, Binding("module", head), mode, guard)
        elif isinstance(statement, ast.ImportFrom):
            module = statement.module or ""
            for alias in statement.names:
                if alias.name == "*":
                    self.stars.append((module, statement.level))
                else:
                    binding = Binding("import", alias.name, module, statement.level)
                    self._bind(alias.asname or alias.name, binding, mode, guard)
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            value = statement.value
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                if not isinstance(target, ast.Name):
                    for name in target_names(target):
                        self._bind(name, _OTHER, mode, guard)
                elif target.id == "__all__":
                    self.all_names = _literal_strings(value)
                elif value is not None:  # a bare `x: int` binds nothing at run time
                    # `Base = pkg.Base` and `IntStore = Store[int]` alias a class.
                    aliased = isinstance(value, ast.Name | ast.Attribute | ast.Subscript)
                    dotted = dotted_name(value) if aliased else ""
                    binding = Binding("alias", dotted) if dotted else _OTHER
                    self._bind(target.id, binding, mode, guard)
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
                self._bind(name, _OTHER, mode, guard)

    def _bind(self, name: str, binding: Binding, mode: str, guard: str = "") -> None:
        if guard == NEVER:
            # The `else` of `if TYPE_CHECKING:`, which the checkers never read: tried last.
            self.never.setdefault(name, []).append(binding)
            return
        if mode == "type" or guard:
            binding = (
                _OTHER_TYPE_ONLY
                if binding is _OTHER and not guard
                else Binding(
                    binding.kind, binding.target, binding.module, binding.level, mode == "type", guard
                )
            )
        if mode == "fallback":
            self.fallback.setdefault(name, []).append(binding)
        elif name in self.declared_classes and self.conditional and binding.kind != "class":
            # A class statement's name rebound in a branch: the class stays what the name
            # means to the checkers; the other binding is only an alternative.
            self.fallback.setdefault(name, []).append(binding)
        else:
            if binding.kind == "class" and not self.conditional:
                self.declared_classes.add(name)
            elif not self.conditional:
                self.declared_classes.discard(name)
            self.primary.setdefault(name, []).append(binding)

    # --- freezing -------------------------------------------------------------------------

    def finish(
        self,
        path: str,
        newline: str,
        facts: ImportFacts,
        suppression_lines: tuple[int, ...],
        ignored_lines: tuple[int, ...] = (),
    ) -> ModuleSummary:
        symbols: dict[str, tuple[Binding, ...]] = {}
        for name in {**self.primary, **self.fallback, **self.never}:
            # The latest unconditional binding wins; except-handler and TYPE_CHECKING-else
            # alternatives are only tried after it.
            ordered = [
                *reversed(self.primary.get(name, ())),
                *self.fallback.get(name, ()),
                *self.never.get(name, ()),
            ]
            symbols[name] = tuple(ordered)
        # A class defined twice (`if`/`else`, `try`/`except`): the last definition keeps its
        # name (names resolve to it); earlier ones get a unique `Name@line` qualname.
        last_line = {builder.qualname: builder.node.lineno for builder in self.classes}
        for builder in self.classes:
            if last_line[builder.qualname] != builder.node.lineno:
                builder.qualname = f"{builder.qualname}@{builder.node.lineno}"
        freezer = Freezer(
            self.lines, self.ascii_only, symbols, self.stars, self.with_parameters, self.assignments
        )
        classes = tuple(freezer.freeze_class(builder) for builder in self.classes)
        # Module functions matter only to KVR102: skip those with no Iterable/Iterator hint.
        functions = tuple(
            summary
            for node in self.functions
            if self.with_parameters
            and _mentions_iteration(node.args)
            and (summary := freezer.freeze_function(node, node.name)).multi_pass
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
            guarded=self.guarded,
            type_ignore_lines=ignored_lines,
        )

def _indented_class_lines(text: str) -> list[int]:
    """The lines that start with indentation and `class`: a superset of where a function body
    can define a class (a class statement always begins a line, and inside a function that
    line is indented; matches inside strings only cost a needless walk)."""
    if "\r" in text:  # line numbers count every line break Python's tokenizer knows
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines: list[int] = []
    line, position = 1, 0
    rfind = text.rfind
    # Finding the word and looking back is cheaper than a pattern tried at every line.
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
