"""Where a key lives: the server URL, and for Redis Cluster the slot map.

URLs: `redis://[[user]:password@]host[:port][/db]`, `rediss://...` (TLS), and
`unix://[[user]:password@]/path/to/socket[?db=N]`, as redis-py reads them.

Cluster: a key's slot is CRC16(key) mod 16384 (of the `{hash tag}` if the key has one); the
slot map comes from `CLUSTER SLOTS` on any known node and is refreshed after a `MOVED` reply or a
node failure (at most once per `_REFRESH_INTERVAL_S`), so a failed-over or resharded cluster is
followed without a restart.
"""

from __future__ import annotations

import binascii
import logging
import threading
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from kvref.tiering.redis.resp import Address, ConnectOptions, RespConnection, RespError, encode_command

__all__ = ["ServerUrl", "parse_server_url", "key_slot", "Router", "SLOT_COUNT"]

logger = logging.getLogger(__name__)

SLOT_COUNT = 16384
_DEFAULT_PORT = 6379
_REFRESH_INTERVAL_S = 0.25


@dataclass(frozen=True)
class ServerUrl:
    """A parsed server URL."""

    address: Address
    username: str | None
    password: str | None
    db: int
    tls: bool


def parse_server_url(url: str) -> ServerUrl:
    """Parse a `redis://`, `rediss://` or `unix://` URL.

    Raises:
        ValueError: naming `url`, if the scheme, port or database is invalid.
    """
    if not isinstance(url, str) or not url:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"url must be a non-empty string, got {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"url must start with redis://, rediss:// or unix://, got {url!r}")
    query = parse_qs(parts.query)
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    db_text = query.get("db", [""])[0]
    try:
        if scheme == "unix":
            if not parts.path:
                raise ValueError("no socket path")
            address = Address(path=unquote(parts.path))
        else:
            if not parts.hostname:
                raise ValueError("no host")
            address = Address(parts.hostname, parts.port or _DEFAULT_PORT)
            path_db = parts.path.lstrip("/")
            db_text = path_db or db_text
        db = int(db_text) if db_text else 0
        if db < 0:
            raise ValueError(f"negative database {db}")
    except ValueError as exc:
        raise ValueError(f"url {url!r} is invalid: {exc}") from exc
    return ServerUrl(address, username, password, db, scheme == "rediss")


def key_slot(key: bytes) -> int:
    """Return the cluster slot of `key` (hash tags honoured)."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key, 0) % SLOT_COUNT


class Router:
    """Maps keys to servers: one server, or a Redis Cluster's slot owners.

    Shared by every I/O thread; `route` reads an immutable snapshot of the slot map, `refresh`
    replaces it.

    Args:
        seed: the server of the URL (in cluster mode, the first node asked for the slot map).
        options: how `refresh` connects.
        cluster: route by slot instead of sending everything to `seed`.
    """

    def __init__(self, seed: Address, options: ConnectOptions, *, cluster: bool) -> None:
        self.seed = seed
        self.cluster = cluster
        self._options = options
        self._slots: tuple[Address | None, ...] | None = None
        self._nodes: tuple[Address, ...] = (seed,)
        self._refresh_lock = threading.Lock()
        self._last_refresh = -_REFRESH_INTERVAL_S

    def route(self, redis_key: bytes) -> Address | None:
        """Return the server holding `redis_key`, or None if no known node serves its slot."""
        if not self.cluster:
            return self.seed
        slots = self._slots
        if slots is None:
            self.refresh(first=True)
            slots = self._slots
            if slots is None:
                return None
        return slots[key_slot(redis_key)]

    def moved(self, redis_key: bytes, error: RespError) -> Address | None:
        """Follow a `MOVED <slot> <host>:<port>` reply: update that slot, refresh the rest.

        Returns:
            The new owner, or None if the reply could not be parsed.
        """
        try:
            _kind, _slot, where = error.message.split(" ", 2)
            host, _, port = where.rpartition(":")
            address = Address(host or self.seed.host, int(port))
        except ValueError:
            return None
        slots = self._slots
        if slots is not None:
            updated = list(slots)
            updated[key_slot(redis_key)] = address
            self._slots = tuple(updated)
        self.refresh()
        return address

    def refresh(self, *, failed: Address | None = None, first: bool = False) -> None:
        """Reload the slot map from the first node that answers (rate-limited; never raises).

        Args:
            failed: a node that just failed; asked last.
            first: the map was never loaded: wait for a refresh in progress in another thread
                instead of skipping it.
        """
        if not self.cluster or not self._refresh_lock.acquire(blocking=first):
            return
        try:
            if first and self._slots is not None:
                return  # another thread loaded it meanwhile
            if time.monotonic() - self._last_refresh < _REFRESH_INTERVAL_S:
                return
            self._last_refresh = time.monotonic()
            candidates = [node for node in self._nodes if node != failed]
            if self.seed not in candidates and self.seed != failed:
                candidates.append(self.seed)
            if failed is not None:
                candidates.append(failed)
            for node in candidates:
                slots = self._fetch_slots(node)
                if slots is not None:
                    self._slots = slots
                    self._nodes = tuple(dict.fromkeys(a for a in slots if a is not None)) or (
                        self.seed,
                    )
                    return
            logger.warning("redis cluster: no node answered CLUSTER SLOTS (%s)", candidates)
        finally:
            self._refresh_lock.release()

    def _fetch_slots(self, node: Address) -> tuple[Address | None, ...] | None:
        connection = RespConnection(node, self._options)
        try:
            connection.connect()
            connection.send([encode_command(b"CLUSTER", b"SLOTS")])
            reply = connection.read_reply()
        except OSError as exc:
            logger.debug("redis cluster: CLUSTER SLOTS on %s failed: %s", node, exc)
            return None
        finally:
            connection.close()
        if not isinstance(reply, list):
            logger.warning("redis cluster: CLUSTER SLOTS on %s answered %r", node, reply)
            return None
        slots: list[Address | None] = [None] * SLOT_COUNT
        for entry in reply:
            if not isinstance(entry, list) or len(entry) < 3:
                continue
            start, end, master = entry[0], entry[1], entry[2]
            if not (isinstance(start, int) and isinstance(end, int) and isinstance(master, list)):
                continue
            host, port = master[0], master[1]
            if not isinstance(host, bytes) or not isinstance(port, int):
                continue
            # An empty or unknown endpoint means "the node you asked".
            host_text = host.decode() if host and host != b"?" else node.host
            address = Address(host_text, port)
            for slot in range(max(start, 0), min(end, SLOT_COUNT - 1) + 1):
                slots[slot] = address
        return tuple(slots)
