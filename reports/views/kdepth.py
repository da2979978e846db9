"""``report kdepth``: outputs differing per K between kernel pairs, summed over seeds."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Option, Report, Section, View, lazy


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports import kdepth as kd

    rows = kd.summary(cat, sweep)
    return View(sweep, rows, [Block(title, table) for title, table in kd.tables(rows, long=opts["long"])],
                empty=None if rows else "no kdepth results yet")


def _document(cat: Any, sweep: str) -> list[Section]:
    from reports.figures import kdepth_figures

    figs = kdepth_figures(cat, sweep)
    return [Section("kdepth", "K-depth: outputs differing as the reduction grows",
                    "Each kernel multiplies random matrices of growing reduction depth K; how many outputs differ "
                    "between kernels (or from the exact reference), in ppm.", figures=figs)] if figs else []


REPORT = Report(
    name="kdepth",
    order=10,
    question="How often do two kernels' outputs differ as the reduction depth K grows?",
    query="kdepth_summary",
    help="""The K-depth table by dtype, implementation pair, scale mode and K, summed over seeds.

By default one line per pair and scale mode, one column per K, each cell `ppm · max`: differing
outputs per million and the largest distance in output spacings. `--long` gives one line per K
with `max sp >5%` (the largest distance over outputs with |reference| >= 5% of the largest) and
the counts of outputs 1, 2 and more than 2 spacings apart. JSON and CSV carry every column.""",
    example="swapcheck report kdepth --results results --format json",
    options=(Option("long", "One line per (pair, scale mode, K) with the spacing histogram.", False),),
    columns={"elements": "outputs compared", "differing": "outputs not bit-identical",
             "max_spacing": "output spacings (ordered bit patterns)", "seeds": "seeds summed"},
    build=_build,
    metrics=lazy("reports.metrics:kdepth_metrics"),
    document=_document,
)
