"""RedisSecondaryTier on a real 3-node Redis Cluster: routing, MOVED, and a killed node.

The cluster runs with `cluster-require-full-coverage no` (as the README asks of deployments), so
when a node dies the others keep serving their slots: only blocks on the dead node fail.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kvref.base import OffloadKey
from kvref.tiering.redis.local import LocalRedisCluster, LocalRedisServer
from kvref.tiering.redis.routing import key_slot
from tests.tiering.helpers import to_key, to_keys
from tests.tiering.redis_helpers import RedisHarness, require_redis_server


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRedisCluster]:
    require_redis_server()
    with LocalRedisCluster(3) as started:
        yield started


def _by_node(cluster: LocalRedisCluster, h: RedisHarness, keys: list[OffloadKey]) -> dict[int, list[OffloadKey]]:
    groups: dict[int, list[OffloadKey]] = {}
    for key in keys:
        node = cluster.nodes.index(cluster.node_of(h.tier.redis_key(key)))
        groups.setdefault(node, []).append(key)
    return groups


def test_blocks_spread_over_the_nodes_and_round_trip(cluster: LocalRedisCluster) -> None:
    h = RedisHarness(cluster.url, num_blocks=16, cluster=True, namespace="spread")
    try:
        keys = to_keys(range(16))
        groups = _by_node(cluster, h, keys)
        assert sorted(groups) == [0, 1, 2]
        assert h.store(keys)
        for index, node_keys in groups.items():
            for key in node_keys:  # each block lives on the node owning its slot
                assert cluster.nodes[index].command("EXISTS", h.tier.redis_key(key)) == 1
        assert h.load(keys[::-1]) and h.loaded_correctly(keys[::-1])
        assert all(h.has(key) for key in keys)
        assert not h.has(to_key(999))
    finally:
        h.close()


def _node_id(node: LocalRedisServer) -> bytes:
    reply = node.command("CLUSTER", "MYID")
    assert isinstance(reply, bytes)
    return reply


def test_moved_slot_is_followed(cluster: LocalRedisCluster) -> None:
    h = RedisHarness(cluster.url, cluster=True, namespace="moved")
    try:
        assert h.store([to_key(0)])  # the tier now holds the slot map
        # A key of node 0 whose slot holds nothing yet: hand that slot to node 1.
        key = next(
            to_key(i)
            for i in range(1, 1000)
            if cluster.node_of(h.tier.redis_key(to_key(i))) is cluster.nodes[0]
            and cluster.nodes[0].command("CLUSTER", "COUNTKEYSINSLOT", str(key_slot(h.tier.redis_key(to_key(i))))) == 0
        )
        slot = str(key_slot(h.tier.redis_key(key)))
        new_owner = _node_id(cluster.nodes[1])
        for node in cluster.nodes:
            assert node.command("CLUSTER", "SETSLOT", slot, "NODE", new_owner) == b"OK"
        assert h.store([key])  # sent to node 0, MOVED to node 1, stored there
        assert cluster.nodes[1].command("EXISTS", h.tier.redis_key(key)) == 1
        assert h.load([key]) and h.loaded_correctly([key])
    finally:
        h.close()


def test_killed_node_fails_only_its_blocks() -> None:
    require_redis_server()
    with LocalRedisCluster(3) as cluster:
        h = RedisHarness(cluster.url, num_blocks=16, cluster=True, socket_timeout_s=0.3)
        try:
            keys = to_keys(range(16))
            assert h.store(keys)
            groups = _by_node(cluster, h, keys)
            cluster.nodes[2].kill()
            alive = groups[0] + groups[1]
            dead = groups[2]
            started = time.monotonic()
            assert h.load(alive, list(range(len(alive)))) and h.loaded_correctly(alive)
            assert not h.load([alive[0], dead[0]], [0, 1])  # the job fails: one block is gone
            assert h.last_result.successful_keys == (alive[0],)  # the other one loaded
            assert h.loaded_correctly([alive[0]], [0])
            assert time.monotonic() - started < 2.0
            assert all(h.has(key) for key in alive)
            assert not any(h.has(key) for key in dead)
            # Stores: blocks of live nodes are stored, the dead node's fail the job.
            fresh = to_keys(range(100, 116))
            fresh_groups = _by_node(cluster, h, fresh)
            assert not h.store(fresh)
            assert all(h.has(key) for key in fresh_groups[0] + fresh_groups[1])
            assert not any(h.has(key) for key in fresh_groups[2])
        finally:
            h.close()
