"""A minimal RESP2 connection that sends memoryviews and reads GET replies into them, uncopied.

redis-py builds each command as bytes (its packers copy a large memoryview argument into a new
bytes object) and returns a GET reply as a new bytes object, so a block crosses memory twice
more per direction than the socket needs. This connection frames commands itself: a command's
small parts (the RESP framing, the key, the value header) are joined, and the block's
memoryview is handed to `sendmsg` as its own buffer; a bulk reply is read with `recv_into`
straight into the destination row, after whatever part of it is already buffered.

Any failure (refused, reset, timed out, a malformed reply) raises `OSError` and leaves the
connection closed: a pipeline that broke midway cannot be resumed, so callers fail what it
carried and the next use reconnects.
"""

from __future__ import annotations

import enum
import select
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from typing_extensions import override

if TYPE_CHECKING:
    import ssl

__all__ = [
    "Address",
    "ConnectOptions",
    "RespError",
    "RespConnection",
    "Reply",
    "BulkInto",
    "encode_command",
]

_IOV_MAX = 1024
_READ_CHUNK = 256 << 10
_CRLF = b"\r\n"


@dataclass(frozen=True)
class Address:
    """Where a server listens: `host` and `port`, or a Unix socket `path` (host and port unused)."""

    host: str = ""
    port: int = 0
    path: str | None = None

    @override
    def __str__(self) -> str:
        return self.path if self.path is not None else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ConnectOptions:
    """How to open and authenticate a connection.

    Attributes:
        connect_timeout_s: bound on establishing the connection (TCP/TLS handshake, AUTH).
        socket_timeout_s: bound on each send or receive that makes no progress.
        username: ACL user for AUTH (None: the default user).
        password: AUTH password (None: no AUTH).
        db: SELECT this database after connecting (standalone servers only).
        tls: a TLS context for `rediss://`, or None for plain TCP / Unix sockets.
    """

    connect_timeout_s: float = 1.0
    socket_timeout_s: float = 1.0
    username: str | None = None
    password: str | None = None
    db: int = 0
    tls: ssl.SSLContext | None = None


class RespError:
    """An error reply (`-ERR ...`, `-MOVED ...`, `-OOM ...`): a value, not an exception."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    @property
    def kind(self) -> str:
        """The error's first word, e.g. "MOVED", "OOM", "ERR"."""
        return self.message.split(" ", 1)[0]

    @override
    def __repr__(self) -> str:
        return f"RespError({self.message!r})"


Reply = bytes | int | None | RespError | list["Reply"]
"""A decoded RESP2 reply: simple and bulk strings are bytes, a nil is None."""


class BulkInto(enum.Enum):
    """Outcome of `read_bulk_into` (besides a `RespError`)."""

    FILLED = "filled"
    NIL = "nil"
    WRONG_SIZE = "wrong size"


def _length_prefix(marker: bytes, length: int) -> bytes:
    return marker + str(length).encode() + _CRLF


def encode_command(*args: bytes) -> bytes:
    """Frame a command whose arguments are all small byte strings."""
    parts = [_length_prefix(b"*", len(args))]
    for arg in args:
        parts += (_length_prefix(b"$", len(arg)), arg, _CRLF)
    return b"".join(parts)


