"""`RedisSecondaryTier`: blocks shared by every engine that can reach a Redis server or cluster.

Keys and values: block `key` of a tier with namespace `ns` and `block_bytes`-byte rows is stored
under `ns:<block_bytes>:<key hex>`, so engines of different models, KV layouts or ranks (which
must differ in `namespace`) or of different block sizes never read each other's blocks. The
value is a 32-byte header (see `value_format`) followed by the row's bytes.

Threads: the scheduler thread only updates dictionaries and queues work. `num_connections` I/O
threads, each with its own connection per server, run one job at a time and pipeline its blocks
(all commands sent, then all replies read; in cluster mode one pipeline per node, so a dead node
fails only the blocks it holds). Loads are served before stores. One more thread answers
existence checks for `lookup`, batched and pipelined the same way.

Lookups: the tier cannot know what other engines stored or what the server evicted, so a
block's first `lookup` answers RETRY and queues an `EXISTS`, sent at the step's end with the
step's others in one pipeline by an `AsyncLookupManager`'s thread (as vLLM's fs tier checks its
files); the answer holds while requests ask for the block. A block whose store by this tier is
in flight answers RETRY; a block a load found gone or damaged answers MISS from then on.

Failures: a refused, reset or silent connection fails the blocks it carried within
`socket_timeout_s` (each receive or send that makes no progress for that long gives up), the
connection is closed, and the next job reconnects (an address that just failed is not retried
by any I/O thread for `_RETRY_AFTER_FAILURE_S`, so a dead server fails jobs at once instead of
once per timeout, and all threads try it again together).
A block the server no longer has (evicted under `maxmemory`, lost in a restart) is a miss; a
value whose header or checksum does not match is a miss and is deleted. An `OOM` reply (a full
server without eviction) fails that block's store. Nothing raises on the scheduler thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import override

from kvref.base import (
    CacheHitSource,
    ConfigInfo,
    ConfigInfoMapping,
    LookupResult,
    Medium,
    OffloadingConnectorStats,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from kvref.tiering._options import check_bool, check_locality
from kvref.tiering.async_lookup import AsyncLookupManager
from kvref.tiering.backpressure import BackpressureDetector
from kvref.tiering.base import JobResult, PrimaryBlocks, SecondaryTierManager, TransferJob
from kvref.tiering.redis.io import Connections, Job, RedisIO
from kvref.tiering.redis.resp import ConnectOptions, encode_command
from kvref.tiering.redis.routing import Router, parse_server_url
from kvref.tiering.run_identity import run_identity
from kvref.tiering.tier_reporting import TierCounters, TierEvents, tier_metric_definitions

if TYPE_CHECKING:
    import ssl

    from kvref.base import OffloadingSpec

__all__ = ["RedisSecondaryTier", "RedisTierInfo"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RedisTierInfo(ConfigInfo):
    """What a `RedisSecondaryTier` publishes on the config-info metric (never the url: it may
    hold a password)."""

    redis_namespace: str
    redis_cluster: bool
    redis_num_connections: int


class _ServerLookups(AsyncLookupManager):
    """`EXISTS` checks, one pipeline per step, over the lookup thread's own connections."""

    def __init__(self, tier_type: str, io: RedisIO) -> None:
        self._io = io  # before the base class starts its thread
        self._connections: Connections = io.connections()
        super().__init__(tier_type)

    @override
    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        # An unreachable server answers absent: a lookup must not wait on a dead server.
        return self._io.exists(self._connections, keys)

    @override
    def shutdown(self) -> None:
        super().shutdown()
        self._connections.close_all()


