"""Exceptions raised by kvref.

Configuration mistakes raise the built-in `ValueError` (naming the argument and the allowed
values); misuse of the offloading protocol raises `OffloadProtocolError`, always before any
state is changed, so a caller that catches it can carry on with the manager as it was.
"""

from __future__ import annotations

__all__ = ["KVRefError", "OffloadProtocolError"]


class KVRefError(Exception):
    """Base class of every error kvref raises on purpose."""


class OffloadProtocolError(KVRefError):
    """A manager call broke the offloading protocol (for example, loading an absent block).

    Attributes:
        key: the offload key the call was about, or None when the misuse is not about a key.
        state: the state the block was in ("absent", "pending", "idle", "reading(2)", ...).
        operation: the manager method that was called.
    """

    def __init__(self, operation: str, key: bytes | None, state: str, detail: str = "") -> None:
        self.operation = operation
        self.key = key
        self.state = state
        where = f"key {key.hex()}" if key is not None else "request"
        text = f"{operation}: {where} is {state}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)
