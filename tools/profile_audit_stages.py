"""Where a cold `kvref audit` spends its time: the stages of one run, then summarising per file.

    python tools/profile_audit_stages.py [--corpus vllm==0.33.0 | --path DIR] [--step N]
        [--no-run] [--kvref-arg=--select=KVR001 --kvref-arg=--no-cache ...]

First, one cold run (`kvref audit PACKAGE --output-format json --exit-zero` with an empty cache
directory and `--python` a bare interpreter, as `tools/bench_audit.py` runs it; `--kvref-arg`
adds arguments), in a child process whose stage functions are wrapped with clocks. Wall seconds
of each stage, in order: start-up (interpreter and imports), configure and discover, summarise
(the process pool; the CPU of the pool's workers is reported too), index, check (the forked
checkers), report (filtering, rendering, writing) and exit (waiting for the cache writer, the
interpreter's teardown); then the CPU seconds of the run's main process and of all its children.

Then, for every Python file (every N-th with `--step`), in this one process with the cyclic
garbage collector off (as `kvref audit` runs), the CPU seconds of:

- parse: `ast.parse` of the decoded source (the floor of any AST-based checker);
- free: dropping that tree (part of the floor's cost too, paid when each tree dies);
- extraction: `kvref.audit.summarise.summary.summarize` minus its own parse and free (decoding, line
  tables, the statement walk, building classes/methods/parameters/annotations);
- pickling: `kvref.audit.runner.cache.dumps` of the summary (what a worker sends to the parent).

The cold-run cost per file beyond the floor is extraction + pickling; `BENCHMARKS.md` explains
what that means for the cold-run target.

With `--parse-pool N`, last, N alternating pairs of: the floor as `tools/bench_audit.py` times
it (one process reading and `ast.parse`-ing every file, collector on, the loop alone) and a
parse-only pool (a child process, timed from its start as a cold run is, that forks one worker
per usable CPU; the workers read and parse the files dealt to them, largest first, with the
collector off as kvref's workers run, and return nothing). That pool is the least wall time any
audit that parses every file with CPython's parser can take on this machine's cores; the median
of its ratios to the floor is the lowest cold ratio such an audit could report.
"""

from __future__ import annotations

import argparse
import ast
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _audit_corpus import (  # noqa: E402
    FLOOR_CODE,
    bare_python,
    fetch_corpus,
    package_dir,
    package_project,
    python_files,
)

from kvref.audit.runner.cache import dumps  # noqa: E402
from kvref.audit.source import decode_source, SummaryError  # noqa: E402
from kvref.audit.summarise.summary import summarize  # noqa: E402

__all__ = ["RUN_STAGES", "STAGES", "main", "profile_run", "profile_stages"]

STAGES = ("parse", "free", "extraction", "pickling")
RUN_STAGES = (
    "start-up", "configure and discover", "summarise", "index", "check", "report", "exit"
)  # fmt: skip

# Runs `kvref audit` in the child with clocks around the functions that begin each stage (where
# the runner looks them up). The first `summarize_many` is the pool's; later ones (files a
# lookup reaches while checking) belong to the check. Prints one JSON object on stderr's last
# line: the marks (`time.perf_counter()`, the system's monotonic clock on Linux, so the parent
# can compare them with its own) and the pool workers' CPU seconds.
_DRIVER = """
import json, os, sys, time
marks = {}
workers = [0.0]
import kvref.cli
from kvref.audit import pipeline, run
from kvref.audit.runner import parallel, scale

def clocked(owner, name, before, after=None):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        marks.setdefault(before, time.perf_counter())
        try:
            return original(*args, **kwargs)
        finally:
            if after is not None:
                marks.setdefault(after, time.perf_counter())
    setattr(owner, name, wrapper)

summarise_chunk = parallel._summarize_chunk_packed

def timed_chunk(*args, **kwargs):  # module-level: the pool sends it to workers by name
    started = time.process_time()
    data = summarise_chunk(*args, **kwargs)
    return data, time.process_time() - started

parallel._summarize_chunk_packed = timed_chunk
unpack = parallel._unpack_rows
def unpack_timed(answer):
    data, seconds = answer
    workers[0] += seconds
    return unpack(data)
parallel._unpack_rows = unpack_timed
clocked(run.AuditRun, "run", "configure and discover", "exit")
clocked(scale, "summarize_many", "summarise", "index")
clocked(pipeline, "index_project", "index", "check")
clocked(scale, "run_shares", "check", "report")
sys.argv = ["kvref", "audit", *sys.argv[1:]]
code = 0
try:
    kvref.cli.main()
except SystemExit as exit:
    code = exit.code if isinstance(exit.code, int) else 1
sys.stderr.write("\\n" + json.dumps({"marks": marks, "workers": workers[0]}) + "\\n")
sys.exit(code)
"""


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


