"""The index's helpers that do not need a whole project (the projects test the rest)."""

from __future__ import annotations

from kvref.audit.resolve.stdlib import TYPESHED, standard_library_files
from kvref.audit.summarise.summary import summarize

assert TYPESHED is not None, "typeshed_client (a dependency of kvref) ships the stubs"

SOURCE = b"""\
import abc
import collections.abc
import json.encoder as encoder
from enum import Enum
from typing import *
from .sibling import Local
from torch import nn


class A(Enum): ...
class B(abc.ABC): ...
class C(collections.abc.Mapping): ...
class D(encoder.JSONEncoder): ...
class E(Local): ...
class F(nn.Module): ...
class G(NotImported): ...
"""


def test_standard_library_files_are_those_bases_and_star_imports_come_from() -> None:
    found = standard_library_files(summarize("m.py", SOURCE))
    # The stubs the type checkers read, typeshed's, not the interpreter's sources.
    expected = {
        str(TYPESHED / "enum.pyi"),  # from enum import Enum
        str(TYPESHED / "abc.pyi"),  # abc.ABC
        str(TYPESHED / "collections" / "__init__.pyi"),  # collections.abc.Mapping: both
        str(TYPESHED / "collections" / "abc.pyi"),
        str(TYPESHED / "json" / "encoder.pyi"),  # `import json.encoder as encoder`: itself
        str(TYPESHED / "typing.pyi"),  # from typing import *
    }
    # Relative imports, third-party packages and unbound names lead nowhere.
    assert set(found) == expected
    assert len(found) == len(set(found))
