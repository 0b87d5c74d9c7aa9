"""One vLLM engine's offloading, in a process of its own, driven from a test by messages.

`EngineProcess` starts a process (multiprocessing `spawn`, as vLLM starts its own) that runs
`examples.vllm_engine.Engine`: vLLM 0.33's `TieringOffloadingSpec` ->
`TieringOffloadingManager` over its `CPUPrimaryTierOffloadingManager`, with the secondary tiers
it is given, built by vLLM's factory. The test tells it to open an engine, serve prompts and
settle; every block it loads is checked byte for byte there (`WrongBytes`), and any error in
the process is raised in the test, with its traceback.

Times are `time.monotonic()`, which on Linux is one clock for every process of the host, so a
test can compare when one engine finished storing with when another asked.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import Mapping, Sequence
from multiprocessing.queues import Queue
from typing import Any

__all__ = ["EngineProcess", "EngineProcessError"]

_REPLY_TIMEOUT_S = 120.0


class EngineProcessError(AssertionError):
    """A command failed inside the engine process (the message holds its traceback)."""


def _serve(inbox: Queue[tuple[Any, ...]], outbox: Queue[tuple[str, Any]]) -> None:
    from examples.vllm_engine import Engine, prompt_keys

    engine: Engine | None = None
    while True:
        command, *args = inbox.get()
        try:
            if command == "exit":
                if engine is not None:
                    engine.close()
                outbox.put(("ok", None))
                return
            if command == "open":
                if engine is not None:
                    engine.close()
                tiers, num_chunks, block_bytes = args
                engine = Engine(tiers, num_chunks=num_chunks, block_bytes=block_bytes)
                outbox.put(("ok", None))
                continue
            assert engine is not None, "no engine open"
            if command == "serve":
                prompts, start_at = args
                time.sleep(max(0.0, start_at - time.monotonic()))
                hits: list[tuple[int, float]] = []
                for prompt, count in prompts:
                    started = time.monotonic()
                    hits.append((engine.serve(f"{prompt}-{started}", prompt_keys(prompt, count)), started))
                    engine.settle()  # no store still pins a CPU block when the next prompt needs it
                outbox.put(("ok", hits))
            elif command == "settle":
                engine.settle()
                outbox.put(("ok", time.monotonic()))
            else:
                raise ValueError(f"unknown command {command!r}")
        except BaseException:
            outbox.put(("error", traceback.format_exc()))


class EngineProcess:
    """A process holding one engine at a time (see the module docstring).

    Args:
        name: names the process in errors.
    """

    def __init__(self, name: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.name = name
        self._inbox: Queue[tuple[Any, ...]] = context.Queue()
        self._outbox: Queue[tuple[str, Any]] = context.Queue()
        self._process = context.Process(target=_serve, args=(self._inbox, self._outbox), name=name, daemon=True)
        self._stopping = False
        self._process.start()

    def _ask(self, *message: Any) -> Any:
        self._inbox.put(message)
        return self.reply()

    def send(self, *message: Any) -> None:
        """Send a command without waiting for its answer (collect it with `reply`)."""
        self._inbox.put(message)

    def reply(self) -> Any:
        status, value = self._outbox.get(timeout=_REPLY_TIMEOUT_S)
        if status == "error":
            raise EngineProcessError(f"engine process {self.name}: {value}")
        return value

    def open(self, tiers: Sequence[Mapping[str, Any]], *, num_chunks: int, block_bytes: int) -> None:
        """Open an engine with these secondary tiers (closing the one before)."""
        self._ask("open", [dict(tier) for tier in tiers], num_chunks, block_bytes)

    def serve(self, prompts: Sequence[tuple[str, int]], start_at: float = 0.0) -> list[tuple[int, float]]:
        """Serve each (prompt, blocks) in turn from `start_at` on, letting its transfers finish
        before the next; return (hits, when asked) for each."""
        return self._ask("serve", list(prompts), start_at)

    def settle(self) -> float:
        """Step until no transfer is in flight; return when that was (every store reported)."""
        return self._ask("settle")

    def stop(self) -> None:
        """Tell the process to close its engine and exit (`close` waits for it)."""
        if not self._stopping:
            self._stopping = True
            self._inbox.put(("exit",))

    def kill(self) -> None:
        """End the process with SIGKILL, wherever it is (as an OOM kill would), and wait for it."""
        assert self._process.pid is not None
        os.kill(self._process.pid, signal.SIGKILL)
        self._process.join()
        self._stopping = True

    def close(self) -> None:
        """Stop the process and wait for it (killed if it does not exit in 30 s)."""
        if self._process.exitcode is not None:
            return  # killed, or ended already
        self.stop()
        try:
            self.reply()
        finally:
            self._process.join(timeout=30)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
