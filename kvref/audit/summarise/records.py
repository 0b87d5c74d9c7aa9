"""The summary records: frozen data that one module's summary is made of, and that pickles.

A summary holds only these records, tuples, strings, ints and bools (no `ast` objects), so
it pickles and can be cached on disk. Positions: lines are 1-based, `Span` columns 0-based
characters (not UTF-8 bytes), end exclusive, the convention of `kvref.audit.model.Edit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from typing_extensions import dataclass_transform

__all__ = [
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
    "TypeExpr",
]

_R = TypeVar("_R")


@dataclass_transform(frozen_default=True)
def _record(cls: type[_R]) -> type[_R]:
    """Make `cls` a summary record: a frozen dataclass to the type checker, cheap to build.

    A large project's summaries hold hundreds of thousands of these, and a frozen
    dataclass's `__init__` sets every field through `object.__setattr__` on each side of the
    pickle. So at run time they are plain slotted dataclasses that hash by value like frozen
    ones, while pyright (which reads `frozen_default`) still rejects any assignment to a field.
    """
    return dataclass(slots=True, unsafe_hash=True)(cls)


@_record
class Span:
    """A source range: 1-based lines, 0-based character columns, end exclusive."""

    line: int
    col: int
    end_line: int
    end_col: int


@_record
class TypeExpr:
    """A normalized annotation: a head name and its subscript arguments.

    `head` is canonical where the name is known (`collections.abc.Sequence` for both
    `typing.Sequence` and `collections.abc.Sequence`, `builtins.list` for `List` and `list`,
    `typing.Union` for `X | Y` and `Optional[X]`, `None`), else the dotted name as written,
    or "" for an expression that is not a name. `text` is the source spelling (kept for the
    annotation and its direct arguments only; "" deeper down).
    """

    head: str
    args: tuple[TypeExpr, ...] = ()
    text: str = ""


@_record
class Param:
    """One parameter: kind is `posonly`, `arg`, `vararg`, `kwonly` or `kwarg`.

    Positions are kept as plain ints (`line`, `col` of the name; `annotation_position` as
    (line, col, end_line, end_col)) and offered as `Span`s by properties: a big project has
    ~10^5 parameters, and a `Span` object each, built, pickled and unpickled, cost more than
    the rest of the parameter.
    """

    name: str
    kind: str
    line: int
    col: int
    annotation: TypeExpr | None = None
    annotation_position: tuple[int, int, int, int] | None = None

    @property
    def span(self) -> Span:
        """The parameter's name."""
        return Span(self.line, self.col, self.line, self.col + len(self.name))

    @property
    def annotation_span(self) -> Span | None:
        """The annotation expression, or None without one."""
        position = self.annotation_position
        return None if position is None else Span(*position)


ParamRow = tuple[str, str, int, int, "TypeExpr | None", "tuple[int, int, int, int] | None"]
"""A `Param`'s fields in order: name, kind, line, col, annotation, annotation_position."""


@_record
class MultiPass:
    """A parameter annotated Iterable/Iterator that one path through the body consumes twice.

    Attributes:
        first_line, second_line: the lines of the first two passes (equal when both are on
            one line: `zip(xs, xs)`, or one expression run again by a loop).
        loop_line: nonzero when the second pass is the first one again, on a later iteration
            of the loop or comprehension that starts on that line.
    """

    param: str
    annotation: str
    first_line: int
    second_line: int
    loop_line: int = 0


@_record
class FunctionSummary:
    """One `def` (a method, or a module-level function).

    Attributes:
        name_col: the column of the function's name on the `def` line (see `name_span`).
        def_line: the line of `def` (a new innermost decorator is inserted before it).
        indent: the text before `def` on that line, or None when it is not only whitespace
            (then no decorator can be inserted).
        decorators: each decorator as a dotted name (a call `@f(x)` gives `f`; "" when the
            expression is not a name).
        has_override: one decorator is `override` from typing/typing_extensions, imported
            under any alias or used as a module attribute (`te.override`).
        parameters: the parameters as plain rows (see `ParamRow`); `params` gives them as
            `Param`s. ~10^5 parameter objects would be built, pickled and unpickled on a
            large project where only the pairs the rules compare are ever looked at.
        guard: the conditions the checkers need to hold to analyse it ("" always; see
            `kvref.audit.summarise.guards`).
    """

    name: str
    qualname: str
    name_col: int
    def_line: int
    indent: str | None
    decorators: tuple[str, ...]
    has_override: bool
    is_overload: bool
    is_property: bool
    is_accessor: bool
    is_staticmethod: bool
    is_abstract: bool
    parameters: tuple[ParamRow, ...]
    multi_pass: tuple[MultiPass, ...] = ()
    guard: str = ""

    @property
    def name_span(self) -> Span:
        """The function's name (on the `def` line)."""
        return Span(self.def_line, self.name_col, self.def_line, self.name_col + len(self.name))

    @property
    def params(self) -> tuple[Param, ...]:
        """The parameters in order (built from `parameters` at each access)."""
        return tuple(Param(*row) for row in self.parameters)


