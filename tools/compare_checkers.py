"""Compare kvref's KVR001 (missing @override) with pyright, mypy and ty on a published sdist.

    python tools/compare_checkers.py [--corpus vllm==0.33.0]

Each checker is installed, pinned, into its own throwaway virtual environment and run once with
only its missing-override check enabled and no third-party packages visible; its raw output is
cached per corpus and tool version (`_checker_runs.py` does all of that). Here, findings are
normalised to (project-relative path, line of the `def`), where the line is that of the first
`def` of the same qualified name in the file, so that a decorator line (mypy on decorated
methods), an overload or a property setter all land on one key. Then:

- consensus: findings reported by at least two of the three checkers; recall is measured on it;
- confirmed: findings reported by at least one; precision is measured on it;
- overrides of `object`'s methods are judged by kvref's policy (`AnalysisOptions.object_dunders`,
  on by default): the checkers report them inconsistently, so with the policy on, one checker
  naming `object` as the base is enough for the consensus, and with it off they leave both sets.

Every disagreement is listed with who reported it. Caches live outside the repository (see
`_audit_corpus.cache_root`); `--refresh` reruns the checkers.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _audit_corpus import (  # noqa: E402
    Corpus,
    bare_python,
    fetch_corpus,
    package_project,
    python_files,
)
from _checker_runs import TOOLS, Raw, Tool, parse_output, run_checker  # noqa: E402

from kvref.audit.model import DEFAULT_EXEMPT_NAMES

__all__ = ["main", "Tool", "TOOLS", "Key", "Report"]

Key = tuple[str, int]
"""A finding's identity: (path relative to the corpus root with `/`, line of the `def`)."""


@dataclass(slots=True)
class Report:
    """One checker's findings after normalisation.

    Attributes:
        keys: the normalised findings.
        object_keys: the subset whose overridden base method is `object`'s.
        seconds: wall time of the (possibly cached) run.
    """

    keys: set[Key] = field(default_factory=lambda: set[Key]())
    object_keys: set[Key] = field(default_factory=lambda: set[Key]())
    exempt_keys: set[Key] = field(default_factory=lambda: set[Key]())
    seconds: float = 0.0


# --- normalising lines to the def of the qualified name ---


