"""No import cycles among the modules of kvref/ and tools/.

The graph is read statically with `ast`, and every import statement counts: at module level,
under `if TYPE_CHECKING:` and inside a function. A deferred import hides a cycle from the
interpreter, not from a reader: the two modules still need each other, and what both need
belongs one layer down (docs/ARCHITECTURE.md). Importing `a.b.c` also runs the `__init__` of
the packages `a` and `a.b`, so those are edges too, except the packages that contain the
importing module (they are initialised before it runs).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class SourceModule:
    """One module of the graph: its file, and whether it is a package's `__init__`."""

    path: Path
    is_package: bool


def source_modules(checkout: Path) -> dict[str, SourceModule]:
    """The modules of kvref/ by dotted name, and the tools by file name (tools/ is on sys.path
    when a tool runs, so `bench_tiering` is how another tool imports it)."""
    modules: dict[str, SourceModule] = {}
    for path in sorted((checkout / "kvref").rglob("*.py")):
        parts = path.relative_to(checkout).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = SourceModule(path, is_package)
    for path in sorted((checkout / "tools").glob("*.py")):
        modules[path.stem] = SourceModule(path, False)
    return modules


def import_statements(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import in the module, wherever it is written."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def imported_names(name: str, module: SourceModule, statement: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The dotted names one import statement of `name` loads (modules or not)."""
    if isinstance(statement, ast.Import):
        yield from (alias.name for alias in statement.names)
        return
    source = statement.module or ""
    if statement.level:
        package = name.split(".") if module.is_package else name.split(".")[:-1]
        package = package[: len(package) - (statement.level - 1)]
        source = ".".join([*package, *([source] if source else [])])
    yield source
    # `from pkg import sub` loads the submodule when there is one.
    yield from (f"{source}.{alias.name}" for alias in statement.names)


def import_graph(modules: Mapping[str, SourceModule]) -> dict[str, set[str]]:
    """Each module -> the modules of the graph that importing it loads directly."""
    graph: dict[str, set[str]] = {}
    for name, module in modules.items():
        edges: set[str] = set()
        tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
        for statement in import_statements(tree):
            for dotted in imported_names(name, module, statement):
                parts = dotted.split(".")
                for end in range(1, len(parts) + 1):
                    loaded = ".".join(parts[:end])
                    # A package around the importer is initialised before the importer runs.
                    if loaded in modules and loaded != name and not name.startswith(loaded + "."):
                        edges.add(loaded)
        graph[name] = edges
    return graph


def strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that can each reach the others (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def shortest_cycle(graph: Mapping[str, set[str]], group: Sequence[str], start: str) -> list[str]:
    """A shortest cycle through `start`, staying inside its group."""
    members = set(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for successor in sorted(graph[node] & members):
                if successor == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if successor not in came_from:
                    came_from[successor] = node
                    following.append(successor)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {group}")


def describe_cycles(graph: Mapping[str, set[str]]) -> list[str]:
    """Per group of modules that import each other: cycles through it until every member
    is named, one line each."""
    lines: list[str] = []
    for group in strongly_connected(graph):
        named: set[str] = set()
        for start in group:
            if start not in named:
                cycle = shortest_cycle(graph, group, start)
                named.update(cycle)
                lines.append(" -> ".join(cycle))
    return lines


def test_no_import_cycles_in_kvref_and_tools() -> None:
    graph = import_graph(source_modules(CHECKOUT))
    assert "kvref.audit.pipeline" in graph and "bench_tiering" in graph  # the graph was read
    cycles = describe_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_check_sees_deferred_and_package_imports(tmp_path: Path) -> None:
    files = {
        "kvref/__init__.py": "",
        "kvref/low.py": "def f():\n    from kvref.high.mod import g\n",
        "kvref/high/__init__.py": "from kvref.high import mod\n",
        "kvref/high/mod.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import other\n",
        "kvref/high/other.py": "import kvref.low\n",
        "tools/a.py": "from b import x\n",
        "tools/b.py": "import kvref.low\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(source_modules(tmp_path))
    assert graph["kvref.low"] == {"kvref.high", "kvref.high.mod"}
    assert graph["kvref.high.mod"] == {"kvref.high.other"}  # not its own package
    assert graph["a"] == {"b"}
    assert describe_cycles(graph) == [
        "kvref.high -> kvref.high.mod -> kvref.high.other -> kvref.low -> kvref.high"
    ]
