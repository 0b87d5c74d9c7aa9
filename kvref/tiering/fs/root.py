"""The root directory of `FileSystemSecondaryTier`: its layout, creating it, checking the block
size and format it was written with, and probing whether it takes O_DIRECT.

Any number of tiers, in any number of processes and hosts, open one root at once: opening takes
no lock and writes nothing but the config file of a new root (through a temporary file renamed
into place, so racing openers leave one whole config).
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import secrets
import socket
from pathlib import Path

import xxhash

from kvref.errors import KVRefError
from kvref.tiering.fs.format import ALIGN, FORMAT_VERSION
from kvref.tiering.fs.posix_io import publish_file

__all__ = [
    "CONFIG_FILE_NAME",
    "BLOCK_SUFFIX",
    "TMP_SUFFIX",
    "FANOUT",
    "TierRootError",
    "writer_token",
    "block_name",
    "fanout_dir",
    "open_root",
    "probe_o_direct",
    "unlink_quietly",
]

CONFIG_FILE_NAME = "kvref_fs_tier.json"
BLOCK_SUFFIX = ".kvb"
TMP_SUFFIX = ".tmp"
FANOUT = 256
"""Directories under the root (`00` to `ff`): a block's is the first byte of its name."""


class TierRootError(KVRefError, OSError):
    """The tier's `root_dir` cannot be used (missing and not creatable, not a directory, not
    writable while new, or written with another block size or format)."""


def _root_error(root: Path, reason: str, err: int | None = None) -> TierRootError:
    text = f"root_dir {str(root)!r} is not usable: {reason}"
    return TierRootError(err, text) if err is not None else TierRootError(text)


def writer_token() -> str:
    """A name part no other writer of the root uses: host, pid and a random tag.

    Temporary files carry it, so writers on different hosts with the same pid, or a process
    that reuses a dead one's pid, never write to one temporary file.
    """
    host = "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())
    return f"{host or 'host'}-{os.getpid()}-{secrets.token_hex(4)}"


def block_name(key: bytes) -> str:
    """The file name of block `key`: the XXH3-128 of the key, in hex, and `BLOCK_SUFFIX`.

    Every engine derives it from the key alone, so a lookup needs no index. The file holds the
    full key, checked on every read: a collision of names is a miss, never another block.
    """
    return xxhash.xxh3_128_hexdigest(key) + BLOCK_SUFFIX


def fanout_dir(name: str) -> int:
    """The index (0 to `FANOUT` - 1) of the directory holding the file `name`."""
    return int(name[:2], 16)


def open_root(root: Path, block_bytes: int) -> None:
    """Create `root` if missing and check (or write) its config.

    Args:
        root: the tier's root directory.
        block_bytes: the block size of the tier opening it.

    Raises:
        TierRootError: the root cannot be used; the message says why and names the path.
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        pass  # something that is not a directory: said below
    except OSError as exc:
        raise _root_error(root, exc.strerror or str(exc), exc.errno) from exc
    if not root.is_dir():
        raise _root_error(root, "it is not a directory", errno.ENOTDIR)
    _check_config(root, block_bytes)


def _check_config(root: Path, block_bytes: int) -> None:
    config_path = root / CONFIG_FILE_NAME
    config: dict[str, int] = {"format": FORMAT_VERSION, "block_bytes": block_bytes}
    try:
        raw = config_path.read_bytes()
    except FileNotFoundError:
        raw = None
    except OSError as exc:
        raise _root_error(root, f"{CONFIG_FILE_NAME}: {exc.strerror or exc}", exc.errno) from exc
    if raw is not None:
        try:
            found: object = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested too deep
            raise _root_error(
                root, f"{config_path} is not a kvref fs tier config (not valid UTF-8 JSON: {exc})"
            ) from exc
        if found != config:
            raise _root_error(
                root,
                f"{config_path} says it holds blocks written as {found}, this tier needs "
                f"{config}; use another root_dir or empty this one",
            )
        return  # already written: start-up writes nothing more (a full disk must not stop it)
    # A new root: writing its config also proves it writable. Openers racing here each write
    # a temporary file of their own and the first to publish it wins; the others check its
    # config. Never replace it: an opener on another host reading the file replaced under it
    # fails (EBADF on JuiceFS, ESTALE on NFS).
    tmp_path = root / f"{CONFIG_FILE_NAME}.{writer_token()}{TMP_SUFFIX}"
    try:
        tmp_path.write_text(json.dumps(config))
        publish_file(str(tmp_path), str(config_path))
    except FileExistsError:
        unlink_quietly(str(tmp_path))
        _check_config(root, block_bytes)  # another opener's config, in place for good now
    except OSError as exc:
        unlink_quietly(str(tmp_path))
        raise _root_error(root, exc.strerror or str(exc), exc.errno) from exc


def probe_o_direct(root: Path) -> bool:
    """Return whether files under `root` can be read and written with O_DIRECT.

    Some filesystems refuse it (overlayfs, older tmpfs, some NFS mounts) with EINVAL at open or
    at the first I/O. The probe reads the root's config file with O_DIRECT (which needs no free
    space, so a tier restarted on a full or read-only disk still reads its blocks directly);
    where that says nothing, it writes and reads back one aligned page of a file of its own.
    """
    o_direct = getattr(os, "O_DIRECT", 0)
    if not o_direct:
        return False
    page = mmap.mmap(-1, ALIGN)
    try:
        try:
            fd = os.open(root / CONFIG_FILE_NAME, os.O_RDONLY | os.O_CLOEXEC | o_direct)
            try:
                os.preadv(fd, [page], 0)
            finally:
                os.close(fd)
            return True
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return False
        path = str(root / f".o_direct_probe.{writer_token()}{TMP_SUFFIX}")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC | o_direct, 0o644)
            try:
                return os.pwritev(fd, [page], 0) == ALIGN and os.preadv(fd, [page], 0) == ALIGN
            finally:
                os.close(fd)
        except OSError:
            return False
        finally:
            unlink_quietly(path)
    finally:
        page.close()


def unlink_quietly(path: str) -> bool:
    """Delete `path`; return whether this call deleted it (a missing file or a failure to
    delete, e.g. a read-only root, is not an error here)."""
    try:
        os.unlink(path)
    except OSError:
        return False
    return True
