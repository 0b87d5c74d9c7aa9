"""Run vLLM 0.33's own `tests/v1/kv_offload` (from its sdist) against installed or patched code,
or against kvref's reference.

    .venv-vllm/bin/python tools/vllm_suite.py [--over DIR]
    .venv-vllm/bin/python tools/vllm_suite.py --kvref [TEST ...]

`--over DIR` puts DIR first on the path, so a `DIR/vllm` (a copy of vLLM with some modules
changed, such as `kvref audit --fix` output) is what the tests import; without it they run
against the installed vLLM. `--kvref` loads `tests/vllm/kvref_vllm_shim.py`, which points the
imports of the modules kvref implements at kvref's (the checkout's `kvref`). The run uses vLLM's own pytest configuration and conftest, on vLLM's
CPU platform, with `tools/_vllm_suite_plugin.py` (it skips vLLM's GPU cleanup after each test, and
records where `vllm.v1.kv_offload` was imported from, so a caller can tell the copy was used).
Prints one line per outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools._audit_corpus import fetch_corpus
from tools.vllm_env import VLLM_SPEC
from tools._vllm_suite_plugin import REPORT_ENV

__all__ = ["SuiteRun", "installed_root", "run_suite", "main"]

_TOOLS = Path(__file__).resolve().parent
_CHECKOUT = _TOOLS.parent
_SHIM_DIR = _CHECKOUT / "tests" / "vllm"
_SHIM = "kvref_vllm_shim"


@dataclass(frozen=True)
class SuiteRun:
    """One run of the suite.

    Attributes:
        outcomes: per node id ("tests/v1/kv_offload/...::test[param]"): "passed", "failed",
            "error" or "skipped".
        imported_from: the directory `vllm.v1.kv_offload` was imported from.
        exit_code: pytest's.
        manager_from: the file the CPU manager under test came from (kvref's through the shim),
            or None if no test imported it.
    """

    outcomes: dict[str, str]
    imported_from: Path
    exit_code: int
    manager_from: Path | None = None

    def counts(self) -> Counter[str]:
        return Counter(self.outcomes.values())


def installed_root(python: Path | str) -> Path:
    """The directory holding the `vllm` package `python` imports (found without importing it)."""
    probe = "import importlib.util as u; print(list(u.find_spec('vllm').submodule_search_locations)[0])"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip()).parent


def run_suite(
    python: Path | str = sys.executable,
    over: Path | None = None,
    tests: Sequence[str] = (),
    timeout_s: float = 900,
    kvref: bool = False,
) -> SuiteRun:
    """Run vLLM's `tests/v1/kv_offload` with `python`, importing `over/vllm` first if given.

    Without `over`, the installed vLLM (ahead of the sdist's own `vllm` source, which lacks
    the wheel's compiled parts). `tests` narrows the run to those node ids. `kvref` points the
    modules kvref implements at the checkout's kvref.
    """
    sdist = fetch_corpus(VLLM_SPEC, log=False).root
    over = over if over is not None else installed_root(python)
    with tempfile.TemporaryDirectory(prefix="kvref-vllm-suite-") as scratch:
        report = Path(scratch) / "report.json"
        env = {
            **os.environ,
            # vLLM's sdist has `tests` and `tools` packages: kvref's plugin comes from tools/.
            "PYTHONPATH": os.pathsep.join(
                (str(over), str(sdist), str(_TOOLS), *((str(_CHECKOUT), str(_SHIM_DIR)) if kvref else ()))
            ),
            "VLLM_TARGET_DEVICE": "cpu",
            REPORT_ENV: str(report),
        }
        targets = [str(sdist / test) for test in tests] or [str(sdist / "tests" / "v1" / "kv_offload")]
        command = [
            str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *(("-p", _SHIM) if kvref else ()),
            "-p", "_vllm_suite_plugin",
            "-c", str(sdist / "pyproject.toml"), "--rootdir", str(sdist),
            # append: the sdist's own `vllm` source (no compiled parts) must not shadow the
            # installed or patched package.
            "--import-mode=append", *targets,
        ]  # fmt: skip
        done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout_s)
        if not report.is_file():
            raise RuntimeError(f"vLLM's suite did not run (exit {done.returncode}):\n{done.stdout}{done.stderr}")
        data = json.loads(report.read_text())
        manager_from = data.get("manager_from")
        return SuiteRun(
            dict(data["outcomes"]),
            Path(data["imported_from"]),
            done.returncode,
            Path(manager_from) if manager_from else None,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--over", type=Path, help="a directory holding a patched `vllm` package")
    parser.add_argument("--kvref", action="store_true", help="run the tests against kvref's reference")
    parser.add_argument("tests", nargs="*", help="test files or node ids, relative to the sdist")
    args = parser.parse_args(argv)
    run = run_suite(over=args.over, tests=args.tests, kvref=args.kvref)
    print(f"vllm.v1.kv_offload imported from {run.imported_from}")
    for outcome, count in sorted(run.counts().items()):
        print(f"{count:5d} {outcome}")
    for node, outcome in sorted(run.outcomes.items()):
        if outcome != "passed":
            print(f"{outcome:8s} {node}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
