"""The root directory of `FileSystemSecondaryTier`: creating it, locking it (one process per
root), and checking the block size and format it was written with."""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from kvref.errors import KVRefError
from kvref.tiering.fs.format import FORMAT_VERSION
from kvref.tiering.fs.index import TMP_SUFFIX, unlink_quietly

__all__ = [
    "CONFIG_FILE_NAME",
    "LOCK_FILE_NAME",
    "TierRootError",
    "open_root",
    "release_root",
]

CONFIG_FILE_NAME = "kvref_fs_tier.json"
LOCK_FILE_NAME = "kvref_fs_tier.lock"


class TierRootError(KVRefError, OSError):
    """The tier's `root_dir` cannot be used (missing and not creatable, not a directory, not
    writable, written with another block size or format, or in use by another process)."""


def _root_error(root: Path, reason: str, err: int | None = None) -> TierRootError:
    text = f"root_dir {str(root)!r} is not usable: {reason}"
    return TierRootError(err, text) if err is not None else TierRootError(text)


def open_root(root: Path, block_bytes: int) -> int:
    """Create `root` if missing, lock it and check (or write) its config.

    Args:
        root: the tier's root directory.
        block_bytes: the block size of the tier opening it.

    Returns:
        The lock file's descriptor; closing it (`release_root`) releases the lock.

    Raises:
        TierRootError: the root cannot be used; the message says why.
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        pass  # something that is not a directory: said below
    except OSError as exc:
        raise _root_error(root, exc.strerror or str(exc), exc.errno) from exc
    if not root.is_dir():
        raise _root_error(root, "it is not a directory", errno.ENOTDIR)
    fd = _lock_root(root)
    try:
        _check_config(root, block_bytes)
    except BaseException:
        release_root(fd)
        raise
    return fd


def release_root(fd: int) -> None:
    """Release the lock `open_root` took."""
    os.close(fd)  # releases the flock


def _lock_root(root: Path) -> int:
    lock_path = root / LOCK_FILE_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
            raise _root_error(root, exc.strerror or str(exc), exc.errno) from exc
        try:
            # A read-only root can still be read from: lock it through a read-only fd.
            fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            # No lock file to fall back on: the root is simply not writable.
            raise _root_error(root, exc.strerror or str(exc), exc.errno) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise _root_error(
            root,
            f"another fs tier holds it (pid {holder}, lock {LOCK_FILE_NAME}); one process "
            "per root_dir",
            exc.errno,
        ) from exc
    try:
        # Who holds it, for the message above; on a full or read-only disk it stays unknown.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    return fd


def _check_config(root: Path, block_bytes: int) -> None:
    config_path = root / CONFIG_FILE_NAME
    config: dict[str, int] = {"format": FORMAT_VERSION, "block_bytes": block_bytes}
    try:
        text = config_path.read_text()
    except FileNotFoundError:
        text = None
    except OSError as exc:
        raise _root_error(root, exc.strerror or str(exc), exc.errno) from exc
    if text is not None:
        try:
            found: object = json.loads(text)
        except ValueError as exc:
            raise _root_error(
                root, f"{CONFIG_FILE_NAME} is not valid JSON ({exc})"
            ) from exc
        if found != config:
            raise _root_error(
                root,
                f"it holds blocks written as {found}, this tier needs {config}; use another "
                "root_dir or empty this one",
            )
        # Already written: start-up writes nothing more (a full disk must not stop it).
        return
    # A new root: writing its config also proves it writable.
    tmp_path = root / f"{CONFIG_FILE_NAME}.{os.getpid()}{TMP_SUFFIX}"
    try:
        tmp_path.write_text(json.dumps(config))
        os.replace(tmp_path, config_path)
    except OSError as exc:
        unlink_quietly(str(tmp_path))
        raise _root_error(root, exc.strerror or str(exc), exc.errno) from exc
