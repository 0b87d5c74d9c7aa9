"""Types of the C extension `kvref.tiering.fs._batch_io` (`_batch_io.c`): a task's block files
in one call without the GIL. `kvref.tiering.fs.block_io` is its only user."""

from collections.abc import Sequence

from typing_extensions import Buffer

FORMAT_VERSION: int
ALIGN: int
MAX_REQUEST: int
MAX_LAST_REQUEST: int
READ_OK: int
READ_MISSING: int
READ_DAMAGED: int
READ_UNREADABLE: int
WRITE_DONE: int
WRITE_EXISTED: int
SYNC_FSYNC: int
SYNC_WRITE_BACK: int
SYNC_DROP_PAGES: int

def read_blocks(
    paths: Sequence[str],
    keys: Sequence[bytes],
    rows: Sequence[Buffer],
    scratch: Buffer,
    block_bytes: int,
    direct: bool,
    zero_copy: bool,
    drop_pages: bool,
    /,
) -> list[int]: ...
def write_blocks(
    paths: Sequence[str],
    tmp_paths: Sequence[str],
    keys: Sequence[bytes],
    rows: Sequence[Buffer],
    scratch: Buffer,
    block_bytes: int,
    direct: bool,
    zero_copy: bool,
    sync: int,
    second_scratch: Buffer | None = None,
    /,
) -> list[int]: ...
def rename_files(sources: Sequence[str], targets: Sequence[str], /) -> list[int]: ...
def touch_files(paths: Sequence[str], /) -> None: ...
def set_avx2(enabled: bool, /) -> bool: ...
