"""Throw-away Redis servers for tests, examples and benchmarks (needs `redis-server` on PATH).

`LocalRedisServer` runs one `redis-server` on a free loopback port with its own temporary
directory and no persistence; `LocalRedisCluster` runs several in cluster mode, splits the slots
between them and waits until every node agrees. Processes are stopped by their pid only.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from typing_extensions import Self

from kvref.tiering.redis.resp import Address, ConnectOptions, RespConnection, RespError, Reply, encode_command
from kvref.tiering.redis.routing import SLOT_COUNT

__all__ = ["redis_server_path", "LocalRedisServer", "LocalRedisCluster"]

_START_TIMEOUT_S = 10.0
_CLUSTER_TIMEOUT_S = 20.0


def redis_server_path() -> str | None:
    """Return the `redis-server` executable, or None if it is not installed."""
    return shutil.which("redis-server")


def _free_port(*, with_bus: bool = False) -> int:
    """A loopback port free now (and, for cluster nodes, its bus port `port + 10000` too)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        if not with_bus:
            return port
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class LocalRedisServer:
    """One `redis-server` process on 127.0.0.1.

    Args:
        args: extra server arguments, e.g. `["--maxmemory", "8mb"]`.
        cluster: start it in cluster mode (see `LocalRedisCluster`).

    Raises:
        FileNotFoundError: `redis-server` is not installed.
    """

    def __init__(self, args: Sequence[str] = (), *, cluster: bool = False) -> None:
        executable = redis_server_path()
        if executable is None:
            raise FileNotFoundError("redis-server is not installed (Debian: apt-get install redis-server)")
        self._executable = executable
        self._args = list(args)
        self._cluster = cluster
        self.port = _free_port(with_bus=cluster)
        self.directory = Path(tempfile.mkdtemp(prefix="kvref-redis-"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> Address:
        """The server's address."""
        return Address("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        """`redis://127.0.0.1:<port>`."""
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self._process.pid if self._process is not None else None

    def start(self) -> Self:
        """Start the server (on the same port as before, if restarted) and wait until it answers.

        Raises:
            RuntimeError: it did not answer within a few seconds (its log is in the message).
        """
        command = [
            self._executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "no",
            "--logfile", "redis.log",
        ]  # fmt: skip
        if self._cluster:
            command += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "1000",
                "--cluster-require-full-coverage", "no",
            ]  # fmt: skip
        command += self._args
        self._process = subprocess.Popen(
            command, cwd=self.directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                reply = self.command(b"PING")
                if reply == b"PONG" or isinstance(reply, RespError):  # NOAUTH: up, needs AUTH
                    return self
            except OSError:
                time.sleep(0.02)
        log = self.log()
        self.kill()
        raise RuntimeError(f"redis-server on port {self.port} did not start:\n{log}")

    def log(self) -> str:
        """The server's log so far."""
        try:
            return (self.directory / "redis.log").read_text(errors="replace")
        except OSError:
            return ""

    def command(self, *args: bytes | str, timeout_s: float = 2.0) -> Reply:
        """Run one command on a fresh connection and return its reply.

        Raises:
            OSError: the server is unreachable.
        """
        connection = RespConnection(self.address, ConnectOptions(timeout_s, timeout_s))
        try:
            connection.connect()
            connection.send([encode_command(*(a.encode() if isinstance(a, str) else a for a in args))])
            return connection.read_reply()
        finally:
            connection.close()

    def kill(self) -> None:
        """SIGKILL the server (its data is lost: nothing is persisted) and reap it."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        if process is not None:
            process.wait()

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing answers (a hung server)."""
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server and delete its directory."""
        self.resume()
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class LocalRedisCluster:
    """A Redis Cluster of `num_nodes` masters (no replicas) on 127.0.0.1.

    Nodes run with `cluster-require-full-coverage no`, so a dead node's slots fail while the
    others keep serving theirs.

    Args:
        num_nodes: how many masters; the slots are split evenly in node order.
        args: extra arguments for every node.
    """

    def __init__(self, num_nodes: int = 3, args: Sequence[str] = ()) -> None:
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
        self.nodes = [LocalRedisServer(args, cluster=True) for _ in range(num_nodes)]

    @property
    def url(self) -> str:
        """The first node's URL (a seed: the client finds the others)."""
        return self.nodes[0].url

    def start(self) -> Self:
        """Start the nodes, assign the slots, join them, and wait until all report "ok".

        Raises:
            RuntimeError: the cluster did not form within `_CLUSTER_TIMEOUT_S`.
        """
        try:
            for node in self.nodes:
                node.start()
            share = SLOT_COUNT // len(self.nodes)
            for index, node in enumerate(self.nodes):
                first = index * share
                last = SLOT_COUNT - 1 if index == len(self.nodes) - 1 else first + share - 1
                self._check(node.command("CLUSTER", "ADDSLOTSRANGE", str(first), str(last)))
            for node in self.nodes[1:]:
                self._check(self.nodes[0].command("CLUSTER", "MEET", "127.0.0.1", str(node.port)))
            self._wait_until_formed()
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _check(reply: Reply) -> None:
        if isinstance(reply, RespError):
            raise RuntimeError(f"cluster setup failed: {reply.message}")

    def _wait_until_formed(self) -> None:
        deadline = time.monotonic() + _CLUSTER_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(self._node_sees_everything(node) for node in self.nodes):
                return
            time.sleep(0.05)
        raise RuntimeError("the cluster did not form in time")

    def _node_sees_everything(self, node: LocalRedisServer) -> bool:
        info = node.command("CLUSTER", "INFO")
        slots = node.command("CLUSTER", "SLOTS")
        if not isinstance(info, bytes) or b"cluster_state:ok" not in info:
            return False
        return isinstance(slots, list) and len(slots) == len(self.nodes)

    def node_of(self, redis_key: bytes) -> LocalRedisServer:
        """The node whose slot range holds `redis_key`."""
        from kvref.tiering.redis.routing import key_slot

        share = SLOT_COUNT // len(self.nodes)
        return self.nodes[min(key_slot(redis_key) // share, len(self.nodes) - 1)]

    def stop(self) -> None:
        """Stop every node and delete their directories."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
