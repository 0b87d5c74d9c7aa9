"""A hypothesis state machine over the Redis tier and a real server, with damage and eviction.

Another client (the "world": other engines, the server's eviction, bit rot) deletes, damages and
overwrites values behind the tier's back. Invariants: a load that reports success returned
exactly the bytes stored for each key; a load of a block the world deleted or damaged fails; a
block whose load failed answers MISS to the request that found it before (so that request does
not promote it again and again); and a new request's lookup says what the server holds.
"""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule
from typing_extensions import override

from kvref.base import LookupResult, OffloadKey, ReqContext
from kvref.tiering.redis.local import LocalRedisServer
from kvref.tiering.redis.value_format import HEADER_BYTES
from tests.tiering.helpers import resolve, to_keys
from tests.tiering.redis_helpers import RedisHarness, require_redis_server

KEYS = to_keys(range(6))
NUM_BLOCKS = 4
BLOCK_BYTES = 512
_server: LocalRedisServer | None = None


def shared_server() -> LocalRedisServer:
    """One server for every example (started on first use, stopped at interpreter exit)."""
    global _server
    if _server is None:
        import atexit

        require_redis_server()
        _server = LocalRedisServer().start()
        atexit.register(_server.stop)
    return _server


class RedisTierMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.server = shared_server()
        self.server.command("FLUSHALL")
        self.h = RedisHarness(self.server.url, NUM_BLOCKS, BLOCK_BYTES, num_connections=2)
        self.requests = itertools.count()
        self.on_server: set[OffloadKey] = set()  # intact values the tier stored
        self.broken: set[OffloadKey] = set()  # present on the server, but damaged

    @initialize()
    def start(self) -> None:
        pass

    @override
    def teardown(self) -> None:
        self.h.close()

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=NUM_BLOCKS, unique=True))
    def store(self, keys: list[OffloadKey]) -> None:
        assert self.h.store(keys)
        self.on_server.update(keys)
        self.broken.difference_update(keys)

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=NUM_BLOCKS, unique=True))
    def load(self, keys: list[OffloadKey]) -> None:
        # As the tiering manager: a request finds the blocks (HIT) before it promotes them.
        request = ReqContext(req_id=f"loads-{next(self.requests)}")
        found = [resolve(self.h.tier, key, request) is LookupResult.HIT for key in keys]
        assert found == [key in self.on_server or key in self.broken for key in keys]
        ok = self.h.load(keys)
        expected = all(key in self.on_server for key in keys)
        assert ok == expected, (ok, [key.hex() for key in keys])
        if ok:
            assert self.h.loaded_correctly(keys)
        else:
            # The blocks reported loaded are exactly those the server held intact, and their
            # bytes are right; a failed block is never reported (its slot may hold anything).
            held = [key for key in keys if key in self.on_server]
            assert self.h.last_result.successful_keys == (tuple(held) if held else None)
            assert self.h.loaded_correctly(held, [keys.index(key) for key in held])
            failed = [key for key in keys if key not in self.on_server]
            for key in failed:
                assert self.h.tier.lookup(key, request) is LookupResult.MISS
            self.broken.difference_update(failed)  # deleted by the tier
        self.h.tier.on_request_finished(request)

    @rule(key=st.sampled_from(KEYS))
    def evict(self, key: OffloadKey) -> None:
        self.server.command("DEL", self.h.tier.redis_key(key))
        self.on_server.discard(key)
        self.broken.discard(key)

    @rule(key=st.sampled_from(KEYS), where=st.integers(0, HEADER_BYTES + BLOCK_BYTES - 1))
    def damage(self, key: OffloadKey, where: int) -> None:
        if key not in self.on_server:
            return
        redis_key = self.h.tier.redis_key(key)
        old = self.server.command("GETRANGE", redis_key, str(where), str(where))
        assert isinstance(old, bytes) and len(old) == 1
        self.server.command("SETRANGE", redis_key, str(where), bytes([old[0] ^ 0x40]))
        self.on_server.discard(key)
        self.broken.add(key)

    @rule(key=st.sampled_from(KEYS))
    def lookup_settles(self, key: OffloadKey) -> None:
        # Damaged values exist on the server: lookup cannot tell, only a load can.
        assert self.h.has(key) == (key in self.on_server or key in self.broken)


RedisTierMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=15)
test_redis_tier_never_returns_wrong_bytes = RedisTierMachine.TestCase
