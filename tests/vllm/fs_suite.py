"""vLLM 0.33's own tests of its fs tier, loaded from the published sdist to run against kvref's tiers.

`load_suite()` executes `tests/v1/kv_offload/tiering/test_fs_tier.py` from the sdist, unmodified,
as a module of its own. A module that runs it against a kvref tier binds the suite's name
`FileSystemTierManager` (the class its fixtures `fs_tier` and `fs_tier_with_events`, and the tests
that build a tier themselves, construct) to that tier, then takes the suite's fixtures and its
applicable tests into its own namespace, where pytest collects them.

`APPLICABLE` lists the tests that judge a tier by vLLM's API alone; `FILE_LAYOUT` those that also
find a block's file through `tier.file_mapper` (run against a tier of block files that answers
with its own paths); `NOT_APPLICABLE` every other test of the file, with the reason: they patch
or inspect vLLM's fs internals (its thread pool, C extension, store function, fields), build
vLLM's registered type, or hold a tier to a choice kvref's makes differently.
`test_suite_is_fully_classified` fails when a vLLM release adds or renames a test, so none is
silently left out.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

from tools._audit_corpus import fetch_corpus
from tools.vllm_env import VLLM_SPEC

__all__ = [
    "APPLICABLE",
    "FILE_LAYOUT",
    "NOT_APPLICABLE",
    "NOT_APPLICABLE_VARIANTS",
    "SUITE_PATH",
    "load_suite",
    "suite_tests",
]

SUITE_PATH = Path("tests") / "v1" / "kv_offload" / "tiering" / "test_fs_tier.py"

APPLICABLE = (
    "test_lookup_empty_tier",
    "test_invalid_path_raises_at_construction",
    "test_invalid_locality_raises_at_construction",
    "test_failed_load_missing_file",
    "test_multiple_jobs_tracked_independently",
    "test_multi_block_job_partial_failure",
    "test_batch_lookup_dispatch",
    "test_out_of_bounds_block_id_smoke",
    "test_successful_store_emits_stored_event",
    "test_store_event_uses_configured_locality",
    "test_load_job_emits_no_event",
    "test_cascade_store_emits_fs_event_through_tiering_manager",
)

# Tests that find a block's file through `tier.file_mapper` (`get_file_name(key)`, and
# `base_path`) and then check, damage, remove or compare it: they apply to a tier of block files
# that says where they are (kvref's `FileSystemTier`, given a `file_mapper` that answers with its
# own paths), not to a tier without files. One hides a published block from `os.path.exists` and
# makes `os.replace` refuse to replace it, as some shared filesystems do: kvref's writes use
# neither (their own existence check, and a publish that never replaces a file), so the store
# ends as "another writer stored it" and the published bytes stay, which is what it checks.
FILE_LAYOUT = (
    "test_store_creates_file_and_lookup_succeeds",
    "test_store_accepts_block_published_by_another_writer",
    "test_store_then_load_roundtrip",
    "test_store_load_data_integrity",
    "test_failed_load_corrects_verdict_and_removes_corrupt_file",
    "test_failed_load_after_abort_does_not_break_newer_probe",
    "test_batched_partial_load_failure_keeps_loaded_blocks",
    "test_transient_load_failure_leaves_file",
    "test_fs_tier_cross_tp_round_trip",
)

NOT_APPLICABLE = {
    "test_factory_forwards_locality_to_fs_tier": "builds vLLM's registered 'fs' type",
    "test_shutdown_discards_pending_tasks": "inspects vLLM's fs thread pool (tier._pool)",
    "test_store_load_roundtrip_without_o_direct": "patches and inspects vLLM's O_DIRECT probe",
    "test_wait_idle_blocks_until_tasks_complete": "tests vLLM's DualQueueThreadPool alone",
    "test_batch_lookup_c_extension": "tests vLLM's fs C extension alone",
    "test_batched_load_first_block_fails_marks_whole_batch": (
        "vLLM's fs tier reads a job's blocks in order and stops at the first bad one; kvref's "
        "reads every block and reports the good ones in successful_keys (vLLM keeps them)"
    ),
    "test_mixed_job_results_emit_event_only_for_successful_job": "patches vLLM's fs store function",
    "test_partially_failed_store_emits_no_event": "patches vLLM's fs store function",
    "test_events_disabled_by_default": "inspects vLLM's fs fields (tier.events, _store_job_keys)",
    "test_events_require_global_kv_events_flag": "inspects vLLM's fs fields (tier.events)",
}

# Variants of applicable tests that choose vLLM's fs C extension (`use_c_ext=True`): internal to
# vLLM's fs tier, and not built into vLLM's wheel (the suite would skip them). Deselected.
NOT_APPLICABLE_VARIANTS = frozenset(
    {
        "test_batch_lookup_dispatch[True]",
        "test_out_of_bounds_block_id_smoke[True]",
        *(f"test_store_load_data_integrity[True-{size}]" for size in (0, 1, 2, 5)),
        "test_failed_load_corrects_verdict_and_removes_corrupt_file[True]",
        "test_batched_partial_load_failure_keeps_loaded_blocks[True]",
        "test_transient_load_failure_leaves_file[True]",
    }
)


def load_suite(module_name: str) -> ModuleType:
    """Execute vLLM's test_fs_tier.py from the sdist as a fresh module named `module_name`."""
    path = fetch_corpus(VLLM_SPEC, log=False).root / SUITE_PATH
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def suite_tests(suite: ModuleType, *, files: bool = False) -> dict[str, Any]:
    """The applicable tests of `suite`, by name (to merge into a test module's namespace), with
    the `FILE_LAYOUT` ones where `files` (the tier has block files it can name)."""
    return {name: getattr(suite, name) for name in (*APPLICABLE, *(FILE_LAYOUT if files else ()))}
