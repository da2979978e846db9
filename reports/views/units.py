"""``report units``: the ledger of a sweep, unit by unit status."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Report, View, lazy


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    rows = cat.named("unit_status", sweep=sweep)
    return View(sweep, rows, [Block("units", rows)])


REPORT = Report(
    name="units",
    order=20,
    question="Which units of the sweep ran, failed or were retried?",
    query="unit_status",
    help="The ledger: units per sweep and status, attempts, rows, time, and an example error.",
    example="swapcheck report units --results results",
    columns={"units": "units", "attempts": "attempts (Ray retries included)", "seconds": "wall seconds"},
    build=_build,
    metrics=lazy("reports.metrics:unit_metrics"),
    document=lambda cat, sweep: [],
)
