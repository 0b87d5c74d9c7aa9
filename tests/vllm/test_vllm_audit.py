"""`kvref audit --fix` on vLLM 0.33.0's own `vllm/v1/kv_offload`, judged by vLLM's own tests.

The fix runs on a copy of the installed package's `v1/kv_offload` inside an overlay of vLLM
(every other part of the package linked to the installed one, and the sdist's packaging files
beside it, so the audit reads vLLM's own dependency declarations). vLLM's `tests/v1/kv_offload`
run, from the sdist, against the installed package (the copy's twin, while the copy is being
fixed) and against the fixed copy (`tools/vllm_suite.py`): each test must end the same way, and
no missing `@override` may remain.
"""

from __future__ import annotations

import hashlib
import json
import os
import py_compile
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools._audit_corpus import fetch_corpus
from tools.vllm_env import VLLM_SPEC
from tools.vllm_suite import SuiteRun, installed_root, run_suite

_ROOT = Path(__file__).resolve().parents[2]
_PACKAGING = ("pyproject.toml", "setup.py", "requirements")
_COPIED = Path("vllm") / "v1" / "kv_offload"
_MISSING_OVERRIDES_IN_0_33_0 = 54


def make_overlay(root: Path) -> Path:
    """`root/vllm`: the installed vLLM with `v1/kv_offload` copied and everything else linked."""
    installed = installed_root(sys.executable) / "vllm"
    sdist = fetch_corpus(VLLM_SPEC, log=False).root
    for name in _PACKAGING:
        source = sdist / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, root / name)
    for parent, keep in ((installed, "v1"), (installed / "v1", "kv_offload")):
        target = root / parent.relative_to(installed.parent)
        target.mkdir(parents=True, exist_ok=True)
        for entry in parent.iterdir():
            if entry.name != keep:
                (target / entry.name).symlink_to(entry)
    shutil.copytree(installed / "v1" / "kv_offload", root / _COPIED, ignore=shutil.ignore_patterns("__pycache__"))
    return root / _COPIED


def digests(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*.py"))
    }


def audit(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`kvref audit` from this checkout, with vLLM's environment resolving its classes."""
    return subprocess.run(
        [sys.executable, "-m", "kvref", "audit", str(_COPIED), "--python", sys.executable, "--no-cache", *args],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(_ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )


def kvr001(project: Path) -> list[object]:
    done = audit(project, "--select", "KVR001", "--output-format", "json", "--exit-zero")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["errors"] == []
    return report["findings"]


def test_audit_fix_on_vllms_kv_offload_keeps_vllms_own_tests_passing(tmp_path: Path) -> None:
    copy = make_overlay(tmp_path)
    installed = installed_root(sys.executable) / _COPIED
    installed_before = digests(installed)
    assert digests(copy) == installed_before
    with ThreadPoolExecutor(1) as pool:
        # "Before" runs on the installed package (the copy's twin) while the copy is fixed.
        before_run = pool.submit(run_suite, sys.executable)

        assert len(kvr001(tmp_path)) == _MISSING_OVERRIDES_IN_0_33_0
        fixed = audit(tmp_path, "--fix")
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr  # 0: nothing left to report
        assert kvr001(tmp_path) == []
        changed = [name for name, digest in digests(copy).items() if installed_before[name] != digest]
        assert len(changed) == 10
        for name in changed:
            py_compile.compile(str(copy / name), doraise=True)

        after = run_suite(sys.executable, over=tmp_path)
        before = before_run.result()
    assert before.imported_from == installed.resolve()
    assert after.imported_from == copy.resolve()
    assert before.counts()["passed"] > 800
    assert differences(before, after, tmp_path) == {}  # the same tests pass, fail and skip
    assert digests(installed) == installed_before  # nothing was written through the links


def differences(before: SuiteRun, after: SuiteRun, over: Path) -> dict[str, tuple[str | None, str | None]]:
    """Tests that end differently before and after, each asked twice more on both copies.

    A few of vLLM's tests are timing-sensitive (threads, processes) and may flip once on a
    loaded machine; a difference the fix made persists. "Before" is the installed vLLM, which
    the copy matched byte for byte before the fix.
    """

    def diff(old: dict[str, str], new: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
        return {t: (old.get(t), new.get(t)) for t in sorted(old.keys() | new.keys()) if old.get(t) != new.get(t)}

    changed = diff(before.outcomes, after.outcomes)
    for _ in range(2):
        if not changed:
            break
        tests = list(changed)
        changed = diff(run_suite(sys.executable, tests=tests).outcomes, run_suite(sys.executable, over=over, tests=tests).outcomes)
    return changed
