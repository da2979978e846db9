"""``report conformance``: one line per kernel pair from every experiment, and the kernel checks."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Report, Section, View, lazy


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports.conformance import check_rows, conformance, table_rows

    rows = conformance(cat, sweep)
    blocks = [Block("conformance summary per kernel pair (every number: --format json; the full evidence: "
                    "swapcheck report certificate)", table_rows(rows))]
    checks = check_rows(cat, sweep)
    if checks:
        blocks.append(Block("kernel checks (worst verdict over trials and shapes)", checks))
    return View(sweep, rows, blocks)


def _document(cat: Any, sweep: str) -> list[Section]:
    from reports.conformance import check_rows, conformance
    from reports.render import evidence_view

    out = []
    checks = check_rows(cat, sweep)
    if checks:
        out.append(Section("checks", "Kernel checks", "Worst verdict over trials and shapes.",
                           [{"title": "Kernel checks (worst verdict over trials and shapes)", "rows": checks, "note": ""}]))
    rows = conformance(cat, sweep)
    if rows:
        out.append(Section("evidence", "Conformance evidence", "What every experiment says per kernel pair.",
                           [{"title": "Conformance evidence per kernel pair and scale mode", "rows": evidence_view(rows),
                             "note": ""}]))
    return out


REPORT = Report(
    name="conformance",
    order=90,
    question="What does each experiment say about swapping one kernel for the other?",
    query="kdepth_summary",
    help="""One page per kernel pair: what each experiment says about swapping one kernel for the other.

K-depth (bit-identical or ppm differing and the largest spacing, per dtype and scale mode),
per-layer replay (k/N layers identical), end to end (k/N sequences identical across arms), and
each kernel's check verdicts.""",
    example="swapcheck report conformance --results results --sweep demo",
    build=_build,
    metrics=lazy("reports.metrics:conformance_metrics"),
    document=_document,
)
