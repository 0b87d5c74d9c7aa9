"""Atomic writes: a writer killed half-way leaves a temporary file that the next run removes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvref.audit.atomic import remove_stale_temporaries, temporary_prefix, write_atomically
from kvref.audit.command import EXIT_CLEAN
from kvref.cli import audit_main as main

CHECKOUT = Path(__file__).resolve().parents[2]


def _killed_while_replacing(target: Path, data: bytes) -> None:
    """Run `write_atomically` in a child that is SIGKILLed between writing and renaming."""
    program = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from kvref.audit.atomic import write_atomically
        os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        write_atomically(Path({str(target)!r}), {data!r})
        """
    )
    child = subprocess.run([sys.executable, "-c", program], cwd=CHECKOUT, check=False)
    assert child.returncode == -9


def _leftovers(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


def test_a_killed_writer_leaves_the_target_whole_and_the_next_write_removes_its_file(
    tmp_path: Path,
) -> None:
    target = tmp_path / "m.py"
    target.write_bytes(b"old\n")
    _killed_while_replacing(target, b"new\n")
    assert target.read_bytes() == b"old\n"
    (leftover,) = _leftovers(tmp_path)
    assert leftover.startswith(temporary_prefix(target))
    write_atomically(target, b"newer\n")
    assert target.read_bytes() == b"newer\n"
    assert _leftovers(tmp_path) == []


def test_a_live_writers_temporary_file_is_not_touched(tmp_path: Path) -> None:
    target = tmp_path / "m.py"
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as sleeper:
        try:
            live = tmp_path / f"{temporary_prefix(target)}{sleeper.pid}-abc.tmp"
            live.write_bytes(b"half")
            other = tmp_path / ".other.py.kvref-1-x.tmp"  # another target's file
            other.write_bytes(b"")
            assert remove_stale_temporaries(target) == 0
            assert live.exists() and other.exists()
        finally:
            sleeper.kill()
    sleeper.wait()
    assert remove_stale_temporaries(target) == 1
    assert not live.exists()


def test_write_keeps_the_mode_and_fails_cleanly(tmp_path: Path) -> None:
    target = tmp_path / "script.py"
    target.write_bytes(b"x\n")
    target.chmod(0o755)
    write_atomically(target, b"y\n")
    assert target.stat().st_mode & 0o777 == 0o755
    with pytest.raises(OSError):
        write_atomically(tmp_path / "missing" / "m.py", b"z\n")


def test_fix_after_a_killed_fix_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'p'\ndependencies = ['typing_extensions']\n"
    )
    (tmp_path / "base.py").write_text("class Base:\n    def work(self) -> None: ...\n")
    child = tmp_path / "child.py"
    child.write_text("from base import Base\n\n\nclass C(Base):\n    def work(self) -> None: ...\n")
    _killed_while_replacing(child, b"half-fixed")
    assert len(_leftovers(tmp_path)) == 1
    monkeypatch.chdir(tmp_path)
    assert main([".", "--fix", "--no-cache"]) == EXIT_CLEAN
    assert "@override" in child.read_text()
    assert _leftovers(tmp_path) == []
