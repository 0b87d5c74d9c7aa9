"""Where the CPU time of summarising a tree goes: parse, free, extraction, pickling.

    python tools/profile_audit_stages.py [--corpus vllm==0.33.0 | --path DIR] [--step N]

For every Python file (every N-th with `--step`), in this one process with the cyclic garbage
collector off (as `kvref audit` runs), it measures CPU seconds of:

- parse: `ast.parse` of the decoded source (the floor of any AST-based checker);
- free: dropping that tree (part of the floor's cost too, paid when each tree dies);
- extraction: `kvref.audit.summarise.summary.summarize` minus its own parse and free (decoding, line
  tables, the statement walk, building classes/methods/parameters/annotations);
- pickling: `kvref.audit.runner.cache.dumps` of the summary (what a worker sends to the parent).

The cold-run cost per file beyond the floor is extraction + pickling; `BENCHMARKS.md` explains
what that means for the cold-run target.
"""

from __future__ import annotations

import argparse
import ast
import gc
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _audit_corpus import fetch_corpus, package_dir, python_files  # noqa: E402

from kvref.audit.runner.cache import dumps  # noqa: E402
from kvref.audit.source import decode_source, SummaryError  # noqa: E402
from kvref.audit.summarise.summary import summarize  # noqa: E402

__all__ = ["main", "profile_stages"]

STAGES = ("parse", "free", "extraction", "pickling")


def profile_stages(files: Sequence[Path]) -> dict[str, float]:
    """CPU seconds per stage over `files` (files that do not decode or parse are skipped)."""
    totals: dict[str, float] = dict.fromkeys(STAGES, 0.0)
    clock = time.process_time
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for path in files:
            source = path.read_bytes()
            try:
                text = decode_source(source)[0]
                started = clock()
                tree = ast.parse(text, filename=str(path))
                parsed = clock()
                del tree
                freed = clock()
                summary = summarize(str(path), source)
                summarized = clock()
                dumps(summary)
                pickled = clock()
            except (SummaryError, SyntaxError, ValueError):
                continue
            totals["parse"] += parsed - started
            totals["free"] += freed - parsed
            totals["extraction"] += max(0.0, (summarized - freed) - (freed - started))
            totals["pickling"] += pickled - summarized
    finally:
        if was_enabled:
            gc.enable()
    return totals


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="CPU seconds per stage of summarising a tree for kvref audit."
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--corpus", default="vllm==0.33.0", help="NAME==VERSION of an sdist")
    source.add_argument("--path", type=Path, help="a directory to profile instead of a corpus")
    parser.add_argument("--step", type=int, default=1, help="profile every N-th file")
    args = parser.parse_args(argv)
    if args.step < 1:
        parser.error("--step must be at least 1")
    if args.path is not None:
        root: Path = args.path
        files = sorted(root.rglob("*.py"))
    else:
        corpus = fetch_corpus(args.corpus)
        root = package_dir(corpus)  # what tools/bench_audit.py audits
        files = python_files(root)
    files = files[:: args.step]
    totals = profile_stages(files)
    floor = totals["parse"] + totals["free"]
    print(f"{root}: {len(files)} files")
    for stage in STAGES:
        print(f"  {stage:<11} {totals[stage]:7.2f} CPU-s")
    extra = totals["extraction"] + totals["pickling"]
    print(f"  beyond the floor (extraction + pickling): {extra / floor if floor else 0:.2f}x of "
          "parse + free")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
