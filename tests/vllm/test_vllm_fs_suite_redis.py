"""vLLM 0.33's fs-tier tests (from its sdist, unmodified) against kvref's `RedisTier`.

The suite builds a tier with a `root_dir` (a fresh temporary directory per test); here that
directory names the tier's Redis namespace on the session's server, so every test starts with
an empty tier of its own, as it does on disk. A path that cannot be created means nothing to a
Redis tier, so the test that expects one to fail construction does not apply here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from kvref.integrations.vllm import RedisTier
from kvref.tiering.redis import RedisSecondaryTier
from kvref.tiering.redis.local import LocalRedisServer
from tests.vllm.fs_suite import NOT_APPLICABLE_VARIANTS, load_suite, suite_tests

__all__ = ["NOT_APPLICABLE_VARIANTS"]


class RedisTierAtRoot(RedisTier):
    """A `RedisTier` built as the suite builds its fs tier: `root_dir` names its namespace."""

    url: ClassVar[str] = ""

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        root_dir: str,
        n_read_threads: int = 4,
        n_write_threads: int = 4,
        **options: Any,
    ) -> None:
        super().__init__(
            offloading_spec,
            primary_kv_view,
            tier_type,
            url=self.url,
            namespace=f"fs-suite:{root_dir}",
            num_connections=n_read_threads,
            **options,
        )
        # The suite reads the lookup manager's queues, by vLLM's name for it (kvref's is the same).
        assert isinstance(self.kvref_tier, RedisSecondaryTier)
        self._lookup_manager = self.kvref_tier._lookup_manager  # pyright: ignore[reportPrivateUsage]


SUITE = load_suite("vllm_test_fs_tier_on_kvref_redis")
setattr(SUITE, "FileSystemTierManager", RedisTierAtRoot)
fs_tier = SUITE.fs_tier
fs_tier_with_events = SUITE.fs_tier_with_events
globals().update(
    (name, test)
    for name, test in suite_tests(SUITE).items()
    if name != "test_invalid_path_raises_at_construction"
)


@pytest.fixture(autouse=True)
def _server(redis_server: LocalRedisServer) -> Iterator[None]:
    RedisTierAtRoot.url = redis_server.url
    yield
