"""``report predictions``: pre-registered predictions scored against the results."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Report, Section, View


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports import predictions as pr

    rows = pr.score_sweeps(cat, sweep)
    edited = sorted({r["file"] for r in rows if r["file_edited_after_registration"]})
    failure = (f"registered prediction file(s) edited after registration: {', '.join(edited)}; the registered text "
               "was scored. Restore them and put changes in an amendment file.") if edited else None
    return View(sweep, rows, [Block(f"pre-registered predictions of {sweep}", pr.scorecard(rows))] if rows else [],
                empty=None if rows else "no pre-registered predictions", failure=failure)


def _document(cat: Any, sweep: str) -> list[Section]:
    from reports import predictions as pr

    rows = pr.score_sweeps(cat, sweep)
    return [Section("predictions", "Pre-registered predictions",
                    "Hashed into the sweep before any unit ran; scored against the results.",
                    [{"title": "Pre-registered predictions", "rows": pr.report_rows(rows), "note": ""}])] if rows else []


REPORT = Report(
    name="predictions",
    order=40,
    question="Did the results confirm what was predicted before any unit ran?",
    query="prediction_every",
    help="""Score the pre-registered predictions against the results: confirmed or refuted, with support.

Each prediction was hashed into the sweep before any unit ran; amended predictions are marked,
and so are amendments registered after results existed. A registered file edited on disk after
registration is reported and makes the command exit 1 (the registered text is what is scored).""",
    example="swapcheck report predictions --results results --format json",
    build=_build,
    document=_document,
)
