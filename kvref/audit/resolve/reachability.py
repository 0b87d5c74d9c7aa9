"""Which guarded code the type checkers analyse, for the project's Python floor and platform.

A guard (`kvref.audit.summarise.guards`) names the conditions under which a class, method,
class attribute or module binding is reached. The checkers evaluate `sys.version_info` against
the Python version they are configured for and `sys.platform` against their platform, and skip
what is false: kvref does the same with the project's floor (`target-version`,
`requires-python`; the running interpreter's version when the project declares none, as mypy
defaults) and the running platform (pyright's and mypy's default).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

from kvref.audit.summarise.guards import NEVER

__all__ = ["Reachability"]


@dataclass(frozen=True, slots=True)
class Reachability:
    """The version and platform guards are decided for.

    Attributes:
        version: (major, minor) of the Python the project is checked for.
        platform: `sys.platform`'s value to the checkers.
    """

    version: tuple[int, int] = (sys.version_info.major, sys.version_info.minor)
    platform: str = sys.platform

    @classmethod
    def for_floor(cls, floor: tuple[int, int] | None) -> Reachability:
        """Decided for the project's floor (None: unknown, the running interpreter's)."""
        return cls() if floor is None else cls(version=floor)

    def reaches(self, guard: str) -> bool:
        """Whether the checkers analyse code under `guard` ("" always)."""
        return not guard or _reaches(guard, self.version, self.platform)


@functools.lru_cache(maxsize=4096)
def _reaches(guard: str, version: tuple[int, int], platform: str) -> bool:
    if guard == NEVER:
        return False
    return any(
        all(_atom_holds(atom, version, platform) for atom in clause.split("&"))
        for clause in guard.split("|")
    )


def _atom_holds(atom: str, version: tuple[int, int], platform: str) -> bool:
    kind, rest = atom[0], atom[1:]
    if kind == "P":
        if rest.startswith("!^="):
            return not platform.startswith(rest[3:])
        if rest.startswith("^="):
            return platform.startswith(rest[2:])
        if rest.startswith("=="):
            return platform == rest[2:]
        if rest.startswith("!="):
            return platform != rest[2:]
        return True
    if kind != "V":
        return atom != NEVER
    for operator in ("<=", ">=", "==", "!=", "<", ">"):
        if rest.startswith(operator):
            wanted = tuple(int(part) for part in rest[len(operator):].split("."))
            have = version[: len(wanted)]
            return {
                "<": have < wanted, "<=": have <= wanted, ">": have > wanted,
                ">=": have >= wanted, "==": have == wanted, "!=": have != wanted,
            }[operator]
    return True
