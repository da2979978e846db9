"""``swapcheck report``: the tables people read.

Each command parses its options, opens ONE catalog over the results (``report_options.catalog``),
calls a ``reports`` function and renders what it returns. The commands live here and in
``report_agreement``, ``report_flips`` and ``report_documents``.
"""

from __future__ import annotations

import typer

from orchestrator.cli import (
    report_agreement,
    report_certificate,
    report_documents,
    report_flips,
    report_fuzz,
    report_noise,
    report_quantize,
)
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
from orchestrator.cli.report_options import By, OutputOpt, catalog, output_to, with_sweep

app = typer.Typer(help="Reports over the results (tables, JSON for machines).", no_args_is_help=True)


@app.command("kdepth")
def kdepth(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    fmt: FormatOpt = TableFormat.table,
    long: bool = typer.Option(False, "--long", help="One line per (pair, scale mode, K) with the spacing histogram."),
    output: OutputOpt = None,
) -> None:
    """The K-depth table by dtype, implementation pair, scale mode and K, summed over seeds.

    By default one line per pair and scale mode, one column per K, each cell `ppm · max`: differing
    outputs per million and the largest distance in output spacings. `--long` gives one line per K
    with `max sp >5%` (the largest distance over outputs with |reference| >= 5% of the largest) and
    the counts of outputs 1, 2 and more than 2 spacings apart. JSON and CSV carry every column.

    Example: swapcheck report kdepth --results results --format json
    """
    with user_errors(), catalog(results, sweep) as cat, output_to(output):
        from reports import kdepth as kd

        rows = kd.summary(cat, sweep)
        if fmt in (TableFormat.json, TableFormat.csv):
            emit_rows(rows, fmt)
            return
        if not rows:
            out.print("no kdepth results yet")
        for title, table in kd.tables(rows, long=long):
            emit_rows(table, fmt, title=title)


@app.command("units")
def units(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    fmt: FormatOpt = TableFormat.table,
    output: OutputOpt = None,
) -> None:
    """The ledger: units per sweep and status, attempts, rows, time, and an example error.

    Example: swapcheck report units --results results
    """
    with user_errors(), catalog(results, sweep) as cat, output_to(output):
        emit_rows(cat.named("unit_status", sweep=sweep), fmt, title="units")


@app.command("replay")
def replay(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    fmt: FormatOpt = TableFormat.table,
    by: By = typer.Option(By.both, "--by", help="type, layer or both (tables); JSON is always per layer."),
    output: OutputOpt = None,
) -> None:
    """Per-layer operand replay: bitwise agreement of each kernel pair on identical captured operands.

    Per layer type: how many layers are bit-identical, the differing fraction and the largest
    distance in output spacings; per layer: the same plus the integer alibi (the int32 accumulators
    of both kernels agree). `capture` rows check that the capture kernel reproduces the model's own
    outputs from the saved operands. When several sweeps are shown, every table has a `sweep` column
    (JSON and CSV always do).

    Example: swapcheck report replay --results results --format json
    """
    with user_errors(), catalog(results, sweep) as cat, output_to(output):
        from reports import replay as rp

        per_layer = rp.by_layer(cat, sweep)
        if fmt in (TableFormat.json, TableFormat.csv):
            emit_rows(per_layer, fmt)
            return
        if not per_layer:
            out.print("no replay results yet")
            return
        if by in (By.type, By.both):
            by_type = rp.by_type(cat, sweep)
            emit_rows(with_sweep(by_type, rp.type_table(by_type)), fmt, title="replay by layer type")
        if by in (By.layer, By.both):
            emit_rows(with_sweep(per_layer, rp.layer_table(per_layer)), fmt, title="replay by layer")


# The remaining commands, in the order `swapcheck report --help` lists them.
app.command("predictions")(report_documents.predictions)
app.command("agreement")(report_agreement.agreement)
app.command("flips")(report_flips.flips)
app.command("quantize")(report_quantize.quantize)
app.command("all")(report_documents.all_)
app.command("conformance")(report_documents.conformance)
app.command("certificate")(report_certificate.certificate)
app.command("noise-floor")(report_noise.noise_floor)
app.command("fuzz")(report_fuzz.fuzz)
