"""The progress of a launch's units on stderr (``on_event`` of ``orchestrator.runner.launch``)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rich.markup import escape

from orchestrator.cli import common
from orchestrator.cli.common import err, note, plural, real_console


class RollingEta:
    """The time left in a launch, from the rate of the units that finished last, not since the start.

    The rate is the last ``window`` finished units over the time from the finish just before them (or
    the start) to *now*: right after a finish it is the recent throughput (every parallel slot counted,
    since units finish from all of them); while nothing finishes it falls, so the ETA grows instead of
    standing still. Units that finish together (a batch) count together. A sweep whose later units are
    slower (larger K) is estimated from the slow ones within ``window`` units, where a rate since the
    start kept showing the early ones' speed (issue #40: an ETA that sat at ~150 s for 15 minutes).
    """

    def __init__(self, total: int, started: float, window: int = 20) -> None:
        self.total, self.started, self.window = total, started, max(1, window)
        self.done = 0
        self._marks: deque[tuple[float, int]] = deque([(started, 0)])  # (time, units done by then)

    def finished(self, at: float, n: int = 1) -> None:
        """``n`` more units finished at time ``at``."""
        self.done += n
        if self._marks[-1][0] == at:
            self._marks.pop()  # several units at one instant: one mark
        self._marks.append((at, self.done))
        # Keep the newest mark with at least ``window`` units after it, as the window's start.
        while len(self._marks) > 2 and self.done - self._marks[1][1] >= self.window:
            self._marks.popleft()

    def rate(self, now: float) -> float:
        """Units per second over the window, up to ``now``; 0.0 before the first finish."""
        since, base = self._marks[0]
        if self.done == base:
            return 0.0
        return (self.done - base) / max(now - since, 1e-9)

    def eta(self, now: float) -> float | None:
        """Seconds left at ``now``; None until a unit has finished."""
        if self.done >= self.total:
            return 0.0
        rate = self.rate(now)
        return (self.total - self.done) / rate if rate > 0 else None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class UnitProgress:
    """``on_event`` for ``orchestrator.runner.launch``: the progress of a sweep's units on stderr.

    On a terminal a bar with the ETA; anywhere else (CI, cron, a log file) a plain line every ``every``
    units (a tenth of them) or every ``seconds``, whichever comes first -- also while no unit finishes
    (a timer, with the real clock) -- and one at the end: done/total, failed, rate and ETA, both from
    :class:`RollingEta`. A failed unit is always one line (it is an error); the rest is off under -q.
    While Ray starts, its lines (``orchestrator.cluster.report_waits``) come here as notes.
    """

    def __init__(self, label: str, *, enabled: bool = True, seconds: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, ticking: bool | None = None) -> None:
        from orchestrator.cluster import report_waits

        self.label, self.seconds, self.clock = label, seconds, clock
        self.enabled = enabled and common.verbosity > common.QUIET
        self.total = self.done = self.failed = 0
        self.every = 1
        self.started = self.last = 0.0
        self.bar: Any = None
        self.eta = RollingEta(0, 0.0)
        # A line as time passes needs the real clock; a test's clock moves only when it says so.
        self.ticking = clock is time.monotonic if ticking is None else ticking
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        report_waits(note)

    def line(self) -> str:
        now = self.clock()
        return (f"{self.label}: {self.done}/{plural(self.total, 'unit')} done, {self.failed} failed, "
                f"{self.eta.rate(now):.2f} units/s, ETA {_duration(self.eta.eta(now))}")

    def tick(self) -> None:
        """A line if none was printed for ``seconds`` (the timer calls it while units run)."""
        with self._lock:
            if not self._stop.is_set() and self.bar is None and self.enabled and self.done < self.total and self.clock() - self.last >= self.seconds:
                self.last = self.clock()
                err.print(self.line(), highlight=False, markup=False)

    def _tick_until_stopped(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()

    def __call__(self, kind: str, info: dict[str, Any]) -> None:
        with self._lock:
            self._event(kind, info)

    def _event(self, kind: str, info: dict[str, Any]) -> None:
        if kind == "cluster":
            if not info["embedded"]:
                note(str(info["line"]))
        elif kind == "start":
            reused = " (the plan reused from the plan cache)" if info.get("plan") == "cache" else ""
            note(f"{self.label}: {plural(info['total'], 'unit')}, {info['skipped']} already done, {info['pending']} to run{reused}")
            self.total, self.started = info["pending"], self.clock()
            self.last, self.every = self.started, max(1, self.total // 10)
            # A window of a tenth of the units (20 to 200): recent enough to follow a change of pace,
            # long enough that a batch's worth of units finishing together does not swing it.
            self.eta = RollingEta(self.total, self.started, window=min(200, max(20, self.total // 10)))
            if self.enabled and self.total and err.is_terminal:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    ProgressColumn,
                    TextColumn,
                    TimeElapsedColumn,
                )
                from rich.text import Text

                progress = self

                class EtaColumn(ProgressColumn):
                    max_refresh = 1.0

                    def render(self, task: Any) -> Text:
                        return Text(f"ETA {_duration(progress.eta.eta(progress.clock()))}")

                self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                    TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(), EtaColumn(),
                                    console=real_console(err))
                self.bar.start()
                self.bar.add_task(self.label, total=self.total, failed=0)
            elif self.enabled and self.total and self.ticking and self._ticker is None:
                self._ticker = threading.Thread(target=self._tick_until_stopped, name="swapcheck-progress", daemon=True)
                self._ticker.start()
        elif kind == "unit":
            self.done += 1
            self.eta.finished(self.clock())
            result = info["result"]
            if result["status"] != "ok":
                self.failed += 1
                first = (result.get("error") or "").splitlines()[:1]
                err.print(f"[red]failed[/] {escape(info['unit'].describe())}: {escape(first[0] if first else '')}",
                          highlight=False)
            if self.bar is not None:
                self.bar.update(self.bar.task_ids[0], advance=1, failed=self.failed)
            elif self.enabled and (self.done % self.every == 0 or self.done == self.total
                                   or self.clock() - self.last >= self.seconds):
                self.last = self.clock()
                err.print(self.line(), highlight=False, markup=False)
        elif kind == "stopping":
            self._halt()
            again = " (SIGINT/SIGTERM again: stop waiting)" if info["why"].startswith("SIG") else ""
            note(f"{info['why']}: stopping; cancelled {plural(info['in_flight'], 'unit')} in flight, waiting up to "
                 f"{info['grace_s']:g} s for them to settle{again}")
        elif kind == "message":  # a damaged ledger file, rebuilt ledger rows (orchestrator.runner.launch)
            if info["level"] == "warning":
                err.print(f"[bold yellow]warning:[/] {escape(info['line'])}", highlight=False)
            else:
                note(info["line"])
        elif kind == "end":
            self._halt()

    def stop(self) -> None:
        """No more lines: the timer ends and the bar goes (the command calls it when the launch returns)."""
        self._halt()
        ticker, self._ticker = self._ticker, None
        if ticker is not None and ticker is not threading.current_thread():
            ticker.join(timeout=2.0)

    def _halt(self) -> None:
        self._stop.set()
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
