"""The target Python environment: where installed packages' sources are, found without importing.

`kvref audit --python PATH` resolves base classes from the packages installed for that
interpreter (so `forward` on a `torch.nn.Module` subclass is checked when torch is installed).
The interpreter is asked for its `sys.path` in a subprocess that imports nothing but `sys`,
`sysconfig` and `json` (its `site` module runs, as for any start of that interpreter, so `.pth`
entries such as editable installs are included); kvref then reads `.py`/`.pyi` files under
those roots itself. Without `--python` the environment is the interpreter running kvref, read
in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from kvref.errors import KVRefError

__all__ = [
    "Environment",
    "InterpreterError",
    "discover_environment",
    "interpreter_path",
    "start_discovery",
]

# Runs in the target interpreter: standard library only, prints one JSON object.
_QUERY = (
    "import json, sys, sysconfig; p = sysconfig.get_paths(); "
    "print(json.dumps({'path': sys.path, 'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'], "
    "'purelib': p['purelib'], 'platlib': p['platlib'], 'version': list(sys.version_info[:3]), "
    "'executable': sys.executable}))"
)
_QUERY_TIMEOUT_S = 30.0


class InterpreterError(KVRefError, ValueError):
    """`--python` names no working interpreter (the message names the option)."""


@dataclass(frozen=True, slots=True)
class Environment:
    """Where an interpreter finds modules.

    Attributes:
        python: the interpreter.
        version: its (major, minor, micro) version.
        stdlib: its standard library directory.
        search_paths: the other import roots in `sys.path` order (site-packages, `.pth`
            entries, PYTHONPATH), existing directories only, without the standard library and
            without anything inside the project root (the project is indexed on its own).
    """

    python: Path
    version: tuple[int, int, int]
    stdlib: Path
    search_paths: tuple[Path, ...]


def interpreter_path(python: Path) -> Path:
    """The interpreter a `--python` value names: an executable, or a venv/prefix directory.

    Raises:
        InterpreterError: no interpreter exists at `python`.
    """
    if python.is_dir():
        for candidate in ("bin/python3", "bin/python", "Scripts/python.exe", "python.exe"):
            if (python / candidate).is_file():
                return python / candidate
        raise InterpreterError(
            f"--python: {python} is a directory without bin/python (give an interpreter or a "
            "virtual environment)"
        )
    if not python.is_file() or not os.access(python, os.X_OK):
        raise InterpreterError(f"--python: {python} is not an executable Python interpreter")
    return python


def _inside(path: Path, root: Path | None) -> bool:
    if root is None:
        return False
    return path == root or root in path.parents


def _select(
    entries: Sequence[str], stdlib_dirs: Sequence[str], project_root: Path | None
) -> tuple[Path, ...]:
    stdlib = [Path(os.path.abspath(directory)) for directory in stdlib_dirs if directory]
    root = Path(os.path.abspath(project_root)) if project_root is not None else None
    chosen: list[Path] = []
    for entry in entries:
        if not entry:
            continue
        path = Path(os.path.abspath(entry))
        if not path.is_dir() or path in chosen:
            continue
        # The stdlib dir itself and lib-dynload are the standard library; site-packages
        # inside it (Debian's layout) are kept.
        if any(path == lib or (lib in path.parents and "-packages" not in path.as_posix())
               for lib in stdlib):
            continue
        if _inside(path, root):
            continue
        chosen.append(path)
    return tuple(chosen)


_started: dict[Path, subprocess.Popen[str]] = {}


def _start(interpreter: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(interpreter), "-c", _QUERY],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # An empty directory as cwd keeps the caller's directory out of the sys.path seen.
        cwd=tempfile.gettempdir(),
    )


def start_discovery(python: Path | None) -> None:
    """Start asking `python` for its import roots now; `discover_environment` collects the
    answer (the interpreter starts while the caller discovers files). Never raises: a
    failure is reported by `discover_environment`."""
    if python is None:
        return
    try:
        interpreter = interpreter_path(python)
        if interpreter not in _started:
            _started[interpreter] = _start(interpreter)
    except (InterpreterError, OSError):
        pass


def _query(python: Path) -> dict[str, object]:
    try:
        process = _started.pop(python, None) or _start(python)
        try:
            stdout, stderr = process.communicate(timeout=_QUERY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
    except (OSError, subprocess.TimeoutExpired) as error:
        raise InterpreterError(f"--python: cannot run {python}: {error}") from None
    if process.returncode != 0:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise InterpreterError(f"--python: {python} failed to report its sys.path: {last}")
    try:
        answer = cast(object, json.loads(stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        raise InterpreterError(f"--python: {python} is not a Python interpreter kvref understands") from None
    if not isinstance(answer, dict):
        raise InterpreterError(f"--python: {python} is not a Python interpreter kvref understands")
    return cast(dict[str, object], answer)


def discover_environment(
    python: Path | None = None, *, project_root: Path | None = None
) -> Environment:
    """Describe the environment whose installed packages the audit resolves bases from.

    Args:
        python: an interpreter or virtual environment (`--python`); None means the interpreter
            running kvref.
        project_root: the audited project; import roots inside it are left out.

    Returns:
        The environment.

    Raises:
        InterpreterError: `python` is not a working interpreter (the message names
            `--python`).
    """
    if python is None:
        paths = sysconfig.get_paths()
        entries = list(sys.path)
        # sys.path[0] is the directory of the running script (the `kvref` launcher) or ''.
        if entries and (not entries[0] or sys.argv and sys.argv[0] and
                        Path(entries[0]) == Path(os.path.abspath(sys.argv[0])).parent):
            entries = entries[1:]
        return Environment(
            python=Path(sys.executable),
            version=(sys.version_info.major, sys.version_info.minor, sys.version_info.micro),
            stdlib=Path(paths["stdlib"]),
            search_paths=_select(
                entries, [paths["stdlib"], paths["platstdlib"]], project_root
            ),
        )
    interpreter = interpreter_path(python)
    answer = _query(interpreter)
    try:
        raw_path = [str(entry) for entry in cast(list[object], answer["path"])]
        version = tuple(int(cast(int, part)) for part in cast(list[object], answer["version"]))
        stdlib = str(answer["stdlib"])
        platstdlib = str(answer["platstdlib"])
    except (KeyError, TypeError, ValueError):
        raise InterpreterError(f"--python: {python} is not a Python interpreter kvref understands") from None
    if len(version) != 3:
        raise InterpreterError(f"--python: {python} reported a malformed version {version!r}")
    # `python -c` puts '' (the cwd) first; _select drops empty entries.
    return Environment(
        python=interpreter,
        version=(version[0], version[1], version[2]),
        stdlib=Path(stdlib),
        search_paths=_select(raw_path, [stdlib, platstdlib], project_root),
    )
