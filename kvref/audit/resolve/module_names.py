"""The dotted names a project file is importable as."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence

from kvref.audit.resolve.stdlib import STDLIB_NAMES

__all__ = ["module_names_for"]

_DOTTED_NAME = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*")


def module_names_for(
    path: str, roots: Sequence[str], is_package: Callable[[str], bool]
) -> tuple[str, ...]:
    """The dotted names a file is importable as, the primary (used for relative imports) first.

    As the import system names it: the dotted path from an import root, where every
    directory below the root is a package, regular (with `__init__.py`) or namespace (PEP 420,
    without). `roots` are tried in order (a src layout's `src/` before the project root); a
    root that is itself a regular package is no import root (its parent is), so its files are
    named by following the `__init__.py` chain up, beyond the root. A module of a regular
    package is also importable by the name that chain gives alone (its top directory on
    `sys.path`, as pytest's rootdir-relative imports and installed plugins do), an alias.

    Args:
        path: the file (absolute, normalized; plain strings, since the engine names every
            file of a big project and `pathlib` arithmetic was most of that cost).
        roots: the import roots (absolute, normalized), preferred first.
        is_package: whether a directory holds an `__init__.py`/`.pyi`.
    """
    directory, filename = os.path.split(path)
    stem = filename.rsplit(".", 1)[0]
    own = "" if stem == "__init__" else stem
    chain: list[str] = [own] if own else []
    current = directory
    while True:
        parent, name = os.path.split(current)
        if parent == current or not is_package(current):
            break
        chain.insert(0, name)
        current = parent
    names: list[str] = []
    for root in roots:
        if directory == root:
            dotted = own
        elif directory.startswith(root) and directory[len(root)] == os.sep:
            relative = directory[len(root) + 1 :].replace(os.sep, ".")
            dotted = f"{relative}.{own}" if own else relative
        else:
            continue
        if dotted and not is_package(root):
            names.append(dotted)
    # Not when it would shadow the standard library (`examples/x/json/` is not `json`).
    if chain and (not names or is_package(directory) and chain[0] not in STDLIB_NAMES):
        names.append(".".join(chain))
    if not names:
        last_directory = os.path.basename(directory)
        names.append(".".join([last_directory, stem] if last_directory else [stem]))
    # A name that cannot be written in an import statement is kept only as the last resort.
    importable = [name for name in names if _DOTTED_NAME.fullmatch(name)]
    return tuple(dict.fromkeys(importable or names))