"""The target Python environment: where installed packages' sources are, found without importing.

Base classes resolve from the packages installed for one interpreter (so `forward` on a
`torch.nn.Module` subclass is checked when torch is installed). `find_interpreter` picks it
the way pyright and mypy users expect: `--python` (an interpreter or a virtual environment,
relative to the working directory), else an activated `VIRTUAL_ENV`, else a `.venv` or `venv`
in the project root, else the interpreter running kvref.

Another interpreter is asked for its `sys.path` in a subprocess that imports nothing but
`sys`, `sysconfig` and `json` (its `site` module runs, as for any start of that interpreter,
so plain `.pth` path entries are included); the running one is read in-process. Editable
installs that work through an import hook rather than a path entry (setuptools'
`__editable___*_finder` modules, the `editables` redirector hatchling uses) are read from the
site directories' `.pth` files without running them: `package_roots` says where each such
top-level package lives. kvref then reads `.py`/`.pyi` files under those roots itself.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from kvref.errors import KVRefError

__all__ = [
    "Environment",
    "InterpreterError",
    "discover_environment",
    "find_interpreter",
    "interpreter_path",
    "start_discovery",
]

# Runs in the target interpreter: standard library only, prints one JSON object.
_QUERY = (
    "import json, sys, sysconfig; p = sysconfig.get_paths(); "
    "print(json.dumps({'path': sys.path, 'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'], "
    "'purelib': p['purelib'], 'platlib': p['platlib'], 'version': list(sys.version_info[:3]), "
    "'executable': sys.executable, 'prefix': sys.prefix}))"
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
            without the project's own source directories (the project is indexed on its own;
            a virtual environment inside the project is kept).
        package_roots: top-level (or dotted namespace) package name -> its directory (or
            module file), for editable installs made through an import hook, searched after
            `search_paths` as the hook comes after them in `sys.meta_path`; none inside the
            project.
        import_roots: the directories inside the project (other than its root) that this
            interpreter imports from: `sys.path` entries (PYTHONPATH, a `.pth` file naming
            `lib/`) and the directories above packages an editable-install hook maps. The
            project's modules are named from them as from the root and `src/`.
    """

    python: Path
    version: tuple[int, int, int]
    stdlib: Path
    search_paths: tuple[Path, ...]
    package_roots: tuple[tuple[str, Path], ...] = ()
    import_roots: tuple[Path, ...] = ()


def interpreter_path(python: Path) -> Path:
    """The interpreter a `--python` value names: an executable, or a venv/prefix directory.

    A relative `python` is taken relative to the process's working directory and made
    absolute (the interpreter is later started from another directory).

    Raises:
        InterpreterError: no interpreter exists at `python`.
    """
    python = Path(os.path.abspath(python))
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


_PROJECT_VENVS = (".venv", "venv")


def find_interpreter(
    python: Path | None,
    *,
    cwd: Path,
    project_root: Path | None,
    environ: Mapping[str, str] | None = None,
) -> Path | None:
    """The interpreter whose installed packages resolve bases; None for the running one.

    In order: `python` (`--python`, relative to `cwd`); the activated virtual environment
    (`VIRTUAL_ENV`); a `.venv` or `venv` holding an interpreter in the project root. Under
    pre-commit (`PRE_COMMIT` set), a `VIRTUAL_ENV` that is kvref's own environment is the
    hook's isolated one, which lacks the project's dependencies: the project's environment
    comes first then. An environment that is the one running kvref is None (read in-process).

    Args:
        python: the `--python` value, if given (its problems are reported when it is asked).
        cwd: the directory relative paths are taken from.
        project_root: the audited project, or None while it is not known yet.
        environ: the environment variables (default `os.environ`).

    Returns:
        An interpreter or virtual environment directory (absolute), or None.
    """
    if python is not None:
        return Path(os.path.abspath(cwd / python))
    environ = os.environ if environ is None else environ
    running = os.path.realpath(sys.prefix)
    active = environ.get("VIRTUAL_ENV", "")
    candidates: list[str] = []
    if active and not (environ.get("PRE_COMMIT") and os.path.realpath(active) == running):
        candidates.append(os.path.abspath(cwd / active))
    if project_root is not None:
        candidates.extend(os.path.join(project_root, name) for name in _PROJECT_VENVS)
    for candidate in candidates:
        if not os.path.isfile(os.path.join(candidate, "pyvenv.cfg")):
            continue  # a stale VIRTUAL_ENV, or a directory that is no virtual environment
        if os.path.realpath(candidate) == running:
            return None
        try:
            return interpreter_path(Path(candidate))
        except InterpreterError:
            continue
    return None


