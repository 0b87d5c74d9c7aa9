"""The index's helpers that do not need a whole project (the projects test the rest)."""

from __future__ import annotations

import enum
import json.encoder
import sysconfig
from pathlib import Path

from kvref.audit.resolve.stdlib import standard_library_files
from kvref.audit.summarise.summary import summarize

STDLIB = Path(sysconfig.get_paths()["stdlib"])

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
    expected = {
        enum.__file__,  # from enum import Enum
        str(STDLIB / "abc.py"),  # abc.ABC
        str(STDLIB / "collections" / "__init__.py"),  # collections.abc.Mapping: both
        str(STDLIB / "collections" / "abc.py"),
        json.encoder.__file__,  # `import json.encoder as encoder`: that module itself
        str(STDLIB / "typing.py"),  # from typing import *
    }
    # Relative imports, third-party packages and unbound names lead nowhere.
    assert set(found) == expected
    assert len(found) == len(set(found))
