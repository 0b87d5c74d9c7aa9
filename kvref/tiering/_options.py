"""Validation of tier options: each check names the field and raises `ValueError`.

Options come from user configuration (JSON, TOML, a dict), so a wrong type is a configuration
mistake like a wrong value, and is reported the same way.
"""

from __future__ import annotations

import operator
import os
from pathlib import Path

from kvref.base import Locality

__all__ = [
    "check_bool",
    "check_int",
    "check_locality",
    "check_optional_int",
    "check_path",
    "check_seconds",
    "check_str",
]


def check_int(field: str, value: object, *, minimum: int) -> int:
    """Return `value` as an int >= `minimum` (bools are not integers here).

    Raises:
        ValueError: `value` is not an integer, or is below `minimum`.
    """
    if isinstance(value, bool):
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")
    try:
        number = operator.index(value)  # pyright: ignore[reportArgumentType]
    except TypeError:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")
    return number


def check_optional_int(field: str, value: object, *, minimum: int) -> int | None:
    """Like `check_int`, but None passes through (no bound)."""
    if value is None:
        return None
    try:
        return check_int(field, value, minimum=minimum)
    except ValueError:
        raise ValueError(f"{field} must be None or an integer >= {minimum}, got {value!r}") from None


def check_bool(field: str, value: object) -> bool:
    """Return `value` if it is a bool.

    Raises:
        ValueError: it is not (a string "false" would be true: refuse it).
    """
    if not isinstance(value, bool):
        raise ValueError(f"{field} must be true or false, got {value!r}")
    return value


def check_str(field: str, value: object) -> str:
    """Return `value` if it is a non-empty string.

    Raises:
        ValueError: it is not.
    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field} must be a non-empty string, got {value!r}")
    return value


def check_path(field: str, value: object) -> Path:
    """Return `value` as a `Path` if it is a non-empty str or path-like.

    Raises:
        ValueError: it is not.
    """
    if isinstance(value, str) and value:
        return Path(value)
    if isinstance(value, os.PathLike):
        path = os.fspath(value)  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
        if isinstance(path, str) and path:
            return Path(path)
    raise ValueError(f"{field} must be a non-empty path, got {value!r}")


def check_seconds(field: str, value: object, *, maximum: float) -> float:
    """Return `value` as a float in (0, `maximum`] seconds (bools are not numbers here).

    Raises:
        ValueError: `value` is not a number, or is out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a number of seconds in (0, {maximum:g}], got {value!r}")
    if not 0 < value <= maximum:
        raise ValueError(f"{field} must be a number of seconds in (0, {maximum:g}], got {value!r}")
    return float(value)


def check_locality(field: str, value: object) -> Locality | None:
    """Return `value` ("LOCAL" or "REMOTE", where a tier's storage is) as a `Locality`; None
    passes through.

    Raises:
        ValueError: it is neither.
    """
    if value is None or isinstance(value, Locality):
        return value
    try:
        return Locality(value)
    except ValueError:
        raise ValueError(f"{field} must be None or a Locality ('LOCAL' or 'REMOTE'), got {value!r}") from None
