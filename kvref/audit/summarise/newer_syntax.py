"""Parse source written for a newer Python than the one running kvref.

`class C[T]:`, `type X = ...` (PEP 695, 3.12), `f"{x["a"]}"` (PEP 701, 3.12), `t"..."` (PEP 750,
3.14) and `except A, B:` (PEP 758, 3.14) do not parse on 3.11, yet pyright, mypy and ruff read
them on any Python. When `ast.parse` fails here, `parse_source` asks a newer interpreter to
parse the file: the project's own (`--python`, see `use_interpreter`), else the newest
`python3.N` under pyenv's versions or on PATH. That interpreter runs a small standard-library
script (sent with `-c`) that answers one request per line on stdin with the tree as JSON:
every node's type, fields and positions. The tree is rebuilt here with the node types this
Python knows: `type_params` are dropped, `type X = v` becomes the assignment `X = v`, a template
string becomes an f-string, and any other unknown node becomes a harmless placeholder (`None`
or `pass`) at the same position. Positions are the same as a native parse would give.

One helper process is started per kvref process that meets such a file (the run, or each pool
worker that does), and then parses every such file that process meets; files that parse here
never start one. Without a newer interpreter, or when it cannot parse the file either, the
`SyntaxError` says in one line which Python the syntax needs when that can be told
(`uses Python 3.12 syntax (PEP 695 type parameters); ...`).
"""

from __future__ import annotations

import ast
import atexit
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final, cast

__all__ = [
    "cache_key",
    "close",
    "candidate_interpreters",
    "parse_source",
    "parse_with_newer_interpreter",
    "required_python",
    "use_interpreter",
]

# Runs in the newer interpreter: standard library only. The first line it prints is its
# version; then one JSON answer per JSON request line.
_SERVER = r"""
import ast, json, sys
sys.setrecursionlimit(20000)
def enc(v):
    if isinstance(v, ast.AST):
        d = {"_": type(v).__name__}
        if isinstance(v, ast.expr): d["~"] = "e"
        elif isinstance(v, ast.stmt): d["~"] = "s"
        for f in v._fields: d[f] = enc(getattr(v, f, None))
        for a in v._attributes:
            if getattr(v, a, None) is not None: d["@" + a] = getattr(v, a)
        return d
    if isinstance(v, list): return [enc(x) for x in v]
    if v is None or isinstance(v, (bool, str, int)): return v
    if isinstance(v, float): return {"$f": repr(v)}
    if isinstance(v, complex): return {"$j": [repr(v.real), repr(v.imag)]}
    if isinstance(v, bytes): return {"$b": v.hex()}
    if v is Ellipsis: return {"$e": 0}
    return None
out = sys.stdout
out.write(json.dumps(list(sys.version_info[:2])) + "\n"); out.flush()
for line in sys.stdin:
    request = json.loads(line)
    try:
        answer = {"tree": enc(ast.parse(request["source"], request["path"]))}
    except SyntaxError as e:
        answer = {"error": [str(e.msg), e.lineno or 1, e.offset or 1]}
    except Exception as e:
        answer = {"error": ["cannot parse: %s" % (e,), 1, 1]}
    try:
        text = json.dumps(answer)
    except Exception as e:
        text = json.dumps({"error": ["cannot parse: %s" % (e,), 1, 1]})
    out.write(text + "\n"); out.flush()
"""
_RUNNING: Final = (sys.version_info.major, sys.version_info.minor)
_NEWEST_MINOR: Final = 20
_ANSWER_TIMEOUT_S: Final = 120.0
# Fields that hold a list in some node type: an absent one is rebuilt as [] (others as None).
_LIST_FIELDS: Final = frozenset(
    {
        "args", "body", "cases", "comparators", "decorator_list", "defaults", "elts",
        "finalbody", "generators", "handlers", "ifs", "items", "keys", "keywords",
        "kw_defaults", "kwd_attrs", "kwd_patterns", "kwonlyargs", "names", "ops", "orelse",
        "patterns", "posonlyargs", "targets", "type_ignores", "values",
    }
)
# What each syntax needs, recognised on the line a SyntaxError points at (compiled on first
# use: every audit imports this module, few ever meet such a file).
_FEATURES: Final = (
    (r"^\s*type\s+[A-Za-z_]\w*\s*[\[=]", (3, 12), "PEP 695 type aliases"),
    (r"^\s*(?:async\s+)?(?:def|class)\s+[A-Za-z_]\w*\s*\[", (3, 12), "PEP 695 type parameters"),
    (r"""(?<![\w.'"])(?:[tT][rR]?|[rR][tT])(?:'|")""", (3, 14), "PEP 750 template strings"),
    (r"^\s*except\*?\s+(?!\()[^:#]*,[^:#]*:", (3, 14), "PEP 758 except without parentheses"),
)


