"""Shared helpers of the Redis tier tests: real servers, and a harness that runs jobs to the end.

The tests start their own `redis-server` processes (on free loopback ports, in temporary
directories). Without `redis-server` they skip, except in CI (CI=true), where they fail: `make
test` installs it.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest

from kvref.base import LookupResult, OffloadKey
from kvref.tiering.base import JobResult, TransferJob
from kvref.tiering.redis import RedisSecondaryTier
from kvref.tiering.redis.local import redis_server_path
from tests.tiering.helpers import CTX, make_spec, make_view, resolve

__all__ = ["require_redis_server", "RedisHarness", "CTX", "wait_for", "payload"]


def payload(key: bytes, size: int) -> bytes:
    """Deterministic random-looking block bytes of `key` (fast at any size)."""
    return random.Random(key).randbytes(size)


def require_redis_server() -> None:
    """Skip (fail in CI) when `redis-server` is not installed."""
    if redis_server_path() is None:
        message = "redis-server is not installed (make test installs Debian's redis-server)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def wait_for(condition: Any, timeout_s: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class RedisHarness:
    """A Redis tier over a bytearray primary of `num_blocks` rows of `block_bytes`."""

    def __init__(self, url: str, num_blocks: int = 8, block_bytes: int = 4096, **kwargs: Any) -> None:
        self.url = url
        self.block_bytes = block_bytes
        self.view = make_view(num_blocks, block_bytes)
        self.rows = self.view.cast("B")
        kwargs.setdefault("num_connections", 2)
        kwargs.setdefault("socket_timeout_s", 0.5)
        kwargs.setdefault("connect_timeout_s", 0.5)
        kwargs.setdefault("enable_kv_events", True)
        self.tier = RedisSecondaryTier(make_spec(kv_events=True), self.view, "redis", url=url, **kwargs)
        self.job_ids = 0

    def row(self, block_id: int) -> bytes:
        start = block_id * self.block_bytes
        return bytes(self.rows[start : start + self.block_bytes])

    def fill(self, keys: list[OffloadKey], block_ids: list[int]) -> None:
        for key, block_id in zip(keys, block_ids):
            start = block_id * self.block_bytes
            self.rows[start : start + self.block_bytes] = payload(key, self.block_bytes)

    def submit(self, keys: list[OffloadKey], block_ids: list[int], promotion: bool) -> int:
        self.job_ids += 1
        job = TransferJob(self.job_ids, tuple(keys), tuple(block_ids), promotion, CTX)
        (self.tier.submit_load if promotion else self.tier.submit_store)(job)
        return self.job_ids

    def store(self, keys: list[OffloadKey], block_ids: list[int] | None = None) -> bool:
        block_ids = block_ids if block_ids is not None else list(range(len(keys)))
        self.fill(keys, block_ids)
        self.submit(keys, block_ids, promotion=False)
        return self.finish()

    def load(self, keys: list[OffloadKey], block_ids: list[int] | None = None) -> bool:
        block_ids = block_ids if block_ids is not None else list(range(len(keys)))
        for block_id in block_ids:
            start = block_id * self.block_bytes
            self.rows[start : start + self.block_bytes] = bytes(self.block_bytes)
        self.submit(keys, block_ids, promotion=True)
        return self.finish()

    def loaded_correctly(self, keys: list[OffloadKey], block_ids: list[int] | None = None) -> bool:
        block_ids = block_ids if block_ids is not None else list(range(len(keys)))
        return all(
            self.row(block_id) == payload(key, self.block_bytes)
            for key, block_id in zip(keys, block_ids)
        )

    def finish(self) -> bool:
        self.tier.drain_jobs()
        results = list(self.tier.get_finished_jobs())
        assert [result.job_id for result in results] == [self.job_ids]
        self.last_result: JobResult = results[0]
        return results[0].success

    def has(self, key: OffloadKey) -> bool:
        """Whether the tier answers HIT for `key`, asked by a request of its own once the
        tier's existence check came back (see `resolve`)."""
        answer = resolve(self.tier, key)
        if answer is LookupResult.RETRY:
            raise AssertionError(f"lookup of {key.hex()} stayed RETRY")
        return answer is LookupResult.HIT

    def close(self) -> None:
        self.tier.shutdown()
        self.rows.release()
