"""Which files `kvref audit` indexes and which it reports on.

Inside a git work tree the project's files come from
`git ls-files --cached --others --exclude-standard -z` (git's own `.gitignore`,
`.git/info/exclude` and global-excludes semantics, no parsing here). Outside git a walker reads
`.gitignore` files itself; it supports comments, blank lines, `!` negation, trailing `/`
(directories only), anchoring by a leading or inner `/`, `*`, `?`, `[...]` and `**`, nested
`.gitignore` files and `.git/info/exclude`; it does not read the global excludes file. Either
way, built-in default excludes (virtual environments, build output, caches) and the configured
`exclude` globs are applied on top.

Explicitly named files are always audited (pre-commit passes the files it wants checked), even
when excluded, unless `force-exclude` is set; a named directory expands to the project files
below it. The whole project is always indexed, so bases in files that were not named resolve.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvref.audit.discover.gitignore import (
    GitignoreRule,
    IgnoreMatcher,
    excluded_by,
    glob_regex,
    matches_glob,
    parse_gitignore,
)
from kvref.errors import KVRefError

# `matches_glob` is re-exported: the command line imports it from here.
__all__ = ["DEFAULT_EXCLUDES", "Discovery", "DiscoveryError", "discover", "matches_glob"]

DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".bzr", ".direnv", ".eggs", ".git", ".hg", ".hypothesis", ".ipynb_checkpoints",
    ".kvref_cache", ".mypy_cache", ".nox", ".pants.d", ".pyenv", ".pytest_cache", ".pytype",
    ".ruff_cache", ".svn", ".tox", ".venv", "__pycache__", "__pypackages__", "_build",
    "buck-out", "build", "dist", "node_modules", "site-packages", "venv", "*.egg-info",
)  # fmt: skip


# Stubs are indexed (a type checker reads `ext.pyi` for a C extension, or before `ext.py`),
# never reported on.
_SUFFIXES = (".py", ".pyi")


class DiscoveryError(KVRefError):
    """A path given on the command line cannot be audited (missing, or outside the project)."""


@dataclass(frozen=True, slots=True)
class Discovery:
    """The outcome of file discovery.

    Attributes:
        project_files: every Python file and stub to index (absolute paths, sorted).
        report_files: the files to report on and fix, or None for all of `project_files`.
        warnings: things skipped that the user may want to know about (one line each).
        vcs_root: the top of the git work tree containing the project, if any.
    """

    project_files: tuple[Path, ...]
    report_files: tuple[Path, ...] | None
    warnings: tuple[str, ...]
    vcs_root: Path | None



def _parts(path: Path) -> tuple[str, ...]:
    return path.parts


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            return stream.read()
    except OSError:
        return None


def _walk(
    root: Path, excludes: Sequence[str], respect_gitignore: bool, warnings: list[str]
) -> list[Path]:
    """Python files under root, following directory symlinks once (loops are cut)."""
    found: list[Path] = []
    rules: list[GitignoreRule] = []
    if respect_gitignore:
        info_exclude = _read_text(os.path.join(root, ".git", "info", "exclude"))
        if info_exclude is not None:
            rules.extend(parse_gitignore(info_exclude, ""))
    visited: set[tuple[int, int]] = set()
    # A pattern without '/' matches one path component; the walk has already tested the
    # parents, so only the entry's own name needs testing (the per-entry cost of a walk).
    bodies = [pattern.strip().rstrip("/") for pattern in excludes]
    name_bodies = [body for body in bodies if "/" not in body]
    name_regex = (
        re.compile("|".join(f"(?:{glob_regex(body)})" for body in name_bodies), re.DOTALL)
        if name_bodies
        else None
    )
    path_patterns = [body for body in bodies if "/" in body]

    def excluded(name: str, rel: str) -> bool:
        if name_regex is not None and name_regex.fullmatch(name):
            return True
        return bool(path_patterns) and excluded_by(rel, path_patterns)

    def visit(directory: str, rel_dir: str, inherited: IgnoreMatcher) -> None:
        try:
            stat = os.stat(directory)
        except OSError as exc:
            warnings.append(f"cannot read directory {rel_dir or '.'}: {exc.strerror}")
            return
        if (stat.st_dev, stat.st_ino) in visited:
            # A second link to a directory already walked is normal; a link back to one of
            # its own ancestors is a loop the user should hear about once.
            real = os.path.realpath(directory)
            parent = os.path.realpath(os.path.dirname(directory))
            if os.path.islink(directory) and (parent == real or parent.startswith(real + os.sep)):
                warnings.append(f"{rel_dir}: symbolic link loop, not followed")
            return
        visited.add((stat.st_dev, stat.st_ino))
        matcher = inherited
        if respect_gitignore:
            text = _read_text(os.path.join(directory, ".gitignore"))
            if text is not None:
                matcher = matcher.extended(parse_gitignore(text, rel_dir))
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError as exc:
            warnings.append(f"cannot read directory {rel_dir or '.'}: {exc.strerror}")
            return
        for entry in entries:
            name = entry.name
            rel = f"{rel_dir}/{name}" if rel_dir else name
            try:
                is_dir = entry.is_dir()  # follows symlinks; a dangling link is neither
                is_file = not is_dir and entry.is_file()
            except OSError as exc:  # a symlink loop (ELOOP), a vanished entry
                if name.endswith(_SUFFIXES) and not excluded(name, rel):
                    warnings.append(f"{rel}: cannot read ({exc.strerror}), skipped")
                continue
            if not is_dir and not name.endswith(_SUFFIXES):
                continue  # neither walked nor reported, whatever the rules say
            if excluded(name, rel) or matcher.ignored(rel, is_dir=is_dir):
                continue
            if not is_dir and not is_file and entry.is_symlink():
                warnings.append(f"{rel}: broken symbolic link (dangling or a loop), skipped")
                continue
            if is_dir:
                visit(entry.path, rel, matcher)
            elif is_file:
                found.append(Path(entry.path))

    visit(str(root), "", IgnoreMatcher().extended(rules))
    return found


# --- git ---


def _git_toplevel(root: Path) -> Path | None:
    try:
        completed = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel"],
            capture_output=True,
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if completed.returncode != 0:
        return None
    return Path(os.fsdecode(completed.stdout.strip()))


def _git_files(root: Path, excludes: Sequence[str]) -> list[Path] | None:
    try:
        completed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            capture_output=True,
            check=False,
            timeout=300,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if completed.returncode != 0:
        return None
    found: list[Path] = []
    for raw in completed.stdout.split(b"\0"):
        rel = os.fsdecode(raw)
        if not rel.endswith(_SUFFIXES) or excluded_by(rel, excludes):
            continue
        path = root / rel
        # --cached also lists tracked files deleted from the work tree.
        if path.is_file():
            found.append(path)
    return sorted(found)


# --- explicit paths ---


def _is_python_file(path: Path, text: bytes | None = None) -> bool:
    """A `.py` file or stub, or a script whose first line (of `text` when given) runs python."""
    if path.suffix in _SUFFIXES:
        return True
    try:
        if text is not None:
            first_line = text.split(b"\n", 1)[0][:200]
        else:
            with path.open("rb") as handle:
                first_line = handle.readline(200)
    except OSError:
        return False
    return first_line.startswith(b"#!") and b"python" in first_line


def _relative(path: Path, root: Path) -> str | None:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return None


def discover(
    root: Path,
    paths: Sequence[Path] = (),
    *,
    cwd: Path | None = None,
    excludes: Sequence[str] = DEFAULT_EXCLUDES,
    respect_gitignore: bool = True,
    force_exclude: bool = False,
    unsaved: bytes | None = None,
) -> Discovery:
    """Find the project's Python files under `root` and the subset named by `paths`.

    Args:
        root: the project root (absolute).
        paths: files or directories given on the command line (absolute or relative to
            `cwd`, default the current directory); empty means "the whole project".
        excludes: globs never indexed (see `matches_glob`).
        respect_gitignore: skip files git ignores.
        force_exclude: apply `excludes` to explicitly named files too.
        unsaved: the text of the one file in `paths` (stdin), which need not exist on disk:
            whether it is a Python file is read from this text.

    Returns:
        The discovery; `report_files` is None when `paths` is empty.

    Raises:
        DiscoveryError: a path does not exist or lies outside `root`.
    """
    root = Path(os.path.abspath(root))
    warnings: list[str] = []
    vcs_root = _git_toplevel(root)
    project: list[Path] | None = None
    if vcs_root is not None and respect_gitignore:
        project = _git_files(root, excludes)
    if project is None:
        # The root of unsaved text may not exist yet: then it is a project of one file.
        project = _walk(root, excludes, respect_gitignore, warnings) if root.is_dir() else []
    if not paths:
        # Sorted by parts, pathlib's own order, without its slow `__lt__`.
        ordered = sorted(set(project), key=_parts)
        return Discovery(tuple(ordered), None, tuple(warnings), vcs_root)

    indexed = set(project)
    report: list[Path] = []
    for given in paths:
        path = Path(os.path.abspath(given if cwd is None else cwd / given))
        rel = _relative(path, root)
        if rel is None:
            raise DiscoveryError(f"{given}: outside the project root {root}")
        if unsaved is None and not path.exists():
            raise DiscoveryError(f"{given}: no such file or directory")
        if path.is_dir():
            prefix = os.path.join(str(path), "")
            below = [file for file in project if str(file).startswith(prefix)]
            if not below:
                warnings.append(f"{rel}: no Python files to audit (excluded or ignored?)")
            report.extend(below)
        elif force_exclude and excluded_by(rel, excludes):
            continue
        elif _is_python_file(path, unsaved):
            report.append(path)
            indexed.add(path)
        else:
            warnings.append(f"{rel}: not a Python file, skipped")
    return Discovery(
        tuple(sorted(indexed, key=_parts)),
        tuple(sorted(set(report), key=_parts)),
        tuple(warnings),
        vcs_root,
    )
