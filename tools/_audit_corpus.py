"""Published sdists as audit corpora, downloaded and unpacked in a cache outside the repository.

A helper module (not a tool), shared by `tools/bench_audit.py`, `tools/compare_checkers.py`,
`tools/_checker_runs.py` and `tools/profile_audit_stages.py`. An sdist is located through the
package index's simple API (PEP 691 JSON), checked against the index's sha256, and unpacked
once; `pip download` is not used because for an sdist it builds metadata, which for projects
such as vLLM needs a compiler toolchain. Nothing here is ever written inside the repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import cast

__all__ = [
    "FLOOR_CODE",
    "Corpus",
    "bare_python",
    "package_project",
    "cache_root",
    "parse_spec",
    "fetch_corpus",
    "package_dir",
    "python_files",
]

FLOOR_CODE = """
import ast, sys, time
paths = sys.stdin.read().split("\\0")
started = time.perf_counter()
for path in paths:
    with open(path, "rb") as stream:
        ast.parse(stream.read(), path)
print(time.perf_counter() - started)
"""
"""The floor of the audit benchmarks, run with `python -c`: one process reads and parses every
file named on stdin (NUL-separated), collector on, and prints the loop's seconds."""

_INDEX_URL = "https://pypi.org/simple"
_SPEC_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
# Directories of an sdist that are not the project's own Python (vendored, build outputs).
_SKIP_DIRS = frozenset({".git", "__pycache__", "build", "dist", ".tox", ".venv", "node_modules"})


@dataclass(frozen=True, slots=True)
class Corpus:
    """An unpacked sdist.

    Attributes:
        name: the distribution name as given, e.g. "vllm".
        version: the exact version, e.g. "0.33.0".
        root: the unpacked source tree (the sdist's single top-level directory).
    """

    name: str
    version: str
    root: Path

    @property
    def key(self) -> str:
        """A file-name-safe identifier of the corpus, e.g. "vllm-0.33.0"."""
        return f"{self.name}-{self.version}"


def cache_root() -> Path:
    """Where corpora, tool environments and tool outputs are cached (never inside the repo).

    `KVREF_CACHE_HOME` overrides; otherwise `$XDG_CACHE_HOME/kvref` or `~/.cache/kvref`.
    """
    override = os.environ.get("KVREF_CACHE_HOME")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvref"


def bare_python() -> Path:
    """An interpreter with no third-party packages (a cached `venv --without-pip`).

    Passed as `kvref audit --python` so kvref, like the checkers it is compared with, sees the
    corpus without its dependencies installed.
    """
    home = cache_root() / "tools" / "bare-venv"
    python = home / "bin" / "python"
    if not python.exists():
        import subprocess

        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", "--clear", str(home)], check=True
        )
    return python


def package_project(corpus: Corpus, package: Path) -> Path:
    """A project directory holding only `package` (a symlink) and a minimal pyproject.toml.

    `kvref audit` indexes the whole project around the paths it is given; the sdist's root
    would add its tests, examples and benchmarks, while the floor and the checkers cover the
    package alone.
    """
    project = cache_root() / "projects" / corpus.key
    project.mkdir(parents=True, exist_ok=True)
    (project / "pyproject.toml").write_text(f"[project]\nname = {corpus.name!r}\n")
    link = project / package.name
    if not link.is_symlink():
        link.symlink_to(package, target_is_directory=True)
    return project


def parse_spec(spec: str) -> tuple[str, str]:
    """Split "NAME==VERSION" into its parts.

    Raises:
        ValueError: the spec is not of the form NAME==VERSION.
    """
    match = _SPEC_RE.match(spec.strip())
    if match is None:
        raise ValueError(f"corpus must be NAME==VERSION (e.g. vllm==0.33.0), got {spec!r}")
    return match.group(1), match.group(2)


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _find_sdist(name: str, version: str) -> tuple[str, str, str]:
    """Return (filename, url, sha256) of the sdist of NAME==VERSION from the index."""
    request = urllib.request.Request(
        f"{_INDEX_URL}/{_normalise(name)}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        page = cast(dict[str, object], json.load(response))
    files = cast(list[dict[str, object]], page.get("files", []))
    wanted = re.compile(
        rf"^{re.escape(_normalise(name)).replace('-', '[-_.]')}-{re.escape(version)}"
        r"\.(tar\.gz|zip)$",
        re.IGNORECASE,
    )
    for entry in files:
        filename = str(entry["filename"])
        if wanted.match(filename):
            hashes = cast(dict[str, str], entry.get("hashes", {}))
            return filename, str(entry["url"]), hashes.get("sha256", "")
    raise ValueError(f"no sdist of {name}=={version} on {_INDEX_URL}")


def _download(url: str, destination: Path, sha256: str) -> None:
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=destination.parent, delete=False) as part:
        with urllib.request.urlopen(url, timeout=600) as response:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                part.write(chunk)
    if sha256 and digest.hexdigest() != sha256:
        os.unlink(part.name)
        raise ValueError(f"sha256 mismatch for {url}: index says {sha256}")
    os.replace(part.name, destination)


def _extract(archive: Path, target: Path) -> Path:
    """Unpack into a temp dir next to `target` and rename it into place; return the tree root."""
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".extract-"))
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as bundle:
                bundle.extractall(staging)
        else:
            with tarfile.open(archive) as bundle:
                bundle.extractall(staging, filter="data")
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    entries = [entry for entry in target.iterdir() if entry.is_dir()]
    return entries[0] if len(entries) == 1 else target


def fetch_corpus(spec: str, *, log: bool = True) -> Corpus:
    """Download and unpack the sdist NAME==VERSION (once; later calls reuse the cache).

    Raises:
        ValueError: a malformed spec, no such sdist, or a checksum mismatch.
    """
    name, version = parse_spec(spec)
    corpora = cache_root() / "corpora"
    corpora.mkdir(parents=True, exist_ok=True)
    target = corpora / f"{_normalise(name)}-{version}"
    if not target.is_dir():
        filename, url, sha256 = _find_sdist(name, version)
        archive = corpora / filename
        if not archive.is_file():
            if log:
                print(f"downloading {filename} into {corpora}", file=sys.stderr)
            _download(url, archive, sha256)
        if log:
            print(f"unpacking {filename}", file=sys.stderr)
        _extract(archive, target)
    entries = [entry for entry in target.iterdir() if entry.is_dir()]
    root = entries[0] if len(entries) == 1 else target
    return Corpus(name=_normalise(name), version=version, root=root)


def package_dir(corpus: Corpus) -> Path:
    """The corpus's import package (`vllm/`, `src/transformers/`), else its root."""
    for candidate in (corpus.name.replace("-", "_"), f"src/{corpus.name.replace('-', '_')}"):
        if (corpus.root / candidate / "__init__.py").is_file():
            return corpus.root / candidate
    return corpus.root


def python_files(root: Path) -> list[Path]:
    """Every `.py`/`.pyi` file under `root` in a stable order, skipping build and VCS dirs."""
    found: list[Path] = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS and not d.startswith("."))
        found.extend(
            Path(directory, file) for file in sorted(files) if file.endswith((".py", ".pyi"))
        )
    return found
