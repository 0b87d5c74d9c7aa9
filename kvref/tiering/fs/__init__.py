"""`FileSystemSecondaryTier`: a disk tier of checksummed block files that any number of engines,
on one host or many, share through one root directory.

Layout under `root_dir/<run identity>` (the root: the directory vLLM's own fs tier would name
after the engine's model and KV layout, `kvref.tiering.run_identity`):

    kvref_fs_tier.json                   the block size and format the files were written with
    <hh>/<xxh3-128 of the key>.kvb       one block file per block (`kvref.tiering.fs.format`)
    <hh>/<name>.kvb.<host>-<pid>-<tag>.tmp
                                         a block being written, renamed into place when whole

Sharing: a block's file name comes from its key alone, so a lookup is one `stat` of that name
(on a lookup thread, as in vLLM's fs tier: a block's first lookup answers RETRY, and the answer
is there the next step) and any engine finds what any other stored, restarts included; no engine
keeps an index, holds a lock or owns the root. Writers write a temporary file of their own (host,
pid and a random tag in its name) and publish it under its final name without ever replacing a
file there (`posix_io.publish_file`): a final name always holds a whole file, keeps its inode
until deleted (so another host's cached name never goes stale under it), and of two engines
storing one block at once the first's file stays and the second's store ends as already stored.
The design needs of the filesystem only: create-exclusive, write, rename within a directory
(without replacing where it can: `renameat2(RENAME_NOREPLACE)`, else a hard link), unlink,
readdir, stat and utime (mtime). No `flock`, no atime, no daemon. Tested across hosts on one
JuiceFS volume mounted twice (`tests/tiering/juicefs.py`); what holds there, and which mount
settings matter (negative-lookup and attribute caches, trash), is in docs/LIBRARY.md.

Integrity: each file's XXH3-64 checksum covers its header and key as well as its payload (a
damaged key never passes for another block's), every load verifies it, and a file that fails
(damaged, truncated, of another format or block size) fails the load, so the bytes read are
never reported as loaded, and is deleted, so it is a miss for every engine afterwards. A file of
another format version is never read. A writer killed mid-store leaves only its temporary file,
which whoever finds it after `stale_tmp_s` (15 minutes by default, an hour at most) deletes.

Off the page cache: files are written and read with O_DIRECT where the root takes it (probed
once at start-up, as vLLM's fs tier does); the payload moves between the device and a
per-I/O-thread buffer on transparent huge pages and is copied to or from its row, where the
kernel grants them (a device takes a huge page as one segment: `kvref.tiering.fs.huge_pages`),
else straight between the device and a page-aligned row. Where the filesystem refuses O_DIRECT (overlayfs, older
tmpfs, some NFS) the tier warns once and uses buffered I/O, writing each file back
(`sync_file_range`) and dropping its pages (`posix_fadvise(DONTNEED)`), after reads too.
`page_cache=True` keeps the pages instead, on purpose.

Capacity: `capacity_bytes` bounds the whole root, whichever engines write to it, by evicting the
least recently used block files; a load or `touch` in any engine marks a file used by setting
its mtime (`kvref.tiering.fs.capacity` has the design, its bounds and its cost).

Threads: the scheduler thread never waits on the disk; it queues lookups on a thread of their
own and tasks on a pool of I/O threads whose read threads serve loads first (`pool`). Failures
(disk full, I/O errors, files deleted or damaged) become failed jobs; nothing raises on the
scheduler thread. `fsync=True` makes stores durable before they are reported finished.
"""

from kvref.tiering.fs.format import FORMAT_VERSION, RECORD_HEADER_BYTES
from kvref.tiering.fs.root import CONFIG_FILE_NAME, TierRootError
from kvref.tiering.fs.reports import FileSystemTierInfo
from kvref.tiering.fs.tier import FileSystemSecondaryTier

__all__ = [
    "FileSystemSecondaryTier",
    "FileSystemTierInfo",
    "TierRootError",
    "CONFIG_FILE_NAME",
    "FORMAT_VERSION",
    "RECORD_HEADER_BYTES",
]
