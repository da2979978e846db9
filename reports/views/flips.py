"""``report flips``: flip risk from teacher-forced replay, per arm pair."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Option, Report, ReportError, Section, View


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports import flips as fl
    from reports.fliprisk import flip_report

    if opts["resamples"] < 1:
        raise ReportError(f"--resamples {opts['resamples']}: must be at least 1")
    rep = flip_report(cat, sweep=sweep, ref_arm=opts["ref_arm"], arm=opts["arm"], bins=opts["bins"],
                      resamples=opts["resamples"], seed=opts["seed"], ci_unit=opts["ci_unit"])
    blocks = [Block("per arm pair (each on its own; nothing pooled)", fl.pair_table(rep), key="pairs")] \
        if rep["pairs"] else []
    for p in rep["pairs"]:
        title = fl.pair_title(p)
        blocks.append(Block(f"calibration by margin bin ({p['calibration_bins']}): {title}", fl.calibration_table(p),
                            heading=title, lines=list(fl.summary_lines(p))))
        if p["concentration"]:
            blocks.append(Block(f"where flips concentrate: {title}", fl.concentration_table(p)))
    selected = " for this selection" if opts["ref_arm"] or opts["arm"] else ""
    return View(sweep, fl.calibration_rows(rep), blocks, json=rep,
                empty=None if rep["pairs"] else "no teacher-forced positions yet" + selected)


def _document(cat: Any, sweep: str) -> list[Section]:
    from reports.figures import flip_figures

    figs, rows = flip_figures(cat, sweep)
    if not figs and not rows:
        return []
    return [Section("flips", "Flip risk", "Teacher-forced decoding: where the other arm's greedy token differs from "
                    "the reference arm's, and whether the reference arm's logit margin predicts it.",
                    [{"title": "Flip risk per arm pair", "rows": rows, "note": ""}] if rows else [], figs)]


REPORT = Report(
    name="flips",
    order=60,
    question="Does the reference arm's logit margin predict where the other arm's token flips?",
    query="flip_positions",
    help="""Flip risk from teacher-forced replay: does the reference margin predict where the other arm flips?

Every figure is per (sweep, ref_arm, arm) pair, never pooled across pairs: one block per pair
(and a table with a line per pair). Per pair: the flip rate with
its exact (Clopper-Pearson) 95% interval over positions (scipy), or with no flips the exact
one-sided upper bound; a power note (positions needed to see one flip with 95% probability at
a given rate); the ROC-AUC of the reference arm's top-1/top-2 logit margin as a flip predictor
(score = -margin), with a seeded 95% percentile-bootstrap interval (resampling whole reference
sequences, or positions with `--ci-unit position`) only when the pair has at least 10 flips and
10 unflipped positions, else a note "too few flips (N) for an interval"; a logistic model of
flip on log10(margin + 1e-7); a calibration table by margin bin (observed flip rate with its
Wilson interval vs the model's mean prediction); and the margins at or below which 50/90/99% of
flips lie. JSON: {`filters`, `pairs`, `notes`}, one object per pair in `pairs` (`positions`,
`flips`, `flip_rate`, `flip_rate_ci`, `rate_ci`, `power`, `auc`, `auc_ci`, `auc_note`,
`auc_ci_note`, `ci`, `model`, `calibration`, `concentration`, `notes`, ...), no pooled figure;
CSV: the calibration table of every pair, a row per pair and bin.""",
    example="swapcheck report flips --results results --sweep e2e-demo --ref-arm cutlass --arm triton --format json",
    options=(Option("ref_arm", "Only this reference arm (default: all)."),
             Option("arm", "Only this scored arm (default: all)."),
             Option("bins", "Calibration bins: decades (fixed, 0/1e-6/.../10) or quantile (10).", "decades",
                    ("decades", "quantile")),
             Option("resamples", "Bootstrap resamples for the AUC interval.", 1000),
             Option("seed", "Bootstrap seed.", 0),
             Option("ci_unit", "Bootstrap unit: sequence (whole reference sequences) or position (stratified).",
                    "sequence", ("sequence", "position"))),
    columns={"flip_rate": "flipped positions / positions", "auc": "ROC-AUC of -margin", "margin": "logits"},
    build=_build,
    document=_document,
)
