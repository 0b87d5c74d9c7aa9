"""vLLM 0.33's fs-tier tests (from its sdist, unmodified) against kvref's `FileSystemTier`.

See `fs_suite` for how the suite is loaded and which of its tests apply.
"""

from __future__ import annotations

import ast

from kvref.integrations.vllm import FileSystemTier
from tests.vllm.fs_suite import (
    APPLICABLE,
    NOT_APPLICABLE,
    NOT_APPLICABLE_VARIANTS,
    load_suite,
    suite_tests,
)

__all__ = ["NOT_APPLICABLE_VARIANTS"]

SUITE = load_suite("vllm_test_fs_tier_on_kvref_fs")
setattr(SUITE, "FileSystemTierManager", FileSystemTier)  # what its fixtures and tests construct
fs_tier = SUITE.fs_tier
fs_tier_with_events = SUITE.fs_tier_with_events
globals().update(suite_tests(SUITE))


def test_suite_is_fully_classified() -> None:
    # A vLLM release that adds or renames a test must not leave it out unnoticed.
    assert SUITE.__file__ is not None
    tree = ast.parse(open(SUITE.__file__).read())
    in_suite = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }
    assert in_suite == set(APPLICABLE) | set(NOT_APPLICABLE)
    assert not set(APPLICABLE) & set(NOT_APPLICABLE)
