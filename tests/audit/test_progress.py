"""The progress bar: only for people at a terminal, only after a second, erased when done."""

from __future__ import annotations

import io

import pytest
from typing_extensions import override

from kvref.audit.runner.progress import ProgressBar, progress_enabled


class Terminal(io.StringIO):
    @override
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("stream", "output_format", "environ", "enabled"),
    [
        pytest.param(Terminal(), "text", {}, True, id="terminal text"),
        pytest.param(io.StringIO(), "text", {}, False, id="piped"),
        pytest.param(Terminal(), "json", {}, False, id="json"),
        pytest.param(Terminal(), "sarif", {}, False, id="sarif"),
        pytest.param(Terminal(), "github", {}, False, id="github"),
        pytest.param(Terminal(), "text", {"CI": "true"}, False, id="CI"),
        pytest.param(Terminal(), "text", {"CI": "1"}, False, id="CI=1"),
        pytest.param(Terminal(), "text", {"CI": "false"}, True, id="CI=false"),
        pytest.param(Terminal(), "text", {"TERM": "dumb"}, False, id="dumb terminal"),
    ],
)
def test_when_the_bar_is_shown(
    stream: io.StringIO, output_format: str, environ: dict[str, str], enabled: bool
) -> None:
    assert progress_enabled(stream, output_format=output_format, environ=environ) is enabled


def test_nothing_is_drawn_during_the_first_second() -> None:
    stream, clock = Terminal(), Clock()
    bar = ProgressBar(10, stream, clock=clock)
    bar.advance(9)
    clock.now += 0.5
    bar.advance(1)
    bar.close()
    assert stream.getvalue() == ""


def test_slow_run_draws_then_erases_itself() -> None:
    stream, clock = Terminal(), Clock()
    with ProgressBar(4, stream, clock=clock, width=4) as bar:
        clock.now += 1.5
        bar.advance(2)
        assert stream.getvalue() == "\r[##--] 2/4 files"
        clock.now += 0.01
        bar.advance(1)  # throttled: less than 0.1 s since the last draw
        assert stream.getvalue() == "\r[##--] 2/4 files"
        bar.advance(1)  # the last unit is always drawn
        assert stream.getvalue().endswith("\r[####] 4/4 files")
        assert bar.visible
    assert stream.getvalue().endswith("\r" + " " * 16 + "\r")
    assert not bar.visible


def test_counts_never_exceed_the_total() -> None:
    stream, clock = Terminal(), Clock()
    bar = ProgressBar(3, stream, clock=clock, width=3)
    clock.now += 2
    bar.advance(10)
    assert bar.done == 3
    assert stream.getvalue() == "\r[###] 3/3 files"


def test_negative_total_is_rejected() -> None:
    with pytest.raises(ValueError, match="total must be >= 0"):
        ProgressBar(-1, io.StringIO())
