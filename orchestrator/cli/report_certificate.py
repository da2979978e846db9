"""``swapcheck report certificate``: one verdict per kernel pair, with its evidence as numbers."""

from __future__ import annotations

import sys
from typing import Any

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


def _by_scale(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The evidence rows turned: one line per kind of evidence, one column per scale mode."""
    keys = [k for k in (rows[0] if rows else {}) if k != "scales"]
    return [{"evidence": k, **{str(r["scales"]): r[k] for r in rows}} for k in keys]


def certificate(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    pair: str = typer.Option(None, "--pair", help="Only this kernel pair, `A,B` (either order)."),
    fmt: FormatOpt = TableFormat.table,
    output: OutputOpt = None,
) -> None:
    """The swap certificate of every kernel pair a sweep ran (N x N), one set per sweep (never pooled).

    Each certificate leads with a one-line answer and one verdict of the vocabulary, then per scale
    mode: K-depth ppm with an exact 95% interval and per K, the K-trend (slope of log-rate on log-K
    with its 95% interval), max spacing raw and beyond the reference's own error, replay layers
    identical, sequences identical, each arm's self-reproducibility and the flips of each
    teacher-forced arm pair with an exact interval; then each kernel's check verdicts and the
    provenance. `--format json` gives a list of certificates with stable keys (docs/schema.md); csv
    gives the matrix, one row per pair and scale mode. See docs/certificate.md.

    Example: swapcheck report certificate --results results --sweep demo --pair int8-cutlass-order,int8-triton-order
    """
    with user_errors(), catalog(results, sweep) as cat, output_to(output):
        from orchestrator.errors import UsageError
        from reports import certificate as cf

        certs = cf.certificates(cat, sweep)
        if pair is not None:
            names = [p.strip() for p in pair.split(",")]
            if len(names) != 2 or not all(names) or names[0] == names[1]:
                raise UsageError(f"--pair {pair!r}: give two different kernels as A,B")
            certs = cf.select_pair(certs, names[0], names[1])
        if fmt is TableFormat.json:
            write_json(certs)
            return
        if fmt is TableFormat.csv:
            emit_rows(cf.matrix_rows(certs), fmt)
            return
        if not certs:
            out.print("no kernel pairs in these results" + (f" for --pair {pair}" if pair else ""))
            return
        for c in certs:
            title = f"{c['sweep']}: {c['kernel_a']} vs {c['kernel_b']} — {c['verdict']}"
            if fmt is TableFormat.markdown:
                sys.stdout.write(f"## {title}\n\n**{c['answer']}**\n\n")
                emit_rows(_by_scale(cf.evidence_rows(c)), fmt)
                sys.stdout.write("\n" + "".join(f"- {line}\n" for line in cf.detail_lines(c)) + "\n")
            else:
                out.print(f"[bold]{c['answer']}[/]", highlight=False)
                emit_rows(_by_scale(cf.evidence_rows(c)), fmt, title=title)
                for line in cf.detail_lines(c):
                    out.print(f"  {line}", highlight=False, markup=False)
                out.print()
