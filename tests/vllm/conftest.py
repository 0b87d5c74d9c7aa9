"""Tests that run kvref next to vLLM 0.33's own code (installed from its wheel) and tests.

They run in the environment `make test` builds with `tools/vllm_env.py` (`.venv-vllm`); the
main environment has no vLLM and leaves this directory out (`--ignore=tests/vllm`). Run alone
somewhere without vLLM, they are skipped with that reason, except in CI (CI=true), where a
missing vLLM is an error: the environment must have been built.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator

import pytest

from kvref.tiering.redis.local import LocalRedisCluster, LocalRedisServer
from tests.tiering.redis_helpers import require_redis_server

_skipped_because: str | None = None
try:
    importlib.import_module("vllm.v1.kv_offload.tiering.manager")
except ImportError as exc:
    if os.environ.get("CI"):
        raise RuntimeError(
            f"vLLM 0.33 does not import ({exc}): CI runs tests/vllm in the environment "
            "`python3 tools/vllm_env.py` builds (make test does)"
        ) from exc
    collect_ignore_glob = ["test_*.py"]
    _skipped_because = f"tests/vllm skipped: vLLM 0.33 does not import here ({exc}); make test runs them in .venv-vllm"


def pytest_report_header() -> str | None:
    return _skipped_because


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedisServer]:
    """One throw-away `redis-server` for the session (tests use namespaces of their own)."""
    require_redis_server()
    with LocalRedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """A throw-away 3-node Redis Cluster for the session."""
    require_redis_server()
    with LocalRedisCluster(3) as cluster:
        yield cluster


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the variants a module lists in `NOT_APPLICABLE_VARIANTS` (see fs_suite.py)."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        variants: frozenset[str] = getattr(getattr(item, "module", None), "NOT_APPLICABLE_VARIANTS", frozenset())
        (dropped if item.name in variants else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


pytest_plugins = ["pytester"]
