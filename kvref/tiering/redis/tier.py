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
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from typing_extensions import override

from kvref.base import OffloadingEvent, OffloadKey, ReqContext
from kvref.tiering.base import JobMetadata, JobResult, PrimaryBlocks, SecondaryTierManager
from kvref.tiering.redis.resp import (
    Address,
    BulkInto,
    ConnectOptions,
    RespConnection,
    RespError,
    encode_command,
)
from kvref.tiering.redis.routing import Router, parse_server_url
from kvref.tiering.redis.value_format import HEADER_BYTES, key_digest, pack_header, verify_header

if TYPE_CHECKING:
    import ssl

__all__ = ["RedisSecondaryTier"]

logger = logging.getLogger(__name__)

_RETRY_AFTER_FAILURE_S = 0.5
_WARN_INTERVAL_S = 10.0
_MAX_REDIRECTS = 2
_MAX_UNSERVED = 1 << 16
_UNSERVED_MAX_AGE_S = 30.0
_CRLF = b"\r\n"
_SEND_PIECE_BYTES = 256 << 10

class _Job:
    """A submitted job: filled in by one I/O thread, settled by the scheduler thread."""

    __slots__ = ("meta", "blocks", "ok_keys", "failed", "missing_keys", "seconds")

    def __init__(self, meta: JobMetadata, blocks: list[tuple[OffloadKey, int]]) -> None:
        self.meta = meta
        self.blocks = blocks  # the (key, block id) pairs to move
        self.ok_keys: list[OffloadKey] = []
        self.failed = False
        # Loads: blocks the server did not have or that failed verification.
        self.missing_keys: list[OffloadKey] = []
        self.seconds: float | None = None  # how long its I/O thread moved it

    def result(self, block_bytes: int) -> JobResult:
        ok = self.ok_keys
        partial = self.failed and self.meta.is_promotion and ok
        return JobResult(
            self.meta.job_id,
            not self.failed,
            successful_keys=tuple(ok) if partial else None,
            transfer_time=self.seconds,
            transfer_bytes=len(ok) * block_bytes if self.seconds is not None else None,
        )


class _Outcome:
    OK = 0
    MISSING = 1  # the server does not have it (or its value was damaged)
    FAILED = 2  # the transfer failed (connection, OOM, unexpected reply)