class RespConnection:
    """One connection to one server, used by one thread at a time.

    Args:
        address: the server.
        options: timeouts, credentials, database and TLS.
    """

    def __init__(self, address: Address, options: ConnectOptions) -> None:
        self.address = address
        self._options = options
        self._sock: socket.socket | None = None
        self._buf = bytearray(_READ_CHUNK)
        self._view = memoryview(self._buf)
        self._start: int = 0
        self._end: int = 0

    @property
    def connected(self) -> bool:
        """True between a successful `connect` and the next failure or `close`."""
        return self._sock is not None

    def idle_and_healthy(self) -> bool:
        """Between pipelines: is the connection open with nothing unread (not closed by the peer)?

        A server that restarted closed its end; sending on the stale socket would fail a job
        that a fresh connection serves. Closes the connection when the answer is no.
        """
        sock = self._sock
        if sock is None:
            return False
        if self._options.tls is not None or self._start != self._end:
            healthy = self._start == self._end
        else:
            # Readable while idle means closed by the peer, or bytes nobody asked for. (A recv
            # with MSG_DONTWAIT would still wait for the socket timeout in Python.)
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            healthy = not poller.poll(0)
        if not healthy:
            self.close()
        return healthy

    def connect(self) -> None:
        """Open the connection and authenticate (a no-op when connected).

        Raises:
            OSError: the server is unreachable, refused AUTH/SELECT, or did not answer in time.
        """
        if self._sock is not None:
            return
        options = self._options
        if self.address.path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(options.connect_timeout_s)
            try:
                sock.connect(self.address.path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection(
                (self.address.host, self.address.port), timeout=options.connect_timeout_s
            )
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                if options.tls is not None:
                    sock = options.tls.wrap_socket(sock, server_hostname=self.address.host)
            except BaseException:
                sock.close()
                raise
        self._sock = sock
        self._start = self._end = 0
        try:
            handshake: list[bytes] = []
            if options.password is not None:
                credentials = [options.password.encode()]
                if options.username is not None:
                    credentials.insert(0, options.username.encode())
                handshake.append(encode_command(b"AUTH", *credentials))
            if options.db:
                handshake.append(encode_command(b"SELECT", str(options.db).encode()))
            if handshake:
                self.send(handshake)
                for _ in handshake:
                    reply = self.read_reply()
                    if isinstance(reply, RespError):
                        raise ConnectionRefusedError(f"{self.address}: {reply.message}")
            sock.settimeout(options.socket_timeout_s)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the socket; buffered input is dropped."""
        sock, self._sock = self._sock, None
        self._start = self._end = 0
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _require(self) -> socket.socket:
        if self._sock is None:
            raise ConnectionResetError(f"{self.address}: not connected")
        return self._sock

    # --- sending ---

    def send(self, parts: Sequence[bytes | memoryview]) -> None:
        """Send `parts` back to back, each one as is (no joined copy of large buffers).

        Raises:
            OSError: the connection failed (it is closed).
        """
        sock = self._require()
        try:
            if self._options.tls is not None:
                # TLS encrypts into its own buffers anyway, and SSLSocket has no sendmsg.
                for part in parts:
                    sock.sendall(part)
                return
            buffers = [memoryview(part).cast("B") for part in parts if len(part)]
            index = 0
            while index < len(buffers):
                sent = sock.sendmsg(buffers[index : index + _IOV_MAX])
                while index < len(buffers) and sent >= len(buffers[index]):
                    sent -= len(buffers[index])
                    index += 1
                if sent:
                    buffers[index] = buffers[index][sent:]
        except BaseException:
            self.close()
            raise

    # --- receiving ---

    def _fill(self) -> None:
        """Receive more bytes into the buffer (compacting it first)."""
        sock = self._require()
        if self._start:
            pending = self._end - self._start
            self._buf[:pending] = self._buf[self._start : self._end]
            self._start, self._end = 0, pending
        if self._end == len(self._buf):
            self._buf.extend(bytes(len(self._buf)))  # a line longer than the buffer
            self._view.release()
            self._view = memoryview(self._buf)
        count = sock.recv_into(self._view[self._end :])
        if count == 0:
            raise ConnectionResetError(f"{self.address}: connection closed by the server")
        self._end += count

    def _read_line(self) -> bytes:
        while True:
            at = self._buf.find(_CRLF, self._start, self._end)
            if at >= 0:
                line = bytes(self._buf[self._start : at])
                self._start = at + 2
                return line
            self._fill()

    def _read_exact_into(self, dest: memoryview) -> None:
        """Fill `dest`: first from the buffer, then straight from the socket."""
        buffered = min(self._end - self._start, len(dest))
        if buffered:
            dest[:buffered] = self._view[self._start : self._start + buffered]
            self._start += buffered
        filled = buffered
        if filled == len(dest):
            return
        sock = self._require()
        while filled < len(dest):
            count = sock.recv_into(dest[filled:])
            if count == 0:
                raise ConnectionResetError(f"{self.address}: connection closed mid-reply")
            filled += count

    def _skip(self, count: int) -> None:
        while count:
            if self._start == self._end:
                self._fill()
            step = min(count, self._end - self._start)
            self._start += step
            count -= step

    def _expect_crlf(self) -> None:
        crlf = bytearray(2)
        self._read_exact_into(memoryview(crlf))
        if bytes(crlf) != _CRLF:
            raise ConnectionAbortedError(f"{self.address}: malformed reply (no CRLF after data)")

    def read_reply(self) -> Reply:
        """Read one reply.

        Raises:
            OSError: the connection failed or the reply is malformed (the connection is closed).
        """
        try:
            return self._read_reply()
        except BaseException:
            self.close()
            raise

    def _read_reply(self) -> Reply:
        line = self._read_line()
        if not line:
            raise ConnectionAbortedError(f"{self.address}: malformed reply (empty line)")
        marker, rest = line[:1], line[1:]
        try:
            if marker == b"+":
                return rest
            if marker == b"-":
                return RespError(rest.decode(errors="replace"))
            if marker == b":":
                return int(rest)
            if marker == b"$":
                length = int(rest)
                if length < 0:
                    return None
                data = bytearray(length)
                self._read_exact_into(memoryview(data))
                self._expect_crlf()
                return bytes(data)
            if marker == b"*":
                count = int(rest)
                if count < 0:
                    return None
                return [self._read_reply() for _ in range(count)]
        except ValueError as exc:
            raise ConnectionAbortedError(f"{self.address}: malformed reply {line!r}") from exc
        raise ConnectionAbortedError(f"{self.address}: unsupported reply type {line[:16]!r}")

    def read_bulk_into(self, head: memoryview, body: memoryview) -> BulkInto | RespError:
        """Read one bulk-string reply of exactly `len(head) + len(body)` bytes into them.

        A reply of any other size is consumed and discarded (the buffers' contents are then
        unspecified).

        Returns:
            `BulkInto.FILLED`, `BulkInto.NIL` (no such key), `BulkInto.WRONG_SIZE`, or the
            server's error reply.

        Raises:
            OSError: the connection failed or the reply is malformed (the connection is closed).
        """
        try:
            line = self._read_line()
            marker = line[:1]
            if marker == b"-":
                return RespError(line[1:].decode(errors="replace"))
            if marker != b"$":
                raise ConnectionAbortedError(f"{self.address}: expected a bulk reply, got {line!r}")
            try:
                length = int(line[1:])
            except ValueError as exc:
                raise ConnectionAbortedError(f"{self.address}: malformed reply {line!r}") from exc
            if length < 0:
                return BulkInto.NIL
            if length != len(head) + len(body):
                self._skip(length + 2)
                return BulkInto.WRONG_SIZE
            self._read_exact_into(head)
            self._read_exact_into(body)
            self._expect_crlf()
            return BulkInto.FILLED
        except BaseException:
            self.close()
            raise