class _Server:
    """A running newer interpreter answering parse requests."""

    __slots__ = ("owner", "process", "version")

    def __init__(self, process: subprocess.Popen[bytes], version: tuple[int, int], owner: int) -> None:
        self.process = process
        self.version = version
        self.owner = owner  # the pid that started it: a forked child starts its own


_configured: list[Path] = []
_server: _Server | None = None
_unavailable_in: int = 0  # the pid in which no newer interpreter could be started


def use_interpreter(python: Path | None, version: Sequence[int] = ()) -> None:
    """Prefer the project's interpreter (`--python`) for files this Python cannot parse.

    Args:
        python: the interpreter; None forgets a previous choice.
        version: its version, when known: one not newer than the running Python is ignored.
    """
    _configured.clear()
    if python is not None and (not version or tuple(version[:2]) > _RUNNING):
        _configured.append(python)
    close()


def close() -> None:
    """Stop this process's helper interpreter, if one runs (the next parse starts another).

    It also stops when kvref exits; an embedding program that audits many times may call this
    between audits so that no child process outlives one.
    """
    global _server, _unavailable_in
    if _server is not None:
        _stop(_server)
    _server, _unavailable_in = None, 0


def candidate_interpreters() -> list[Path]:
    """Interpreters newer than this one to try, best first (found without running them).

    The configured one (`use_interpreter`), then `python3.N` for N above the running minor,
    newest first: under pyenv's `versions` directory (`$PYENV_ROOT`, default `~/.pyenv`),
    then on PATH.
    """
    found: list[Path] = list(_configured)
    versions: list[tuple[tuple[int, int], Path]] = []
    try:
        pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
        entries = list((pyenv_root / "versions").iterdir())
    except (OSError, RuntimeError):  # no such directory, or no home directory at all
        entries = []
    for entry in entries:
        match = re.fullmatch(r"3\.(\d+)\.\d+", entry.name)
        if match and (3, int(match.group(1))) > _RUNNING:
            binary = entry / "bin" / f"python3.{match.group(1)}"
            if binary.is_file():
                versions.append(((3, int(match.group(1))), binary))
    found.extend(binary for _, binary in sorted(versions, reverse=True))
    for minor in range(_NEWEST_MINOR, _RUNNING[1], -1):
        located = shutil.which(f"python3.{minor}")
        if located is not None:
            found.append(Path(located))
    unique: list[Path] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


def cache_key() -> str:
    """What a cached parse result depends on beyond the file: the interpreters to try."""
    return "|".join(ascii(str(path)) for path in candidate_interpreters())


def required_python(text: str, error: SyntaxError) -> tuple[tuple[int, int], str] | None:
    """The Python version and feature a syntax error most likely stands for, or None.

    Args:
        text: the source.
        error: the error the running Python raised for it.
    """
    if error.msg.startswith("f-string") and _RUNNING < (3, 12):
        return (3, 12), "PEP 701 f-strings"
    lines = text.splitlines()
    line = lines[error.lineno - 1] if error.lineno and 0 < error.lineno <= len(lines) else ""
    for pattern, version, feature in _FEATURES:
        if version > _RUNNING and re.search(pattern, line):
            return version, feature
    return None


