"""Benchmark `kvref server` on vLLM 0.33 (about 3,000 files) against `kvref audit` in the same run.

    python tools/bench_server.py [--corpus vllm==0.33.0] [--edits 50] [--file REL ...] [--busy N]
                                 [--against CHECKOUT]

In one run, each in a fresh process, with the corpus's package as the workspace:

- `kvref audit PACKAGE` with an empty cache: the cold CLI time, and its peak memory (the
  largest single process, `ru_maxrss`, and the sampled process tree);
- the server with an empty cache: seconds from `didOpen` of the first file to its first
  diagnostics (target: within the cold CLI time);
- for each edited file, a server with the cache that CLI run left: the same (target: within
  1 s), then, once indexing is done, 50 edits of the file (each adds or removes one
  `@override` on a method, so the findings change): seconds from `didChange` to the
  diagnostics of that version, with the default `debounce` of 100 ms (the wait the server
  adds on purpose) included; p50 and p95 (target: p95 within the debounce + 100 ms), and the
  server's CPU seconds per edit (user + system from `/proc`, the mean over the edits), which
  the machine's load inflates far less than the latency;
- each server's peak memory (`VmHWM`, once the workspace is indexed: the cold one parsed every
  file itself, on one core, in the background) against the CLI's peak process (target: at most
  1.5x).

The default files are vLLM's `kv_offload` CPU manager and tiering manager (1,305 lines), and
`model_executor/models/interfaces.py`, the file whose classes have the most subclasses in
other files (466, the model classes that implement its protocols). `--busy N` keeps N
CPU-bound processes running for the whole run (N = the core count: the figures under load).
`--against CHECKOUT` also runs each warm session with another kvref checkout's server (an
older commit, say), right after this one's, so both see the same load: the ratios compare them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _audit_corpus import fetch_corpus, package_dir, package_project  # noqa: E402

__all__ = ["main"]

CHECKOUT = Path(__file__).resolve().parents[1]
DEFAULT_FILES = (
    "v1/kv_offload/cpu/manager.py",
    "v1/kv_offload/tiering/manager.py",
    "model_executor/models/interfaces.py",
)
DEBOUNCE_MS = 100  # the server's default
EDIT_TARGET_S = 0.1  # on top of the debounce
WARM_FIRST_TARGET_S = 1.0


@dataclass(frozen=True, slots=True)
class Session:
    """One server session's figures."""

    first: float
    first_cpu: float
    latencies: list[float]
    edit_cpu: float
    """The server's CPU seconds per edit (its threads, user and system; the mean over the
    edits, which the machine's load inflates far less than their wall-clock latency)."""
    peak_kib: int
    indexing: float


def _rss_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_seconds(pid: int) -> float:
    """The process's CPU seconds so far (user + system, all threads)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_kib(root: int) -> int:
    """VmRSS summed over `root` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _rss_kib(int(entry), "PPid")
            children.setdefault(parent, []).append(int(entry))
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        total += _rss_kib(pid, "VmRSS")
        pending.extend(children.get(pid, ()))
    return total


def cold_cli(project: Path, package: str, cache: Path) -> tuple[float, int, int]:
    """`kvref audit` with an empty cache: (seconds, peak single-process KiB, peak tree KiB)."""
    argv = [sys.executable, "-m", "kvref", "audit", package, "--output-format", "json", "--exit-zero", "--cache-dir", str(cache)]
    started = time.perf_counter()
    process = subprocess.Popen(argv, cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(cache))
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_kib(process.pid))
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"kvref audit failed: {process.stderr.read().decode() if process.stderr else ''}")
    return seconds, usage.ru_maxrss, peak[0]


def _env(cache: Path, checkout: Path = CHECKOUT) -> dict[str, str]:
    return {**os.environ, "KVREF_CACHE_DIR": str(cache), "PYTHONPATH": str(checkout), "XDG_CACHE_HOME": str(cache / "xdg")}


