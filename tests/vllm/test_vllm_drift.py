"""kvref's reference against vLLM's `kv_offload`, name by name and signature by signature.

`tools/vllm_drift.py` reads both as source. On vLLM 0.33.0, the release kvref names, every
difference must be one docs/VLLM_DIFFERENCES.md lists with its reason; every listed difference must
still exist (a stale row hides nothing but misleads); and the tool must notice what a new release
would change.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools._audit_corpus import fetch_corpus
from tools.vllm_drift import MODULES, Difference, differences, documented, main
from tools.vllm_env import VLLM_SPEC


@pytest.fixture(scope="module")
def vllm_root() -> Path:
    return fetch_corpus(VLLM_SPEC, log=False).root


def test_no_undocumented_difference_from_vllm_0_33(vllm_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--all"]) == 0
    print(capsys.readouterr().out)


def test_every_documented_difference_still_exists(vllm_root: Path) -> None:
    found = {(d.module, d.name, d.kind) for d in differences(vllm_root)}
    stale = sorted(set(documented()) - found)
    assert not stale, f"docs/VLLM_DIFFERENCES.md lists differences that no longer exist: {stale}"


def _release_with(vllm_root: Path, tmp_path: Path, module: str, old: str, new: str) -> Path:
    """A copy of vLLM's compared modules with one edit, standing for another release."""
    for path in MODULES:
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(vllm_root / path, target)
    edited = tmp_path / module
    text = edited.read_text()
    assert old in text
    edited.write_text(text.replace(old, new, 1))
    return tmp_path


def test_a_renamed_parameter_is_a_migration_to_make(vllm_root: Path, tmp_path: Path) -> None:
    release = _release_with(
        vllm_root, tmp_path, "vllm/v1/kv_offload/base.py",
        "def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:",
        "def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:",
    )  # fmt: skip
    found = differences(release)
    assert any(d.name == "OffloadingManager.lookup" and d.kind == "parameters" for d in found), found


def test_a_new_method_and_a_new_default_are_reported(vllm_root: Path, tmp_path: Path) -> None:
    release = _release_with(
        vllm_root, tmp_path, "vllm/v1/kv_offload/cpu/manager.py",
        "max_tracker_size: int = 64_000,",
        "max_tracker_size: int = 32_000,",
    )  # fmt: skip
    module = release / "vllm/v1/kv_offload/base.py"
    module.write_text(module.read_text() + "\n\nclass OffloadingManagerV2(OffloadingManager):\n    def drain(self) -> None: ...\n")
    found = set(differences(release))
    assert Difference("vllm/v1/kv_offload/base.py", "OffloadingManagerV2", "missing", "class OffloadingManagerV2") in found
    defaults = [d for d in found if d.kind == "default" and d.name == "CPUOffloadingManager.__init__"]
    assert defaults and "32000" in defaults[0].what, found


def test_a_module_vllm_dropped_is_reported(vllm_root: Path, tmp_path: Path) -> None:
    release = _release_with(vllm_root, tmp_path, "vllm/v1/kv_offload/config.py", "class", "class")
    (release / "vllm/v1/kv_offload/tiering/async_lookup.py").unlink()
    assert Difference("vllm/v1/kv_offload/tiering/async_lookup.py", "*", "missing", "vLLM has no such module") in differences(release)
