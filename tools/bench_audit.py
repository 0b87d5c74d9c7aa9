"""Benchmark `kvref audit` on a published sdist against the floor of parsing every file once.

    python tools/bench_audit.py [--corpus vllm==0.33.0] [--corpus transformers==5.25.0]
    python tools/bench_audit.py --cold-only --kvref-arg=--select=KVR001 --kvref-arg=--no-cache

For each corpus, in one run and each in a fresh process:

- floor: read and `ast.parse` every file of the package in a single process (no startup
  counted): the least work any AST-based checker must do without parallelism or a cache;
- cold: `kvref audit PACKAGE --output-format json --exit-zero` with an empty cache directory
  (parse in parallel, resolve, check, write the cache). Floor and cold alternate `--repeat`
  times (default 3); each cold run is divided by the floor measured just before it and the
  median of those ratios is the verdict (on a shared machine one pair can be off by 5%); the
  best cold run against the best floor is printed too;
- warm: the same command again, twice (the better time counts), reusing the cache (skipped with
  `--cold-only`, which times cold runs alone: with `--no-cache` there is no warm run).

Prints wall seconds, the ratio to the floor, and peak memory: the largest single process
(`ru_maxrss` from `wait4`) and the sampled total of the process tree (parent plus workers,
from /proc). Targets on the 2-core development machine: cold <= 0.60x, warm <= 0.08x, RSS < 1 GB.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _audit_corpus import (  # noqa: E402
    FLOOR_CODE,
    bare_python,
    fetch_corpus,
    package_dir,
    package_project,
    python_files,
)

__all__ = ["main", "Measurement"]



@dataclass(frozen=True, slots=True)
class Measurement:
    """One timed run.

    Attributes:
        label: what ran.
        seconds: wall time (for the floor: the parse loop alone).
        max_process_rss: the largest resident set of any single process, in bytes.
        tree_rss: the largest sampled sum over the process and its descendants, in bytes.
        detail: e.g. the number of findings reported.
        ratio: the ratio to the floor when it is not seconds / floor (for cold runs: the
            median of the ratios of the alternating pairs).
    """

    label: str
    seconds: float
    max_process_rss: int
    tree_rss: int
    detail: str = ""
    ratio: float | None = None


def _tree_rss(root_pid: int) -> int:
    """Sum of VmRSS over `root_pid` and its descendants (Linux /proc; 0 elsewhere)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        pid = int(entry)
        parent = int(fields.get("PPid", "0").strip() or 0)
        children.setdefault(parent, []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    total, pending = 0, [root_pid]
    while pending:
        pid = pending.pop()
        total += rss.get(pid, 0)
        pending.extend(children.get(pid, ()))
    return total


def _run(argv: Sequence[str], *, cwd: Path, stdin: bytes = b"") -> tuple[float, int, int, bytes]:
    """Run `argv`, returning (wall seconds, max single-process RSS, max tree RSS, stdout)."""
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        process = subprocess.Popen(
            list(argv), cwd=cwd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.PIPE
        )
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _tree_rss(process.pid))
                done.wait(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        assert process.stdin is not None and process.stderr is not None
        process.stdin.write(stdin)
        process.stdin.close()
        stderr = process.stderr.read()
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        done.set()
        sampler.join()
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv[:4])}... exited {process.returncode}: "
                f"{stderr.decode(errors='replace')[-1500:]}"
            )
        out.seek(0)
        # ru_maxrss is in KiB on Linux.
        return seconds, usage.ru_maxrss * 1024, peak[0], out.read()


def _floor(files: Sequence[Path], cwd: Path) -> Measurement:
    payload = "\0".join(str(path) for path in files).encode()
    _, rss, tree, out = _run([sys.executable, "-c", FLOOR_CODE], cwd=cwd, stdin=payload)
    return Measurement("floor: ast.parse, 1 process", float(out.decode().strip()), rss, tree)


def _count_findings(out: bytes) -> str:
    try:
        document = cast(object, json.loads(out))
    except ValueError:
        return "output is not JSON"
    if isinstance(document, dict):
        mapping = cast(dict[str, object], document)
        findings = cast(list[object], mapping.get("findings", []))
        errors = cast(list[object], mapping.get("errors", []))
        return f"{len(findings)} findings, {len(errors)} file errors"
    return f"{len(cast(list[object], document))} findings"


def _audit(
    label: str, project: Path, package: Path, cache_dir: Path, extra: Sequence[str]
) -> Measurement:
    argv = [
        sys.executable,
        "-m",
        "kvref",
        "audit",
        package.name,
        "--output-format",
        "json",
        "--exit-zero",
        "--cache-dir",
        str(cache_dir),
        *extra,
    ]
    seconds, rss, tree, out = _run(argv, cwd=project)
    return Measurement(label, seconds, rss, tree, _count_findings(out))


def _of(count: int) -> str:
    return f" (median of {count})" if count > 1 else ""


def _mib(value: int) -> str:
    return f"{value / 1048576:7.0f} MiB"


