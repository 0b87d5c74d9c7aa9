"""Atomic file replacement, the one way kvref writes a file that someone may be reading.

Fixed sources, baselines and the caches are written to a temporary file in the target's own
directory and moved over the target with `os.replace`, so a reader sees the old bytes or the
new ones, never half. A process killed between the two steps (SIGKILL, power loss) leaves its
temporary file behind; the names carry the writer's pid, and the next write to the same target
removes those whose writer is gone, so no temporary file outlives the next run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["remove_stale_temporaries", "temporary_prefix", "write_atomically"]

_MARK = ".kvref-"


def temporary_prefix(target: Path) -> str:
    """The name prefix of every temporary file kvref writes on the way to `target`."""
    return f".{target.name}{_MARK}"


def write_atomically(target: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace `target` with `data` through a temporary file in the same directory.

    An existing target keeps its permission bits; a new one gets the umask's default.

    Args:
        target: the file to write.
        data: its new contents.
        durable: fsync the data before the rename (sources and baselines); caches, which
            are rebuilt when lost, skip it.

    Raises:
        OSError: the directory is not writable, the disk is full, ... (the target is then
            unchanged and the temporary file removed).
    """
    remove_stale_temporaries(target)
    try:
        mode: int | None = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = None
    handle, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f"{temporary_prefix(target)}{os.getpid()}-", suffix=".tmp"
    )
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            if durable:
                stream.flush()
                os.fsync(stream.fileno())
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def remove_stale_temporaries(target: Path) -> int:
    """Delete the temporary files that writers of `target` left when they were killed.

    Only names of kvref's own form (`.<name>.kvref-<pid>-<random>.tmp`) whose pid is no
    longer a running process are removed: a live writer's file is its own.

    Returns:
        How many files were removed.
    """
    prefix = temporary_prefix(target)
    removed = 0
    try:
        entries = os.scandir(target.parent)
    except OSError:
        return 0
    with entries:
        for entry in entries:
            name = entry.name
            if not (name.startswith(prefix) and name.endswith(".tmp")):
                continue
            pid_text = name[len(prefix) :].partition("-")[0]
            if not pid_text.isdigit() or _is_running(int(pid_text)):
                continue
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    return removed


def _is_running(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process writes one target at a time: an old file is a leftover
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True