def parse_source(text: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(text)`, or the tree a newer interpreter parses when this one cannot.

    Args:
        text: the source.
        filename: for messages.

    Returns:
        The module, built from node types this Python knows (see the module docstring).

    Raises:
        SyntaxError: no interpreter at hand parses it: the running Python's error, or one
            line naming the Python version the syntax needs.
        ValueError: the source holds NUL bytes.
        RecursionError: absurd nesting.
    """
    try:
        return ast.parse(text, filename=filename, type_comments=False)
    except SyntaxError as error:
        original = error
    tree, version = parse_with_newer_interpreter(text, filename)
    if tree is not None:
        return tree
    needed = required_python(text, original)
    if needed is not None and needed[0] > version:
        (major, minor), feature = needed
        message = (
            f"uses Python {major}.{minor} syntax ({feature}); run kvref with Python >= "
            f"{major}.{minor} or pass --python"
        )
        raise SyntaxError(message, (filename, original.lineno, original.offset, None))
    raise original


def parse_with_newer_interpreter(
    text: str, filename: str = "<unknown>"
) -> tuple[ast.Module | None, tuple[int, int]]:
    """Parse `text` in the newer interpreter (started on first use, then kept).

    Args:
        text: the source.
        filename: for messages.

    Returns:
        The module rebuilt with this Python's node types (None when the newer interpreter
        cannot parse it either, or none is at hand), and that interpreter's version ((0, 0)
        when none could be started).
    """
    server = _ensure_server()
    if server is None:
        return None, (0, 0)
    answer = _ask(server, text, filename)
    tree = answer.get("tree") if answer is not None else None
    if isinstance(tree, dict):
        try:
            built = _build(cast(dict[str, object], tree))
        except RecursionError:
            built = None
        if isinstance(built, ast.Module):
            return built, server.version
    return None, server.version


# --- the helper process ------------------------------------------------------------------


def _ensure_server() -> _Server | None:
    global _server, _unavailable_in
    pid = os.getpid()
    if _server is not None and _server.owner == pid and _server.process.poll() is None:
        return _server
    if _unavailable_in == pid:
        return None
    _server = None
    for python in candidate_interpreters():
        started = _start(python)
        if started is not None:
            _server = started
            atexit.register(_stop, started)
            return started
    _unavailable_in = pid
    return None


def _start(python: Path) -> _Server | None:
    try:
        process = subprocess.Popen(
            [str(python), "-I", "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=tempfile.gettempdir(),
        )
    except OSError:
        return None
    server = _Server(process, (0, 0), os.getpid())
    first = _read_line(server)
    try:
        version = cast(list[int], json.loads(first)) if first else []
    except ValueError:
        version = []
    if len(version) != 2 or (version[0], version[1]) <= _RUNNING:
        _stop(server)
        return None
    server.version = (version[0], version[1])
    return server


def _read_line(server: _Server) -> bytes:
    stdout = server.process.stdout
    assert stdout is not None
    if sys.platform == "win32":  # select() takes only sockets there
        return stdout.readline()
    ready, _, _ = select.select([stdout], [], [], _ANSWER_TIMEOUT_S)
    return stdout.readline() if ready else b""


def _ask(server: _Server, text: str, filename: str) -> dict[str, object] | None:
    global _server
    stdin = server.process.stdin
    assert stdin is not None
    request = json.dumps({"source": text, "path": filename}) + "\n"
    try:
        stdin.write(request.encode("ascii"))
        stdin.flush()
        line = _read_line(server)
        answer = cast(object, json.loads(line)) if line else None
    except (OSError, ValueError):
        answer = None
    if not isinstance(answer, dict):  # the helper died or hangs: do without it
        _stop(server)
        _server = None
        return None
    return cast(dict[str, object], answer)


def _stop(server: _Server) -> None:
    if server.owner != os.getpid():
        return  # a forked child leaves its parent's helper alone
    # Killed rather than waited for: it holds nothing worth flushing, and a process forked
    # from this one (a background cache save) may still hold its stdin open.
    process = server.process
    try:
        if process.stdin is not None:
            process.stdin.close()
    except OSError:
        pass
    process.kill()
    process.wait()


# --- rebuilding the tree -----------------------------------------------------------------


def _build(data: object) -> object:
    if isinstance(data, list):
        items = [_build(item) for item in cast(list[object], data)]
        return [item for item in items if item is not _DROPPED]
    if not isinstance(data, dict):
        return data
    fields = cast(dict[str, object], data)
    name = fields.get("_")
    if isinstance(name, str):
        return _node(name, fields)
    if "$f" in fields:
        return float(cast(str, fields["$f"]))
    if "$j" in fields:
        real, imag = cast(list[str], fields["$j"])
        return complex(float(real), float(imag))
    if "$b" in fields:
        return bytes.fromhex(cast(str, fields["$b"]))
    if "$e" in fields:
        return ...
    return None


_DROPPED: Final = object()
"""An unknown node that is neither an expression nor a statement (left out of its list)."""


def _node(name: str, fields: dict[str, object]) -> object:
    if name == "TypeAlias":  # `type X = v` binds X, like the assignment `X = v`
        name, fields = "Assign", {**fields, "targets": [fields.get("name")]}
    elif name == "TemplateStr":  # t"..." is an f-string but for the object it makes
        name = "JoinedStr"
    elif name == "Interpolation":
        name = "FormattedValue"
    cls = getattr(ast, name, None)
    if not (isinstance(cls, type) and issubclass(cls, ast.AST)):
        kind = fields.get("~")
        if kind == "e":
            name, fields = "Constant", {**fields, "value": None}
        elif kind == "s":
            name, fields = "Pass", fields
        else:
            return _DROPPED
        cls = cast(type[ast.AST], getattr(ast, name))
    node = cls()
    for field in cls._fields:
        value = _build(fields[field]) if field in fields else None
        if value is _DROPPED:
            value = None
        if value is None and field in _LIST_FIELDS:
            value = []
        setattr(node, field, value)
    for attribute in cls._attributes:
        position = fields.get("@" + attribute)
        if isinstance(position, int):
            setattr(node, attribute, position)
    return node
