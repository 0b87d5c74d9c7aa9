"""`kvref server` from a real editor: headless Neovim on a copy of a large project.

    .venv/bin/python tools/bench_neovim.py                                  # vLLM 0.33, two files
    .venv/bin/python tools/bench_neovim.py --file vllm/v1/kv_offload/cpu/manager.py --edits 50

Copies the corpus's package (an sdist fetched into kvref's cache outside the repository) into a
temporary project, configures Neovim exactly as docs/EDITORS.md says (its Lua block, the server
command pointed at this checkout), and runs `tools/neovim_latency.lua` headless per file, twice:
with an empty cache (the server indexes the project while the edits run) and warm. Prints the
time from `:edit` to the first diagnostics (starting the server process included) and the
edits' p50 / p95 / max from the change to the changed diagnostics (the server's 100 ms debounce
included). `--client-debounce MS` sets Neovim's own `debounce_text_changes` instead of the
documented 0, to see what the client's debounce adds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools` and `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_docs import EDITORS, code_blocks
from tools._audit_corpus import fetch_corpus

CHECKOUT = Path(__file__).resolve().parent.parent
SCRIPT = CHECKOUT / "tools" / "neovim_latency.lua"
DOCUMENTED_COMMAND = "/path/to/project/.venv/bin/kvref"
FILES = ("vllm/v1/kv_offload/tiering/manager.py", "vllm/v1/kv_offload/cpu/manager.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time kvref server from headless Neovim on a copy of a project.")
    parser.add_argument("--corpus", default="vllm==0.33.0")
    parser.add_argument("--file", action="append", help="file to open, relative to the project (repeatable)")
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--client-debounce", type=int, default=None, metavar="MS")
    args = parser.parse_args(argv)
    nvim = shutil.which("nvim")
    if nvim is None:
        parser.exit(2, "bench_neovim.py: nvim is not installed (make test installs Debian's neovim)\n")
    corpus = fetch_corpus(args.corpus)
    package = args.corpus.split("==")[0]
    with tempfile.TemporaryDirectory(prefix="kvref-neovim-") as scratch:
        work = Path(scratch)
        project = work / "project"
        project.mkdir()
        shutil.copytree(corpus.root / package, project / package)
        shutil.copy(corpus.root / "pyproject.toml", project / "pyproject.toml")
        command = work / "kvref"
        command.write_text(f'#!/bin/sh\nexec {sys.executable} -m kvref "$@"\n')
        command.chmod(0o755)
        (setup,) = code_blocks(EDITORS.read_text(encoding="utf-8"), "lua")
        setup = setup.replace(DOCUMENTED_COMMAND, str(command))
        if args.client_debounce is not None:
            setup = setup.replace("debounce_text_changes = 0", f"debounce_text_changes = {args.client_debounce}")
        (work / "setup.lua").write_text(setup)
        print(f"{args.corpus}: {sum(1 for _ in (project / package).rglob('*.py'))} files; nvim {nvim}")
        for name in args.file or FILES:
            for label in ("empty cache", "warm cache"):
                if label == "empty cache":
                    shutil.rmtree(work / "cache", ignore_errors=True)
                out = work / "out.json"
                env = {
                    **os.environ,
                    "KVREF_SETUP": str(work / "setup.lua"), "KVREF_FILE": str(project / name),
                    "KVREF_OUT": str(out), "KVREF_EDITS": str(args.edits), "KVREF_CACHE_DIR": str(work / "cache"),
                    "XDG_CACHE_HOME": str(work / "xdg-cache"), "XDG_STATE_HOME": str(work / "xdg-state"),
                }  # fmt: skip
                done = subprocess.run(
                    [nvim, "--headless", "--clean", "-n", "-c", f"luafile {SCRIPT}"],
                    env=env, cwd=project, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                )  # fmt: skip
                report = json.loads(out.read_text(encoding="utf-8"))
                edits = sorted(float(edit["ms"]) for edit in report["edits"])
                answered = all(edit["ok"] for edit in report["edits"]) and report["first_ok"] and done.returncode == 0
                print(
                    f"  {name}, {label}: first diagnostics {report['first_ms']:.0f} ms; {len(edits)} edits: "
                    f"p50 {statistics.median(edits):.0f} ms, p95 {edits[int(0.95 * (len(edits) - 1))]:.0f} ms, "
                    f"max {edits[-1]:.0f} ms{'' if answered else '  (NOT every edit answered)'}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
