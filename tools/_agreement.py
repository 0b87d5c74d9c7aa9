"""KVR001 measured against the type checkers: findings keyed alike, the consensus, recall and
precision, and the disagreements with their source lines.

A helper module of `tools/compare_checkers.py` (not a tool). Findings are normalised to
(corpus-relative path, line of the `def`), where the line is that of the first `def` of the same
qualified name in the file, so that a decorator line (mypy on decorated methods), an overload or
a property setter all land on one key. Then:

- consensus: findings reported by at least two of the three checkers; recall is measured on it;
- confirmed: findings reported by at least one; precision is measured on it;
- overrides of `object`'s methods are judged by kvref's policy (`AnalysisOptions.object_dunders`,
  on by default): the checkers report them inconsistently, so with the policy on, one checker
  naming `object` as the base is enough for the consensus, and with it off they leave both sets;
- the names kvref's policy exempts (`__init__`, `__new__`, `__init_subclass__`,
  `__post_init__`) leave both sets (pyright and ty never report them; mypy reports
  `__init_subclass__`).
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _checker_runs import Raw

from kvref.audit.model import DEFAULT_EXEMPT_NAMES

__all__ = ["Agreement", "DefIndex", "Key", "Report", "agreement", "normalise", "print_agreement"]

Key = tuple[str, int]
"""A finding's identity: (path relative to the corpus root with `/`, line of the `def`)."""


@dataclass(slots=True)
class Report:
    """One tool's findings after normalisation.

    Attributes:
        keys: the normalised findings.
        object_keys: the subset whose overridden base method is `object`'s.
        exempt_keys: the subset of methods kvref's policy exempts.
        seconds: wall time of the (possibly cached) run.
    """

    keys: set[Key] = field(default_factory=lambda: set[Key]())
    object_keys: set[Key] = field(default_factory=lambda: set[Key]())
    exempt_keys: set[Key] = field(default_factory=lambda: set[Key]())
    seconds: float = 0.0


class DefIndex:
    """Per file: every line of a def's header (decorators to `def`) -> canonical def line."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._files: dict[str, dict[int, tuple[int, str]]] = {}
        self._lines: dict[str, list[str]] = {}

    def relative(self, path: str) -> str:
        absolute = Path(path) if os.path.isabs(path) else self.root / path
        try:
            return absolute.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return Path(path).as_posix()

    def canonical(self, relative: str, line: int) -> tuple[int, str]:
        """(the canonical def line, the method name) of a reported line."""
        table = self._files.get(relative)
        if table is None:
            table = self._files[relative] = self._index(self.root / relative)
        return table.get(line, (line, "?"))

    def source_line(self, relative: str, line: int) -> str:
        """The text of a line of a corpus file, stripped ("" past its end)."""
        lines = self._lines.get(relative)
        if lines is None:
            try:
                text = (self.root / relative).read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            lines = self._lines[relative] = text.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    @staticmethod
    def _index(path: Path) -> dict[int, tuple[int, str]]:
        try:
            tree = ast.parse(path.read_bytes(), str(path))
        except (OSError, SyntaxError, ValueError):
            return {}
        first_def: dict[str, int] = {}
        table: dict[int, tuple[int, str]] = {}

        def visit(body: Iterable[ast.stmt], prefix: str) -> None:
            for node in body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    qualname = prefix + node.name
                    canonical = first_def.setdefault(qualname, node.lineno)
                    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    for header_line in range(start, node.lineno + 1):
                        table[header_line] = (canonical, node.name)
                    visit(node.body, f"{qualname}.<locals>.")
                elif isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")
                else:
                    # if/try/with/for/match blocks: defs inside keep the enclosing prefix.
                    for child in ast.iter_child_nodes(node):
                        if isinstance(child, ast.stmt):
                            visit([child], prefix)
                        elif isinstance(child, ast.ExceptHandler | ast.match_case):
                            visit(child.body, prefix)

        visit(tree.body, "")
        return table


def normalise(raws: Sequence[Raw], index: DefIndex) -> Report:
    """One tool's raw findings keyed by the canonical def line."""
    report = Report()
    for path, line, base in raws:
        relative = index.relative(path)
        canonical, name = index.canonical(relative, line)
        key = (relative, canonical)
        report.keys.add(key)
        if name in DEFAULT_EXEMPT_NAMES:
            report.exempt_keys.add(key)
        if base.rsplit(".", 1)[-1] == "object" and base in ("object", "builtins.object"):
            report.object_keys.add(key)
    return report


@dataclass(slots=True)
class Agreement:
    """The checkers' findings against kvref's on one corpus (see the module docstring)."""

    votes: dict[Key, set[str]]
    consensus: set[Key]
    confirmed: set[Key]
    object_keys: set[Key]
    exempt: set[Key]
    kvref: set[Key] | None

    @property
    def hits(self) -> set[Key]:
        return (self.kvref or set()) & self.consensus

    @property
    def recall(self) -> float | None:
        if self.kvref is None or not self.consensus:
            return None
        return len(self.hits) / len(self.consensus)

    @property
    def precision(self) -> float | None:
        if not self.kvref:
            return None
        return len(self.kvref & self.confirmed) / len(self.kvref)

    @property
    def missed(self) -> set[Key]:
        return self.consensus - (self.kvref or set())

    @property
    def unconfirmed(self) -> set[Key]:
        return (self.kvref or set()) - self.confirmed


def agreement(reports: Mapping[str, Report], kvref: Report | None, *, object_dunders: bool) -> Agreement:
    """Consensus, confirmed set and kvref's findings under the policy (module docstring)."""
    votes: dict[Key, set[str]] = defaultdict(set)
    object_keys: set[Key] = set()
    exempt: set[Key] = set()
    for name, report in reports.items():
        for key in report.keys:
            votes[key].add(name)
        object_keys |= report.object_keys
        exempt |= report.exempt_keys
    for key in exempt:
        votes.pop(key, None)
    object_keys -= exempt
    confirmed = set(votes)
    consensus = {key for key, who in votes.items() if len(who) >= 2}
    if object_dunders:
        consensus |= object_keys
    else:
        consensus -= object_keys
        confirmed -= object_keys
    kvref_keys = None
    if kvref is not None:
        kvref_keys = (kvref.keys if object_dunders else kvref.keys - object_keys) - exempt
    return Agreement(dict(votes), consensus, confirmed, object_keys, exempt, kvref_keys)


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "n/a"


def print_agreement(
    found: Agreement,
    reports: Mapping[str, Report],
    kvref: Report | None,
    index: DefIndex,
    *,
    object_dunders: bool,
    limit: int,
) -> None:
    """The counts per tool, recall and precision, and each disagreement with its source line."""
    consensus = found.consensus
    print(f"\nfindings confirmed by >=1 checker: {len(found.confirmed)}")
    print(f"consensus (>=2 checkers{', object dunders by policy' if object_dunders else ''}): "
          f"{len(consensus)}")
    print(f"object-dunder overrides reported by some checker: {len(found.object_keys)}")
    print(f"left out as exempt by policy ({', '.join(sorted(DEFAULT_EXEMPT_NAMES))}): "
          f"{len(found.exempt)}")
    print("\nper tool (agreement = share of the consensus it reports; extra = outside it):")
    for name, report in reports.items():
        keys = report.keys
        print(
            f"  {name:8} {len(keys):6d} findings  {report.seconds:7.1f} s  "
            f"agreement {_pct(len(keys & consensus), len(consensus)):>8}  "
            f"extra {len(keys - consensus)}  object {len(report.object_keys)}"
        )
    if kvref is None or found.kvref is None:
        return
    kvref_keys = found.kvref
    print(
        f"  {'kvref':8} {len(kvref.keys):6d} findings  {kvref.seconds:7.1f} s  "
        f"agreement {_pct(len(found.hits), len(consensus)):>8}  extra {len(kvref_keys - consensus)}"
    )
    print(f"\nKVR001 recall    vs consensus: {_pct(len(found.hits), len(consensus))} "
          f"({len(found.hits)}/{len(consensus)})")
    print(f"KVR001 precision vs confirmed: {_pct(len(kvref_keys & found.confirmed), len(kvref_keys))} "
          f"({len(kvref_keys & found.confirmed)}/{len(kvref_keys)})")

    def listing(title: str, keys: set[Key]) -> None:
        print(f"\n{title}: {len(keys)}")
        for path, line in sorted(keys)[:limit]:
            who = ",".join(sorted(found.votes.get((path, line), set()))) or "-"
            print(f"  {path}:{line}  reported by: {who}")
            print(f"      {index.source_line(path, line)}")
        if len(keys) > limit:
            print(f"  ... {len(keys) - limit} more (raise --limit)")

    listing("missed by kvref (in the consensus)", found.missed)
    listing("reported only by kvref (no checker confirms)", found.unconfirmed)
    listing(
        "reported by kvref and exactly one checker (outside the consensus)",
        (kvref_keys & found.confirmed) - consensus,
    )
    listing(
        "reported by exactly one checker, not by kvref",
        {key for key in found.confirmed - consensus - kvref_keys if len(found.votes[key]) == 1},
    )
