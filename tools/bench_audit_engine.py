"""Benchmark the audit engine against the floor it cannot beat: a bare `ast.parse`.

Reads every `.py` file under a tree once into memory (the standard library by default),
then times, in one process and one run: (1) `ast.parse` of each file (the baseline),
(2) `summarize` of each file (one parse plus the targeted walk), (3) index + rules over the
summaries (`analyze` with the summaries handed in). It prints the lines per second of each
and the ratio summarize / parse, i.e. what the engine adds on top of parsing.

    python tools/bench_audit_engine.py [--root DIR] [--limit N] [--repeat K]
"""

from __future__ import annotations

import argparse
import ast
import sysconfig
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvref.audit import FileError, ModuleSummary, analyze
from kvref.audit.source import SummaryError
from kvref.audit.summarise.summary import summarize

__all__ = ["main"]


def _best(seconds: list[float]) -> float:
    return min(seconds)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(sysconfig.get_paths()["stdlib"]),
        help="the tree to read (default: this interpreter's standard library)",
    )
    parser.add_argument("--limit", type=int, default=800, help="at most this many files")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs; the best counts")
    args = parser.parse_args(argv)
    if args.limit < 1 or args.repeat < 1:
        parser.error("--limit and --repeat must be at least 1")

    root: Path = args.root.absolute()
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.relative_to(root).parts)
    sources: dict[Path, bytes] = {}
    for path in paths[: args.limit]:
        try:
            sources[path] = path.read_bytes()
        except OSError:
            continue
    lines = sum(source.count(b"\n") for source in sources.values())

    parse_times: list[float] = []
    summary_times: list[float] = []
    analyze_times: list[float] = []
    summaries: dict[Path, ModuleSummary | FileError] = {}
    findings = 0
    for _ in range(args.repeat):
        start = time.perf_counter()
        for source in sources.values():
            try:
                ast.parse(source)
            except (SyntaxError, ValueError):
                pass
        parse_times.append(time.perf_counter() - start)

        start = time.perf_counter()
        for path, source in sources.items():
            try:
                summaries[path] = summarize(path.relative_to(root).as_posix(), source)
            except SummaryError as error:
                summaries[path] = FileError(str(path), error.line, error.col, error.message)
        summary_times.append(time.perf_counter() - start)

        def handed_in(batch: Sequence[Path]) -> Mapping[Path, ModuleSummary | FileError]:
            return {path: summaries[path] for path in batch}

        start = time.perf_counter()
        result = analyze(list(sources), root=root, summarize_many=handed_in)
        analyze_times.append(time.perf_counter() - start)
        findings = len(result.findings)

    parse, summary, index = _best(parse_times), _best(summary_times), _best(analyze_times)
    print(f"tree: {root} ({len(sources)} files, {lines} lines)")
    print(f"ast.parse (baseline): {parse:7.3f} s  {lines / parse:>10,.0f} lines/s")
    print(f"summarize           : {summary:7.3f} s  {lines / summary:>10,.0f} lines/s")
    print(f"index + rules       : {index:7.3f} s  {lines / index:>10,.0f} lines/s  ({findings} findings)")
    print(f"ratio summarize / ast.parse: {summary / parse:.2f}")
    print(f"ratio (summarize + index + rules) / ast.parse: {(summary + index) / parse:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
