"""``swapcheck report fuzz``: what the fuzzing hunts of a sweep found, and how to replay each failure."""

from __future__ import annotations

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
from orchestrator.cli.report_options import OutputOpt, catalog, output_to, with_sweep


def fuzz(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    fmt: FormatOpt = TableFormat.table,
    output: OutputOpt = None,
) -> None:
    """Fuzzing hunts (the `fuzz` kind): trials per kernel, verdicts, and every saved failure.

    One line per hunt (experiment, kernel, output format): trials run, how many trials each check
    (exact match on binary inputs, bounds) judged other than IDENTICAL, the worst verdict, failures
    saved and kernel errors. Then one line per saved failure: the trial, the shape drawn and the
    shape it shrank to, the check that failed, the first failing element, and the `swapcheck check
    replay` command that reproduces it byte for byte. JSON and CSV: one object per failure.

    Example: swapcheck report fuzz --results results --sweep fuzz-demo
    """
    with user_errors(), catalog(results, sweep) as cat, output_to(output):
        from reports import fuzz as fr

        hunts = fr.summary(cat, sweep)
        fails = fr.failures(cat, sweep)
        if fmt in (TableFormat.json, TableFormat.csv):
            emit_rows(fr.failure_table(fails, results), fmt)
            return
        if not hunts:
            out.print("no fuzz results yet")
            return
        emit_rows(with_sweep(hunts, fr.summary_table(hunts)), fmt, title="fuzzing hunts (one line per kernel)")
        if fails:
            emit_rows(with_sweep(fails, fr.failure_table(fails, results)), fmt, title="saved failures")
        else:
            out.print("no failures saved: every trial passed both checks")
