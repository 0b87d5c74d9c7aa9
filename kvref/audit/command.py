"""One `kvref audit` run: `run_audit(AuditRequest) -> int` (the typer command in `kvref.cli`
parses the command line into the request).

`run_audit` catches every exception and turns it into exit 2 with one line on stderr, because
an uncaught exception would exit 1 and read as "findings".
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import BinaryIO, Final, TextIO

from kvref.audit.report import OutputFormat
from kvref.audit.request import (
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_FINDINGS,
    AnalyzeFn,
    AnalyzeSourceFn,
    AuditRequest,
    Backend,
    UsageError,
    split_selectors,
)
from kvref.audit.run import AuditRun
from kvref.audit.runner.scale import wait_for_saves
from kvref.errors import KVRefError

__all__ = [
    "EXIT_CLEAN",
    "EXIT_FINDINGS",
    "EXIT_ERROR",
    "AnalyzeFn",
    "AnalyzeSourceFn",
    "Backend",
    "AuditRequest",
    "OutputFormat",
    "UsageError",
    "real_backend",
    "run_audit",
    "split_selectors",
]


def real_backend() -> Backend:
    """The real engine, imported only when an audit runs."""
    from kvref.audit.fixes.edits import FixError, apply_fixes
    from kvref.audit.pipeline import analyze
    from kvref.audit.rules import rule_catalogue
    from kvref.audit.runner.scale import analyze_at_scale
    from kvref.audit.stdin import analyze_source

    return Backend(analyze, apply_fixes, FixError, rule_catalogue(), analyze_at_scale, analyze_source)


_FREEZE_AFTER_ALLOCATIONS: Final = 200_000


@contextlib.contextmanager
def _cyclic_gc_paused() -> Generator[None, None, None]:
    """Turn the cyclic garbage collector off for one audit (worker processes inherit it).

    An audit allocates about a million small objects (summaries, index entries) that form no
    cycles; every gen-2 pass re-scans all of them. On vLLM's 1.16 M lines, unpickling the
    summaries took 2.7x longer with the collector on. Reference counting still frees
    everything that is dropped, and the collector is back on for the caller afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            # After a big run the first allocation once `enable` is back would scan every
            # object the run left alive as one huge youngest generation (0.7 s on vLLM), so
            # they are frozen first: reference counting still frees them, the cyclic collector
            # just never scans them (a process-wide effect, kept to runs that need it).
            if gc.get_count()[0] > _FREEZE_AFTER_ALLOCATIONS:
                gc.freeze()
            gc.enable()


def run_audit(
    request: AuditRequest,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    backend: Backend | Callable[[], Backend] | None = None,
    cwd: Path | None = None,
    stdin: BinaryIO | None = None,
) -> int:
    """Run one audit and return its exit code; never raises (errors are exit 2, one line).

    `backend` defaults to the real engine (`real_backend`, looked up when called); `stdin`
    (default: `sys.stdin`'s bytes) is read for the path `-`.
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    for stream in (out, err):
        _pass_undecodable_names_through(stream)
    try:
        if backend is None:
            resolved = real_backend()
        else:
            resolved = backend if isinstance(backend, Backend) else backend()
        streams = (out, err, stdin)
        runner = AuditRun(request, resolved, cwd if cwd is not None else Path.cwd(), streams)
        try:
            with _cyclic_gc_paused():
                return runner.run()
        finally:
            wait_for_saves()
    except KVRefError as exc:
        err.write(f"kvref: error: {exc}\n")
    except BrokenPipeError:
        # The reader went away (`kvref audit | head`): stop quietly, and keep Python from
        # complaining again when it flushes stdout at exit.
        _silence(out)
        return EXIT_FINDINGS
    except KeyboardInterrupt:
        err.write("kvref: interrupted\n")
    except Exception as exc:  # noqa: BLE001 - the one place every failure becomes exit 2
        err.write(f"kvref: internal error: {type(exc).__name__}: {exc}\n")
    return EXIT_ERROR


def _pass_undecodable_names_through(stream: TextIO) -> None:
    """Let a console stream write file names that are not valid UTF-8 as their own bytes.

    Such a name is held as lone surrogates (`os.fsdecode`); a strict stream would raise on
    it, ending the run with nothing reported. Written back as the original bytes, the name
    is the one `ls` shows and a shell can open.
    """
    if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
        stream.reconfigure(errors="surrogateescape")


def _silence(stream: TextIO) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass
