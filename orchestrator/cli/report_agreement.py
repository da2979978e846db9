"""``swapcheck report agreement``: bitwise agreement of generated sequences."""

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
from orchestrator.cli.report_options import (
    AgreementTable,
    OutputOpt,
    catalog,
    output_to,
    write_json,
)


def agreement(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    fmt: FormatOpt = TableFormat.table,
    table: AgreementTable = typer.Option(AgreementTable.all, "--table",
                                         help="all, self, cross, divergence, positions or distinct (CSV: one of the last five)."),
    output: OutputOpt = None,
) -> None:
    """Bitwise agreement of generated sequences: each arm with itself across cold restarts, and arm pairs.

    `self`: per arm, the prompts whose generated sequence is bit-identical in every cold restart (k/N),
    the worker processes of the restarts (fresh processes: distinct processes = restarts) and whether
    the kernel-selection evidence matched the configured kernel. `cross`: per pair of arms of a sweep,
    the prompts whose restart-0 sequences are identical (k/N), the arms' scales, and the first
    generated position (0-based) where the others diverge (min / median / max; `divergence` lists
    every prompt). `positions`: per generated position, the share of prompts whose tokens agree there
    and whose sequences are still identical up to it. `distinct`: per arm, the distinct completions
    its N cold restarts produced per prompt (max / mean, prompts with more than one, and how many
    prompts had 1, 2, ... of them). JSON (`--table all`): one object with `self_reproducibility`,
    `cross_arm` (each pair with `diverged`, `first_divergence`, `first_divergences`),
    `first_divergence`, `position_agreement` and `distinct_completions`; another `--table` gives its rows.

    Example: swapcheck report agreement --results results --sweep e2e-demo --format json
    """
    with user_errors(), catalog(results, sweep) as cat, output_to(output):
        from orchestrator.errors import UsageError
        from reports import agreement as ag

        if fmt is TableFormat.csv and table is AgreementTable.all:
            raise UsageError("--format csv holds one table: add --table self, cross, divergence, positions or distinct")
        rep = ag.agreement(cat, sweep)
        if fmt is TableFormat.json and table is AgreementTable.all:
            write_json(rep)
            return
        if fmt in (TableFormat.json, TableFormat.csv):
            emit_rows(rep[ag.TABLE_KEYS[table.value]], fmt)
            return
        if not rep["self_reproducibility"] and not rep["cross_arm"]:
            out.print("no generated sequences yet")
            return
        if table in (AgreementTable.all, AgreementTable.self):
            emit_rows(ag.self_table(rep["self_reproducibility"]), fmt,
                      title="self-reproducibility: sequences bit-identical across cold restarts")
        if table in (AgreementTable.all, AgreementTable.cross):
            emit_rows(ag.cross_table(rep["cross_arm"]), fmt,
                      title="cross-arm agreement: restart-0 sequences bit-identical (positions 0-based)")
        if table in (AgreementTable.all, AgreementTable.distinct):
            emit_rows(ag.distinct_table(rep["distinct_completions"]), fmt,
                      title="distinct completions in N cold restarts, per arm and prompt")
        if table is AgreementTable.divergence:
            emit_rows(ag.divergence_table(rep["first_divergence"]), fmt, title="first divergence per prompt (restart 0)")
        if table is AgreementTable.positions:
            emit_rows(ag.positions_table(rep["position_agreement"]), fmt, title="per-position agreement (restart 0)")
