"""The on-disk block file of `FileSystemSecondaryTier` (format 4).

    block file = header page(s) | payload, zero-padded to a multiple of ALIGN bytes
    header     = fields: magic, format (4), checksum algorithm (1: XXH3-64), key length,
                 reserved, payload length
                 | XXH3-64 of (fields | key)
                 | XXH3-64 of (fields | key | payload)
                 | key, zero-padded to a multiple of ALIGN bytes

Both parts start and end on ALIGN (4 KiB) boundaries, so the file can be written and read with
O_DIRECT (whose buffer address, file offset and length must each be a multiple of the device's
logical block size, 512 or 4096 bytes) and the payload lands straight in a page-aligned primary
row. The record checksum covers the header fields and the key as well as the payload, so a
damaged key can never make a file pass for another block's. Magic and version sit where formats
2 and 3 had them: a file of another version is never read as this one.
"""

from __future__ import annotations

import struct

import xxhash

__all__ = [
    "FORMAT_VERSION",
    "ALIGN",
    "RECORD_HEADER_BYTES",
    "MAX_KEY_BYTES",
    "align_up",
    "header_bytes",
    "file_bytes",
    "pack_header",
    "check_header",
    "payload_checksum_ok",
]

FORMAT_VERSION = 4
"""Version of the block file format; roots and files of any other version are never read."""
ALIGN = 4096
"""Alignment of the header's and the payload's start and length in a block file."""
_CHECKSUM_XXH3_64 = 1
_MAGIC = b"KVREFBLK"
# The fields both checksums cover, then the two checksums.
_FIELDS = struct.Struct("<8sHHHHQ")
_CHECKSUMS = struct.Struct("<QQ")
RECORD_HEADER_BYTES = _FIELDS.size + _CHECKSUMS.size
"""Bytes of a block file's fixed header fields and checksums (the key follows them)."""
MAX_KEY_BYTES = 4 * ALIGN - RECORD_HEADER_BYTES
"""The longest key a block file holds (its header then spans at most four pages)."""


def align_up(size: int) -> int:
    """Return `size` rounded up to a multiple of `ALIGN`."""
    return -(-size // ALIGN) * ALIGN


def header_bytes(key_len: int) -> int:
    """Return the bytes of a block file's header part for a key of `key_len` bytes."""
    return align_up(RECORD_HEADER_BYTES + key_len)


def file_bytes(key_len: int, block_bytes: int) -> int:
    """Return the size of the block file of a `key_len`-byte key and `block_bytes` payload."""
    return header_bytes(key_len) + align_up(block_bytes)


def _fields(key_len: int, block_bytes: int) -> bytes:
    return _FIELDS.pack(_MAGIC, FORMAT_VERSION, _CHECKSUM_XXH3_64, key_len, 0, block_bytes)


def pack_header(into: memoryview, key: bytes, payload: memoryview) -> None:
    """Write the header part of `key`'s block file, with both checksums, into `into`.

    Args:
        into: `header_bytes(len(key))` bytes (an aligned buffer for O_DIRECT); zeroed past the
            key.
        key: the block's key.
        payload: the block's bytes, hashed here.
    """
    fields = _fields(len(key), len(payload))
    hasher = xxhash.xxh3_64(fields)
    hasher.update(key)
    header_sum = hasher.intdigest()
    hasher.update(payload)
    end = RECORD_HEADER_BYTES + len(key)
    into[: _FIELDS.size] = fields
    _CHECKSUMS.pack_into(into, _FIELDS.size, header_sum, hasher.intdigest())
    into[RECORD_HEADER_BYTES:end] = key
    into[end:] = bytes(len(into) - end)


def check_header(header: memoryview, key: bytes, block_bytes: int) -> xxhash.xxh3_64 | None:
    """Check a block file's header part, read back, against the block it should hold.

    Args:
        header: the first `header_bytes(len(key))` bytes of the file.
        key: the block the file's name promises.
        block_bytes: the tier's payload size.

    Returns:
        A hasher fed with the fields and key, to be fed the payload (`payload_checksum_ok`), or
        None when the header is not this block's (damaged, another format or block size, or a
        hash collision of file names).
    """
    fields = _fields(len(key), block_bytes)
    end = RECORD_HEADER_BYTES + len(key)
    if header[: _FIELDS.size].tobytes() != fields or header[RECORD_HEADER_BYTES:end].tobytes() != key:
        return None
    hasher = xxhash.xxh3_64(fields)
    hasher.update(key)
    if hasher.intdigest() != _CHECKSUMS.unpack_from(header, _FIELDS.size)[0]:
        return None
    return hasher


def payload_checksum_ok(header: memoryview, hasher: xxhash.xxh3_64, payload: memoryview) -> bool:
    """Finish the record checksum `check_header` started with the payload read back."""
    hasher.update(payload)
    return hasher.intdigest() == _CHECKSUMS.unpack_from(header, _FIELDS.size)[1]
