"""The I/O side of the Redis tier: connections per server, pipelines, and what a job sends and reads.

`RedisIO` is shared by a tier's I/O threads (and its existence checks): each thread holds its own
`Connections`, and `store`, `load` and `exists` pipeline a job's commands over them, one pipeline
per server (cluster mode routes each key to the node owning its slot and follows `MOVED`). The
tier (`kvref.tiering.redis.tier`) keeps the scheduler thread's state and the threads; nothing
here touches that state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from kvref.base import OffloadKey
from kvref.tiering.base import JobResult, PrimaryBlocks, TransferJob
from kvref.tiering.redis.resp import Address, BulkInto, ConnectOptions, RespConnection, RespError, encode_command
from kvref.tiering.redis.routing import Router
from kvref.tiering.redis.value_format import HEADER_BYTES, key_digest, pack_header, verify_header

__all__ = ["Job", "Outcome", "Connections", "RedisIO"]

logger = logging.getLogger(__name__.rsplit(".", 1)[0] + ".tier")

_RETRY_AFTER_FAILURE_S = 0.5
_WARN_INTERVAL_S = 10.0
_MAX_REDIRECTS = 2
_CRLF = b"\r\n"
_SEND_PIECE_BYTES = 256 << 10


class Job:
    """A submitted job: filled in by one I/O thread, settled by the scheduler thread."""

    __slots__ = ("meta", "blocks", "ok_keys", "failed", "missing_keys", "seconds")

    def __init__(self, meta: TransferJob, blocks: list[tuple[OffloadKey, int]]) -> None:
        self.meta = meta
        self.blocks = blocks  # the (key, primary chunk id) pairs to move
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


class Outcome:
    OK = 0
    MISSING = 1  # the server does not have it (or its value was damaged)
    FAILED = 2  # the transfer failed (connection, OOM, unexpected reply)


class Connections:
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


class RedisIO:
    """What a tier's I/O threads do, with the server(s) of one tier.

    Args:
        primary: the primary's rows (read by stores, written by loads).
        router: where each key lives.
        options: how to connect.
        key_prefix: `<namespace>:<block_bytes>:` as bytes.
        expiry_suffix: the `PX <ms>` arguments of SET, framed (empty: no expiry).
        medium: the tier's name, for warnings.
    """

    def __init__(
        self,
        primary: PrimaryBlocks,
        router: Router,
        options: ConnectOptions,
        key_prefix: bytes,
        expiry_suffix: bytes,
        medium: str,
    ) -> None:
        self._primary = primary
        self.block_bytes = primary.block_bytes
        self._router = router
        self._options = options
        self._key_prefix = key_prefix
        self._expiry_suffix = expiry_suffix
        self.medium = medium
        # Shared by the threads' connections (dict operations are atomic under the GIL).
        self._down_until: dict[Address, float] = {}
        self._last_warning = 0.0

    def redis_key(self, key: OffloadKey) -> bytes:
        """Return the Redis key block `key` is stored under."""
        return self._key_prefix + key.hex().encode()

    def connections(self) -> Connections:
        """A new set of connections for one thread (sharing the tier's reconnect hold-offs)."""
        return Connections(self._options, self._down_until)

    def store(self, connections: Connections, state: Job) -> None:
        """SET each block of a store job (header, then the row, uncopied)."""
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
            return Outcome.OK if reply == b"OK" else Outcome.FAILED

        outcomes = self.pipeline(connections, keys, parts, read)
        for (key, _block_id), outcome in zip(state.blocks, outcomes):
            if outcome == Outcome.OK:
                state.ok_keys.append(key)
            else:
                state.failed = True

    def load(self, connections: Connections, state: Job) -> None:
        """GET each block of a load job straight into its row, and verify it."""
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
                return Outcome.MISSING
            problem = (
                "wrong size"
                if filled is BulkInto.WRONG_SIZE
                else verify_header(heads[i], key_digest(keys[i]), rows[i])
            )
            if problem is None:
                return Outcome.OK
            self.warn("load", ValueError(f"{keys[i]!r}: {problem}; deleted"))
            damaged.append(keys[i])
            return Outcome.MISSING

        outcomes = self.pipeline(connections, keys, parts, read)
        for (key, _block_id), outcome in zip(state.blocks, outcomes):
            if outcome == Outcome.OK:
                state.ok_keys.append(key)
            else:
                state.failed = True
                if outcome == Outcome.MISSING:
                    state.missing_keys.append(key)
        if damaged:
            # Other engines must not trip over it too; best effort.
            self.pipeline(
                connections,
                damaged,
                lambda i: [encode_command(b"DEL", damaged[i])],
                lambda connection, i: Outcome.OK if isinstance(connection.read_reply(), int) else Outcome.FAILED,
            )

    def exists(self, connections: Connections, keys: Sequence[OffloadKey]) -> list[bool]:
        """Whether the server holds each block (EXISTS, pipelined); unreachable counts as absent.

        Raises:
            Exception: only a bug: failures to connect or read are answers of False.
        """
        redis_keys = [self.redis_key(key) for key in keys]
        outcomes = self.pipeline(connections, redis_keys, lambda i: [encode_command(b"EXISTS", redis_keys[i])], self._read_exists)
        return [outcome == Outcome.OK for outcome in outcomes]

    @staticmethod
    def _read_exists(connection: RespConnection, i: int) -> int | RespError:
        reply = connection.read_reply()
        if isinstance(reply, RespError):
            return reply
        return Outcome.OK if reply == 1 else Outcome.MISSING

    def pipeline(
        self,
        connections: Connections,
        keys: Sequence[bytes],
        parts: Callable[[int], list[bytes | memoryview]],
        read: Callable[[RespConnection, int], int | RespError],
    ) -> list[int]:
        """Send one command per key, pipelined per server, and read the replies.

        `parts(i)` frames key i's command; `read(connection, i)` reads its reply into an
        outcome, or returns the server's error reply. `MOVED` replies are followed (the command
        is sent again to the new owner, at most `_MAX_REDIRECTS` times).

        Returns:
            One `Outcome` per key.
        """
        outcomes = [Outcome.FAILED] * len(keys)
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
                        self.warn("command", RuntimeError(f"{address}: {outcome.message}"))
                        outcome = Outcome.FAILED
                    outcomes[i] = outcome
            if not pending:
                break
        return outcomes

    def _connection_failed(self, connections: Connections, address: Address, exc: Exception) -> None:
        connections.failed(address)
        self._router.refresh(failed=address)
        self.warn(f"connection to {address}", exc)

    def warn(self, operation: str, exc: Exception) -> None:
        # A dead server fails every block: warn at most every few seconds.
        now = time.monotonic()
        level = logging.DEBUG
        if now - self._last_warning >= _WARN_INTERVAL_S:
            self._last_warning = now
            level = logging.WARNING
        logger.log(level, "redis tier %s: %s failed: %s", self.medium, operation, exc)
