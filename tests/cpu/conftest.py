"""vLLM 0.33's own CPU manager and policies, for the tests that compare kvref's with them."""

from __future__ import annotations

import pytest

from kvref.stats import OffloadingConnectorStats
from tools.compare_vllm_manager import VLLMKVOffload, load_vllm_kv_offload


@pytest.fixture(scope="session")
def vllm_kv_offload() -> VLLMKVOffload:
    """vLLM's classes, executed from its sdist (cached outside the repository; no vLLM install).

    The loader stands in an opaque class for vLLM's `OffloadingConnectorStats`; kvref's is the
    same payload type, so vLLM's `get_stats` is given it and the two managers' stats compare.
    """
    vllm = load_vllm_kv_offload()
    vllm.manager_class.get_stats.__globals__["OffloadingConnectorStats"] = OffloadingConnectorStats
    return vllm
