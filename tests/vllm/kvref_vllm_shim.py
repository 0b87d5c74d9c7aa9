"""A pytest plugin that points vLLM's `kv_offload` imports at kvref (`-p kvref_vllm_shim`).

vLLM 0.33.0's own tests of the offloading reference (`tests/v1/kv_offload`, from its sdist) run
with it loaded, so that `from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager` gives
kvref's class: each module kvref implements replaces vLLM's in `sys.modules` before any test (or
vLLM's own conftest) imports it. vLLM's modules that kvref does not implement (its specs,
factories, example tier, connector) stay vLLM's, and run over kvref's classes. vLLM's
`OffloadingConnectorStats` is kvref's too: kvref's managers return kvref's.

Loaded as a top-level module from tests/vllm: vLLM's sdist has a `tests` package of its own.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["ALIASES"]

ALIASES: dict[str, str] = {
    "vllm.v1.metrics.cache_hit_source": "kvref.cache_hit_source",
    "vllm.v1.kv_offload.base": "kvref.base",
    "vllm.v1.kv_offload.config": "kvref.config",
    "vllm.v1.kv_offload.cpu.common": "kvref.cpu.common",
    "vllm.v1.kv_offload.cpu.manager": "kvref.cpu.manager",
    "vllm.v1.kv_offload.cpu.gpu_worker": "kvref.cpu.gpu_worker",
    "vllm.v1.kv_offload.cpu.policies.base": "kvref.cpu.policies.base",
    "vllm.v1.kv_offload.cpu.policies.lru": "kvref.cpu.policies.lru",
    "vllm.v1.kv_offload.cpu.policies.arc": "kvref.cpu.policies.arc",
    "vllm.v1.kv_offload.cpu.policies.factory": "kvref.cpu.policies.factory",
    "vllm.v1.kv_offload.tiering.base": "kvref.tiering.base",
    "vllm.v1.kv_offload.tiering.backpressure": "kvref.tiering.backpressure",
    "vllm.v1.kv_offload.tiering.async_lookup": "kvref.tiering.async_lookup",
    "vllm.v1.kv_offload.tiering.metrics": "kvref.tiering.metrics",
    "vllm.v1.kv_offload.tiering.manager": "kvref.tiering.manager",
}
"""vLLM's module -> the kvref module that stands in for it."""

_STATS_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics"


def _install() -> None:
    for vllm_name, kvref_name in ALIASES.items():
        # The parent packages are vLLM's (their __init__ modules import none of the aliased ones).
        parent, _, child = vllm_name.rpartition(".")
        package = importlib.import_module(parent)
        module = importlib.import_module(kvref_name)
        sys.modules[vllm_name] = module
        setattr(package, child, module)
    stats = importlib.import_module("kvref.stats")
    connector_metrics = importlib.import_module(_STATS_MODULE)
    setattr(connector_metrics, "OffloadingConnectorStats", stats.OffloadingConnectorStats)  # noqa: B010


_install()
