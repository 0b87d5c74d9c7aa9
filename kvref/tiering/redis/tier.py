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

Lookups: the tier cannot know what other engines stored or what the server evicted, so `lookup`
of a block it has no fresh answer for queues an `EXISTS` and answers None ("ask again"); the
answer is kept for `lookup_cache_s`. A block stored by this tier answers None while its store is
in flight and True afterwards for `lookup_cache_s`. The thread answering those checks starts with
the first `lookup`; `contains` asks the server directly on its caller's thread instead (vLLM's
asynchronous lookups call it from their own thread, and never call `lookup`).

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
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from typing_extensions import override

from kvref.base import OffloadingEvent, OffloadKey, ReqContext
from kvref.tiering.base import JobMetadata, JobResult, PrimaryBlocks, SecondaryTierManager
from kvref.tiering.redis.io import Job, RedisIO
from kvref.tiering.redis.resp import ConnectOptions, encode_command
from kvref.tiering.redis.routing import Router, parse_server_url

if TYPE_CHECKING:
    import ssl

__all__ = ["RedisSecondaryTier"]

logger = logging.getLogger(__name__)

_MAX_UNSERVED = 1 << 16
_UNSERVED_MAX_AGE_S = 30.0

class RedisSecondaryTier(SecondaryTierManager):
    """Secondary tier on a Redis server or Redis Cluster, shareable by many engines.

    Args:
        primary_kv_view: the primary's `(num_blocks, block_bytes)` memoryview.
        url: `redis://[[user]:password@]host[:port][/db]`, `rediss://...` (TLS) or
            `unix://[[user]:password@]/path/to/socket[?db=N]`.
        cluster: treat `url` as a seed node of a Redis Cluster and route each key to the node
            owning its slot.
        namespace: the first part of every key. Engines share blocks exactly when they use the
            same namespace (and block size), so it must name the model, the KV layout and the
            worker rank (e.g. "llama3-8b/bf16/tp2/rank0").
        num_connections: I/O threads, each with one connection per server (so up to this many
            jobs move data at once).
        connect_timeout_s: bound on opening a connection.
        socket_timeout_s: a send or receive that makes no progress for this long fails its job.
        lookup_cache_s: how long an existence answer (from the server, or a store by this
            tier) is trusted before `lookup` asks the server again.
        ttl_s: expire stored blocks after this long (None: only the server's eviction policy
            removes them).
        tls_ca_file: CA bundle verifying a `rediss://` server (None: the system's).
        name: the medium named in events.
        enable_events: buffer stored/removed events for `take_events` (removed events come
            from loads that found a block gone or damaged: the server evicts silently).

    Raises:
        ValueError: an option is invalid (the message names it).
    """

    def __init__(
        self,
        primary_kv_view: memoryview,
        url: str,
        *,
        cluster: bool = False,
        namespace: str = "kvref",
        num_connections: int = 4,
        connect_timeout_s: float = 1.0,
        socket_timeout_s: float = 1.0,
        lookup_cache_s: float = 1.0,
        ttl_s: float | None = None,
        tls_ca_file: str | None = None,
        name: str = "redis",
        enable_events: bool = False,
    ) -> None:
        server = parse_server_url(url)
        if cluster and server.address.path is not None:
            raise ValueError("cluster: a Redis Cluster is reached over TCP, not a unix:// url")
        if cluster and server.db:
            raise ValueError(f"cluster: a Redis Cluster has only database 0, url names {server.db}")
        if not namespace:
            raise ValueError("namespace must be a non-empty string")
        if num_connections < 1:
            raise ValueError(f"num_connections must be >= 1, got {num_connections}")
        for field, value in (
            ("connect_timeout_s", connect_timeout_s),
            ("socket_timeout_s", socket_timeout_s),
            ("lookup_cache_s", lookup_cache_s),
        ):
            if not value > 0:
                raise ValueError(f"{field} must be > 0, got {value}")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s must be None or > 0, got {ttl_s}")
        if tls_ca_file is not None and not server.tls:
            raise ValueError("tls_ca_file needs a rediss:// url")
        tls: ssl.SSLContext | None = None
        if server.tls:
            import ssl  # only TLS deployments pay for importing it

            try:
                tls = ssl.create_default_context(cafile=tls_ca_file)
            except OSError as exc:
                raise ValueError(f"tls_ca_file {tls_ca_file!r} is unusable: {exc}") from exc

        self._primary = PrimaryBlocks(primary_kv_view)
        self.medium = name
        self.url = url
        self.block_bytes = self._primary.block_bytes
        self.lookup_cache_s = lookup_cache_s
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
            medium=name,
        )

        # --- scheduler-thread state ---
        self._storing: Counter[OffloadKey] = Counter()
        # key -> (present, trusted until): insertion order is expiry order (one lifetime).
        self._known: OrderedDict[OffloadKey, tuple[bool, float]] = OrderedDict()
        self._checking: set[OffloadKey] = set()
        # Answers not yet served since they arrived: key -> (present, served until).
        self._unserved: OrderedDict[OffloadKey, tuple[bool, float]] = OrderedDict()
        self._done: list[Job] = []
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._closed = False
        self._submitted = 0

        # --- hand-over between threads (deque appends/pops and SimpleQueue never block) ---
        self._loads: deque[Job] = deque()
        self._stores: deque[Job] = deque()
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._completions: deque[Job] = deque()
        self._check_requests: queue.SimpleQueue[OffloadKey | None] = queue.SimpleQueue()
        self._check_results: deque[tuple[OffloadKey, bool]] = deque()
        self._idle = threading.Condition()
        self._finished = 0  # under _idle
        # `contains` callers share one set of connections, one caller at a time.
        self._contains_lock = threading.Lock()
        self._contains_connections = self._io.connections()

        self._threads = [
            threading.Thread(target=self._work, name=f"kvref-{name}-io{i}", daemon=True)
            for i in range(num_connections)
        ]
        for thread in self._threads:
            thread.start()
        self._check_thread: threading.Thread | None = None  # started by the first lookup

    def redis_key(self, key: OffloadKey) -> bytes:
        """Return the Redis key block `key` is stored under."""
        return self._io.redis_key(key)

    # --- scheduler-thread API ---

    def _absorb_check_results(self) -> None:
        results = self._check_results
        while results:
            key, present = results.popleft()
            self._checking.discard(key)
            current = self._known.get(key)
            if not present and current is not None and current[0] and current[1] > time.monotonic():
                continue  # checked before this tier's own store of it landed: stale
            self._remember(key, present)
            # Served at least once even if it expires first (a step longer than
            # lookup_cache_s must not make the request ask forever).
            self._serve_once(key, present)

    def _serve_once(self, key: OffloadKey, present: bool) -> None:
        self._unserved[key] = (present, time.monotonic() + _UNSERVED_MAX_AGE_S)
        self._unserved.move_to_end(key)
        if len(self._unserved) > _MAX_UNSERVED:
            self._unserved.popitem(last=False)

    def _remember(self, key: OffloadKey, present: bool) -> None:
        self._known[key] = (present, time.monotonic() + self.lookup_cache_s)
        self._known.move_to_end(key)

    def _forget_expired(self, now: float) -> None:
        known = self._known
        while known:
            key = next(iter(known))
            if known[key][1] > now:
                return
            del known[key]

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        self._absorb_check_results()
        if key in self._storing:
            return None
        now = time.monotonic()
        self._forget_expired(now)
        answer = self._known.get(key)
        if answer is not None:
            self._unserved.pop(key, None)
            return answer[0]
        unserved = self._unserved.pop(key, None)
        if unserved is not None and unserved[1] > now:
            return unserved[0]
        if self._closed:
            return False
        if key not in self._checking:
            if self._check_thread is None:
                self._check_thread = threading.Thread(
                    target=self._check_loop, name=f"kvref-{self.medium}-lookup", daemon=True
                )
                self._check_thread.start()
            self._checking.add(key)
            self._check_requests.put(key)
        return None

    @override
    def contains(self, keys: Sequence[OffloadKey]) -> list[bool]:
        if not keys:
            return []
        with self._contains_lock:
            if self._closed:
                return [False] * len(keys)
            try:
                return self._io.exists(self._contains_connections, keys)
            except Exception as exc:  # a bug: absent, never an exception
                logger.exception("redis tier %s: existence check failed", self.medium)
                self._io.warn("lookup", exc)
                return [False] * len(keys)

    @override
    def submit_store(self, job: JobMetadata) -> None:
        self._absorb_check_results()
        self._forget_expired(time.monotonic())
        blocks: dict[OffloadKey, int] = {}
        for key, block_id in zip(job.keys, job.block_ids):
            answer = self._known.get(key)
            if key in blocks or (answer is not None and answer[0]):
                continue  # stored moments ago (by some engine): nothing to do
            blocks[key] = block_id
        state = Job(job, list(blocks.items()))
        if self._closed:
            state.failed = True
            state.blocks.clear()
        if not state.blocks:
            self._done.append(state)
            return
        self._storing.update(blocks.keys())  # (a mapping would add its values as counts)
        self._enqueue(state, self._stores)

    @override
    def submit_load(self, job: JobMetadata) -> None:
        state = Job(job, list(zip(job.keys, job.block_ids)))
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
        self._absorb_check_results()
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
        keys = [key for key, _block_id in state.blocks]
        self._storing.subtract(keys)
        self._storing = +self._storing  # drop the keys that reached 0
        for key in keys:
            self._known.pop(key, None)
            self._unserved.pop(key, None)
        for key in state.ok_keys:
            self._remember(key, True)
        if self._events is not None and state.ok_keys:
            self._events.append(OffloadingEvent(state.ok_keys, self.medium, removed=False))

    def _settle_load(self, state: Job) -> None:
        if not state.failed:
            return
        ok = set(state.ok_keys)
        for key in state.meta.keys:
            if key not in ok:
                self._remember(key, False)  # the ABC: a failed block answers False...
                self._serve_once(key, False)  # ...at least once, however late it is asked
        if self._events is not None and state.missing_keys:
            self._events.append(OffloadingEvent(state.missing_keys, self.medium, removed=True))

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return ()
        events, self._events = self._events, []
        return events

    @override
    def drain_jobs(self) -> None:
        with self._idle:
            while self._finished < self._submitted:
                self._idle.wait()

    @override
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._tokens.put(False)  # after every queued job's token: those get cancelled
        self._check_requests.put(None)
        threads = self._threads if self._check_thread is None else [*self._threads, self._check_thread]
        for thread in threads:
            thread.join()
        with self._contains_lock:  # a `contains` in progress finishes with its connection
            self._contains_connections.close_all()
        self._primary.release()

    @override
    def __repr__(self) -> str:
        mode = "cluster" if self._router.cluster else "server"
        return (
            f"RedisSecondaryTier({mode}={self._router.seed}, block_bytes={self.block_bytes}, "
            f"known={len(self._known)}, storing={len(self._storing)})"
        )

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
                    logger.exception("redis tier %s: job %d failed", self.medium, state.meta.job_id)
                    self._io.warn("job", exc)
                    state.failed = True
                finally:
                    self._completions.append(state)
                    with self._idle:
                        self._finished += 1
                        self._idle.notify_all()
        finally:
            connections.close_all()

    def _check_loop(self) -> None:
        connections = self._io.connections()
        try:
            while True:
                first = self._check_requests.get()
                if first is None:
                    return
                batch = [first]
                # Take every key queued meanwhile: one pipeline answers a step's lookups.
                while True:
                    try:
                        more = self._check_requests.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        return
                    batch.append(more)
                try:
                    present = self._io.exists(connections, batch)
                except Exception as exc:
                    logger.exception("redis tier %s: existence check failed", self.medium)
                    self._io.warn("lookup", exc)
                    present = [False] * len(batch)
                # Unreachable counts as absent: a lookup must not wait on a dead server.
                self._check_results.extend(zip(batch, present))
        finally:
            connections.close_all()
