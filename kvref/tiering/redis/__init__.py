"""The Redis secondary tier: engines on many machines share offloaded KV blocks.

    create_tiering_manager(region, [{"type": "redis", "url": "redis://cache:6379",
                                     "namespace": "llama3-8b/bf16/tp1/rank0"}])

See `kvref.tiering.redis.tier` for the design, `value_format` for the stored bytes, `resp` for
the zero-copy connection, `routing` for URLs and Redis Cluster, and `local` for throw-away
servers (tests, examples, benchmarks).
"""

from __future__ import annotations

from kvref.tiering.redis.tier import RedisSecondaryTier

__all__ = ["RedisSecondaryTier"]
