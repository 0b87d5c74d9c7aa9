"""`FileSystemSecondaryTier`: a crash-safe secondary tier of checksummed block files.

Layout under `root_dir`:

    kvref_fs_tier.json                  the block size and format the files were written with
    kvref_fs_tier.lock                  held (flock) by the one process using the root
    <ff>/<ff>/<generation>.kvs          a segment: the blocks of one store job, back to back,
                                        as records (see `kvref.tiering.fs.format`)

The tier, its index and capacity are in `kvref.tiering.fs.tier` and `kvref.tiering.fs.index`; the
record format is in `kvref.tiering.fs.format`, the file work of the I/O threads in
`kvref.tiering.fs.segment_io`, the I/O thread pool in `kvref.tiering.fs.pool`.

A store job's new blocks are written as one segment file (split at `max_segment_bytes`), so a
file is created per job rather than per block: creating files is the slow part of small writes
on most filesystems. The two fan-out directory levels come from a hash of the segment's
generation (a strictly increasing nanosecond clock), which also makes every segment name new,
so deleting an evicted segment can never remove newer data.

Integrity: a segment is written to `<name>.tmp` (optionally `fsync`ed) and renamed into place
with `os.replace`, so a final name always holds whole records. Each record's XXH3-64 checksum
covers its header and key as well as its payload (a damaged key never passes for another
block's), and a header checksum lets start-up re-indexing check headers and keys without reading
payloads. A load reads a run of adjacent records straight into the primary slots, one `preadv`
per piece of up to 1 MiB, hashing each piece right after reading it, and verifies each record's
header, key and checksum; any mismatch fails the job, so the bytes already in the slots are
never reported as loaded, and drops the block from the index (its record is marked dead on disk,
or its segment deleted once empty), so it is a miss afterwards, restarts included. Records of
another format version (format 2 used CRC-32 of the payload only) are never read: a root written
with another format is refused at start-up. At start-up the tier re-indexes the segments already
there (blocks survive a restart), deletes stale `.tmp` files left by a crash, and skips records
that are damaged, truncated or of another block size.

One process per root: the tier holds an exclusive `flock` on `kvref_fs_tier.lock` while it runs;
a second tier on the same root, in this process or another, is refused with an `OSError` naming
the holder's pid. (flock is advisory and local: a root on a network filesystem shared between
hosts is not protected.) Start-up writes nothing it does not need, so a tier restarted on a full
disk starts and serves the blocks it holds; its stores fail until space is freed.

Threads: the scheduler thread only updates an in-memory index (so `lookup` never touches the
disk) and queues tasks (one per segment to write, one per up to 8 MiB of a segment's records to
read) on a pool of I/O threads whose read threads serve loads first; by default one thread per
usable core, half of them read threads, at most four of each (page-cache I/O is copying and
hashing on a core: more threads than cores only contend for the cores and the GIL). Failures
(disk full, permission denied, I/O errors) become failed jobs; nothing raises on the scheduler
thread.

Capacity: with `capacity_bytes`, storing evicts whole segments, least recently used first (a
block's `touch`, store or promotion makes its segment recent), skipping segments being written
or read and segments holding blocks of the storing job; a segment that cannot be placed fails
its job. Blocks of one segment were stored together by one request, so they tend to be reused
together. I/O is buffered (through the page cache); `fsync=True` makes stores durable before
they are reported finished.
"""

from kvref.tiering.fs.format import FORMAT_VERSION, RECORD_HEADER_BYTES
from kvref.tiering.fs.root import CONFIG_FILE_NAME, LOCK_FILE_NAME, TierRootError
from kvref.tiering.fs.tier import FileSystemSecondaryTier

__all__ = [
    "FileSystemSecondaryTier",
    "TierRootError",
    "CONFIG_FILE_NAME",
    "LOCK_FILE_NAME",
    "FORMAT_VERSION",
    "RECORD_HEADER_BYTES",
]