def _inside(path: str, root: str | None) -> bool:
    return root is not None and (path == root or path.startswith(root + os.sep))


def _select(
    entries: Sequence[str],
    stdlib_dirs: Sequence[str],
    project_root: Path | None,
    keep: Sequence[str] = (),
) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """The import roots among `entries`: existing directories, without the standard library;
    those that are the project's own source directories are returned apart (second).

    Args:
        keep: directories whose contents are installed packages even when they lie inside the
            project (the target environment's prefix: a `.venv` in the project root).
    """
    stdlib = [os.path.abspath(directory) for directory in stdlib_dirs if directory]
    root = os.path.abspath(project_root) if project_root is not None else None
    # A prefix holding the whole project (a project inside its environment) keeps nothing.
    installed = [
        prefix
        for prefix in (os.path.abspath(directory) for directory in keep if directory)
        if not (root is not None and _inside(root, prefix))
    ]
    chosen: dict[str, None] = {}
    own: dict[str, None] = {}
    for entry in entries:
        if not entry:
            continue
        path = os.path.abspath(entry)
        if path in chosen or not os.path.isdir(path):
            continue
        # The stdlib dir itself and lib-dynload are the standard library; site-packages
        # inside it (Debian's layout) are kept.
        if any(path == lib or (_inside(path, lib) and "-packages" not in path) for lib in stdlib):
            continue
        if _inside(path, root) and not any(_inside(path, prefix) for prefix in installed):
            if path != root:
                own[path] = None
            continue
        chosen[path] = None
    return tuple(Path(path) for path in chosen), tuple(Path(path) for path in own)


# --- editable installs through an import hook ------------------------------------------------


def _literal_assignment(tree: ast.Module, name: str) -> object:
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            try:
                return cast(object, ast.literal_eval(value))
            except ValueError:
                return None
    return None


def _hook_roots(module_file: str) -> list[tuple[str, str]]:
    """The packages an editable-install hook module maps: setuptools' finder (`MAPPING`,
    `NAMESPACES`) or the `editables` redirector (`F.map_module(name, path)` calls)."""
    try:
        with open(module_file, "rb") as stream:
            tree = ast.parse(stream.read())
    except (OSError, SyntaxError, ValueError):
        return []
    found: list[tuple[str, str]] = []
    mapping = _literal_assignment(tree, "MAPPING")
    if isinstance(mapping, dict):
        for name, where in cast(dict[object, object], mapping).items():
            if isinstance(name, str) and isinstance(where, str):
                found.append((name, where))
    namespaces = _literal_assignment(tree, "NAMESPACES")
    if isinstance(namespaces, dict):
        for name, paths in cast(dict[object, object], namespaces).items():
            if isinstance(name, str) and isinstance(paths, list):
                found.extend(
                    (name, where) for where in cast(list[object], paths) if isinstance(where, str)
                )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "map_module"
            and len(node.args) == 2
            and all(isinstance(arg, ast.Constant) and isinstance(arg.value, str) for arg in node.args)
        ):
            name, where = (cast(str, cast(ast.Constant, arg).value) for arg in node.args)
            # The redirector maps a package to its `__init__.py`.
            if os.path.basename(where) in ("__init__.py", "__init__.pyi"):
                where = os.path.dirname(where)
            found.append((name, where))
    return found


