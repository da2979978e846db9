"""``swapcheck report flips``: flip risk from teacher-forced replay."""

from __future__ import annotations

import typer

from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    FormatOpt,
    ResultsOpt,
    SweepOpt,
    TableFormat,
    emit_rows,
    out,
    user_errors,
)
from orchestrator.cli.report_options import Bins, CiUnit, catalog, write_json


def flips(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    ref_arm: str = typer.Option(None, "--ref-arm", help="Only this reference arm (default: all)."),
    arm: str = typer.Option(None, "--arm", help="Only this scored arm (default: all)."),
    fmt: FormatOpt = TableFormat.table,
    bins: Bins = typer.Option(Bins.decades, "--bins", help="Calibration bins: decades (fixed, 0/1e-6/.../10) or quantile (10)."),
    resamples: int = typer.Option(1000, "--resamples", help="Bootstrap resamples for the AUC interval."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    ci_unit: CiUnit = typer.Option(CiUnit.sequence, "--ci-unit", help="Bootstrap unit: sequence (whole reference sequences) or position (stratified)."),
) -> None:
    """Flip risk from teacher-forced replay: does the reference margin predict where the other arm flips?

    Every figure is per (sweep, ref_arm, arm) pair, never pooled across pairs: one block per pair
    (and, with several pairs or markdown, a table with a line per pair). Per pair: the flip rate with
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
    CSV: the calibration table of every pair, a row per pair and bin.

    Example: swapcheck report flips --results results --sweep e2e-demo --ref-arm cutlass --arm triton --format json
    """
    with user_errors(), catalog(results) as cat:
        from orchestrator.errors import UsageError
        from reports import flips as fl
        from reports.fliprisk import flip_report

        if resamples < 1:
            raise UsageError(f"--resamples {resamples}: must be at least 1")
        rep = flip_report(cat, sweep=sweep, ref_arm=ref_arm, arm=arm, bins=bins.value, resamples=resamples,
                          seed=seed, ci_unit=ci_unit.value)
        if fmt is TableFormat.json:
            write_json(rep)
            return
        if fmt is TableFormat.csv:
            emit_rows(fl.calibration_rows(rep), fmt)
            return
        if not rep["pairs"]:
            out.print("no teacher-forced positions yet" + (" for this selection" if sweep or ref_arm or arm else ""))
            return
        if len(rep["pairs"]) > 1 or fmt is TableFormat.markdown:
            emit_rows(fl.pair_table(rep), fmt, title="per arm pair (each on its own; nothing pooled)")
        for p in rep["pairs"]:
            title = fl.pair_title(p)
            if fmt is TableFormat.markdown:
                out.print(f"\n## {title}\n", highlight=False, markup=False)
            else:
                out.print(f"\n[bold]{title}[/]", highlight=False)
            for line in fl.summary_lines(p):
                out.print(line, highlight=False, markup=False)
            emit_rows(fl.calibration_table(p), fmt, title=f"calibration by margin bin ({p['calibration_bins']}): {title}")
            if p["concentration"]:
                emit_rows(fl.concentration_table(p), fmt, title=f"where flips concentrate: {title}")
