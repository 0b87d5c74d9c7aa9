"""What the tier benchmarks (`bench_tiering.py`, `bench_redis.py`) share: block sizes as the
command line spells them and as the tables print them, and the keys of the blocks they move.

It lives below both, so `bench_tiering.py --redis` can run `bench_redis.py` without the two
importing each other.
"""

from __future__ import annotations

# The benchmarks that import this put the checkout on sys.path first.
from kvref.base import OffloadKey, make_offload_key

__all__ = ["parse_size", "human", "key_of"]

_SIZES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """`"64K"`, `"1MiB"`, `"4m"` or `"512"` -> bytes."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in _SIZES:
        return int(float(text[:-1]) * _SIZES[text[-1]])
    return int(text)


def human(size: int) -> str:
    """`1048576` -> `"1 MiB"` (bytes when no unit divides it)."""
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


def key_of(i: int) -> OffloadKey:
    """The offload key of the benchmark's `i`-th block (group 0)."""
    return make_offload_key(i.to_bytes(32, "big"), 0)