@_record
class BaseRef:
    """One base-class expression: its dotted name (subscripts stripped), "" if not a name."""

    dotted: str
    text: str


@_record
class ClassSummary:
    """One class statement at module level or nested in a class body.

    Attributes:
        scope: the qualified name of the enclosing class ("" at module level): the scope its
            base expressions are evaluated in before the module's globals.
        attributes: names the class body binds other than by `def` (assignments, annotated
            declarations, nested classes, `__slots__` entries), so `__hash__ = None` counts.
        guard: the conditions under which the checkers analyse the class (see
            `kvref.audit.summarise.guards`; "" always).
        guarded_attributes: (name, guard) of the attributes bound only under conditions.
        instance_attributes: the names its methods assign on `self` (declared instance
            attributes to the type checkers: `self.host = host` in `__init__`).
    """

    name: str
    qualname: str
    scope: str
    name_span: Span
    bases: tuple[BaseRef, ...]
    methods: tuple[FunctionSummary, ...]
    attributes: tuple[str, ...]
    guard: str = ""
    guarded_attributes: tuple[tuple[str, str], ...] = ()
    instance_attributes: tuple[str, ...] = ()


@_record
class Binding:
    """What a module-level name is bound to.

    kind: `class` (target = qualname), `import` (`from module import target`, with the
    relative `level`), `module` (`import module [as name]`: target = module), `alias`
    (`Name = dotted.name`: target = the dotted text) or `other`. `type_only` marks a binding
    made under `if TYPE_CHECKING:` (absent at run time); `guard` one made under version or
    platform conditions (`kvref.audit.summarise.guards`).
    """

    kind: str
    target: str = ""
    module: str = ""
    level: int = 0
    type_only: bool = False
    guard: str = ""


# Most bindings are "something other than a class or import": one shared object each (a
# pickle then stores it once per file, not once per name).


@_record
class ImportFacts:
    """Where the fixer can put an import.

    Attributes:
        insert_line: the line a new import statement goes before (after the module
            docstring and `from __future__` imports).
        block: the leading import block: the top-level import statements that follow the
            docstring with no other statement between them (`from __future__` imports
            included), one line per statement, fields separated by tabs: first line, last
            line, end column, module (`from` imports: with its leading dots; plain imports:
            the first module), the imported names of a `from` import (`a,b as c`), and only
            when the statement has a comment the (line, col, end line, end col) of each name,
            comma-separated; columns in characters. "" when there is no block, or when the
            module has no class (only fixes in classes read it). One string: cheap to cache
            and to hand across processes (`kvref.audit.fixes.import_edits.parse_block` reads it).
        next_line: the first line of the first statement after the block (its first
            decorator's), or the line past the end of the file.
        next_is_definition: that statement is a `def` or `class` (ruff wants two blank lines
            before it, one before anything else).
    """

    insert_line: int
    block: str
    next_line: int
    next_is_definition: bool


@_record
class ModuleSummary:
    """Everything the audit needs from one file; see the module docstring.

    Attributes:
        symbols: each module-level name with its bindings, the one to try first first.
        star_imports: `(module, level)` of each `from module import *`.
        all_names: a literal `__all__`, else None.
        classes: module-level and nested classes, in source order.
        functions: the module-level functions with KVR102 facts (no other rule looks at
            module functions, so the rest are not kept).
        suppression_lines: the lines that mention `noqa` or `kvref` in any case (only they
            can carry a suppression comment).
        guarded: something in the module has a guard (else none need deciding).
        type_ignore_lines: the lines with a bare `# type: ignore`, which hides them from the
            type checkers (`kvref.audit.summarise.suppress.type_ignore_lines`).
    """

    path: str
    newline: str
    is_stub: bool
    symbols: tuple[tuple[str, tuple[Binding, ...]], ...]
    star_imports: tuple[tuple[str, int], ...]
    all_names: tuple[str, ...] | None
    classes: tuple[ClassSummary, ...]
    functions: tuple[FunctionSummary, ...]
    import_facts: ImportFacts
    suppression_lines: tuple[int, ...] = ()
    guarded: bool = False
    type_ignore_lines: tuple[int, ...] = ()
