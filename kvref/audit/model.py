"""The data that crosses from the analysis engine to the command line: findings, fixes, errors.

Positions: lines are 1-based; `Finding.col`/`end_col` are 1-based character columns (what text
output prints); `Edit` columns are 0-based character offsets into the line (not UTF-8 bytes,
unlike `ast.col_offset`), and `end_col` is exclusive.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "Applicability",
    "Edit",
    "Fix",
    "Finding",
    "RequiredImport",
    "FileError",
    "AnalysisOptions",
    "AnalysisResult",
    "CONSTRUCTOR_NAMES",
    "DEFAULT_EXEMPT_NAMES",
    "DEFAULT_MAX_FILE_BYTES",
    "TypingExtensions",
]


class Applicability(enum.Enum):
    """Whether a fix preserves behaviour (safe) or may change it (unsafe: `--unsafe-fixes`)."""

    SAFE = "safe"
    UNSAFE = "unsafe"


@dataclass(frozen=True, slots=True)
class Edit:
    """Replace the text from (start_line, start_col) up to (end_line, end_col) with `text`.

    An insertion has equal start and end. Lines are 1-based, columns 0-based characters.
    """

    start_line: int
    start_col: int
    end_line: int
    end_col: int
    text: str


@dataclass(frozen=True, slots=True, order=True)
class RequiredImport:
    """A module-level import that a fixed file needs: `from module import name [as alias]`.

    Attributes:
        module: the module as the statement spells it; leading dots make it relative
            (`.base`, `..keys`).
        name: the imported name; "" for `import module [as alias]`.
        alias: the `as` name ("" for none).
        older: where set, `module` has `name` only from Python `since` on, and the import is
            `if sys.version_info >= since:` from `module`, `else:` from `older` (after the
            import block; the module binds `sys` to the `sys` module).
        since: see `older`.
    """

    module: str
    name: str = ""
    alias: str = ""
    older: str = ""
    since: tuple[int, int] = (0, 0)

    @property
    def bound_name(self) -> str:
        """The module-level name the import binds (`collections` for `import collections.abc`)."""
        if self.alias:
            return self.alias
        return self.name or self.module.partition(".")[0]


@dataclass(frozen=True, slots=True)
class Fix:
    """The edits that resolve one finding.

    Attributes:
        applicability: safe fixes run with `--fix`; unsafe ones need `--unsafe-fixes` too.
        edits: every edit of the fix, the imports it needs included, non-overlapping and
            within the finding's file. Applied alone they give a file that runs; two fixes
            of one file may carry the very same import edit (applied once).
        description: a short imperative line, e.g. "Add @override", followed by why the fix
            is unsafe when that is not the rule's usual reason.
        unsafe_reason: why an unsafe fix is unsafe, one clause ("the body may rely on the
            narrower type..."); the summary groups the fixes withheld without
            `--unsafe-fixes` by it. Empty for a safe fix.
    """

    applicability: Applicability
    edits: tuple[Edit, ...]
    description: str = ""
    unsafe_reason: str = ""


@dataclass(frozen=True, slots=True)
class Finding:
    """One rule violation.

    Attributes:
        path: project-relative path with `/` separators.
        line, col, end_line, end_col: 1-based position of the offending name.
        code: the rule code, e.g. "KVR001".
        message: the rendered message.
        symbol: the qualified name inside the module, e.g. "FsTier.on_request_finished"
            (baselines key on path, code and symbol, never on line numbers).
        fix: how to fix it, when the rule can.
    """

    path: str
    line: int
    col: int
    end_line: int
    end_col: int
    code: str
    message: str
    symbol: str
    fix: Fix | None = None


@dataclass(frozen=True, slots=True)
class FileError:
    """A file that could not be audited (unreadable, undecodable, does not parse)."""

    path: str
    line: int
    col: int
    message: str


# Constructors are not called through a base-class reference: their signatures may differ,
# and KVR001 exempts them by default.
CONSTRUCTOR_NAMES: frozenset[str] = frozenset({"__init__", "__new__", "__init_subclass__", "__post_init__"})
DEFAULT_EXEMPT_NAMES: frozenset[str] = CONSTRUCTOR_NAMES


# Larger files are reported ("skipped: ... over the limit") instead of parsed: parsing 16 MiB
# of generated code needs about a gigabyte of memory and says nothing about class
# hierarchies. `[tool.kvref] max-file-size` changes it.
DEFAULT_MAX_FILE_BYTES: Final = 16 * 1024 * 1024


TypingExtensions = Literal["runtime", "before-3.12", "development", "conditional", "undeclared"]
"""Where a project's declarations install `typing_extensions`: wherever it runs (a run-time
dependency), wherever it runs on Python below 3.12 (run-time dependencies under markers such
as `python_version < "3.13"`), only where its tests and tools run (groups, extras, development
requirements), only under other markers, or nowhere known."""


@dataclass(frozen=True, slots=True)
class AnalysisOptions:
    """Policy choices where the type checkers disagree (defaults follow their consensus).

    Attributes:
        object_dunders: require `@override` on overrides of `object`'s methods (`__repr__`...).
        abstract_implementations: require it on implementations of abstract methods.
        protocol_members: require it on members of `Protocol` subclasses that override.
        exempt_names: method names never reported by KVR001.
        override_import: the module the fixer imports `override` from when the project may
            use either (`typing` needs a `python_floor` of 3.12 or later).
        python_floor: the lowest Python the project supports (None: unknown, taken as below
            3.12, so `typing.override` is never written).
        typing_extensions: where the project's declarations install `typing_extensions`;
            below a 3.12 floor, a fix that imports it is unsafe in a file it may be missing
            for (outside tests and tools when only development declares it).
        build_typing_extensions: `[build-system] requires` installs `typing_extensions` where
            `setup.py` runs (else, below a 3.12 floor, a fix there that imports it is unsafe).
        import_line_length: ruff's line length, for an import line a fix lengthens.
        first_party: top-level module names ruff's isort files as first-party.
        max_file_bytes: files larger than this are reported as skipped, not parsed.
        report_dependents: when only some files are reported, also report the classes of
            other files that derive from theirs (set for files named one by one, as
            pre-commit names the changed ones).
        rules: the codes of the rules to run (None: every rule). The command line passes
            its selection; the runner runs every rule where its result is cached (so that
            the cached result serves any selection).
    """

    object_dunders: bool = True
    abstract_implementations: bool = True
    protocol_members: bool = True
    exempt_names: frozenset[str] = DEFAULT_EXEMPT_NAMES
    override_import: Literal["typing_extensions", "typing"] = "typing_extensions"
    python_floor: tuple[int, int] | None = None
    typing_extensions: TypingExtensions = "runtime"
    build_typing_extensions: bool = False
    import_line_length: int = 88
    first_party: frozenset[str] = frozenset()
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    report_dependents: bool = False
    rules: frozenset[str] | None = None


@dataclass(slots=True)
class AnalysisResult:
    """Everything one analysis produced.

    Attributes:
        findings: every finding of every rule (selection and suppression are applied later).
        errors: files that could not be audited.
        unresolved_bases: dotted name of each base class that could not be resolved, with
            the number of classes that inherit from it. Such classes are checked for KVR001
            against their resolvable ancestors only (a hit there is an override whatever the
            unknown base holds) and get no KVR002/KVR1xx findings (absence proves nothing).
        missing_modules: the top-level modules that bases lead into but that cannot be found
            (not installed where kvref looked), with how many classes' bases lead there,
            most first.
        files_analyzed: how many files were indexed.
        suppression_lines: for each reported file that was analyzed, the lines that mention
            `noqa` or `kvref` (only those can carry a suppression comment), so suppressions
            are checked without reading files again; None when not known (then the files
            with findings are read).
        dependent_paths: files outside the reported ones whose classes derive from a reported
            file's classes; their findings on those classes are reported too.
    """

    findings: list[Finding] = field(default_factory=lambda: [])
    errors: list[FileError] = field(default_factory=lambda: [])
    unresolved_bases: Mapping[str, int] = field(default_factory=lambda: {})
    files_analyzed: int = 0
    suppression_lines: Mapping[str, tuple[int, ...]] | None = None
    dependent_paths: tuple[str, ...] = ()
    missing_modules: Mapping[str, int] = field(default_factory=lambda: {})