def profile_run(project: Path, target: str, extra: Sequence[str]) -> dict[str, float]:
    """Wall seconds of each of `RUN_STAGES` in one cold run of `kvref audit target` (cwd
    `project`), and the CPU seconds of its main process ("main CPU"), all its processes
    ("all CPU") and the pool's workers ("workers CPU").

    Raises:
        RuntimeError: the run failed, or a stage never began (the runner changed shape).
    """
    cache = Path(tempfile.mkdtemp(prefix="kvref-profile-cache-"))
    argv = [
        sys.executable, "-c", _DRIVER, target, "--output-format", "json", "--exit-zero",
        "--cache-dir", str(cache), "--python", str(bare_python()), *extra,
    ]  # fmt: skip
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        process = subprocess.Popen(
            argv, cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        _, stderr = process.communicate()
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    lines = stderr.decode(errors="replace").strip().splitlines()
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"kvref audit exited {process.returncode}: {lines[-5:]}")
    report = cast(dict[str, object], json.loads(lines[-1]))
    marks = cast(dict[str, float], report["marks"])
    missing = [stage for stage in RUN_STAGES[1:] if stage not in marks]
    if missing:
        raise RuntimeError(f"stages never began: {missing} (did the runner change shape?)")
    # Start-up counts the interpreter's start and imports, exit its teardown.
    times = [0.0, *(marks[stage] - started for stage in RUN_STAGES[1:]), wall]
    result = {stage: times[i + 1] - times[i] for i, stage in enumerate(RUN_STAGES)}
    result["total"] = wall
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result["all CPU"] = cpu
    result["workers CPU"] = float(cast(float, report["workers"]))
    return result


_PARSE_POOL_CODE = """
import ast, gc, os, sys
from concurrent.futures import ProcessPoolExecutor
import multiprocessing

def parse(paths):
    for path in paths:
        with open(path, "rb") as stream:
            ast.parse(stream.read(), path)
    return len(paths)

gc.disable()
paths = sys.stdin.read().split("\\0")
workers = len(os.sched_getaffinity(0))
shares = [[] for _ in range(workers)]
loads = [0] * workers
for path in sorted(paths, key=os.path.getsize, reverse=True):
    least = loads.index(min(loads))
    shares[least].append(path)
    loads[least] += os.path.getsize(path)
with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
    assert sum(pool.map(parse, shares)) == len(paths)
"""


def parse_pool_pairs(files: Sequence[Path], pairs: int) -> list[tuple[float, float]]:
    """`pairs` alternating (floor seconds, parse-only pool seconds); see the module docstring."""
    payload = "\0".join(str(path) for path in files).encode()
    measured: list[tuple[float, float]] = []
    for _ in range(pairs):
        floor = subprocess.run(
            [sys.executable, "-c", FLOOR_CODE], input=payload, capture_output=True, check=True
        )
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", _PARSE_POOL_CODE], input=payload, capture_output=True, check=True
        )
        measured.append((float(floor.stdout.decode().strip()), time.perf_counter() - started))
    return measured


def _print_run(target: str, figures: dict[str, float]) -> None:
    total = figures["total"]
    print(f"one cold run of `kvref audit {target}`: {total:.2f} s wall")
    for stage in RUN_STAGES:
        share = figures[stage] / total if total else 0.0
        print(f"  {stage:<23} {figures[stage]:6.3f} s  {share:6.1%}")
    print(
        f"  CPU: {figures['all CPU']:.2f} s in all processes, of which the pool's workers "
        f"{figures['workers CPU']:.2f} s"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="CPU seconds per stage of summarising a tree for kvref audit."
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--corpus", default="vllm==0.33.0", help="NAME==VERSION of an sdist")
    source.add_argument("--path", type=Path, help="a directory to profile instead of a corpus")
    parser.add_argument("--step", type=int, default=1, help="profile every N-th file")
    parser.add_argument("--no-run", action="store_true", help="skip the cold run's stages")
    parser.add_argument(
        "--parse-pool",
        type=int,
        default=0,
        metavar="N",
        help="then N pairs of the floor and a parse-only pool (default 0: none)",
    )
    parser.add_argument(
        "--kvref-arg",
        action="append",
        default=[],
        help="extra argument for the cold run (repeatable), e.g. --kvref-arg=--select=KVR001",
    )
    args = parser.parse_args(argv)
    if args.step < 1:
        parser.error("--step must be at least 1")
    if args.path is not None:
        root: Path = args.path
        files = sorted(root.rglob("*.py"))
        project = Path(os.path.abspath(root)).parent
    else:
        corpus = fetch_corpus(args.corpus)
        root = package_dir(corpus)  # what tools/bench_audit.py audits
        files = python_files(root)
        project = package_project(corpus, root)
    if not args.no_run:
        target = Path(os.path.abspath(root)).name
        try:
            figures = profile_run(project, target, cast(list[str], args.kvref_arg))
        except (RuntimeError, OSError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        _print_run(target, figures)
    every_file = files
    files = files[:: args.step]
    totals = profile_stages(files)
    floor = totals["parse"] + totals["free"]
    print(f"summarising {root}, per file in one process: {len(files)} files")
    for stage in STAGES:
        print(f"  {stage:<11} {totals[stage]:7.2f} CPU-s")
    extra = totals["extraction"] + totals["pickling"]
    print(f"  beyond the floor (extraction + pickling): {extra / floor if floor else 0:.2f}x of "
          "parse + free")
    if args.parse_pool > 0:
        pairs = parse_pool_pairs(every_file, args.parse_pool)
        ratios = sorted(pool / floor for floor, pool in pairs)
        shown = ", ".join(f"{pool:.2f}/{floor:.2f}" for floor, pool in pairs)
        print(f"parse-only pool of {len(os.sched_getaffinity(0))} workers / floor, each pair: {shown}")
        print(f"  median {ratios[len(ratios) // 2]:.3f}x, best/best "
              f"{min(p for _, p in pairs) / min(f for f, _ in pairs):.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
