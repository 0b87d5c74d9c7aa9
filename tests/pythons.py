"""Other CPython versions for tests that check code under the Python it targets.

The development and CI machines carry pyenv's 3.10, 3.12 and 3.13 besides the 3.11 that runs
the tests; they are found without pyenv on PATH (CI's environment may lack it), then on PATH,
skipping pyenv's shims (a shim names versions it may not be able to run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["find_python"]


def find_python(version: str) -> Path | None:
    """A working CPython `version` ("3.12"), or None when this machine has none."""
    candidates: list[Path] = []
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates.extend(sorted((pyenv_root / "versions").glob(f"{version}.*/bin/python{version}")))
    on_path = shutil.which(f"python{version}")
    if on_path and "shims" not in Path(on_path).parts:
        candidates.append(Path(on_path))
    wanted = str(tuple(int(part) for part in version.split(".")))
    for candidate in candidates:
        probe = subprocess.run(
            [str(candidate), "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == wanted:
            return candidate
    return None
