"""RedisSecondaryTier against real redis-server processes: round trips, verification, faults.

Every test talks to servers it started itself (loopback, temporary directories). An
independent client (redis-py) inspects and damages what the tier stored. Whatever the fault,
the scheduler-side calls never raise, and a load either returns the exact bytes or fails.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis

from kvref.base import LookupResult, Medium, OffloadingEvent, ReqContext
from kvref.tiering.factory import SecondaryTierFactory
from kvref.tiering.redis import RedisSecondaryTier
from kvref.tiering.redis.local import LocalRedisServer
from kvref.tiering.redis.io import Connections
from kvref.tiering.redis.resp import Address, BulkInto, ConnectOptions, RespConnection, RespError
from kvref.tiering.redis.routing import parse_server_url
from kvref.tiering.redis.value_format import HEADER_BYTES, key_digest
from kvref.tiering.run_identity import run_identity
from kvref.tiering.tier_reporting import KvrefTierMetrics
from tests.tiering.helpers import (
    load_chunks,
    make_spec,
    make_view,
    resolve,
    tiering_from_configs,
    to_key,
    to_keys,
    wait_for_hits,
)
from tests.tiering.redis_helpers import CTX, RedisHarness, payload, require_redis_server, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server() -> Iterator[LocalRedisServer]:
    require_redis_server()
    with LocalRedisServer() as started:
        yield started


@pytest.fixture
def client(server: LocalRedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis(port=server.port, socket_timeout=2)
    server.command("FLUSHALL")
    yield connection
    connection.close()


@pytest.fixture
def harness(server: LocalRedisServer, client: redis.Redis) -> Iterator[RedisHarness]:
    h = RedisHarness(server.url)
    yield h
    h.close()


# --- configuration ---


@pytest.mark.parametrize(
    ("url", "address", "db", "tls"),
    [
        ("redis://cache:7000/2", "cache:7000", 2, False),
        ("redis://user:secret@10.0.0.5", "10.0.0.5:6379", 0, False),
        ("rediss://cache", "cache:6379", 0, True),
        ("unix:///run/redis.sock?db=3", "/run/redis.sock", 3, False),
    ],
)
def test_urls(url: str, address: str, db: int, tls: bool) -> None:
    parsed = parse_server_url(url)
    assert (str(parsed.address), parsed.db, parsed.tls) == (address, db, tls)


def test_credentials_come_from_the_url() -> None:
    parsed = parse_server_url("redis://alice:p%40ss@cache:6380")
    assert (parsed.username, parsed.password) == ("alice", "p@ss")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"url": "http://cache"}, "url"),
        ({"url": "redis://cache:notaport"}, "url"),
        ({"url": "redis://cache/x"}, "url"),
        ({"url": "redis://cache", "num_connections": 0}, "num_connections"),
        ({"url": "redis://cache", "socket_timeout_s": 0}, "socket_timeout_s"),
        ({"url": "redis://cache", "connect_timeout_s": -1}, "connect_timeout_s"),
        ({"url": "redis://cache", "lookup_cache_s": 1.0}, "lookup_cache_s"),  # gone: AsyncLookupManager
        ({"url": "redis://cache", "locality": "far"}, "locality"),
        ({"url": "redis://cache", "enable_kv_events": 1}, "enable_kv_events"),
        ({"url": "redis://cache", "ttl_s": 0}, "ttl_s"),
        ({"url": "redis://cache", "namespace": ""}, "namespace"),
        ({"url": "unix:///tmp/r.sock", "cluster": True}, "cluster"),
        ({"url": "redis://cache/1", "cluster": True}, "cluster"),
        ({"url": "redis://cache", "tls_ca_file": "/ca.pem"}, "tls_ca_file"),
        ({"url": "redis://cache", "no_such_option": 1}, "no_such_option"),
    ],
)
def test_invalid_options_raise_value_error_naming_them(options: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SecondaryTierFactory.create_secondary_tier({"type": "redis", **options}, make_view(2), make_spec())


def test_key_names_namespace_and_block_size() -> None:
    tier = RedisSecondaryTier(make_spec(), make_view(2, 64), "redis", url="redis://127.0.0.1:1", namespace="m/bf16/rank3")
    try:
        assert tier.redis_key(to_key(1)) == b"m/bf16/rank3:64:" + to_key(1).hex().encode()
        assert tier.config_info() == {"redis_namespace": "m/bf16/rank3", "redis_cluster": False, "redis_num_connections": 4}
    finally:
        tier.shutdown()


def test_the_default_namespace_is_the_run_identity() -> None:
    # Engines share blocks exactly when model, KV layout and rank agree (as vLLM's fs tier's
    # directories): another rank of a tensor-parallel model gets another namespace.
    spec, other_rank = make_spec(tp_size=2), make_spec(tp_size=2, rank=1)
    tiers = [RedisSecondaryTier(s, make_view(2, 64), "redis", url="redis://127.0.0.1:1") for s in (spec, other_rank)]
    try:
        assert tiers[0].redis_key(to_key(1)).startswith(f"{run_identity(spec)}:64:".encode())
        assert run_identity(spec) != run_identity(other_rank)
    finally:
        for tier in tiers:
            tier.shutdown()


# --- normal operation ---


def test_store_then_load_round_trip(harness: RedisHarness) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.tier.lookup(k1, CTX) is LookupResult.RETRY  # checked at the step's end
    assert not harness.has(k1)
    harness.tier.on_request_finished(CTX)  # else its verdict (MISS) would stand for it
    assert harness.store([k1, k2], [0, 1])
    assert harness.has(k1)
    assert harness.load([k2, k1], [5, 6])
    assert harness.row(5) == payload(k2, 4096) and harness.row(6) == payload(k1, 4096)
    assert harness.tier.take_events() == [OffloadingEvent([k1, k2], Medium.STORAGE, removed=False, ownership="redis")]
    _, values = harness.tier.get_stats().metric_sections()
    assert values[KvrefTierMetrics.CHUNKS_STORED] == {("redis",): 2}
    assert values[KvrefTierMetrics.CHUNKS_LOADED] == {("redis",): 2}


def test_lookup_answers_retry_while_the_store_is_in_flight(
    server: LocalRedisServer, client: redis.Redis
) -> None:
    h = RedisHarness(server.url, num_connections=1)
    try:
        server.pause()  # the store cannot finish while the server is stopped
        h.fill([to_key(1)], [0])
        h.submit([to_key(1)], [0], promotion=False)
        assert h.tier.lookup(to_key(1), CTX) is LookupResult.RETRY
        server.resume()
        assert h.finish()
        assert h.has(to_key(1))
    finally:
        server.resume()
        h.close()


def test_a_verdict_holds_while_its_request_asks_and_a_failed_load_turns_it_to_miss(
    harness: RedisHarness, client: redis.Redis
) -> None:
    k1, k2 = to_keys([1, 2])
    assert harness.store([k1, k2])
    request = ReqContext(req_id="asks-twice")
    assert [resolve(harness.tier, key, request) for key in (k1, k2)] == [LookupResult.HIT] * 2
    client.delete(harness.tier.redis_key(k1))  # evicted by the server: the verdict stands
    assert harness.tier.lookup(k1, request) is LookupResult.HIT
    assert not harness.load([k1, k2])
    assert harness.last_result.successful_keys == (k2,)
    # The lost block is a MISS from now on: not promoted again and again.
    assert harness.tier.lookup(k1, request) is LookupResult.MISS
    assert harness.tier.lookup(k2, request) is LookupResult.HIT
    harness.tier.on_request_finished(request)
    assert not harness.has(k1) and harness.has(k2)


def test_stored_value_is_header_then_payload(harness: RedisHarness, client: redis.Redis) -> None:
    key = to_key(7)
    assert harness.store([key])
    value = client.get(harness.tier.redis_key(key))
    assert isinstance(value, bytes) and len(value) == HEADER_BYTES + 4096
    magic, version, _reserved, size, digest, _checksum = struct.unpack_from("<4sHHQQQ", value)
    assert (magic, version, size) == (b"KVRB", 1, 4096)
    assert digest == key_digest(harness.tier.redis_key(key))
    assert value[HEADER_BYTES:] == payload(key, 4096)


def test_large_jobs_pipeline_through_one_connection(server: LocalRedisServer, client: redis.Redis) -> None:
    h = RedisHarness(server.url, num_blocks=64, block_bytes=256 << 10, num_connections=1)
    try:
        keys = to_keys(range(64))
        assert h.store(keys)
        assert h.load(keys[::-1])
        assert h.loaded_correctly(keys[::-1])
    finally:
        h.close()


def test_rows_travel_as_memoryviews_of_the_primary(
    harness: RedisHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[bytes | memoryview] = []
    filled: list[memoryview] = []
    real_send, real_read = RespConnection.send, RespConnection.read_bulk_into

    def send(self: RespConnection, parts: Sequence[bytes | memoryview]) -> None:
        sent.extend(parts)
        real_send(self, parts)

    def read_bulk_into(self: RespConnection, head: memoryview, body: memoryview) -> BulkInto | RespError:
        filled.append(body)
        return real_read(self, head, body)

    monkeypatch.setattr(RespConnection, "send", send)
    monkeypatch.setattr(RespConnection, "read_bulk_into", read_bulk_into)
    primary = harness.view.obj
    assert harness.store([to_key(1)], [2])
    # The payload is sent as a view of the primary row itself, never copied into bytes.
    assert [part.obj for part in sent if isinstance(part, memoryview)] == [primary]
    assert all(len(part) < 200 for part in sent if isinstance(part, bytes))
    assert harness.load([to_key(1)], [5])
    assert [body.obj for body in filled] == [primary] and len(filled[0]) == 4096
    assert harness.loaded_correctly([to_key(1)], [5])


def test_unix_socket_and_database(tmp_path: Path) -> None:
    require_redis_server()
    socket_path = tmp_path / "redis.sock"
    with LocalRedisServer(["--unixsocket", str(socket_path), "--unixsocketperm", "700"]) as unix_server:
        h = RedisHarness(f"unix://{socket_path}?db=2")
        try:
            assert h.store([to_key(1)])
            assert h.load([to_key(1)])
            assert h.loaded_correctly([to_key(1)])
        finally:
            h.close()
        assert unix_server.command("EXISTS", h.tier.redis_key(to_key(1))) == 0  # not in db 0
        other = redis.Redis(port=unix_server.port, db=2)
        assert other.exists(h.tier.redis_key(to_key(1))) == 1
        other.close()


def test_tls_with_a_ca_file(tmp_path: Path) -> None:
    require_redis_server()
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    placeholder = LocalRedisServer()  # never started: it only picks a free port
    tls_port = placeholder.port
    placeholder.stop()
    tls_args = ["--tls-port", str(tls_port), "--tls-cert-file", str(cert),
                "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]  # fmt: skip
    with LocalRedisServer(tls_args):
        url = f"rediss://127.0.0.1:{tls_port}"
        h = RedisHarness(url, tls_ca_file=str(cert))
        untrusted = RedisHarness(url)  # the system's CAs do not know this certificate
        try:
            assert h.store(to_keys([1, 2]))
            assert h.load(to_keys([2, 1])) and h.loaded_correctly(to_keys([2, 1]))
            assert not untrusted.load(to_keys([1]))
        finally:
            h.close()
            untrusted.close()


def test_password_from_url() -> None:
    require_redis_server()
    with LocalRedisServer(["--requirepass", "s3cret"]) as secured:
        wrong = RedisHarness(f"redis://:nope@127.0.0.1:{secured.port}")
        right = RedisHarness(f"redis://:s3cret@127.0.0.1:{secured.port}")
        try:
            assert not wrong.store([to_key(1)])
            assert right.store([to_key(1)])
        finally:
            wrong.close()
            right.close()


def test_ttl_expires_blocks(server: LocalRedisServer, client: redis.Redis) -> None:
    h = RedisHarness(server.url, ttl_s=0.2)
    try:
        assert h.store([to_key(1)])
        assert 0 < client.pttl(h.tier.redis_key(to_key(1))) <= 200
        wait_for(lambda: client.exists(h.tier.redis_key(to_key(1))) == 0, what="expiry")
        assert not h.load([to_key(1)])
    finally:
        h.close()


# --- correct or absent ---


def _flip_payload_byte(client: redis.Redis, key: bytes) -> None:
    value = client.getrange(key, HEADER_BYTES + 100, HEADER_BYTES + 100)
    assert isinstance(value, bytes)
    client.setrange(key, HEADER_BYTES + 100, bytes([value[0] ^ 0x01]))


def _break_magic(client: redis.Redis, key: bytes) -> None:
    client.setrange(key, 0, b"XXXX")


def _truncate(client: redis.Redis, key: bytes) -> None:
    value = client.get(key)
    assert isinstance(value, bytes)
    client.set(key, value[:-1])


def _wrong_block_size_in_header(client: redis.Redis, key: bytes) -> None:
    client.setrange(key, 8, struct.pack("<Q", 8192))


def _copied_from_another_key(client: redis.Redis, key: bytes) -> None:
    other = key[:-2] + b"ff"  # a key of another block, same namespace
    value = client.get(key)
    assert isinstance(value, bytes)
    client.set(other, value)
    client.rename(other, key)  # a whole valid value, but written for another key
    client.setrange(key, 16, struct.pack("<Q", key_digest(other)))


@pytest.mark.parametrize(
    "damage",
    [_flip_payload_byte, _break_magic, _truncate, _wrong_block_size_in_header, _copied_from_another_key],
)
def test_damaged_value_fails_the_load_becomes_a_miss_and_is_deleted(
    harness: RedisHarness, client: redis.Redis, damage: object
) -> None:
    assert callable(damage)
    good, bad = to_keys([1, 2])
    assert harness.store([good, bad])
    damage(client, harness.tier.redis_key(bad))
    assert not harness.load([good, bad])
    assert harness.last_result.successful_keys == (good,) and harness.loaded_correctly([good])
    assert not harness.has(bad)
    assert client.exists(harness.tier.redis_key(bad)) == 0  # other engines won't trip on it
    assert list(harness.tier.take_events())[-1] == OffloadingEvent([bad], Medium.STORAGE, removed=True, ownership="redis")
    assert harness.load([good]) and harness.loaded_correctly([good])


def test_block_gone_from_the_server_is_a_miss(harness: RedisHarness, client: redis.Redis) -> None:
    key = to_key(1)
    assert harness.store([key])
    client.delete(harness.tier.redis_key(key))
    assert not harness.has(key)  # a new request asks the server again
    assert not harness.load([key])


# --- faults ---


def test_the_io_threads_share_the_hold_off_after_a_failed_connect() -> None:
    # After a failure each I/O thread held off reconnecting on its own clock, so one thread
    # could still refuse a job for its own recent failure after another had reconnected: a
    # load right after a successful store failed. The hold-off is now one per server.
    require_redis_server()
    server = LocalRedisServer().start()
    shared: dict[Address, float] = {}
    first, second = Connections(ConnectOptions(), shared), Connections(ConnectOptions(), shared)

    def connects(connections: Connections) -> bool:
        try:
            return connections.get(server.address).connected
        except OSError:
            return False

    try:
        server.kill()
        with pytest.raises(OSError):
            first.get(server.address)
        time.sleep(0.3)
        with pytest.raises(OSError, match="not retried yet"):
            second.get(server.address)  # the server one thread found dead fails the other at once
        server.start()
        wait_for(lambda: connects(first), what="a connect after the restart")
        assert connects(second)  # not held off by its own failure 0.3 s later
    finally:
        first.close_all()
        second.close_all()
        server.stop()


def test_server_killed_and_restarted_during_stores() -> None:
    require_redis_server()
    server = LocalRedisServer().start()
    h = RedisHarness(server.url, num_connections=2)
    try:
        before = to_keys(range(4))
        assert h.store(before)
        server.kill()
        started = time.monotonic()
        for i in range(3):  # stores while the server is down fail, quickly, without raising
            assert not h.store(to_keys([10 + i]))
        assert time.monotonic() - started < 3 * 1.0
        assert not h.has(to_key(99))  # unreachable answers "not here"
        server.start()  # same port, empty (nothing was persisted)
        wait_for(lambda: h.store(to_keys([20])), what="a store after the restart")
        assert not h.has(before[0])  # lost in the restart: a miss
        assert not h.load(before[:1])
        # One thread's connect shows the server is back: every thread tries again at once,
        # none waits out the hold-off of its own earlier failure.
        for _ in range(4):
            assert h.load(to_keys([20])) and h.loaded_correctly(to_keys([20]))
    finally:
        h.close()
        server.stop()


def test_hung_server_fails_jobs_within_the_timeout_and_lookups_do_not_wait() -> None:
    require_redis_server()
    with LocalRedisServer() as server:
        h = RedisHarness(server.url, socket_timeout_s=0.3)
        try:
            assert h.store([to_key(1)])
            server.pause()
            started = time.monotonic()
            assert not h.load([to_key(1)])
            assert time.monotonic() - started < 1.5
            started = time.monotonic()
            assert h.tier.lookup(to_key(2), CTX) is LookupResult.RETRY  # never waits for the server
            assert time.monotonic() - started < 0.05
            assert not h.has(to_key(2))
            server.resume()
            wait_for(lambda: h.load([to_key(1)]), what="a load after resuming")
            assert h.loaded_correctly([to_key(1)])
        finally:
            server.resume()
            h.close()


def test_out_of_memory_without_eviction_fails_stores_cleanly() -> None:
    require_redis_server()
    with LocalRedisServer(["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]) as server:
        h = RedisHarness(server.url, num_blocks=4, block_bytes=256 << 10)
        try:
            results = [h.store(to_keys(range(i, i + 4))) for i in range(0, 40, 4)]
            assert results[0] and not results[-1]  # fills up, then OOM fails the stores
            assert h.load(to_keys(range(4))) and h.loaded_correctly(to_keys(range(4)))
        finally:
            h.close()


def test_maxmemory_eviction_turns_blocks_into_misses_never_wrong_bytes() -> None:
    require_redis_server()
    with LocalRedisServer(["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]) as server:
        h = RedisHarness(server.url, num_blocks=4, block_bytes=256 << 10)
        try:
            keys = to_keys(range(40))
            for i in range(0, 40, 4):
                assert h.store(keys[i : i + 4])  # eviction makes room: every store succeeds
            present = [h.has(key) for key in keys]
            assert not all(present) and any(present)
            for key, found in zip(keys, present):
                assert h.load([key]) == found
                if found:
                    assert h.loaded_correctly([key])
                else:
                    assert not h.has(key)
        finally:
            h.close()


def test_shutdown_fails_queued_jobs_and_later_calls(server: LocalRedisServer, client: redis.Redis) -> None:
    h = RedisHarness(server.url, num_connections=1)
    server.pause()
    try:
        h.fill(to_keys(range(4)), list(range(4)))
        ids = [h.submit([to_key(i)], [i], promotion=False) for i in range(4)]
        server.resume()
        h.tier.shutdown()
        results = {result.job_id: result.success for result in h.tier.get_finished_jobs()}
        assert sorted(results) == ids  # every job reported once
        h.submit([to_key(9)], [0], promotion=True)
        assert [(r.job_id, r.success) for r in h.tier.get_finished_jobs()] == [(h.job_ids, False)]
        assert h.tier.lookup(to_key(9), CTX) is LookupResult.MISS
    finally:
        server.resume()
        h.rows.release()


# --- engines sharing blocks ---


_ENGINE_A = """
import sys
from kvref.base import ReqContext
from tests.tiering.helpers import store_chunks, tiering_from_configs, to_keys
from tests.tiering.redis_helpers import payload
manager = tiering_from_configs(8, 65536, [{"type": "redis", "url": sys.argv[1], "namespace": "shared"}])
ctx = ReqContext("a")
manager.on_new_request(ctx)
store_chunks(manager, to_keys(range(6)), ctx, lambda key: payload(key, 65536))
manager.shutdown()
print("stored")
"""


def test_two_engine_processes_share_blocks(server: LocalRedisServer, client: redis.Redis) -> None:
    # Engine A: another process, its own primary region.
    done = subprocess.run(
        [sys.executable, "-c", _ENGINE_A, server.url], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "stored", done.stderr
    # Engine B: this process, a primary of its own, has never seen the blocks.
    manager = tiering_from_configs(8, 65536, [{"type": "redis", "url": server.url, "namespace": "shared"}])
    try:
        ctx = ReqContext("b")
        manager.on_new_request(ctx)
        keys = to_keys(range(6))
        wait_for_hits(manager, keys, ctx)  # promoted from Redis into this engine's primary
        assert load_chunks(manager, keys, ctx) == [payload(key, 65536) for key in keys]
        # Another namespace (another model or rank) does not see them.
        assert server.command("DBSIZE") == 6
    finally:
        manager.shutdown()


def test_example_shares_blocks_between_two_processes(server: LocalRedisServer, client: redis.Redis) -> None:
    done = subprocess.run(
        [sys.executable, "examples/redis_share.py", "--url", server.url, "--blocks", "4"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "engine A" in done.stdout and "identical bytes" in done.stdout


def test_example_says_plainly_when_no_server_answers() -> None:
    done = subprocess.run(
        [sys.executable, "examples/redis_share.py", "--url", "redis://127.0.0.1:1"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stdout.startswith("No Redis server answers at redis://127.0.0.1:1")


def test_example_without_redis_server_installed() -> None:
    env = {**os.environ, "PATH": "/nonexistent"}
    done = subprocess.run(
        [sys.executable, "examples/redis_share.py"], cwd=REPO, capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0
    assert done.stdout.startswith("No Redis server available")
