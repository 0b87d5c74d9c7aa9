"""Guards (`kvref.audit.summarise.guards`) and how `Reachability` decides them: the conditions
pyright, mypy and ty evaluate statically, for a project floor and a platform."""

from __future__ import annotations

import ast

import pytest

from kvref.audit.resolve.reachability import Reachability
from kvref.audit.summarise.guards import NEVER, branch_guards

PY311_LINUX = Reachability((3, 11), "linux")
PY313_WINDOWS = Reachability((3, 13), "win32")


def decided(test: str, reach: Reachability) -> tuple[bool, bool] | None:
    """(is the body analysed, is the `else` analysed), None when the test guards nothing."""
    guards = branch_guards(ast.parse(test, mode="eval").body)
    return None if guards is None else (reach.reaches(guards[0]), reach.reaches(guards[1]))


@pytest.mark.parametrize(
    ("test", "linux_311", "windows_313"),
    [
        ("TYPE_CHECKING", (True, False), (True, False)),
        ("typing.TYPE_CHECKING", (True, False), (True, False)),
        ("not TYPE_CHECKING", (False, True), (False, True)),
        ("sys.version_info >= (3, 12)", (False, True), (True, False)),
        ("sys.version_info[:2] < (3, 12)", (True, False), (False, True)),
        ("sys.version_info >= (3, 11, 0)", (True, False), (True, False)),
        ("sys.version_info >= (3,)", (True, False), (True, False)),
        ('sys.platform == "win32"', (False, True), (True, False)),
        ('sys.platform != "win32"', (True, False), (False, True)),
        ('sys.platform.startswith("linux")', (True, False), (False, True)),
        ('sys.platform == "win32" or sys.version_info >= (3, 13)', (False, True), (True, False)),
        ('sys.platform == "linux" and sys.version_info >= (3, 12)', (False, True), (False, True)),
        ('sys.platform == "win32" or (not TYPE_CHECKING and hasattr(a, "b"))', (False, True), (True, False)),
        ('not (sys.platform == "win32" or sys.version_info < (3, 12))', (False, True), (False, True)),
        ("TYPE_CHECKING and sys.version_info >= (3, 12)", (False, True), (True, False)),
    ],
)
def test_conditions_the_checkers_evaluate(
    test: str, linux_311: tuple[bool, bool], windows_313: tuple[bool, bool]
) -> None:
    assert decided(test, PY311_LINUX) == linux_311
    assert decided(test, PY313_WINDOWS) == windows_313


@pytest.mark.parametrize(
    "test",
    ["DEBUG", "sys.version_info >= (3, 11, 4)", "sys.version_info > minimum", "os.name == 'nt'", "PY312"],
)
def test_other_conditions_guard_nothing(test: str) -> None:
    # The checkers analyse both branches of what they cannot evaluate (a micro version
    # cannot be compared with a floor that has none).
    assert decided(test, PY311_LINUX) is None


def test_the_floor_decides_when_known_and_the_interpreter_otherwise() -> None:
    assert Reachability.for_floor((3, 9)).version == (3, 9)
    assert Reachability.for_floor(None) == Reachability()
    assert not Reachability().reaches(NEVER) and Reachability().reaches("")