def _package_roots(site_dirs: Iterable[Path]) -> dict[str, str]:
    """The packages that editable-install hooks in `site_dirs`' `.pth` files map (absolute
    paths that exist), the first mapping of a name winning."""
    roots: dict[str, str] = {}
    for site_dir in site_dirs:
        try:
            names = sorted(name for name in os.listdir(site_dir) if name.endswith(".pth"))
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(site_dir, name), encoding="utf-8", errors="replace") as pth:
                    lines = pth.read().splitlines()
            except OSError:
                continue
            for line in lines:
                # `import __editable___pkg_1_0_finder; __editable___pkg_1_0_finder.install()`
                if not line.startswith(("import ", "import\t")):
                    continue
                statement = line.split(";", 1)[0][len("import") :]
                for module in (part.strip() for part in statement.split(",")):
                    if not module.isidentifier():
                        continue
                    for package, where in _hook_roots(os.path.join(site_dir, f"{module}.py")):
                        path = os.path.abspath(where)
                        if package not in roots and os.path.exists(path):
                            roots[package] = path
    return roots


def _site_dirs(search_paths: Sequence[Path], site: Sequence[str]) -> list[Path]:
    """The directories whose `.pth` files `site` processed: site-packages and the like."""
    wanted = {os.path.abspath(directory) for directory in site if directory}
    return [
        path
        for path in search_paths
        if str(path) in wanted or path.name in ("site-packages", "dist-packages")
    ]


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


def _environment(
    python: Path,
    version: tuple[int, int, int],
    stdlib_dirs: tuple[str, str],
    entries: Sequence[str],
    site: Sequence[str],
    prefix: str,
    project_root: Path | None,
) -> Environment:
    search_paths, own = _select(entries, stdlib_dirs, project_root, [prefix, *site])
    root = os.path.abspath(project_root) if project_root is not None else None
    package_roots: list[tuple[str, Path]] = []
    import_roots = dict.fromkeys(own)
    for package, where in _package_roots(_site_dirs(search_paths, site)).items():
        if not _inside(where, root):
            package_roots.append((package, Path(where)))
            continue
        # The project's own package, installed editable: the directory above it is where
        # the interpreter imports it from (when the mapping keeps the package's name).
        parts = package.split(".")
        above = where[: -len(".py")] if where.endswith(".py") else where
        for part in reversed(parts):
            head, tail = os.path.split(above)
            above = head if tail == part else ""
        if above and above != root:
            import_roots[Path(above)] = None
    return Environment(
        python=python,
        version=version,
        stdlib=Path(stdlib_dirs[0]),
        search_paths=search_paths,
        package_roots=tuple(package_roots),
        import_roots=tuple(import_roots),
    )


def discover_environment(
    python: Path | None = None, *, project_root: Path | None = None
) -> Environment:
    """Describe the environment whose installed packages the audit resolves bases from.

    Args:
        python: an interpreter or virtual environment (`--python`, or what
            `find_interpreter` chose); None means the interpreter running kvref.
        project_root: the audited project; its own source directories are left out.

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
        return _environment(
            Path(sys.executable),
            (sys.version_info.major, sys.version_info.minor, sys.version_info.micro),
            (paths["stdlib"], paths["platstdlib"]),
            entries,
            [paths["purelib"], paths["platlib"]],
            sys.prefix,
            project_root,
        )
    interpreter = interpreter_path(python)
    answer = _query(interpreter)
    try:
        raw_path = [str(entry) for entry in cast(list[object], answer["path"])]
        version = tuple(int(cast(int, part)) for part in cast(list[object], answer["version"]))
        stdlib = str(answer["stdlib"])
        platstdlib = str(answer["platstdlib"])
        site = [str(answer["purelib"]), str(answer["platlib"])]
        prefix = str(answer.get("prefix", ""))
    except (KeyError, TypeError, ValueError):
        raise InterpreterError(f"--python: {python} is not a Python interpreter kvref understands") from None
    if len(version) != 3:
        raise InterpreterError(f"--python: {python} reported a malformed version {version!r}")
    # `python -c` puts '' (the cwd) first; _select drops empty entries.
    return _environment(
        interpreter,
        (version[0], version[1], version[2]),
        (stdlib, platstdlib),
        raw_path,
        site,
        prefix,
        project_root,
    )
