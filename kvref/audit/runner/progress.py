"""A progress bar on stderr for audits long enough to wonder about (over a second).

Shown only when stderr is a terminal, the output format is for humans (`text`), and neither
`CI` nor `TERM=dumb` says otherwise; it draws nothing during its first second, so a warm
pre-commit run never flickers, and it erases itself when done so the summary starts on a
clean line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TextIO

__all__ = ["ProgressBar", "progress_enabled"]

_MACHINE_FORMATS = frozenset({"json", "sarif", "github"})
_FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


def progress_enabled(
    stream: TextIO, *, output_format: str = "text", environ: Mapping[str, str] | None = None
) -> bool:
    """Whether a progress bar may be drawn on `stream`.

    Args:
        stream: where the bar would go (stderr).
        output_format: the audit's output format; machine formats never get a bar.
        environ: the environment (default `os.environ`).

    Returns:
        True only for a terminal, a human format, outside CI and not on a dumb terminal.
    """
    env = os.environ if environ is None else environ
    if output_format in _MACHINE_FORMATS:
        return False
    if env.get("CI", "").strip().lower() not in _FALSE_WORDS:
        return False
    if env.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


class ProgressBar:
    """`[#####-----] 1234/2991 files` redrawn in place at most ten times a second.

    Args:
        total: the number of units of work.
        stream: where to draw (a terminal).
        label: the word after the counts.
        delay_s: nothing is drawn before this much time has passed since creation.
        clock: monotonic seconds (injectable for tests).
        width: characters of the bar itself.
    """

    def __init__(
        self,
        total: int,
        stream: TextIO,
        *,
        label: str = "files",
        delay_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        width: int = 30,
    ) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = total
        self.done = 0
        self._stream = stream
        self._label = label
        self._clock = clock
        self._started = clock()
        self._delay_s = delay_s
        self._width = width
        self._last_draw = float("-inf")
        self._drawn_length = 0

    @property
    def visible(self) -> bool:
        """Whether the bar has been drawn and not yet erased."""
        return self._drawn_length > 0

    def advance(self, count: int = 1) -> None:
        """Record `count` more finished units and redraw if due."""
        self.done = min(self.total, self.done + count)
        now = self._clock()
        if now - self._started < self._delay_s:
            return
        if now - self._last_draw < 0.1 and self.done < self.total:
            return
        self._last_draw = now
        self._draw()

    def _draw(self) -> None:
        filled = self._width * self.done // self.total if self.total else self._width
        text = (
            f"[{'#' * filled}{'-' * (self._width - filled)}] "
            f"{self.done}/{self.total} {self._label}"
        )
        padding = " " * max(0, self._drawn_length - len(text))
        self._stream.write(f"\r{text}{padding}")
        self._stream.flush()
        self._drawn_length = len(text)

    def close(self) -> None:
        """Erase the bar (if it was drawn), leaving the cursor at the start of the line."""
        if self._drawn_length:
            self._stream.write("\r" + " " * self._drawn_length + "\r")
            self._stream.flush()
            self._drawn_length = 0

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
