"""The tiering manager's tier-poll thread (vLLM 0.33: in `tiering/manager.py`).

A tier that answers a counterpart the engine does not drive (a peer engine) sets
`tolerates_off_thread_polling`; its peers' requests should not wait for the next scheduler
step. The thread runs `poll_tiers` every `interval_s`, under the manager's lock, between steps.
A failing round is logged and retried; after `GIVE_UP_AFTER_S` of failures the thread stops and
the tiers are served once per step, as without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["DEFAULT_TIER_POLL_INTERVAL_S", "TierPollThread"]

logger = logging.getLogger(__name__)

DEFAULT_TIER_POLL_INTERVAL_S = 0.001
"""The pause between rounds: how long a peer's request can wait, far below a model step."""
# A round waits this long for the lock, then retries: the thread must notice a stop even
# while a caller holds the lock for long (or leaked it).
_LOCK_TIMEOUT_S = 1.0
_STALL_WARN_S = 30.0
# Counted in time, not rounds: at 1 ms a round budget would end the thread on a passing fault.
GIVE_UP_AFTER_S = 30.0
_ERROR_LOG_INTERVAL_S = 1.0
JOIN_TIMEOUT_S = 5.0


class TierPollThread:
    """Runs `poll` every `interval_s` with `lock` held, until `stop`.

    Args:
        poll: one round (the manager's `poll_tiers`).
        lock: the manager's lock.
        interval_s: the pause between rounds.
        name: the thread's name.
    """

    def __init__(self, poll: Callable[[], None], lock: threading.Lock, interval_s: float, name: str) -> None:
        self._poll = poll
        self._lock = lock
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the thread may still be inside a round."""
        return self._thread is not None

    def stop(self) -> None:
        """Ask the thread to stop and wait up to `JOIN_TIMEOUT_S` for it (`running` says if it did)."""
        self._stopping.set()
        if self._thread is None:
            return
        self._thread.join(timeout=JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            logger.error("KV offload tier-poll thread did not exit within %.1fs", JOIN_TIMEOUT_S)
        else:
            self._thread = None

    def _loop(self) -> None:
        stalled_since: float | None = None
        failing_since: float | None = None
        last_error_log = 0.0
        while not self._stopping.is_set():
            if not self._lock.acquire(timeout=_LOCK_TIMEOUT_S):
                now = time.monotonic()
                if stalled_since is None:
                    stalled_since = now
                elif now - stalled_since > _STALL_WARN_S:
                    logger.warning(
                        "KV offload tier-poll thread has not acquired the manager lock for %.0fs; "
                        "peer requests are only being served at engine-step boundaries.",
                        now - stalled_since,
                    )
                    stalled_since = None
                continue
            stalled_since = None
            try:
                self._poll()
                failing_since = None
            except Exception:
                # A failing round must not end the thread silently; the tiers are still served
                # once per step meanwhile.
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - last_error_log >= _ERROR_LOG_INTERVAL_S:
                    last_error_log = now
                    logger.exception("KV offload tier-poll round failed")
            finally:
                self._lock.release()
            if failing_since is not None and time.monotonic() - failing_since >= GIVE_UP_AFTER_S:
                logger.error(
                    "KV offload tier-poll thread stopping after %.0fs of consecutive failures; "
                    "falling back to per-step servicing.",
                    GIVE_UP_AFTER_S,
                )
                return
            # Python locks are not fair: pausing after the release is what lets the scheduler
            # thread in, so its wait is bounded by one round.
            self._stopping.wait(self._interval_s)
