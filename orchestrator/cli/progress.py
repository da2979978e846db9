"""The progress of a launch's units on stderr (``on_event`` of ``orchestrator.runner.launch``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.markup import escape

from orchestrator.cli import common
from orchestrator.cli.common import err, note, plural, real_console


class UnitProgress:
    """``on_event`` for ``orchestrator.runner.launch``: the progress of a sweep's units on stderr.

    On a terminal a bar; anywhere else (CI, cron, a log file) a plain line every ``every`` units (a
    tenth of them) or every ``seconds``, whichever comes first, and one at the end: done/total,
    failed, rate and ETA. A failed unit is always one line (it is an error); the rest is off under -q.
    """

    def __init__(self, label: str, *, enabled: bool = True, seconds: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.seconds, self.clock = label, seconds, clock
        self.enabled = enabled and common.verbosity > common.QUIET
        self.total = self.done = self.failed = 0
        self.every = 1
        self.started = self.last = 0.0
        self.bar: Any = None

    def line(self) -> str:
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = self.done / elapsed
        eta = f"{(self.total - self.done) / rate:.0f} s" if rate > 0 else "?"
        return (f"{self.label}: {self.done}/{plural(self.total, 'unit')} done, {self.failed} failed, "
                f"{rate:.2f} units/s, ETA {eta}")

    def __call__(self, kind: str, info: dict[str, Any]) -> None:
        if kind == "cluster":
            if not info["embedded"]:
                note(str(info["line"]))
        elif kind == "start":
            note(f"{self.label}: {plural(info['total'], 'unit')}, {info['skipped']} already done, {info['pending']} to run")
            self.total, self.started = info["pending"], self.clock()
            self.last, self.every = self.started, max(1, self.total // 10)
            if self.enabled and self.total and err.is_terminal:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                )

                self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                    TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(), console=real_console(err))
                self.bar.start()
                self.bar.add_task(self.label, total=self.total, failed=0)
        elif kind == "unit":
            self.done += 1
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
            self.stop()
            again = " (SIGINT/SIGTERM again: stop waiting)" if info["why"].startswith("SIG") else ""
            note(f"{info['why']}: stopping; cancelled {plural(info['in_flight'], 'unit')} in flight, waiting up to "
                 f"{info['grace_s']:g} s for them to settle{again}")
        elif kind == "message":  # a damaged ledger file, rebuilt ledger rows (orchestrator.runner.launch)
            if info["level"] == "warning":
                err.print(f"[bold yellow]warning:[/] {escape(info['line'])}", highlight=False)
            else:
                note(info["line"])
        elif kind == "end":
            self.stop()

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
