"""The file-system secondary tier (see `kvref.tiering.fs.tier`)."""

from kvref.tiering.fs.tier import (
    CONFIG_FILE_NAME,
    FORMAT_VERSION,
    LOCK_FILE_NAME,
    RECORD_HEADER_BYTES,
    FileSystemSecondaryTier,
    TierRootError,
)

__all__ = [
    "FileSystemSecondaryTier",
    "TierRootError",
    "CONFIG_FILE_NAME",
    "LOCK_FILE_NAME",
    "FORMAT_VERSION",
    "RECORD_HEADER_BYTES",
]
