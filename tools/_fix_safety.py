"""`kvref audit --fix` on a copy of a corpus package: every fixed file compiles, a second audit
has no KVR001 that the first marked fixable, and the fixes make no KVR002 (stale @override).

A helper module of `tools/compare_checkers.py` (`--fix-check`), not a tool. The package is
copied into a temporary project (never the cached corpus itself) and audited as
`compare_checkers` audits it, with `--unsafe-fixes` so that every KVR001 fix is applied
(without a declared typing_extensions they are unsafe only for that import).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from _audit_corpus import Corpus, bare_python

__all__ = ["FixCheck", "check_fixes"]

Finding = dict[str, object]


@dataclass(frozen=True, slots=True)
class FixCheck:
    """What one `--fix` round did to a package and what the second audit found.

    Attributes:
        fixable: KVR001 findings the first audit marked fixable.
        changed: files the fix rewrote.
        not_compiling: rewritten files that no longer compile (path: error).
        still_fixable: KVR001 findings of the first audit's fixable ones found again.
        new_stale: KVR002 findings the second audit makes that the first did not.
        stale_before: KVR002 findings of the first audit.
    """

    fixable: int
    changed: int
    not_compiling: tuple[str, ...]
    still_fixable: tuple[str, ...]
    new_stale: tuple[str, ...]
    stale_before: tuple[str, ...]

    @property
    def safe(self) -> bool:
        return not (self.not_compiling or self.still_fixable or self.new_stale)


def _audit(project: Path, package: str, *extra: str) -> list[Finding]:
    argv = [
        sys.executable, "-m", "kvref", "audit", package, "--select", "KVR001,KVR002",
        "--output-format", "json", "--exit-zero", "--no-cache", "--unsafe-fixes",
        "--python", str(bare_python()), *extra,
    ]
    completed = subprocess.run(argv, cwd=project, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"kvref audit {' '.join(extra)} exited {completed.returncode}: {completed.stderr[-2000:]}")
    document = cast(dict[str, object], json.loads(completed.stdout))
    return cast(list[Finding], document["findings"])


def _key(finding: Finding) -> str:
    return f"{finding['path']}::{finding['symbol']}"


def _sources(root: Path) -> dict[str, bytes]:
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*.py")}


def check_fixes(corpus: Corpus, subdir: str) -> FixCheck:
    """Fix a temporary copy of `subdir` and check the result (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix=f"kvref-fix-{corpus.key}-") as temporary:
        project = Path(temporary)
        package = (corpus.root / subdir).name
        shutil.copytree(corpus.root / subdir, project / package)
        (project / "pyproject.toml").write_text(f"[project]\nname = {corpus.name!r}\n")
        first = _audit(project, package)
        fixable = {_key(f) for f in first if f["code"] == "KVR001" and f["fixable"]}
        stale_before = {_key(f) for f in first if f["code"] == "KVR002"}
        before = _sources(project)
        _audit(project, package, "--fix")
        after = _sources(project)
        changed = sorted(path for path in after if before.get(path) != after[path])
        broken: list[str] = []
        for path in changed:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", SyntaxWarning)
                    compile(after[path], path, "exec", dont_inherit=True)
            except SyntaxError as error:
                broken.append(f"{path}: {error}")
        second = _audit(project, package)
        again = {_key(f) for f in second if f["code"] == "KVR001"}
        stale_after = {_key(f) for f in second if f["code"] == "KVR002"}
    return FixCheck(
        fixable=len(fixable),
        changed=len(changed),
        not_compiling=tuple(broken),
        still_fixable=tuple(sorted(fixable & again)),
        new_stale=tuple(sorted(stale_after - stale_before)),
        stale_before=tuple(sorted(stale_before)),
    )
