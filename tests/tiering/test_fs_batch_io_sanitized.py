"""The fs tier's C extension under AddressSanitizer and UndefinedBehaviorSanitizer: a copy of
kvref with `_batch_io.c` built with both runs `test_fs_batch_io.py` and `test_fs.py` (but their
Python-path twins) in a child process, which the sanitizers abort at the first out-of-bounds
access, use after free or undefined behaviour (a tier must never return wrong bytes, nor corrupt the engine's memory)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "kvref" / "tiering" / "fs" / "_batch_io.c"


def _runtime(name: str) -> str | None:
    """The path of a sanitizer runtime the compiler ships, or None."""
    compiler = shutil.which("gcc")
    if compiler is None:
        return None
    found = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True, check=False).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


@pytest.mark.slow
@pytest.mark.skipif(
    not sys.platform.startswith("linux") or _runtime("libasan.so") is None or _runtime("libubsan.so") is None,
    reason="needs gcc with its AddressSanitizer and UndefinedBehaviorSanitizer runtimes",
)
def test_the_c_extension_is_clean_under_sanitizers(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "kvref", copy / "kvref", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copytree(REPO / "tests", copy / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "tools", copy / "tools", ignore=shutil.ignore_patterns("__pycache__"))  # the tests' engines
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    target = copy / "kvref" / "tiering" / "fs" / f"_batch_io{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(
        [
            "gcc", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
            "-o", str(target), str(SOURCE),
        ],
        check=True,
    )  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(copy),
        "LD_PRELOAD": f"{_runtime('libasan.so')} {_runtime('libubsan.so')}",
        # Python itself leaks by design at exit; what is checked is the extension's accesses.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
    }
    probe = "from kvref.tiering.fs import block_io; print(block_io.NATIVE_BATCH_IO.__file__)"
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=copy, env=env, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == str(target)  # the sanitized build, not the installed one
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:kvref-conformance"]
    files = ["tests/tiering/test_fs_batch_io.py", "tests/tiering/test_fs.py"]
    # The tests' Python-path twins (ids `[python...]`) never call the extension: not run here.
    collected = subprocess.run([*pytest, "--collect-only", *files], cwd=copy, env=env, capture_output=True, text=True, check=True).stdout
    tests = [line for line in collected.splitlines() if "::" in line and "[python" not in line]
    assert len(tests) > 80, collected[-2000:]
    run = subprocess.run([*pytest, *tests], cwd=copy, env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "ERROR: AddressSanitizer" not in run.stderr and "runtime error:" not in run.stderr
