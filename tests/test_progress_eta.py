"""The launch's ETA is a rolling estimate that moves (issue #40: it sat at ~150 s for 15 minutes).

:class:`RollingEta` is fed synthetic finish times; the progress lines are driven with a test clock.
"""

from __future__ import annotations

import time

import pytest

from orchestrator.cli.progress import RollingEta, UnitProgress


def _eta(eta: RollingEta, now: float) -> float:
    value = eta.eta(now)
    assert value is not None
    return value


def _feed(eta: RollingEta, start: float, n: int, every_s: float) -> float:
    t = start
    for _ in range(n):
        t += every_s
        eta.finished(t)
    return t


def test_a_steady_rate_gives_the_time_left() -> None:
    eta = RollingEta(100, 0.0, window=10)
    assert eta.eta(5.0) is None and eta.rate(5.0) == 0.0  # nothing finished: no estimate
    t = _feed(eta, 0.0, 40, 2.0)
    assert eta.rate(t) == pytest.approx(0.5)
    assert eta.eta(t) == pytest.approx(60 * 2.0)
    _feed(eta, t, 60, 2.0)
    assert eta.eta(200.0) == 0.0


def test_the_eta_follows_a_slowdown_where_a_rate_since_the_start_does_not() -> None:
    """50 units at 1 s each, then units of 10 s (larger K): within a window the estimate is the slow
    rate; the average since the start would still promise most of the early speed."""
    total = 200
    eta = RollingEta(total, 0.0, window=20)
    t = _feed(eta, 0.0, 50, 1.0)
    before = eta.eta(t)
    assert before == pytest.approx(150.0)
    t = _feed(eta, t, 30, 10.0)  # 80 done, 120 left at 10 s each
    after = _eta(eta, t)
    assert after == pytest.approx(120 * 10.0)
    since_start = (total - 80) / (80 / t)
    assert since_start < 0.5 * after  # the old estimate: 120 units / (80 units / 350 s) = 525 s
    # ... and it comes back down when units speed up again.
    t = _feed(eta, t, 40, 0.5)
    assert eta.eta(t) == pytest.approx(80 * 0.5)


def test_the_eta_grows_while_nothing_finishes() -> None:
    eta = RollingEta(100, 0.0, window=10)
    t = _feed(eta, 0.0, 20, 1.0)
    at_finish = _eta(eta, t)
    assert at_finish == pytest.approx(80.0)
    later = [_eta(eta, t + gap) for gap in (5.0, 30.0, 120.0)]
    assert later == sorted(later) and later[0] > at_finish  # it moves with the clock, upward
    assert later[-1] == pytest.approx(80 * (10 + 120) / 10)


def test_units_that_finish_together_count_together() -> None:
    """A batch of 8 units every 8 s is a rate of 1 unit/s, however the window falls on the batches."""
    eta = RollingEta(400, 0.0, window=20)
    t = 0.0
    for _ in range(20):
        t += 8.0
        for _ in range(8):
            eta.finished(t)
    assert eta.done == 160
    assert eta.rate(t) == pytest.approx(1.0)
    assert eta.eta(t) == pytest.approx(240.0)


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Unit:
    def describe(self) -> str:
        return "kdepth int8 k=32"


def _etas(err: str) -> list[str]:
    return [line.rsplit("ETA ", 1)[1] for line in err.splitlines() if " units done, " in line]


def test_progress_lines_show_the_rolling_eta_and_a_line_while_nothing_finishes(capsys: pytest.CaptureFixture[str]) -> None:
    clock = _Clock()
    progress = UnitProgress("sweep s", clock=clock, seconds=10.0)
    progress("start", {"total": 400, "skipped": 0, "pending": 400})
    for _ in range(40):  # fast units: a line every 40
        clock.t += 0.5
        progress("unit", {"unit": _Unit(), "result": {"status": "ok"}})
    for _ in range(40):  # slow ones: a line at least every 10 s
        clock.t += 10.0
        progress("unit", {"unit": _Unit(), "result": {"status": "ok"}})
    first = _etas(capsys.readouterr().err)
    assert first[0] == "3 min" and first[-1] == "53 min"  # 360 x 0.5 s, then 320 x 10 s
    clock.t += 25.0  # a stall: the timer's line says the estimate grew
    progress.tick()
    stalled = capsys.readouterr().err
    assert "80/400 units done" in stalled and _etas(stalled) == ["57 min"]  # 320 / (40 units / 425 s)
    progress.tick()  # within `seconds` of the last line: nothing
    assert capsys.readouterr().err == ""
    progress("end", {})
    clock.t += 60.0
    progress.tick()  # after the end: nothing
    assert capsys.readouterr().err == ""


def test_the_timer_prints_with_the_real_clock_and_stops(capsys: pytest.CaptureFixture[str]) -> None:
    progress = UnitProgress("sweep s", seconds=0.5)
    assert progress.ticking
    progress("start", {"total": 3, "skipped": 0, "pending": 3})
    time.sleep(2.6)
    progress.stop()
    lines = [line for line in capsys.readouterr().err.splitlines() if " units done, " in line]
    assert 1 <= len(lines) <= 3 and lines[0] == "sweep s: 0/3 units done, 0 failed, 0.00 units/s, ETA ?"
    time.sleep(1.2)
    assert capsys.readouterr().err == ""  # stopped: no more lines
