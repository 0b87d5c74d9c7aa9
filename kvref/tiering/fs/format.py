"""The on-disk record format of `FileSystemSecondaryTier` (format 3), and its raw I/O helpers.

    record = header | key | payload
    header = magic, format (3), checksum algorithm (1: XXH3-64), key length, reserved,
             payload length,
             XXH3-64 of (the fields above | key),
             XXH3-64 of (the fields above | key | payload)

The record checksum covers the header fields and the key as well as the payload, so a damaged
key can never make a record pass for another block's; the header checksum lets re-indexing
check every header and key without reading payloads. Magic and version sit where format 2 (a
CRC-32 of the payload only) had them, so either version's reader recognises the other's records
and skips them: a record of another version is never read as this one.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

import xxhash

from kvref.base import OffloadKey

__all__ = [
    "FORMAT_VERSION",
    "RECORD_HEADER_BYTES",
    "MAX_KEY_BYTES",
    "DEAD_MAGIC",
    "pack_header",
    "expected_fields",
    "RecordCheck",
    "scan_segment",
    "write_all",
    "read_into",
]

FORMAT_VERSION = 3
"""Version of the record format; roots and records of any other version are never read."""
_CHECKSUM_XXH3_64 = 1
_MAGIC = b"KVREFBLK"
DEAD_MAGIC = b"KVREFDED"
"""Written over a record's magic when it is dropped (damaged) while its segment lives on."""
# The fields both checksums cover, then the two checksums.
_FIELDS = struct.Struct("<8sHHHHQ")
_CHECKSUMS = struct.Struct("<QQ")
RECORD_HEADER_BYTES = _FIELDS.size + _CHECKSUMS.size
"""Bytes of a record's fixed header; a record is this header, then its key, then its payload."""
MAX_KEY_BYTES = 0xFFFF
_IOV_MAX = 1024


def _checksums(fields: bytes, key: bytes, payload: memoryview) -> tuple[int, int]:
    """Return (header checksum, record checksum) of one record, in one pass."""
    hasher = xxhash.xxh3_64(fields)
    hasher.update(key)
    header_sum = hasher.intdigest()
    hasher.update(payload)
    return header_sum, hasher.intdigest()


def expected_fields(key_len: int, block_bytes: int) -> bytes:
    """Return the header fields of a live record with this key length and payload size."""
    return _FIELDS.pack(_MAGIC, FORMAT_VERSION, _CHECKSUM_XXH3_64, key_len, 0, block_bytes)


def pack_header(key: bytes, payload: memoryview) -> bytes:
    """Return a record's header followed by its key (the payload is written after them)."""
    fields = expected_fields(len(key), len(payload))
    return fields + _CHECKSUMS.pack(*_checksums(fields, key, payload)) + key


class RecordCheck:
    """Verifies one record read back in pieces: its header and key first (`check_header`), then
    its payload piece by piece (`update`), each piece hashed right after it is read.

    Args:
        header: the buffer the record's header and key are read into.
        fields: `expected_fields(len(key), block_bytes)`.
        key: the block the index says the record holds.
    """

    __slots__ = ("_header", "_fields", "_key", "_hasher", "problem")

    def __init__(self, header: bytearray, fields: bytes, key: bytes) -> None:
        self._header = header
        self._fields = fields
        self._key = key
        self._hasher: xxhash.xxh3_64 | None = None
        self.problem: str | None = None
        """What is wrong with the record so far ("header", "checksum mismatch", ...)."""

    def check_header(self) -> None:
        """Check the header and key just read, and start hashing the payload if they are sound."""
        header, fields, key = self._header, self._fields, self._key
        if not header.startswith(fields) or not header.endswith(key):
            self.problem = "header"
            return
        # The fields and key read are the expected ones: hash those, in one call (every call
        # releases and retakes the GIL, which the other I/O threads contend for).
        hasher = xxhash.xxh3_64(fields + key)
        if hasher.intdigest() != _CHECKSUMS.unpack_from(header, _FIELDS.size)[0]:
            self.problem = "checksum mismatch"
            return
        self._hasher = hasher

    def update(self, piece: memoryview) -> None:
        """Hash the next piece of the payload, just read."""
        if self._hasher is not None:
            self._hasher.update(piece)

    def finish(self) -> str | None:
        """Return what is wrong with the record, whose payload has been read, or None."""
        if self.problem is None:
            if self._hasher is None:
                self.problem = "header not read"
            elif self._hasher.intdigest() != _CHECKSUMS.unpack_from(self._header, _FIELDS.size)[1]:
                self.problem = "checksum mismatch"
        return self.problem


def scan_segment(
    fd: int, size: int, block_bytes: int
) -> tuple[list[tuple[OffloadKey, int]], int]:
    """Read a segment's record headers, without their payloads.

    Args:
        fd: the segment file, open for reading.
        size: its size in bytes.
        block_bytes: the payload size of this tier's records.

    Returns:
        (key, offset) of each whole live record whose header and key pass their checksum, and
        the number of records skipped: damaged (everything after a damaged header is skipped,
        its lengths cannot be trusted), of another format, or of another block size.

    Raises:
        OSError: reading failed (the records found so far are lost to the caller).
    """
    records: list[tuple[OffloadKey, int]] = []
    offset = 0
    while offset + RECORD_HEADER_BYTES <= size:
        header = os.pread(fd, RECORD_HEADER_BYTES, offset)
        if len(header) < RECORD_HEADER_BYTES:
            return records, 1
        magic, version, algorithm, key_len, _reserved, payload_len = _FIELDS.unpack_from(header)
        end = offset + RECORD_HEADER_BYTES + key_len + payload_len
        if (
            magic not in (_MAGIC, DEAD_MAGIC)
            or version != FORMAT_VERSION
            or algorithm != _CHECKSUM_XXH3_64
            or end > size
        ):
            return records, 1
        key = os.pread(fd, key_len, offset + RECORD_HEADER_BYTES)
        header_sum, _record_sum = _CHECKSUMS.unpack_from(header, _FIELDS.size)
        # A dead record was written whole with the live magic, then only its magic was
        # overwritten: check it as written.
        fields = _MAGIC + header[len(_MAGIC) : _FIELDS.size]
        if len(key) != key_len or xxhash.xxh3_64_intdigest(fields + key) != header_sum:
            return records, 1
        if magic == _MAGIC:
            if payload_len != block_bytes:
                return records, 1
            records.append((OffloadKey(key), offset))
        offset = end
    return records, 1 if offset != size else 0


def write_all(fd: int, parts: Sequence[memoryview | bytes]) -> None:
    """Write `parts` in order with `writev`, finishing partial writes."""
    pending = list(parts)
    while pending:
        written = os.writev(fd, pending[:_IOV_MAX])
        while pending and written >= len(pending[0]):
            written -= len(pending[0])
            pending.pop(0)
        if pending and written:
            pending[0] = memoryview(pending[0])[written:]


def read_into(fd: int, buffers: Sequence[memoryview], offset: int) -> int:
    """Fill `buffers` in order from `offset` with `preadv`; return the bytes read (short if the
    file ends first)."""
    pending = list(buffers)
    total = 0
    while pending:
        count = os.preadv(fd, pending[:_IOV_MAX], offset)
        if count == 0:
            return total
        offset += count
        total += count
        while pending and count >= len(pending[0]):
            count -= len(pending[0])
            pending.pop(0)
        if pending and count:
            pending[0] = pending[0][count:]
    return total
