"""``swapcheck report flips``: flip risk from teacher-forced replay."""

from __future__ import annotations

import typer

from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    Format,
    ResultsOpt,
    SweepOpt,
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
    fmt: Format = typer.Option(Format.table, "--format", help="table, json, csv (the calibration table) or markdown."),
    bins: Bins = typer.Option(Bins.decades, "--bins", help="Calibration bins: decades (fixed, 0/1e-6/.../10) or quantile (10)."),
    resamples: int = typer.Option(1000, "--resamples", help="Bootstrap resamples for the AUC interval."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    ci_unit: CiUnit = typer.Option(CiUnit.sequence, "--ci-unit", help="Bootstrap unit: sequence (whole reference sequences) or position (stratified)."),
) -> None:
    """Flip risk from teacher-forced replay: does the reference margin predict where the other arm flips?

    Over the selected teacher_forced positions (pooled, and a line per sweep and arm pair): the flip
    rate; the ROC-AUC of the reference arm's top-1/top-2 logit margin as a flip predictor (score =
    -margin) with a seeded 95% percentile-bootstrap interval (resampling whole reference sequences,
    or positions with `--ci-unit position`); a logistic model of flip on log10(margin + 1e-7); a
    calibration table by margin bin (observed flip rate with its Wilson interval vs the model's mean
    prediction); and the margins at or below which 50/90/99% of flips lie, with the share of all
    positions there. With no flips (or only flips) AUC is null with a note. JSON: one object
    (`positions`, `flips`, `flip_rate`, `auc`, `auc_ci`, `model`, `calibration`,
    `concentration_margin`, `concentration`, `pairs`, `notes`); CSV: the calibration table.

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
        if fmt is Format.json:
            write_json(rep)
            return
        calib = fl.calibration_table(rep)
        if fmt is Format.csv:
            emit_rows(calib, fmt)
            return
        if not rep["positions"]:
            out.print("no teacher-forced positions yet" + (" for this selection" if sweep or ref_arm or arm else ""))
            return
        for line in fl.summary_lines(rep):
            out.print(line, highlight=False)
        if len(rep["pairs"]) > 1 or fmt is Format.markdown:
            emit_rows(fl.pair_table(rep), fmt, title="per arm pair")
        emit_rows(calib, fmt, title=f"calibration by margin bin ({rep['calibration_bins']})")
        if rep["concentration"]:
            emit_rows(fl.concentration_table(rep), fmt, title="where flips concentrate")
