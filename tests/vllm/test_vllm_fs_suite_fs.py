"""vLLM 0.33's fs-tier tests (from its sdist, unmodified) against kvref's `FileSystemTier`.

See `fs_suite` for how the suite is loaded and which of its tests apply. The tests that find a
block's file through the tier's `file_mapper` (to check it is there, damage or remove it, or
compare two engines' paths) run too: `FileSystemTierWithPaths` answers them with kvref's own
paths, so they judge kvref's files as they judge vLLM's.
"""

from __future__ import annotations

import ast
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey

from kvref.base import OffloadKey as KvrefKey
from kvref.integrations.vllm import FileSystemTier
from kvref.tiering.fs import FileSystemSecondaryTier
from tests.vllm.fs_suite import (
    APPLICABLE,
    FILE_LAYOUT,
    NOT_APPLICABLE,
    NOT_APPLICABLE_VARIANTS,
    load_suite,
    suite_tests,
)

__all__ = ["NOT_APPLICABLE_VARIANTS"]


class BlockPaths:
    """What the suite reads of vLLM's `FileMapper`, answered from a kvref tier's layout."""

    def __init__(self, tier: FileSystemSecondaryTier) -> None:
        self._tier = tier
        self.base_path = str(tier.root_dir)

    def get_file_name(self, key: OffloadKey) -> str:
        return self._tier.block_path(KvrefKey(key))


class FileSystemTierWithPaths(FileSystemTier):
    """kvref's `FileSystemTier`, with the `file_mapper` through which the suite finds files."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert isinstance(self.kvref_tier, FileSystemSecondaryTier)
        self.file_mapper = BlockPaths(self.kvref_tier)
        # The suite reads the lookup manager's queues, by vLLM's name for it (kvref's is the same).
        self._lookup_manager = self.kvref_tier._lookup_manager  # pyright: ignore[reportPrivateUsage]


SUITE = load_suite("vllm_test_fs_tier_on_kvref_fs")
setattr(SUITE, "FileSystemTierManager", FileSystemTierWithPaths)  # what its fixtures and tests construct
fs_tier = SUITE.fs_tier
fs_tier_with_events = SUITE.fs_tier_with_events
globals().update(suite_tests(SUITE, files=True))


def test_suite_is_fully_classified() -> None:
    # A vLLM release that adds or renames a test must not leave it out unnoticed.
    assert SUITE.__file__ is not None
    tree = ast.parse(open(SUITE.__file__).read())
    in_suite = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }
    classified = [*APPLICABLE, *FILE_LAYOUT, *NOT_APPLICABLE]
    assert in_suite == set(classified)
    assert len(classified) == len(set(classified))
