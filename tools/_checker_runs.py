"""The type checkers KVR001 is compared with: pinned installs, command lines, cached runs, and
their outputs read back as raw findings.

A helper module of `tools/compare_checkers.py` (not a tool). Each checker is installed, pinned,
into its own virtual environment under `_audit_corpus.cache_root()` and run once per corpus
and version with only its missing-override check enabled and no third-party packages visible;
its raw output is cached there (pyright needs minutes and gigabytes on vLLM). `run_checker`
returns that output, `parse_output` the (path, line, base class) it reports.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _audit_corpus import Corpus, bare_python, cache_root  # noqa: E402

__all__ = ["POPULAR", "Package", "Raw", "TOOLS", "Tool", "parse_output", "run_checker"]


@dataclass(frozen=True, slots=True)
class Tool:
    """A pinned checker: what to install and how to name its cache entries."""

    name: str
    version: str
    requirement: str

    @property
    def label(self) -> str:
        return f"{self.name}-{self.version}"


TOOLS: tuple[Tool, ...] = (
    Tool("pyright", "1.1.414", "pyright[nodejs]==1.1.414"),
    Tool("mypy", "2.4.1", "mypy==2.4.1"),
    Tool("ty", "1.0.0", "ty==1.0.0"),
)


@dataclass(frozen=True, slots=True)
class Package:
    """One package of a published sdist to compare on: the sdist, the directory checked, and
    what about it the comparison exercises."""

    spec: str
    subdir: str
    exercises: str


POPULAR: tuple[Package, ...] = (
    Package("urllib3==2.8.0", "src/urllib3", "http.client and io subclasses; a class name rebound when ssl is missing"),
    Package("requests==2.34.2", "src/requests", "bases from an uninstalled package (urllib3); MutableMapping"),
    Package("httpx==0.28.1", "httpx", "deep transport and stream hierarchies; TYPE_CHECKING imports"),
    Package("rich==15.0.0", "rich", "many small protocols; io.TextIOBase; sys.platform checks"),
    Package("attrs==26.1.0", "src/attr", "methods defined under version checks; code hidden from checkers"),
    Package("pydantic==2.14.3", "pydantic", "dunders under `if not TYPE_CHECKING:`; deep hierarchies"),
    Package("click==8.5.1", "src/click", "parameter and context hierarchies; io wrappers"),
    Package("jinja2==3.1.6", "src/jinja2", "node visitors; collections.abc mappings"),
    Package("sqlalchemy==2.1.9", "lib/sqlalchemy", "the deepest hierarchies; TYPE_CHECKING everywhere"),
    Package("werkzeug==3.1.9", "src/werkzeug", "http.server and socketserver subclasses; MultiDict over dict"),
    Package("pytest==9.2.0", "src/_pytest", "node hierarchies; ast.NodeVisitor; version checks"),
    Package("trio==0.35.0", "src/trio", "sys.platform branches; ABCs; version checks"),
    Package("django==5.2.9", "django", "a large untyped codebase; sqlite3.Cursor; stdlib everywhere"),
    Package("black==26.10.1", "src/black", "ast.NodeVisitor subclasses; dataclasses"),
)
"""The corpus of issue 44: popular typed packages nobody here wrote (`--popular`)."""


# --- installing and running the checkers ---


def _venv(tool: Tool) -> Path:
    """The tool's own virtual environment (created and filled on first use)."""
    home = cache_root() / "tools" / tool.label
    stamp = home / ".installed"
    if not stamp.is_file():
        print(f"installing {tool.requirement} into {home}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(home)], check=True)
        subprocess.run(
            [
                str(home / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                tool.requirement,
            ],
            check=True,
        )
        stamp.touch()
    return home


def _workdir(corpus: Corpus, tool: Tool) -> Path:
    work = cache_root() / "outputs" / corpus.key / tool.label
    work.mkdir(parents=True, exist_ok=True)
    return work


def _run_cached(
    corpus: Corpus, tool: Tool, subdir: str, argv: list[str], *, refresh: bool
) -> tuple[str, float]:
    """Run `argv` in the corpus root once; return (stdout, seconds), cached on disk."""
    work = _workdir(corpus, tool)
    output = work / f"{subdir.replace('/', '_') or 'root'}.out"
    meta = output.with_suffix(".meta.json")
    if not refresh and output.is_file() and meta.is_file():
        seconds = float(cast(dict[str, float], json.loads(meta.read_text()))["seconds"])
        return output.read_text(encoding="utf-8"), seconds
    print(f"running {tool.label} on {corpus.key}/{subdir} (cached afterwards)", file=sys.stderr)
    started = time.perf_counter()
    completed = subprocess.run(
        argv, cwd=corpus.root, capture_output=True, text=True, encoding="utf-8", check=False
    )
    seconds = time.perf_counter() - started
    if completed.returncode not in (0, 1):
        raise RuntimeError(
            f"{tool.label} exited {completed.returncode}: {completed.stderr.strip()[-2000:]}"
        )
    if tool.name == "pyright" and '"filesAnalyzed": 0' in completed.stdout:
        raise RuntimeError(f"{tool.label} analysed no files: {completed.stdout[-500:]}")
    temporary = output.with_suffix(".tmp")
    temporary.write_text(completed.stdout, encoding="utf-8")
    os.replace(temporary, output)
    meta.write_text(json.dumps({"seconds": seconds, "argv": argv}))
    return completed.stdout, seconds


def _pyright_argv(corpus: Corpus, tool: Tool, subdir: str, python_version: str) -> list[str]:
    home = _venv(tool)
    # Everything off except the one rule (pyright reports syntax errors regardless). pyright
    # only takes relative "include" paths, so the config lives in the (cached) corpus root.
    config: dict[str, object] = {
        "include": [subdir],
        "exclude": ["**/__pycache__", "**/node_modules"],
        "pythonVersion": python_version,
        "typeCheckingMode": "off",
        "reportMissingImports": "none",
        "reportMissingModuleSource": "none",
        "reportUndefinedVariable": "none",
        "reportAttributeAccessIssue": "none",
        "reportImplicitOverride": "error",
        "enableReachabilityAnalysis": False,
    }
    config_path = corpus.root / ".kvref-compare-pyrightconfig.json"
    config_path.write_text(json.dumps(config, indent=2))
    return [
        str(home / "bin" / "pyright"),
        "--outputjson",
        # An interpreter with nothing installed: the corpus's dependencies stay unresolved.
        "--pythonpath",
        str(bare_python()),
        "-p",
        str(config_path),
    ]


def _mypy_argv(corpus: Corpus, tool: Tool, subdir: str, python_version: str) -> list[str]:
    home = _venv(tool)
    work = _workdir(corpus, tool)
    empty = work / "empty.ini"
    empty.write_text("[mypy]\n")
    return [
        str(home / "bin" / "mypy"),
        "--config-file",
        str(empty),
        "--python-version",
        python_version,
        "--no-site-packages",
        "--ignore-missing-imports",
        "--follow-imports=silent",
        "--enable-error-code",
        "explicit-override",
        "--cache-dir",
        str(work / "mypy-cache"),
        "--show-column-numbers",
        "--no-pretty",
        "--no-error-summary",
        "--hide-error-context",
        subdir,
    ]


def _ty_argv(corpus: Corpus, tool: Tool, subdir: str, python_version: str) -> list[str]:
    home = _venv(tool)
    work = _workdir(corpus, tool)
    # An explicit empty config keeps the corpus's own [tool.ty] (its .venv) out of the run.
    empty = work / "ty.toml"
    empty.write_text("")
    return [
        str(home / "bin" / "ty"),
        "check",
        "--config-file",
        str(empty),
        "--python",
        str(bare_python().parent.parent),
        "--python-version",
        python_version,
        "--ignore",
        "all",
        "--error",
        "missing-override-decorator",
        "--output-format",
        "concise",
        "--no-progress",
        "--color",
        "never",
        "--exit-zero",
        subdir,
    ]


_ARGV = {"pyright": _pyright_argv, "mypy": _mypy_argv, "ty": _ty_argv}


# --- parsing each tool's output into raw (path, line, base class) triples ---

Raw = tuple[str, int, str]
"""(path as the tool printed it, 1-based line, the overridden base class as named)."""

_PYRIGHT_BASE = re.compile(r'overriding a method in class "([^"]+)"')
_MYPY_LINE = re.compile(
    r'^(?P<path>[^:\n]+):(?P<line>\d+):(?:\d+:)? error: .*?in class "(?P<base>[^"]+)"'
    r".*\[explicit-override\]$"
)
_TY_LINE = re.compile(
    r"^(?P<path>[^:\n]+):(?P<line>\d+):\d+: \w+\[missing-override-decorator\] "
    r"Method `[^`]+` overrides `(?P<base>[^`]+)\.[^.`]+`"
)


def _parse_pyright(text: str) -> list[Raw]:
    document = cast(dict[str, object], json.loads(text))
    found: list[Raw] = []
    for diagnostic in cast(list[dict[str, object]], document.get("generalDiagnostics", [])):
        if diagnostic.get("rule") != "reportImplicitOverride":
            continue
        start = cast(dict[str, dict[str, int]], diagnostic["range"])["start"]
        match = _PYRIGHT_BASE.search(str(diagnostic.get("message", "")))
        found.append(
            (str(diagnostic["file"]), start["line"] + 1, match.group(1) if match else "?")
        )
    return found


def _parse_lines(text: str, pattern: re.Pattern[str]) -> list[Raw]:
    found: list[Raw] = []
    for line in text.splitlines():
        match = pattern.match(line.strip())
        if match:
            found.append((match.group("path"), int(match.group("line")), match.group("base")))
    return found


def run_checker(
    corpus: Corpus, tool: Tool, subdir: str, python_version: str, *, refresh: bool
) -> tuple[str, float]:
    """`tool`'s output on `subdir` of the corpus and its wall time (cached; `refresh` reruns)."""
    argv = _ARGV[tool.name](corpus, tool, subdir, python_version)
    return _run_cached(corpus, tool, subdir, argv, refresh=refresh)


def parse_output(tool: str, text: str) -> list[Raw]:
    """The raw findings in a checker's output (see `Raw`)."""
    if tool == "pyright":
        return _parse_pyright(text)
    return _parse_lines(text, _MYPY_LINE if tool == "mypy" else _TY_LINE)
