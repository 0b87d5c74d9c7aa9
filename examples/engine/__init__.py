"""A small example "engine" built on kvref: a FIFO cache policy, an in-memory offloading manager
and a transfer worker that records statistics.

It is type-correct and works, but it carries the kind of drift `kvref audit` exists to catch
(see README.md): overriding methods without `@override`, and a parameter narrowed from the base
class's `Collection` to `Sequence`.
"""

from __future__ import annotations

from .manager import DictOffloadingManager
from .policy import FifoPolicy
from .worker import StatsWorker

__all__ = ["DictOffloadingManager", "FifoPolicy", "StatsWorker"]
