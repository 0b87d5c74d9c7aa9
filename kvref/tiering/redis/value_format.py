"""The bytes of one block in Redis: a fixed header, then the block's payload.

    header = magic "KVRB" | format version (u16) | reserved (u16) | block bytes (u64)
             | XXH3-64 of the Redis key (u64) | XXH3-64 of the payload (u64)      (32 bytes, LE)

The key digest catches a value copied or renamed to another key; the block size catches a
namespace shared by engines with different layouts; the payload checksum catches damage. A load
trusts nothing it has not verified: any mismatch makes the block a miss.
"""

from __future__ import annotations

import struct

import xxhash

__all__ = ["HEADER_BYTES", "FORMAT_VERSION", "key_digest", "pack_header", "verify_header"]

_MAGIC = b"KVRB"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<4sHHQQQ")
HEADER_BYTES = _HEADER.size
"""Bytes of the header in front of every stored block."""


def key_digest(redis_key: bytes) -> int:
    """Return the digest of `redis_key` that its value's header carries."""
    return xxhash.xxh3_64_intdigest(redis_key)


def pack_header(digest: int, payload: memoryview) -> bytes:
    """Return the header of a value holding `payload` under the key whose digest is `digest`.

    Args:
        digest: `key_digest` of the Redis key.
        payload: the block's bytes.

    Returns:
        `HEADER_BYTES` bytes.
    """
    return _HEADER.pack(
        _MAGIC, FORMAT_VERSION, 0, len(payload), digest, xxhash.xxh3_64_intdigest(payload)
    )


def verify_header(header: memoryview | bytes, digest: int, payload: memoryview) -> str | None:
    """Check a loaded value: its header against the key and block size, then the payload.

    Args:
        header: the `HEADER_BYTES` bytes read in front of the payload.
        digest: `key_digest` of the Redis key the value was read from.
        payload: the payload as read (the primary row).

    Returns:
        None if the value is intact, else what is wrong.
    """
    magic, version, _reserved, size, found_digest, checksum = _HEADER.unpack(header)
    if magic != _MAGIC:
        return "not a kvref block (bad magic)"
    if version != FORMAT_VERSION:
        return f"format version {version}, expected {FORMAT_VERSION}"
    if size != len(payload):
        return f"block size {size}, expected {len(payload)}"
    if found_digest != digest:
        return "stored under another key"
    if xxhash.xxh3_64_intdigest(payload) != checksum:
        return "payload checksum mismatch"
    return None