class _DefIndex:
    """Per file: every line of a def's header (decorators to `def`) -> canonical def line."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._files: dict[str, dict[int, tuple[int, str]]] = {}

    def relative(self, path: str) -> str:
        absolute = Path(path) if os.path.isabs(path) else self._root / path
        try:
            return absolute.resolve().relative_to(self._root.resolve()).as_posix()
        except ValueError:
            return Path(path).as_posix()

    def canonical(self, relative: str, line: int) -> tuple[int, str]:
        """(the canonical def line, the method name) of a reported line."""
        table = self._files.get(relative)
        if table is None:
            table = self._files[relative] = self._index(self._root / relative)
        return table.get(line, (line, "?"))

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


def _normalise(raws: Sequence[Raw], index: _DefIndex) -> Report:
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


# --- kvref ---


def _kvref_raws(corpus: Corpus, subdir: str, jobs: int | None) -> tuple[list[Raw], float, str]:
    """KVR001 findings of kvref on the corpus subdirectory, with the wall time.

    Uses `kvref audit --select KVR001 --output-format json` when the command exists, else the
    engine API with the parallel summariser (no cache either way: this measures a cold run).
    """
    if importlib.util.find_spec("kvref.audit.command") is not None:
        package = corpus.root / subdir
        project = package_project(corpus, package)
        prefix = Path(subdir).parent.as_posix()
        argv = [
            sys.executable, "-m", "kvref", "audit", package.name,
            "--select", "KVR001", "--output-format", "json", "--exit-zero", "--no-cache",
            "--python", str(bare_python()),
        ]
        if jobs is not None:
            argv.append(f"--jobs={jobs}")
        started = time.perf_counter()
        completed = subprocess.run(
            argv, cwd=project, capture_output=True, text=True, encoding="utf-8", check=False
        )
        seconds = time.perf_counter() - started
        if completed.returncode not in (0, 2) or not completed.stdout.strip():
            raise RuntimeError(
                f"kvref audit exited {completed.returncode}: {completed.stderr[-2000:]}"
            )
        document = cast(object, json.loads(completed.stdout))
        if isinstance(document, dict):
            items = cast(list[dict[str, object]], cast(dict[str, object], document)["findings"])
        else:
            items = cast(list[dict[str, object]], document)
        raws = [
            (
                str(item["path"]) if prefix == "." else f"{prefix}/{item['path']}",
                int(cast(int, item["line"])),
                "?",
            )
            for item in items
            if item.get("code") == "KVR001"
        ]
        return raws, seconds, completed.stderr.strip()

    from kvref.audit.runner.parallel import available_cpus
    from kvref.audit.runner.scale import run_pipeline

    started = time.perf_counter()
    result = run_pipeline(python_files(corpus.root / subdir), root=corpus.root, jobs=jobs or available_cpus())
    seconds = time.perf_counter() - started
    raws = [(f.path, f.line, "?") for f in result.findings if f.code == "KVR001"]
    unresolved = sum(result.unresolved_bases.values())
    summary = (
        f"engine API: {result.files_analyzed} files, {len(result.errors)} file errors, "
        f"{len(result.unresolved_bases)} unresolved bases ({unresolved} classes only checked "
        "against their resolvable bases)"
    )
    return raws, seconds, summary


# --- comparison ---


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "n/a"


def _compare(
    reports: Mapping[str, Report], kvref: Report | None, *, object_dunders: bool, limit: int
) -> None:
    names = list(reports)
    votes: dict[Key, set[str]] = defaultdict(set)
    object_keys: set[Key] = set()
    exempt: set[Key] = set()
    for name, report in reports.items():
        for key in report.keys:
            votes[key].add(name)
        object_keys |= report.object_keys
        exempt |= report.exempt_keys
    # kvref's documented policy exempts __init__, __new__, __init_subclass__, __post_init__
    # (pyright and ty never report them; mypy reports __init_subclass__).
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

    print(f"\nfindings confirmed by >=1 checker: {len(confirmed)}")
    print(f"consensus (>=2 checkers{', object dunders by policy' if object_dunders else ''}): "
          f"{len(consensus)}")
    print(f"object-dunder overrides reported by some checker: {len(object_keys)}")
    print(f"left out as exempt by policy ({', '.join(sorted(DEFAULT_EXEMPT_NAMES))}): "
          f"{len(exempt)}")
    print("\nper tool (agreement = share of the consensus it reports; extra = outside it):")
    for name in names:
        keys = reports[name].keys
        print(
            f"  {name:8} {len(keys):6d} findings  {reports[name].seconds:7.1f} s  "
            f"agreement {_pct(len(keys & consensus), len(consensus)):>8}  "
            f"extra {len(keys - consensus)}  object {len(reports[name].object_keys)}"
        )
    if kvref is None:
        return
    kvref_keys = (kvref.keys if object_dunders else kvref.keys - object_keys) - exempt
    hits = kvref_keys & consensus
    precise = kvref_keys & confirmed
    print(
        f"  {'kvref':8} {len(kvref.keys):6d} findings  {kvref.seconds:7.1f} s  "
        f"agreement {_pct(len(hits), len(consensus)):>8}  extra {len(kvref_keys - consensus)}"
    )
    print(f"\nKVR001 recall    vs consensus: {_pct(len(hits), len(consensus))} "
          f"({len(hits)}/{len(consensus)})")
    print(f"KVR001 precision vs confirmed: {_pct(len(precise), len(kvref_keys))} "
          f"({len(precise)}/{len(kvref_keys)})")

    def listing(title: str, keys: set[Key]) -> None:
        print(f"\n{title}: {len(keys)}")
        for path, line in sorted(keys)[:limit]:
            who = ",".join(sorted(votes.get((path, line), set()))) or "-"
            print(f"  {path}:{line}  reported by: {who}")
        if len(keys) > limit:
            print(f"  ... {len(keys) - limit} more (raise --limit)")

    listing("missed by kvref (in the consensus)", consensus - kvref_keys)
    listing("reported only by kvref (no checker confirms)", kvref_keys - confirmed)
    listing(
        "reported by kvref and exactly one checker (outside the consensus)",
        (kvref_keys & confirmed) - consensus,
    )
    listing(
        "reported by exactly one checker, not by kvref",
        {key for key in confirmed - consensus - kvref_keys if len(votes[key]) == 1},
    )


def _default_subdir(corpus: Corpus) -> str:
    for candidate in (corpus.name.replace("-", "_"), f"src/{corpus.name.replace('-', '_')}"):
        if (corpus.root / candidate / "__init__.py").is_file():
            return candidate
    return "."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Compare kvref KVR001 with pyright, mypy and ty on a published sdist."
    )
    parser.add_argument("--corpus", default="vllm==0.33.0", help="NAME==VERSION of an sdist")
    parser.add_argument(
        "--subdir", help="directory of the sdist to check (default: the package named NAME)"
    )
    parser.add_argument(
        "--tools", default="pyright,mypy,ty", help="comma-separated checkers to compare"
    )
    parser.add_argument("--python-version", default="3.11", help="target Python version")
    parser.add_argument("--refresh", action="store_true", help="rerun checkers despite the cache")
    parser.add_argument("--no-kvref", action="store_true", help="compare the checkers only")
    parser.add_argument(
        "--no-object-dunders",
        action="store_true",
        help="judge by the policy that object dunder overrides need no @override",
    )
    parser.add_argument("--jobs", type=int, help="kvref worker processes (default: all CPUs)")
    parser.add_argument("--limit", type=int, default=1000, help="max rows per disagreement list")
    args = parser.parse_args(argv)

    try:
        corpus = fetch_corpus(str(args.corpus))
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    subdir = str(args.subdir) if args.subdir else _default_subdir(corpus)
    wanted = [name.strip() for name in str(args.tools).split(",") if name.strip()]
    unknown = sorted(set(wanted) - {tool.name for tool in TOOLS})
    if unknown:
        print(f"error: --tools: unknown {unknown}; allowed: pyright, mypy, ty", file=sys.stderr)
        return 2
    index = _DefIndex(corpus.root)
    reports: dict[str, Report] = {}
    for tool in TOOLS:
        if tool.name not in wanted:
            continue
        text, seconds = run_checker(
            corpus, tool, subdir, str(args.python_version), refresh=bool(args.refresh)
        )
        report = _normalise(parse_output(tool.name, text), index)
        report.seconds = seconds
        reports[tool.name] = report

    kvref: Report | None = None
    if not args.no_kvref:
        try:
            raws, seconds, summary = _kvref_raws(corpus, subdir, args.jobs)
        except (RuntimeError, ValueError, KeyError) as error:
            print(f"kvref could not run ({error}); comparing the checkers only", file=sys.stderr)
        else:
            kvref = _normalise(raws, index)
            kvref.seconds = seconds
            if summary:
                print(f"kvref: {summary.splitlines()[-1]}")
    print(f"corpus {corpus.key} ({subdir}) at {corpus.root}")
    _compare(reports, kvref, object_dunders=not args.no_object_dunders, limit=int(args.limit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
