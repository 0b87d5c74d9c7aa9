"""How the audit spells file paths: absolute for identity, project-relative for reports.

Shared by the engine, the process pool and the cache driver, which must agree on both (a file
summarised by a worker is looked up by the engine under the same path).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["absolute_path", "relative_path"]


def absolute_path(path: Path) -> Path:
    """`path` made absolute and normalized (`os.path.abspath`), reusing it when it already is.

    Discovery yields normalized absolute paths; building thousands of `Path` objects again
    cost more than the rest of a warm run's bookkeeping on a big tree.
    """
    text = str(path)
    absolute = os.path.abspath(text)
    return path if absolute == text else Path(absolute)


def relative_path(path: Path, root: Path) -> str:
    """`path` relative to `root` with `/` separators (absolute-ized first, no symlink walk)."""
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    return relative.replace(os.sep, "/")