class _Connections:
    """One I/O thread's connections, one per server, opened on first use.

    Args:
        options: how to connect.
        down_until: per server, until when not to try connecting after a failure; shared by
            every thread of a tier, so a server one thread found dead fails the others' jobs at
            once too, and all of them try again at the same time (a successful connect ends
            the hold-off for all).
    """

    def __init__(self, options: ConnectOptions, down_until: dict[Address, float]) -> None:
        self._options = options
        self._connections: dict[Address, RespConnection] = {}
        self._down_until = down_until

    def get(self, address: Address) -> RespConnection:
        """Return a connected connection to `address`.

        Raises:
            OSError: connecting failed now or very recently.
        """
        connection = self._connections.get(address)
        if connection is not None and connection.idle_and_healthy():
            return connection
        if time.monotonic() < self._down_until.get(address, 0.0):
            raise ConnectionRefusedError(f"{address}: failed moments ago; not retried yet")
        if connection is None:
            connection = self._connections[address] = RespConnection(address, self._options)
        try:
            connection.connect()
        except OSError:
            self.failed(address)
            raise
        self._down_until.pop(address, None)  # up again: no thread need wait any longer
        return connection

    def failed(self, address: Address) -> None:
        """Note that `address` failed: close its connection, hold off reconnecting briefly."""
        now = time.monotonic()
        if now >= self._down_until.get(address, 0.0):  # a refusal while held off: no extension
            self._down_until[address] = now + _RETRY_AFTER_FAILURE_S
        connection = self._connections.get(address)
        if connection is not None:
            connection.close()

    def close_all(self) -> None:
        for connection in self._connections.values():
            connection.close()


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
        self._key_prefix = f"{namespace}:{self.block_bytes}:".encode()
        self.lookup_cache_s = lookup_cache_s
        self._expiry_suffix = (
            b"" if ttl_s is None else encode_command(b"PX", str(max(1, round(ttl_s * 1000))).encode())[4:]
        )
        self._options = ConnectOptions(
            connect_timeout_s=connect_timeout_s,
            socket_timeout_s=socket_timeout_s,
            username=server.username,
            password=server.password,
            db=server.db,
            tls=tls,
        )
        self._router = Router(server.address, self._options, cluster=cluster)
        # Shared by the I/O threads' connections (dict operations are atomic under the GIL).
        self._down_until: dict[Address, float] = {}

        # --- scheduler-thread state ---
        self._storing: Counter[OffloadKey] = Counter()
        # key -> (present, trusted until): insertion order is expiry order (one lifetime).
        self._known: OrderedDict[OffloadKey, tuple[bool, float]] = OrderedDict()
        self._checking: set[OffloadKey] = set()
        # Answers not yet served since they arrived: key -> (present, served until).
        self._unserved: OrderedDict[OffloadKey, tuple[bool, float]] = OrderedDict()
        self._done: list[_Job] = []
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._closed = False
        self._submitted = 0

        # --- hand-over between threads (deque appends/pops and SimpleQueue never block) ---
        self._loads: deque[_Job] = deque()
        self._stores: deque[_Job] = deque()
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._completions: deque[_Job] = deque()
        self._check_requests: queue.SimpleQueue[OffloadKey | None] = queue.SimpleQueue()
        self._check_results: deque[tuple[OffloadKey, bool]] = deque()
        self._idle = threading.Condition()
        self._finished = 0  # under _idle
        self._last_warning = 0.0
        # `contains` callers share one set of connections, one caller at a time.
        self._contains_lock = threading.Lock()
        self._contains_connections = _Connections(self._options, self._down_until)

        self._threads = [
            threading.Thread(target=self._work, name=f"kvref-{name}-io{i}", daemon=True)
            for i in range(num_connections)
        ]
        for thread in self._threads:
            thread.start()
        self._check_thread: threading.Thread | None = None  # started by the first lookup

    def redis_key(self, key: OffloadKey) -> bytes:
        """Return the Redis key block `key` is stored under."""
        return self._key_prefix + key.hex().encode()

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
        redis_keys = [self.redis_key(key) for key in keys]
        with self._contains_lock:
            if self._closed:
                return [False] * len(keys)
            try:
                outcomes = self._pipeline(
                    self._contains_connections,
                    redis_keys,
                    lambda i: [encode_command(b"EXISTS", redis_keys[i])],
                    self._read_exists,
                )
            except Exception as exc:  # unreachable or a bug: absent, never an exception
                logger.exception("redis tier %s: existence check failed", self.medium)
                self._warn("lookup", exc)
                return [False] * len(keys)
        return [outcome == _Outcome.OK for outcome in outcomes]

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
        state = _Job(job, list(blocks.items()))
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
        state = _Job(job, list(zip(job.keys, job.block_ids)))
        if self._closed or not state.blocks:
            state.failed = True
            state.blocks.clear()
            self._done.append(state)
            return
        self._enqueue(state, self._loads)

    def _enqueue(self, state: _Job, jobs: deque[_Job]) -> None:
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

    def _settle_store(self, state: _Job) -> None:
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

    def _settle_load(self, state: _Job) -> None:
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
        connections = _Connections(self._options, self._down_until)
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
                            self._load(connections, state)
                        else:
                            self._store(connections, state)
                        state.seconds = time.monotonic() - started
                except Exception as exc:  # a bug must not kill the thread or lose the job
                    logger.exception("redis tier %s: job %d failed", self.medium, state.meta.job_id)
                    self._warn("job", exc)
                    state.failed = True
                finally:
                    self._completions.append(state)
                    with self._idle:
                        self._finished += 1
                        self._idle.notify_all()
        finally:
            connections.close_all()

    def _store(self, connections: _Connections, state: _Job) -> None:
        keys = [self.redis_key(key) for key, _block_id in state.blocks]
        rows = [self._primary.row(block_id) for _key, block_id in state.blocks]
        value_prefix = b"$" + str(HEADER_BYTES + self.block_bytes).encode() + _CRLF
        command = b"*5\r\n$3\r\nSET\r\n" if self._expiry_suffix else b"*3\r\n$3\r\nSET\r\n"

        def parts(i: int) -> list[bytes | memoryview]:
            key = keys[i]
            head = b"".join(
                (command, b"$", str(len(key)).encode(), _CRLF, key, _CRLF, value_prefix,
                 pack_header(key_digest(key), rows[i]))
            )  # fmt: skip
            return [head, rows[i], _CRLF + self._expiry_suffix]

        def read(connection: RespConnection, i: int) -> int | RespError:
            reply = connection.read_reply()
            if isinstance(reply, RespError):
                return reply
            return _Outcome.OK if reply == b"OK" else _Outcome.FAILED

        outcomes = self._pipeline(connections, keys, parts, read)
        for (key, _block_id), outcome in zip(state.blocks, outcomes):
            if outcome == _Outcome.OK:
                state.ok_keys.append(key)
            else:
                state.failed = True

    def _load(self, connections: _Connections, state: _Job) -> None:
        keys = [self.redis_key(key) for key, _block_id in state.blocks]
        rows = [self._primary.row(block_id) for _key, block_id in state.blocks]
        heads = [memoryview(bytearray(HEADER_BYTES)) for _ in keys]
        damaged: list[bytes] = []

        def parts(i: int) -> list[bytes | memoryview]:
            return [encode_command(b"GET", keys[i])]

        def read(connection: RespConnection, i: int) -> int | RespError:
            filled = connection.read_bulk_into(heads[i], rows[i])
            if isinstance(filled, RespError):
                return filled
            if filled is BulkInto.NIL:
                return _Outcome.MISSING
            problem = (
                "wrong size"
                if filled is BulkInto.WRONG_SIZE
                else verify_header(heads[i], key_digest(keys[i]), rows[i])
            )
            if problem is None:
                return _Outcome.OK
            self._warn("load", ValueError(f"{keys[i]!r}: {problem}; deleted"))
            damaged.append(keys[i])
            return _Outcome.MISSING

        outcomes = self._pipeline(connections, keys, parts, read)
        for (key, _block_id), outcome in zip(state.blocks, outcomes):
            if outcome == _Outcome.OK:
                state.ok_keys.append(key)
            else:
                state.failed = True
                if outcome == _Outcome.MISSING:
                    state.missing_keys.append(key)
        if damaged:
            # Other engines must not trip over it too; best effort.
            self._pipeline(
                connections,
                damaged,
                lambda i: [encode_command(b"DEL", damaged[i])],
                lambda connection, i: _Outcome.OK if isinstance(connection.read_reply(), int) else _Outcome.FAILED,
            )

    def _check_loop(self) -> None:
        connections = _Connections(self._options, self._down_until)
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
                    keys = [self.redis_key(key) for key in batch]
                    outcomes = self._pipeline(
                        connections,
                        keys,
                        lambda i: [encode_command(b"EXISTS", keys[i])],
                        self._read_exists,
                    )
                except Exception as exc:
                    logger.exception("redis tier %s: existence check failed", self.medium)
                    self._warn("lookup", exc)
                    outcomes = [_Outcome.FAILED] * len(batch)
                for key, outcome in zip(batch, outcomes):
                    # Unreachable counts as absent: a lookup must not wait on a dead server.
                    self._check_results.append((key, outcome == _Outcome.OK))
        finally:
            connections.close_all()

    @staticmethod
    def _read_exists(connection: RespConnection, i: int) -> int | RespError:
        reply = connection.read_reply()
        if isinstance(reply, RespError):
            return reply
        return _Outcome.OK if reply == 1 else _Outcome.MISSING

    def _pipeline(
        self,
        connections: _Connections,
        keys: Sequence[bytes],
        parts: Callable[[int], list[bytes | memoryview]],
        read: Callable[[RespConnection, int], int | RespError],
    ) -> list[int]:
        """Send one command per key, pipelined per server, and read the replies.

        `parts(i)` frames key i's command; `read(connection, i)` reads its reply into an
        outcome, or returns the server's error reply. `MOVED` replies are followed (the command
        is sent again to the new owner, at most `_MAX_REDIRECTS` times).

        Returns:
            One `_Outcome` per key.
        """
        outcomes = [_Outcome.FAILED] * len(keys)
        pending: list[int] = list(range(len(keys)))
        redirects: dict[int, Address] = {}
        for _attempt in range(_MAX_REDIRECTS + 1):
            groups: dict[Address, list[int]] = {}
            for i in pending:
                address = redirects.get(i) or self._router.route(keys[i])
                if address is not None:
                    groups.setdefault(address, []).append(i)
            sent: list[tuple[Address, RespConnection, list[int]]] = []
            for address, indices in groups.items():
                try:
                    connection = connections.get(address)
                    # Framed and sent in pieces of about _SEND_PIECE_BYTES: the server parses
                    # and stores a block while the next one's header (its checksum) is made.
                    piece: list[bytes | memoryview] = []
                    size = 0
                    for i in indices:
                        for part in parts(i):
                            piece.append(part)
                            size += len(part)
                        if size >= _SEND_PIECE_BYTES:
                            connection.send(piece)
                            piece, size = [], 0
                    if piece:
                        connection.send(piece)
                    sent.append((address, connection, indices))
                except OSError as exc:
                    self._connection_failed(connections, address, exc)
            pending: list[int] = []
            for address, connection, indices in sent:
                for i in indices:
                    try:
                        outcome = read(connection, i)
                    except OSError as exc:
                        self._connection_failed(connections, address, exc)
                        break
                    if isinstance(outcome, RespError):
                        new_owner = (
                            self._router.moved(keys[i], outcome)
                            if outcome.kind == "MOVED" and self._router.cluster
                            else None
                        )
                        if new_owner is not None:
                            redirects[i] = new_owner
                            pending.append(i)
                            continue
                        self._warn("command", RuntimeError(f"{address}: {outcome.message}"))
                        outcome = _Outcome.FAILED
                    outcomes[i] = outcome
            if not pending:
                break
        return outcomes

    def _connection_failed(self, connections: _Connections, address: Address, exc: Exception) -> None:
        connections.failed(address)
        self._router.refresh(failed=address)
        self._warn(f"connection to {address}", exc)

    def _warn(self, operation: str, exc: Exception) -> None:
        # A dead server fails every block: warn at most every few seconds.
        now = time.monotonic()
        level = logging.DEBUG
        if now - self._last_warning >= _WARN_INTERVAL_S:
            self._last_warning = now
            level = logging.WARNING
        logger.log(level, "redis tier %s: %s failed: %s", self.medium, operation, exc)
