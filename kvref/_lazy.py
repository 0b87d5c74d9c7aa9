"""Package attributes imported on first use (PEP 562), so `import kvref` costs next to nothing.

`kvref audit` in a pre-commit hook imports `kvref.audit.command` and what a warm run needs; the
package `__init__` modules re-export the whole library for readers and users, and importing all
of it eagerly was a tenth of a warm audit of a large project. Static checkers still see every
name: each `__init__` imports them under `TYPE_CHECKING` as well.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """Module-level `__getattr__` and `__dir__` for a package that re-exports names lazily.

    Args:
        package: the package's `__name__`.
        exports: each public name -> the module that defines it.

    Returns:
        (`__getattr__`, `__dir__`): the first imports the defining module, caches the value in
        the package's namespace and returns it; unknown names raise `AttributeError` as usual.
    """

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value: object = getattr(importlib.import_module(module), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *exports})

    return __getattr__, __dir__
