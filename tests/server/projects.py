"""Small projects the server's tests open (a base class in one file, subclasses in another)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["BASE", "SUB", "UNICODE", "write_project"]

BASE = """\
class Base:
    def load(self, key: str) -> bytes:
        return b""

    def store(self, key: str, value: bytes) -> None: ...
"""

SUB = """\
from typing_extensions import override

from pkg.base import Base


class Cached(Base):
    def load(self, key: str) -> bytes:
        return b"cached"

    @override
    def store(self, key: str, value: bytes) -> None: ...
"""

# A name outside the Basic Multilingual Plane (two UTF-16 code units, four UTF-8 bytes) before
# KVR101's range, and as KVR001's name.
UNICODE = """\
from collections.abc import Collection, Sequence

from typing_extensions import override


class Base:
    def touch(self, \U00010400: int, keys: Collection[bytes]) -> None: ...

    def \U00010400\U00010400(self) -> None: ...


class Sub(Base):
    @override
    def touch(self, \U00010400: int, keys: Sequence[bytes]) -> None: ...

    def \U00010400\U00010400(self) -> None: ...
"""


def write_project(root: Path, files: dict[str, str], kvref: str = "") -> Path:
    """`root` with a pyproject.toml (its `[tool.kvref]` table holding `kvref`) and `files`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "demo"\ndependencies = ["typing_extensions"]\n\n[tool.kvref]\n{kvref}\n',
        encoding="utf-8",
    )
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root
