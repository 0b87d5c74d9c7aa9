"""Compare kvref's KVR001 (missing @override) with pyright, mypy and ty on published sdists.

    python tools/compare_checkers.py [--corpus vllm==0.33.0]     # one corpus, every disagreement
    python tools/compare_checkers.py --popular                    # issue 44's corpus, and a table
    python tools/compare_checkers.py --popular --fix-check        # and --fix on a copy of each

Each checker is installed, pinned, into its own virtual environment and run once with only its
missing-override check enabled, pointed at an interpreter that has nothing installed (as kvref
is, with `--python`), so that no third-party package is visible to any of them; its raw output is
cached per corpus and tool version (`_checker_runs.py` does all of that). Findings are keyed
alike, and recall (against the consensus of at least two checkers) and precision (against the
findings at least one checker makes) computed, by `_agreement.py`, whose docstring gives the
rules. Every disagreement is listed with who reported it and its source line; with several
corpora, a table of every corpus's recall and precision ends the output (BENCHMARKS.md carries
it). Caches live outside the repository (see `_audit_corpus.cache_root`); `--refresh` reruns
the checkers. `--fix-check` also applies `kvref audit --fix` to a copy of each package and
checks the result (`_fix_safety.py`): every fixed file compiles, no fixable KVR001 is left, and
the fixes add no KVR002.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _agreement import Agreement, DefIndex, Report, agreement, normalise, print_agreement  # noqa: E402
from _audit_corpus import (  # noqa: E402
    Corpus,
    bare_python,
    fetch_corpus,
    package_project,
    python_files,
)
from _checker_runs import POPULAR, TOOLS, Package, Raw, parse_output, run_checker  # noqa: E402
from _fix_safety import FixCheck, check_fixes  # noqa: E402

__all__ = ["main"]

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


def _default_subdir(corpus: Corpus) -> str:
    for candidate in (corpus.name.replace("-", "_"), f"src/{corpus.name.replace('-', '_')}"):
        if (corpus.root / candidate / "__init__.py").is_file():
            return candidate
    return "."


def _compare_one(
    package: Package, args: argparse.Namespace, wanted: Sequence[str]
) -> tuple[Corpus, str, Agreement, dict[str, Report]]:
    corpus = fetch_corpus(package.spec)
    subdir = package.subdir or _default_subdir(corpus)
    index = DefIndex(corpus.root)
    reports: dict[str, Report] = {}
    for tool in TOOLS:
        if tool.name not in wanted:
            continue
        text, seconds = run_checker(
            corpus, tool, subdir, str(args.python_version), refresh=bool(args.refresh)
        )
        report = normalise(parse_output(tool.name, text), index)
        report.seconds = seconds
        reports[tool.name] = report
    kvref: Report | None = None
    if not args.no_kvref:
        try:
            raws, seconds, summary = _kvref_raws(corpus, subdir, args.jobs)
        except (RuntimeError, ValueError, KeyError) as error:
            print(f"kvref could not run ({error}); comparing the checkers only", file=sys.stderr)
        else:
            kvref = normalise(raws, index)
            kvref.seconds = seconds
            if summary:
                print(f"kvref: {summary.splitlines()[-1]}")
    object_dunders = not args.no_object_dunders
    found = agreement(reports, kvref, object_dunders=object_dunders)
    print(f"\n=== corpus {corpus.key} ({subdir}) at {corpus.root}")
    print_agreement(found, reports, kvref, index, object_dunders=object_dunders, limit=int(args.limit))
    return corpus, subdir, found, reports


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _table(rows: Sequence[tuple[Corpus, str, Agreement, dict[str, Report]]]) -> None:
    """One markdown row per corpus: the checkers' counts, kvref's, recall and precision."""
    names = [tool.name for tool in TOOLS if rows and tool.name in rows[0][3]]
    print("\n| package | directory | " + " | ".join(names) + " | consensus | kvref | recall | precision |")
    print("|---|---|" + "---:|" * (len(names) + 4))
    for corpus, subdir, found, reports in rows:
        counts = " | ".join(str(len(reports[name].keys)) for name in names)
        kvref = "-" if found.kvref is None else str(len(found.kvref))
        print(
            f"| {corpus.name} {corpus.version} | `{subdir}` | {counts} | {len(found.consensus)} | "
            f"{kvref} | {_ratio(found.recall)} | {_ratio(found.precision)} |"
        )


def _fix_table(rows: Sequence[tuple[Corpus, FixCheck]]) -> None:
    print("\n| package | fixable KVR001 | files fixed | not compiling | fixable again | new KVR002 | KVR002 before |")
    print("|---|" + "---:|" * 6)
    for corpus, check in rows:
        print(
            f"| {corpus.name} {corpus.version} | {check.fixable} | {check.changed} | "
            f"{len(check.not_compiling)} | {len(check.still_fixable)} | {len(check.new_stale)} | "
            f"{len(check.stale_before)} |"
        )
    for corpus, check in rows:
        for problem in (*check.not_compiling, *check.still_fixable, *check.new_stale):
            print(f"  {corpus.key}: {problem}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Compare kvref KVR001 with pyright, mypy and ty on published sdists."
    )
    parser.add_argument(
        "--corpus", action="append", help="NAME==VERSION of an sdist (repeatable; default vllm==0.33.0)"
    )
    parser.add_argument(
        "--popular", action="store_true", help="every package of issue 44's corpus (see _checker_runs.POPULAR)"
    )
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
    parser.add_argument(
        "--fix-check", action="store_true", help="also --fix a copy of each package and check it"
    )
    args = parser.parse_args(argv)

    wanted = [name.strip() for name in str(args.tools).split(",") if name.strip()]
    unknown = sorted(set(wanted) - {tool.name for tool in TOOLS})
    if unknown:
        print(f"error: --tools: unknown {unknown}; allowed: pyright, mypy, ty", file=sys.stderr)
        return 2
    specs = cast(list[str] | None, args.corpus)
    if args.subdir and (args.popular or (specs and len(specs) > 1)):
        print("error: --subdir names the directory of a single --corpus", file=sys.stderr)
        return 2
    packages = [Package(spec, str(args.subdir or ""), "") for spec in specs or ()]
    if args.popular:
        packages.extend(POPULAR)
    if not packages:
        packages.append(Package("vllm==0.33.0", str(args.subdir or ""), ""))
    rows: list[tuple[Corpus, str, Agreement, dict[str, Report]]] = []
    fixes: list[tuple[Corpus, FixCheck]] = []
    for package in packages:
        try:
            rows.append(_compare_one(package, args, wanted))
            if args.fix_check:
                fixes.append((rows[-1][0], check_fixes(rows[-1][0], rows[-1][1])))
        except (ValueError, OSError, RuntimeError) as error:
            print(f"error: {package.spec}: {error}", file=sys.stderr)
            return 2
    if len(rows) > 1:
        _table(rows)
    if fixes:
        _fix_table(fixes)
    return 0 if all(check.safe for _, check in fixes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
