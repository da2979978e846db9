"""``swapcheck report quantize``: two activation quantizers on the same captured activations."""

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
from orchestrator.cli.report_options import OutputOpt, catalog, output_to, with_sweep


def quantize(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    fmt: FormatOpt = TableFormat.table,
    layers: bool = typer.Option(False, "--layers", help="Also one line per layer call and pair."),
    output: OutputOpt = None,
) -> None:
    """Quantizer swaps: how often two activation quantizers disagree, and what it does downstream.

    Per (reference, candidate) pair, summed over every captured layer call of the `quantize` kind:
    the quantized values that differ (count and percent of all values), the largest |q_ref - q_cand|
    (int8 steps, or FP8 values), the per-token scales that differ and their largest distance in
    spacings of the scale format, and downstream, with both sides fed through the SAME GEMM kernel
    and weights: output elements that differ (count and parts per million), the largest distance in
    output spacings, and how many layer calls stay bit-identical. Downstream columns are empty for
    FP8 pairs. JSON and CSV: one object per layer call and pair (`quantize_by_layer`).

    Example: swapcheck report quantize --results results --sweep quantize-demo
    """
    with user_errors(), catalog(results, sweep) as cat, output_to(output):
        from reports import quantize as qr

        per_layer = qr.by_layer(cat, sweep)
        if fmt in (TableFormat.json, TableFormat.csv):
            emit_rows(per_layer, fmt)
            return
        if not per_layer:
            out.print("no quantize results yet")
            return
        pairs = qr.by_pair(cat, sweep)
        emit_rows(with_sweep(pairs, qr.pair_table(pairs)), fmt, title="quantizer pairs (all layer calls)")
        if layers:
            emit_rows(with_sweep(per_layer, qr.layer_table(per_layer)), fmt, title="quantizer pairs by layer call")
