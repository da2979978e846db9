"""``swapcheck report noise-floor``: batch invariance of each kernel and the model's noise floor."""

from __future__ import annotations

from enum import Enum

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
from orchestrator.cli.report_options import OutputOpt, catalog, output_to, write_json


class NoiseTable(str, Enum):
    """``report noise-floor --table``: which table to show."""

    all = "all"
    kernels = "kernels"
    attention = "attention"
    m = "m"
    model = "model"
    floor = "floor"
    distinct = "distinct"


#: --table -> the key of reports.noise_floor.noise_floor() holding its rows (JSON and CSV).
KEYS = {"kernels": "kernels", "attention": "attention_kernels", "m": "by_m", "model": "model", "floor": "model_overall", "distinct": "distinct_completions"}


def noise_floor(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    fmt: FormatOpt = TableFormat.table,
    table: NoiseTable = typer.Option(NoiseTable.all, "--table",
                                     help="all, kernels, attention, m, model, floor or distinct (CSV: one of the last six)."),
    output: OutputOpt = None,
) -> None:
    """Batch invariance and the noise floor: what the same kernel changes by batch shape alone.

    `kernels`: per kernel of a `batch_invariance` experiment (level kernel), its verdict —
    `batch-invariant` (the probe row bit-identical to the row computed alone, M = 1, at every position
    of every batch size M and seed), `varies within k spacings` or `varies beyond k spacings` (k the
    spec's `tolerance_spacings`) — with the cells bit-identical, the outputs differing, the largest
    distance in output spacings and the first M that varies; `m`: per M, for the kernels that vary.
    `attention`: the same verdicts per attention kernel (`attention_kernels`): a probe batch element's
    causal attention, output and logsumexp, in batches of B elements vs alone.
    `floor`: per kernel, scales, reductions and comparison (padded prefill, or KV-cache decode, vs the
    prompt scored alone), the sequences whose argmax differs in some batch size, k/N with an exact
    (Clopper-Pearson) 95% interval over prompts (k = 0: the exact one-sided upper bound); `model`: the
    same per batch size, with positions (exact 95%, positions treated as independent), positions with
    any logit differing, the largest logit distance in fp32 spacings and the largest margin at a flip.
    `distinct`: per arm of a `generate` experiment, how many distinct greedy completions its N cold
    restarts produced per prompt. JSON (`--table all`): one object with `kernels`, `attention_kernels`, `by_m`, `model`,
    `model_overall`, `distinct_completions` and `method`; another `--table` gives its rows. See
    docs/noise-floor.md.

    Example: swapcheck report noise-floor --results results --sweep noise-floor-demo
    """
    with user_errors(), catalog(results, sweep) as cat, output_to(output):
        from orchestrator.errors import UsageError
        from reports import noise_floor as nf

        if fmt is TableFormat.csv and table is NoiseTable.all:
            raise UsageError("--format csv holds one table: add --table kernels, attention, m, model, floor or distinct")
        rep = nf.noise_floor(cat, sweep)
        if fmt is TableFormat.json and table is NoiseTable.all:
            write_json(rep)
            return
        if fmt in (TableFormat.json, TableFormat.csv):
            emit_rows(rep[KEYS[table.value]], fmt)
            return
        if not any(rep[k] for k in KEYS.values()):
            out.print("no batch_invariance or generate results yet")
            return
        views = [(NoiseTable.kernels, "batch invariance per kernel (probe row in batches of M vs alone)",
                  nf.kernel_table(rep["kernels"])),
                 (NoiseTable.attention, "batch invariance per attention kernel (probe element in batches of B vs alone)",
                  nf.attention_kernel_table(rep["attention_kernels"])),
                 (NoiseTable.m, "kernels that vary: cells per batch size M", nf.m_table(rep["by_m"])),
                 (NoiseTable.floor, "model noise floor over every batch shape", nf.floor_table(rep["model_overall"])),
                 (NoiseTable.model, "model noise floor per batch size", nf.model_table(rep["model"])),
                 (NoiseTable.distinct, "distinct completions in N cold restarts, per arm",
                  nf.distinct_table(rep["distinct_completions"]))]
        for which, title, rows in views:
            if table in (NoiseTable.all, which) and (rows or table is which):
                emit_rows(rows, fmt, title=title)
        out.print(f"intervals: sequences — {rep['method']['sequences']}; positions — {rep['method']['positions']}",
                  highlight=False, markup=False)