def _median(measurements: Sequence[Measurement], label: str) -> Measurement:
    """The run of median time (memory: the largest seen over all of them)."""
    ordered = sorted(measurements, key=lambda measurement: measurement.seconds)
    middle = ordered[len(ordered) // 2]
    return Measurement(
        label,
        middle.seconds,
        max(m.max_process_rss for m in measurements),
        max(m.tree_rss for m in measurements),
        middle.detail,
    )


def bench_corpus(
    spec: str, *, warm_runs: int, extra: Sequence[str], repeat: int = 3, cold_only: bool = False
) -> list[Measurement]:
    """Measure the floor, cold runs and warm runs on one corpus and print the table.

    The floor and the cold run alternate `repeat` times; the verdict is the median of the
    ratios of each cold run to the floor just before it, so that a burst of load on a shared
    machine moves one pair, not the verdict.
    """
    corpus = fetch_corpus(spec)
    package = package_dir(corpus)
    files = python_files(package)
    cold_mtime_ns = files[len(files) // 2].stat().st_mtime_ns
    lines = 0
    for path in files:
        with open(path, "rb") as stream:
            lines += stream.read().count(b"\n")
    print(f"\n{corpus.key}: {package.relative_to(corpus.root)}/, {len(files)} files, "
          f"{lines / 1e6:.2f} M lines, {os.cpu_count()} CPUs")
    project = package_project(corpus, package)
    floors: list[Measurement] = []
    colds: list[Measurement] = []
    cache_dir = Path(tempfile.mkdtemp(prefix="kvref-bench-cache-"))
    results: list[Measurement] = []
    try:
        for _ in range(max(1, repeat)):
            shutil.rmtree(cache_dir, ignore_errors=True)
            cache_dir.mkdir()
            floors.append(_floor(files, corpus.root))
            colds.append(
                _audit("kvref audit cold (empty cache)", project, package, cache_dir, extra)
            )
        # Each cold run is compared with the floor measured just before it (the machine in
        # the same state); the verdict is the median of those ratios.
        ratios = sorted(
            cold.seconds / floor.seconds for floor, cold in zip(floors, colds, strict=True)
        )
        if len(floors) > 1:
            pairs = ", ".join(
                f"{cold.seconds:.2f}/{floor.seconds:.2f} = {cold.seconds / floor.seconds:.3f}x"
                for floor, cold in zip(floors, colds, strict=True)
            )
            print(f"  cold/floor, each pair: {pairs}")
            best_cold = min(cold.seconds for cold in colds)
            best_floor = min(floor.seconds for floor in floors)
            print(
                f"  best cold / best floor: {best_cold:.2f}/{best_floor:.2f} = "
                f"{best_cold / best_floor:.3f}x"
            )
        results.append(_median(floors, f"floor: ast.parse, 1 process{_of(len(floors))}"))
        results.append(
            replace(
                _median(colds, f"kvref audit cold{_of(len(colds))}"),
                ratio=statistics.median(ratios),
            )
        )
        if not cold_only:
            warm = [
                _audit("kvref audit warm", project, package, cache_dir, extra)
                for _ in range(max(1, warm_runs))
            ]
            results.append(min(warm, key=lambda measurement: measurement.seconds))
            # One edited file: the result cache misses, the summary cache serves the rest.
            edited = files[len(files) // 2]
            os.utime(edited)
            results.append(
                _audit("kvref audit warm, 1 file touched", project, package, cache_dir, extra)
            )
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    floor = results[0].seconds
    print(f"  {'run':40} {'wall':>8} {'x floor':>8} {'max process':>12} {'process tree':>13}")
    for measurement in results:
        ratio = measurement.ratio if measurement.ratio is not None else measurement.seconds / floor
        print(
            f"  {measurement.label:40} {measurement.seconds:7.2f}s {ratio:7.3f}x"
            f" {_mib(measurement.max_process_rss):>12} {_mib(measurement.tree_rss):>13}"
            f"  {measurement.detail}"
        )
    cold = results[1]
    cold_ratio = cold.ratio if cold.ratio is not None else cold.seconds / floor
    os.utime(files[len(files) // 2], ns=(cold_mtime_ns, cold_mtime_ns))
    peak = max(m.tree_rss for m in results[1:])
    verdicts = [f"cold <= 0.60x {'OK' if cold_ratio <= 0.60 else 'MISSED'}"]
    if not cold_only:
        best_warm = results[2]
        verdicts.append(f"warm <= 0.08x {'OK' if best_warm.seconds <= 0.08 * floor else 'MISSED'}")
    verdicts.append(f"RSS < 1 GB {'OK' if peak < 1_000_000_000 else 'MISSED'}")
    print(f"  targets: {', '.join(verdicts)}")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Time kvref audit cold and warm against a single-process ast.parse floor."
    )
    parser.add_argument(
        "--corpus",
        action="append",
        help="NAME==VERSION of an sdist (repeatable; default vllm==0.33.0)",
    )
    parser.add_argument("--warm-runs", type=int, default=2, help="warm runs (best counts)")
    parser.add_argument(
        "--cold-only", action="store_true", help="time the floor and cold runs only (no warm)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="floor and cold runs, alternating (medians count; default 3)",
    )
    parser.add_argument(
        "--kvref-arg",
        action="append",
        default=[],
        help="extra argument for kvref audit (repeatable), e.g. --kvref-arg=--jobs=2",
    )
    parser.add_argument(
        "--python",
        help="interpreter whose packages resolve bases (default: a bare venv, as the checkers "
        "in compare_checkers run without the corpus's dependencies)",
    )
    args = parser.parse_args(argv)
    specs = cast(list[str], args.corpus or ["vllm==0.33.0"])
    # Installing kvref from a wheel byte-compiles it; a checkout run with
    # PYTHONDONTWRITEBYTECODE set (as on some CI machines) would recompile kvref's sources in
    # every timed process instead (about 0.05 s each).
    spec = importlib.util.find_spec("kvref")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            compileall.compile_dir(location, quiet=1)
    try:
        python = str(args.python) if args.python else str(bare_python())
        extra = ["--python", python, *cast(list[str], args.kvref_arg)]
        for spec in specs:
            bench_corpus(
                spec,
                warm_runs=int(args.warm_runs),
                extra=extra,
                repeat=int(args.repeat),
                cold_only=bool(args.cold_only),
            )
    except (ValueError, RuntimeError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