@contextmanager
def busy_cores(count: int) -> Generator[None]:
    """`count` CPU-bound processes running until the block ends (the machine under load)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def edited_line(lines: Sequence[str]) -> int:
    """The first method (an indented `def`) without a decorator: the line `@override` goes on."""
    for number, line in enumerate(lines):
        if line.startswith((" ", "\t")) and line.lstrip().startswith("def ") and not lines[number - 1].lstrip().startswith("@"):
            return number
    raise ValueError("the file has no undecorated method to edit")


class _Client(LanguageClient):
    def __init__(self) -> None:
        super().__init__("kvref-bench", "1")
        self.arrived: dict[tuple[str, int | None], float] = {}
        self.awaited: dict[tuple[str, int | None], asyncio.Event] = {}
        self.indexed = asyncio.Event()

    async def diagnostics(self, uri: str, version: int) -> float:
        """When the diagnostics of that version arrived (waiting without polling, which would
        take CPU from the server it times)."""
        key = (uri, version)
        if key not in self.arrived:
            await self.awaited.setdefault(key, asyncio.Event()).wait()
        return self.arrived[key]


async def serve(project: Path, opened: Path, cache: Path, edits: int, checkout: Path = CHECKOUT) -> Session:
    """One session of `checkout`'s server: first diagnostics after didOpen, then (once the
    workspace is indexed) `edits` timed edits; the peak memory is read at the end."""
    client = _Client()

    def published(params: types.PublishDiagnosticsParams) -> None:
        key = (params.uri, params.version)
        client.arrived.setdefault(key, time.perf_counter())
        if key in client.awaited:
            client.awaited[key].set()

    def create(params: types.WorkDoneProgressCreateParams) -> None:
        del params

    def progress(params: types.ProgressParams) -> None:
        value: object = params.value
        if isinstance(value, dict) and value.get("kind") == "end":  # pyright: ignore[reportUnknownMemberType]
            client.indexed.set()

    for method, handler in (
        (types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS, published),
        (types.WINDOW_WORK_DONE_PROGRESS_CREATE, create),
        (types.PROGRESS, progress),
    ):
        client.feature(method)(handler)

    await client.start_io(sys.executable, "-m", "kvref", "server", env=_env(cache, checkout), cwd=str(project))  # pyright: ignore[reportUnknownMemberType]
    server: asyncio.subprocess.Process = getattr(client, "_server")
    capabilities = types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=True))
    await client.initialize_async(
        types.InitializeParams(
            capabilities=capabilities,
            root_uri=project.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name=project.name)],
            initialization_options={"debounce": DEBOUNCE_MS},
        )
    )
    client.initialized(types.InitializedParams())
    uri = opened.as_uri()
    text = opened.read_text(encoding="utf-8")
    cpu = _cpu_seconds(server.pid)
    sent = time.perf_counter()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
    )
    first = await client.diagnostics(uri, 1) - sent
    first_cpu = _cpu_seconds(server.pid) - cpu
    latencies: list[float] = []
    started = time.perf_counter()
    await asyncio.wait_for(client.indexed.wait(), 900)
    indexing = time.perf_counter() - started
    if edits:
        lines = text.split("\n")
        target = edited_line(lines)
        indent = lines[target][: len(lines[target]) - len(lines[target].lstrip())]
        cpu = _cpu_seconds(server.pid)
        for version in range(2, edits + 2):
            add = version % 2 == 0  # add the decorator, then take it away again
            start = types.Position(line=target, character=0)
            change = types.TextDocumentContentChangePartial(
                range=types.Range(start=start, end=start if add else types.Position(line=target + 1, character=0)),
                text=f"{indent}@override\n" if add else "",
            )
            sent = time.perf_counter()
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version), content_changes=[change]
                )
            )
            latencies.append(await client.diagnostics(uri, version) - sent)
        cpu = (_cpu_seconds(server.pid) - cpu) / edits
    peak = _rss_kib(server.pid, "VmHWM")
    await client.shutdown_async(None)
    client.exit(None)
    await server.wait()
    await client.stop()
    return Session(first, first_cpu, latencies, cpu if edits else 0.0, peak, indexing)


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _verdict(ok: bool) -> str:
    return "OK" if ok else "MISSED"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time kvref server against kvref audit on one corpus.")
    parser.add_argument("--corpus", default="vllm==0.33.0")
    parser.add_argument("--edits", type=int, default=50)
    parser.add_argument(
        "--file", action="append", dest="files", metavar="REL",
        help="a file to open and edit, relative to the package (repeatable; default: the three above)",
    )  # fmt: skip
    parser.add_argument("--busy", type=int, default=0, metavar="N", help="keep N CPU-bound processes running (default 0)")
    parser.add_argument("--against", type=Path, metavar="CHECKOUT", help="also time this kvref checkout's server, for ratios")
    args = parser.parse_args(argv)
    against: Path | None = args.against
    if against is not None and not (against / "kvref" / "server").is_dir():
        parser.error(f"{against} is no kvref checkout with a server")
    corpus = fetch_corpus(args.corpus)
    package = package_dir(corpus)
    project = package_project(corpus, package)
    opened = [project / package.name / name for name in args.files or DEFAULT_FILES]
    for path in opened:
        if not path.is_file():
            parser.error(f"{path.relative_to(project)} is not a file of {corpus.key}")
    files = sum(1 for _ in package.rglob("*.py"))
    print(f"{corpus.key}: {files} files; {args.busy} busy processes; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    warm_cache = Path(tempfile.mkdtemp(prefix="kvref-bench-server-warm-"))
    cold_cache = Path(tempfile.mkdtemp(prefix="kvref-bench-server-cold-"))
    try:
        with busy_cores(args.busy):
            cli_seconds, cli_peak, cli_tree = cold_cli(project, package.name, warm_cache)
            cold = asyncio.run(serve(project, opened[0], cold_cache, 0))
            warm: dict[Path, Session] = {}
            other: dict[Path, Session] = {}
            for path in opened:
                warm[path] = asyncio.run(serve(project, path, warm_cache, args.edits))
                if against is not None:
                    other[path] = asyncio.run(serve(project, path, warm_cache, args.edits, against))
    finally:
        shutil.rmtree(warm_cache, ignore_errors=True)
        shutil.rmtree(cold_cache, ignore_errors=True)
    print(f"  kvref audit, cold (empty cache):       {cli_seconds:7.2f} s   peak {cli_peak / 1024:4.0f} MiB (process tree {cli_tree / 1024:.0f} MiB)")
    ratio = cold.first / cli_seconds
    print(f"  server, first diagnostics, cold cache: {cold.first:7.3f} s   {ratio:.3f}x the cold CLI   {_verdict(cold.first <= cli_seconds)}")
    _print_memory("cold", opened[0].relative_to(project), cold, cli_peak)
    edit_target = DEBOUNCE_MS / 1000 + EDIT_TARGET_S
    for path, run in warm.items():
        print(f"  {path.relative_to(project)} ({len(path.read_text(encoding='utf-8').splitlines())} lines), warm cache:")
        print(
            f"    first diagnostics:   {run.first:7.3f} s, server CPU {run.first_cpu:.2f} s "
            f"(target {WARM_FIRST_TARGET_S:.0f} s)   {_verdict(run.first <= WARM_FIRST_TARGET_S)}"
        )
        if run.latencies:
            p50, p95 = statistics.median(run.latencies), _percentile(run.latencies, 0.95)
            print(
                f"    didChange -> diagnostics ({len(run.latencies)} edits, debounce {DEBOUNCE_MS} ms included): "
                f"p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {max(run.latencies) * 1000:.0f} ms "
                f"(target p95 {edit_target * 1000:.0f} ms)   {_verdict(p95 <= edit_target)}; "
                f"server CPU {run.edit_cpu * 1000:.0f} ms per edit"
            )
        _print_memory("warm", None, run, cli_peak)
        if path in other:
            _print_against(other[path], run)
    return 0


def _print_against(old: Session, new: Session) -> None:
    p95 = _percentile(new.latencies, 0.95) if new.latencies else 0.0
    old_p95 = _percentile(old.latencies, 0.95) if old.latencies else 0.0
    print(
        f"    --against's server: first diagnostics {old.first:.3f} s (this one {new.first / old.first:.2f}x), "
        f"p95 {old_p95 * 1000:.0f} ms (this one {p95 / old_p95 if old_p95 else 0:.2f}x), "
        f"server CPU {old.edit_cpu * 1000:.0f} ms per edit (this one {new.edit_cpu / old.edit_cpu if old.edit_cpu else 0:.2f}x)"
    )


def _print_memory(label: str, opened: Path | None, run: Session, cli_peak: int) -> None:
    ratio = run.peak_kib / cli_peak
    where = f" ({opened} open)" if opened is not None else ""
    print(
        f"    server peak memory, {label} cache{where}, indexed {run.indexing:4.1f} s after the first diagnostics: "
        f"{run.peak_kib / 1024:4.0f} MiB = {ratio:.2f}x the CLI's peak process (target 1.5x)   {_verdict(ratio <= 1.5)}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
