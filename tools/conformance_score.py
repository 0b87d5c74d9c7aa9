"""How much broken code the conformance kit catches: the kit against mutants it has never seen.

    .venv-vllm/bin/python tools/conformance_score.py                  # both targets, every mutant
    .venv-vllm/bin/python tools/conformance_score.py --target manager --limit 40 --show-survivors

Mutants are made mechanically from correct code, one small change each (a comparison or a
boolean flipped, a constant moved by one, `+=` turned into `-=`, a statement dropped, a return
value replaced by None), so nobody wrote them with the kit in mind:

* `manager`: the methods of vLLM 0.33's own `CPUOffloadingManager` (installed), each mutant run
  through `OffloadingManagerContract` as the manager ships: once with `policy = "lru"` and once
  with `policy = "arc"` (caught if either fails);
* `tier`: the example third-party tier (`examples/vllm_dict_tier/dict_tier.py`), each mutant run
  through `SecondaryTierContract`.

A mutant is caught when its contract class fails (or errors). Mutants that leave the source as
it was are not counted. Before the mutants, the kit runs once on the unchanged code under a line
tracer: a mutant on a line the kit never runs (code for a setting its fixture does not use, such
as the reuse filter's `store_threshold`) is reported as unreached, apart from the rest. Some
mutants change nothing that matters (a counter nobody reads, an early exit that only saves
work), so the share caught is a lower bound on what the kit would catch of deliberately broken
code; `--show-survivors` prints the survivors' diffs to judge which are real misses.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import importlib.util
import inspect
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pytest

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["Mutant", "mutants", "main"]

_ROOT = Path(__file__).resolve().parent.parent
TraceFunction = Callable[[FrameType, str, object], "TraceFunction | None"]  # what sys.settrace takes
_FLIPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE,
    ast.GtE: ast.Gt, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    index: int
    what: str
    source: str


def _sites(tree: ast.Module, class_name: str) -> list[tuple[ast.AST, str]]:
    """Nodes of `class_name`'s methods that a mutation can change, with what it would do."""
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name)
    sites: list[tuple[ast.AST, str]] = []
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef) or method.name == "__init__":
            continue
        for node in ast.walk(method):
            where = f"{method.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Compare) and type(node.ops[0]) in _FLIPS:
                sites.append((node, f"{where} flip comparison"))
            elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
                sites.append((node, f"{where} flip {node.value}"))
            elif isinstance(node, ast.Constant) and type(node.value) is int:
                sites.append((node, f"{where} constant {node.value} + 1"))
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add | ast.Sub):
                sites.append((node, f"{where} += / -= swapped"))
            elif isinstance(node, ast.BoolOp):
                sites.append((node, f"{where} and / or swapped"))
            elif isinstance(node, ast.Return) and node.value is not None:
                sites.append((node, f"{where} return None"))
        for block in ast.walk(method):
            for field in ("body", "orelse"):
                statements = getattr(block, field, None)
                if isinstance(statements, list) and len(statements) > 1:  # pyright: ignore[reportUnknownArgumentType]
                    for statement in statements:  # pyright: ignore[reportUnknownVariableType]
                        if isinstance(statement, ast.Expr | ast.Assign | ast.AugAssign | ast.If | ast.For):
                            sites.append((statement, f"{method.name}:{statement.lineno} statement dropped"))
    return sites


def _mutate(node: ast.AST, what: str) -> None:
    if isinstance(node, ast.Compare):
        node.ops[0] = _FLIPS[type(node.ops[0])]()
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        node.value = not node.value
    elif isinstance(node, ast.Constant) and isinstance(node.value, int):
        node.value = node.value + 1
    elif isinstance(node, ast.AugAssign):
        node.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.Return):
        node.value = ast.Constant(None)
    else:
        raise AssertionError(what)


def mutants(path: Path, class_name: str) -> Iterator[Mutant]:
    """Every single-change mutant of `class_name`'s methods in the module at `path` (those that
    change the source: `return None` where it already returns None is no mutant)."""
    source = path.read_text()
    tree = ast.parse(source)
    unchanged = ast.unparse(tree)
    for index in range(len(_sites(tree, class_name))):
        clone = copy.deepcopy(tree)
        node, what = _sites(clone, class_name)[index]
        if what.endswith("statement dropped"):
            for parent in ast.walk(clone):
                for field in ("body", "orelse"):
                    statements = getattr(parent, field, None)
                    if isinstance(statements, list) and node in statements:
                        statements[statements.index(node)] = ast.Pass()  # pyright: ignore[reportUnknownMemberType]
        else:
            _mutate(node, what)
        mutated = ast.unparse(ast.fix_missing_locations(clone))
        if mutated != unchanged:
            yield Mutant(index, what, mutated)