class RedisSecondaryTier(SecondaryTierManager):
    """Secondary tier on a Redis server or Redis Cluster, shareable by many engines.

    Args:
        offloading_spec, primary_kv_view, tier_type, backpressure_detector: as every tier
            (`SecondaryTierManager`).
        url: `redis://[[user]:password@]host[:port][/db]`, `rediss://...` (TLS) or
            `unix://[[user]:password@]/path/to/socket[?db=N]`.
        cluster: treat `url` as a seed node of a Redis Cluster and route each key to the node
            owning its slot.
        namespace: the first part of every key. Engines share blocks exactly when they use the
            same namespace (and block size), so it must name the model, the KV layout and the
            worker rank. None (the default): the run identity (`kvref.tiering.run_identity`,
            the name vLLM's own fs tier gives the engine's directory), which does.
        num_connections: I/O threads, each with one connection per server (so up to this many
            jobs move data at once).
        connect_timeout_s: bound on opening a connection.
        socket_timeout_s: a send or receive that makes no progress for this long fails its job.
        ttl_s: expire stored blocks after this long (None: only the server's eviction policy
            removes them).
        tls_ca_file: CA bundle verifying a `rediss://` server (None: the system's).
        enable_kv_events: emit stored/removed events (also needs the spec's global flag;
            removed events come from loads that found a block gone or damaged: the server
            evicts silently).
        locality: "LOCAL" or "REMOTE", for events and load tier filters; None if unknown.

    Raises:
        ValueError: an option is invalid (the message names it).
    """

    medium: ClassVar[Medium | None] = Medium.STORAGE
    # A remote store: vLLM's fallback source, not "disk" (what STORAGE would give).
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        *,
        url: str,
        cluster: bool = False,
        namespace: str | None = None,
        num_connections: int = 4,
        connect_timeout_s: float = 1.0,
        socket_timeout_s: float = 1.0,
        ttl_s: float | None = None,
        tls_ca_file: str | None = None,
        enable_kv_events: bool = False,
        locality: str | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        server = parse_server_url(url)
        cluster = check_bool("cluster", cluster)
        if cluster and server.address.path is not None:
            raise ValueError("cluster: a Redis Cluster is reached over TCP, not a unix:// url")
        if cluster and server.db:
            raise ValueError(f"cluster: a Redis Cluster has only database 0, url names {server.db}")
        namespace = run_identity(offloading_spec) if namespace is None else namespace
        if not isinstance(namespace, str) or not namespace:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"namespace must be a non-empty string, got {namespace!r}")
        if isinstance(num_connections, bool) or not isinstance(num_connections, int) or num_connections < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"num_connections must be an integer >= 1, got {num_connections!r}")
        for field, value in (("connect_timeout_s", connect_timeout_s), ("socket_timeout_s", socket_timeout_s)):
            if not value > 0:
                raise ValueError(f"{field} must be > 0, got {value}")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s must be None or > 0, got {ttl_s}")
        if tls_ca_file is not None and not server.tls:
            raise ValueError("tls_ca_file needs a rediss:// url")
        self.locality = check_locality("locality", locality)
        events = check_bool("enable_kv_events", enable_kv_events)
        tls: ssl.SSLContext | None = None
        if server.tls:
            import ssl  # only TLS deployments pay for importing it

            try:
                tls = ssl.create_default_context(cafile=tls_ca_file)
            except OSError as exc:
                raise ValueError(f"tls_ca_file {tls_ca_file!r} is unusable: {exc}") from exc

        self._primary = PrimaryBlocks(primary_kv_view)
        self.url = url
        self.block_bytes = self._primary.block_bytes
        options = ConnectOptions(
            connect_timeout_s=connect_timeout_s,
            socket_timeout_s=socket_timeout_s,
            username=server.username,
            password=server.password,
            db=server.db,
            tls=tls,
        )
        self._router = Router(server.address, options, cluster=cluster)
        self._io = RedisIO(
            self._primary,
            self._router,
            options,
            key_prefix=f"{namespace}:{self.block_bytes}:".encode(),
            expiry_suffix=b"" if ttl_s is None else encode_command(b"PX", str(max(1, round(ttl_s * 1000))).encode())[4:],
            medium=tier_type,
        )
        self._info = RedisTierInfo(namespace, cluster, num_connections)

        # --- scheduler-thread state ---
        self._storing: Counter[OffloadKey] = Counter()
        self._done: list[Job] = []
        self._events = TierEvents(events, offloading_spec, Medium.STORAGE, self.locality, tier_type)
        self._counters = TierCounters()
        self._closed = False
        self._submitted = 0

        # --- hand-over between threads (deque appends/pops and SimpleQueue never block) ---
        self._loads: deque[Job] = deque()
        self._stores: deque[Job] = deque()
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._completions: deque[Job] = deque()
        self._idle = threading.Condition()
        self._finished = 0  # under _idle

        self._threads = [
            threading.Thread(target=self._work, name=f"kvref-{tier_type}-io{i}", daemon=True)
            for i in range(num_connections)
        ]
        for thread in self._threads:
            thread.start()
        self._lookup_manager = _ServerLookups(tier_type, self._io)

    def redis_key(self, key: OffloadKey) -> bytes:
        """Return the Redis key block `key` is stored under."""
        return self._io.redis_key(key)

    # --- requests and lookups ---

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._storing:
            return LookupResult.RETRY  # this tier's store is in flight: ask again
        if self._closed:
            return LookupResult.MISS
        found = self._lookup_manager.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY  # checked on the lookup thread after this step
        return LookupResult.HIT if found else LookupResult.MISS

    @override
    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookup_manager.flush()

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookup_manager.cleanup(req_context.req_id)

    # --- jobs ---

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        # A block named twice in one job is sent once.
        blocks = dict(zip(job_metadata.keys, job_metadata.chunk_ids))
        state = Job(job_metadata, list(blocks.items()))
        if self._closed or not state.blocks:
            state.failed = self._closed
            state.blocks.clear()
            self._done.append(state)
            return
        self._storing.update(blocks.keys())  # (a mapping would add its values as counts)
        self._enqueue(state, self._stores)

    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        state = Job(job_metadata, list(zip(job_metadata.keys, job_metadata.chunk_ids)))
        if self._closed or not state.blocks:
            state.failed = True
            state.blocks.clear()
            self._done.append(state)
            return
        self._enqueue(state, self._loads)

    def _enqueue(self, state: Job, jobs: deque[Job]) -> None:
        jobs.append(state)
        self._submitted += 1
        self._tokens.put(True)

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        done, self._done = self._done, []
        while self._completions:
            done.append(self._completions.popleft())
        results: list[JobResult] = []
        for state in done:
            if state.meta.is_promotion:
                self._settle_load(state)
            else:
                self._settle_store(state)
            results.append(state.result(self.block_bytes))
        return results

    def _settle_store(self, state: Job) -> None:
        keys = [key for key, _chunk_id in state.blocks]
        self._storing.subtract(keys)
        self._storing = +self._storing  # drop the keys that reached 0
        self._counters.chunks_stored += len(state.ok_keys)
        self._events.announce(state.ok_keys, removed=False)

    def _settle_load(self, state: Job) -> None:
        self._counters.chunks_loaded += len(state.ok_keys)
        if not state.failed:
            return
        ok = set(state.ok_keys)
        lost = [key for key in state.meta.keys if key not in ok]
        self._counters.chunks_lost += len(lost)
        # The lost blocks answer MISS from now on, so that the manager does not promote them
        # again and again (as vLLM's fs tier does).
        self._lookup_manager.mark_miss(lost)
        self._events.announce(state.missing_keys, removed=True)

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        return self._events.take()

    @override
    def drain_jobs(self) -> None:
        with self._idle:
            while self._finished < self._submitted:
                self._idle.wait()

    # --- metrics ---

    @classmethod
    @override
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        return tier_metric_definitions()

    @override
    def get_stats(self) -> OffloadingConnectorStats:
        return self._counters.take_stats(self.tier_type, None)  # the server's memory is its own

    @classmethod
    @override
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return RedisTierInfo.config_info_keys()

    @override
    def config_info(self) -> ConfigInfoMapping:
        return self._info.as_config_info()

    @override
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._tokens.put(False)  # after every queued job's token: those get cancelled
        for thread in self._threads:
            thread.join()
        self._lookup_manager.shutdown()
        self._primary.release()

    @override
    def __repr__(self) -> str:
        mode = "cluster" if self._router.cluster else "server"
        return f"RedisSecondaryTier({mode}={self._router.seed}, block_bytes={self.block_bytes}, storing={len(self._storing)})"

    # --- I/O threads ---

    def _work(self) -> None:
        connections = self._io.connections()
        try:
            while self._tokens.get():
                try:
                    state = self._loads.popleft()
                except IndexError:
                    state = self._stores.popleft()
                try:
                    if self._closed:
                        state.failed = True
                    else:
                        started = time.monotonic()
                        if state.meta.is_promotion:
                            self._io.load(connections, state)
                        else:
                            self._io.store(connections, state)
                        state.seconds = time.monotonic() - started
                except Exception as exc:  # a bug must not kill the thread or lose the job
                    logger.exception("redis tier %s: job %d failed", self.tier_type, state.meta.job_id)
                    self._io.warn("job", exc)
                    state.failed = True
                finally:
                    self._completions.append(state)
                    with self._idle:
                        self._finished += 1
                        self._idle.notify_all()
        finally:
            connections.close_all()
