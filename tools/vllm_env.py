"""Build, once, the environment in which kvref's tests run next to vLLM 0.33.0, and reuse it.

    python3 tools/vllm_env.py [--link .venv-vllm]

The environment lives in kvref's cache outside the checkout (`tools/_audit_corpus.cache_root()`:
`$KVREF_CACHE_HOME`, else `$XDG_CACHE_HOME/kvref` or `~/.cache/kvref`), under a name that
includes a digest of everything installed into it, so a second `make test` (from this checkout
or a fresh clone) finds it and installs nothing, and a changed pin builds a new one beside it.
`--link` points a symbolic link in the checkout at it (`make` uses `.venv-vllm/bin/python`).

What it holds: torch 2.13.0 (the CPU build), vLLM 0.33.0's wheel installed without its
dependencies, and the pinned packages of `tools/vllm_env_requirements.txt` (what importing
`vllm.v1.kv_offload` and running its tests need, plus kvref's own dependencies and test tools).
vLLM's wheel asks for a CUDA build of torch 2.14.0, triton, flashinfer and more, several GB that
its offloading code never imports on a CPU-only machine. kvref itself is not installed: tests and
tools import it from the checkout (`PYTHONPATH`), so one environment serves every checkout.

The published sdist of vLLM 0.33.0 (for its `tests/v1/kv_offload`) is fetched into the same
cache. A build that fails leaves nothing that a later run would mistake for a finished one.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools._audit_corpus import cache_root, fetch_corpus

__all__ = ["VLLM_SPEC", "TORCH_SPEC", "REQUIREMENTS", "env_dir", "env_python", "ensure_env", "main"]

VLLM_SPEC = "vllm==0.33.0"
TORCH_SPEC = "torch==2.13.0"
# Installed after the pinned packages, without dependencies (their declared ones pull CUDA).
NO_DEPS_SPECS = (VLLM_SPEC, "xgrammar==0.2.8")
REQUIREMENTS = Path(__file__).resolve().with_name("vllm_env_requirements.txt")
_STAMP = ".kvref-vllm-env-complete"
# What every build must be able to import: vLLM's tiering code, and what kvref's tests use.
_SMOKE_IMPORTS = (
    "vllm.v1.kv_offload.tiering.manager",
    "vllm.v1.kv_offload.tiering.fs.manager",
    "vllm.v1.kv_offload.tiering.spec",
    "redis",
    "hypothesis",
    "typer",
    "xxhash",
)


def _digest() -> str:
    """A digest of everything that decides the environment's contents."""
    recipe = hashlib.sha256()
    for part in (TORCH_SPEC, *NO_DEPS_SPECS, f"py{sys.version_info[0]}.{sys.version_info[1]}"):
        recipe.update(part.encode() + b"\n")
    recipe.update(REQUIREMENTS.read_bytes())
    return recipe.hexdigest()[:12]


def env_dir() -> Path:
    """Where the environment for this recipe lives (built or not)."""
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    return cache_root() / "envs" / f"{VLLM_SPEC.replace('==', '-')}-{py}-{_digest()}"


def env_python(home: Path | None = None) -> Path:
    """The environment's interpreter."""
    return (home or env_dir()) / "bin" / "python"


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


def _run(*args: str | Path) -> None:
    subprocess.run([str(arg) for arg in args], check=True)


def _build(home: Path) -> None:
    if home.exists():
        _say(f"removing an unfinished environment at {home}")
        shutil.rmtree(home)
    home.parent.mkdir(parents=True, exist_ok=True)
    _say(f"creating the vLLM test environment at {home} (once; later runs reuse it)")
    _run(sys.executable, "-m", "venv", home)
    pip = (env_python(home), "-m", "pip", "--disable-pip-version-check", "install", "--progress-bar", "off")
    _say(f"installing {TORCH_SPEC} (the CPU build; vLLM's own pin is a CUDA build of several GB)")
    _run(*pip, TORCH_SPEC)
    _say(f"installing the pinned packages of {REQUIREMENTS.name} (without their dependencies)")
    _run(*pip, "--no-deps", "-r", REQUIREMENTS)
    _say(f"installing {', '.join(NO_DEPS_SPECS)} without their dependencies (they ask for CUDA)")
    _run(*pip, "--no-deps", *NO_DEPS_SPECS)
    _say("checking that vLLM's offloading code imports")
    _run(env_python(home), "-c", "; ".join(f"import {name}" for name in _SMOKE_IMPORTS))
    (home / _STAMP).write_text(f"{VLLM_SPEC}\n{TORCH_SPEC}\n")


def ensure_env() -> Path:
    """Return the environment's directory, building it first if it is missing or unfinished."""
    home = env_dir()
    if (home / _STAMP).is_file():
        _say(f"reusing the vLLM test environment at {home}")
    else:
        _build(home)
    corpus = fetch_corpus(VLLM_SPEC)
    _say(f"vLLM's tests are in {corpus.root / 'tests' / 'v1' / 'kv_offload'}")
    return home


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    temporary = link.with_name(link.name + ".new")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target, target_is_directory=True)
    os.replace(temporary, link)  # atomic: the link always points at a finished environment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--link", type=Path, help="point this symbolic link at the environment")
    parser.add_argument("--print-python", action="store_true", help="print the interpreter's path")
    args = parser.parse_args(argv)
    home = ensure_env()
    if args.link is not None:
        _link(args.link, home)
    if args.print_python:
        print(env_python(home))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