_TESTS = {
    "manager": '''
import os, importlib, pytest
from kvref.testing.vllm import OffloadingManagerContract
cls = getattr(importlib.import_module(os.environ["KVREF_MUTANT"]), "CPUOffloadingManager")

class TestMutantLRU(OffloadingManagerContract):
    policy = "lru"
    @pytest.fixture
    def make_manager(self):
        return lambda num_chunks, enable_events: cls(num_chunks, "lru", enable_events=enable_events)

class TestMutantARC(OffloadingManagerContract):
    policy = "arc"
    @pytest.fixture
    def make_manager(self):
        return lambda num_chunks, enable_events: cls(num_chunks, "arc", enable_events=enable_events)
''',
    "tier": '''
import os, pytest
from kvref.testing.vllm import SecondaryTierContract

class TestMutant(SecondaryTierContract):
    persistent = False
    @pytest.fixture
    def tier_config(self):
        return {"type": "DictTier", "module_path": os.environ["KVREF_MUTANT"]}
''',
}


def _target_path(target: str) -> tuple[Path, str]:
    if target == "manager":
        import vllm.v1.kv_offload.cpu.manager as manager_module

        return Path(inspect.getfile(manager_module)), "CPUOffloadingManager"
    return _ROOT / "examples" / "vllm_dict_tier" / "dict_tier.py", "DictTier"


def _caught(target: str, mutant: Mutant, scratch: Path, *, name: str = "") -> bool:
    name = name or f"kvref_mutant_{target}_{mutant.index}"
    module_path = scratch / f"{name}.py"
    module_path.write_text(mutant.source)
    spec = importlib.util.spec_from_file_location(name, module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        return True  # does not even import: caught by anyone
    test_file = scratch / f"test_{name}.py"
    test_file.write_text(_TESTS[target])
    os.environ["KVREF_MUTANT"] = name
    code = pytest.main(
        [str(test_file), "-q", "-x", "-p", "no:cacheprovider", "--import-mode=importlib", "-o", "addopts="],
        plugins=[],
    )
    return code != pytest.ExitCode.OK


def lines_run(target: str, path: Path, scratch: Path) -> set[int]:
    """The lines of the module at `path` that the kit runs (in any thread) on the unchanged code."""
    name = f"kvref_original_{target}"
    filename = str(scratch / f"{name}.py")
    lines: set[int] = set()

    def trace(frame: FrameType, event: str, arg: object) -> TraceFunction | None:
        if frame.f_code.co_filename != filename:
            return None
        if event == "line":
            lines.add(frame.f_lineno)
        return trace

    threading.settrace(trace)
    sys.settrace(trace)
    try:
        failed = _caught(target, Mutant(-1, "unchanged", path.read_text()), scratch, name=name)
    finally:
        sys.settrace(None)
        threading.settrace(None)
    if failed:
        raise SystemExit(f"the kit fails the unchanged {path.name}: no score without a passing baseline")
    return lines


def _line(mutant: Mutant) -> int:
    return int(mutant.what.split(" ", 1)[0].rsplit(":", 1)[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=["manager", "tier", "both"], default="both")
    parser.add_argument("--limit", type=int, default=0, help="at most this many mutants per target (0: all)")
    parser.add_argument("--show-survivors", action="store_true", help="print each survivor's diff")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(_ROOT))
    summary: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kvref-mutants-") as scratch:
        sys.path.insert(0, scratch)
        for target in ("manager", "tier") if args.target == "both" else (args.target,):
            path, class_name = _target_path(target)
            original = path.read_text()
            started = time.monotonic()
            run = lines_run(target, path, Path(scratch))
            caught = 0
            survivors: list[Mutant] = []
            all_mutants = list(mutants(path, class_name))
            chosen = all_mutants if not args.limit else all_mutants[:: max(1, len(all_mutants) // args.limit)][: args.limit]
            unreached = [mutant for mutant in chosen if _line(mutant) not in run]
            for mutant in chosen:
                if _caught(target, mutant, Path(scratch)):
                    caught += 1
                else:
                    survivors.append(mutant)
            took = time.monotonic() - started
            reached = len(chosen) - len(unreached)
            caught_reached = caught - sum(1 for mutant in unreached if mutant not in survivors)
            summary.append(
                f"{target}: {caught} of {len(chosen)} mutants caught ({caught / len(chosen):.0%}); on lines the kit"
                f" runs {caught_reached} of {reached} ({caught_reached / max(reached, 1):.0%}), {len(unreached)}"
                f" on lines it never runs; {took:.0f} s [{class_name} in {path.name}]"
            )  # fmt: skip
            for mutant in survivors:
                summary.append(f"  survived: {mutant.what}{' [unreached]' if mutant in unreached else ''}")
                if args.show_survivors:
                    diff = difflib.unified_diff(
                        ast.unparse(ast.parse(original)).splitlines(), mutant.source.splitlines(), lineterm="", n=1
                    )
                    summary.extend(f"    {line}" for line in list(diff)[2:])
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
