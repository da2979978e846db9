"""``swapcheck report predictions``, ``report all`` and ``report conformance``: the documents."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    Format,
    FormatOpt,
    ResultsOpt,
    SweepOpt,
    emit_rows,
    out,
    user_errors,
)
from orchestrator.cli.report_options import catalog


def predictions(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: str = typer.Option(None, "--sweep", help="Only this sweep (default: every sweep with predictions)."),
    fmt: FormatOpt = Format.table,
) -> None:
    """Score the pre-registered predictions against the results: confirmed or refuted, with support.

    Each prediction was hashed into the sweep before any unit ran; amended predictions are marked,
    and so are amendments registered after results existed. A registered file edited on disk after
    registration is reported and makes the command exit 1 (the registered text is what is scored).

    Example: swapcheck report predictions --results results --format json
    """
    with user_errors(), catalog(results) as cat:
        from reports import predictions as pr

        rows = pr.score_sweeps(cat, sweep)
        edited = sorted({r["file"] for r in rows if r["file_edited_after_registration"]})
        if fmt in (Format.json, Format.csv):
            emit_rows(rows, fmt)
        elif not rows:
            out.print("no pre-registered predictions")
        else:
            one_sweep = len({r["sweep"] for r in rows}) == 1
            title = f"pre-registered predictions of {rows[0]['sweep']}" if one_sweep else "pre-registered predictions"
            emit_rows(pr.scorecard(rows), fmt, title=title)
        if edited:
            from orchestrator.cli.common import err

            err.print(f"[bold red]error:[/] registered prediction file(s) edited after registration: {', '.join(edited)}; "
                      "the registered text was scored. Restore them and put changes in an amendment file.")
            raise typer.Exit(1)


def all_(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    fmt: Format = typer.Option(Format.markdown, "--format", help="html or markdown."),
    out_file: Path = typer.Option(None, "--out", help="Write here instead of standard output (required for html)."),
) -> None:
    """Everything in one document: K-depth curves, replay heatmap, ROC and calibration plots, tables.

    HTML embeds its images (no network needed to view it); Markdown carries the tables (conformance
    summary per kernel pair, agreement, prediction scorecard, provenance) for terminals and PRs.

    Example: swapcheck report all --results results --format html --out report.html
    """
    with user_errors(), catalog(results) as cat:
        from orchestrator.errors import UsageError
        from reports.render import html_document, markdown_document

        if fmt not in (Format.html, Format.markdown):
            raise UsageError(f"--format {fmt.value}: `report all` writes html or markdown")
        if fmt is Format.html and out_file is None:
            raise UsageError("--format html needs --out FILE")
        text = html_document(cat, sweep) if fmt is Format.html else markdown_document(cat, sweep)
    if out_file is None:
        typer.echo(text)
    else:
        out_file.write_text(text, encoding="utf-8")
        out.print(f"wrote {out_file}")


def conformance(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """One page per kernel pair: what each experiment says about swapping one kernel for the other.

    K-depth (bit-identical or ppm differing and the largest spacing, per dtype and scale mode),
    per-layer replay (k/N layers identical), end to end (k/N sequences identical across arms), and
    each kernel's check verdicts.

    Example: swapcheck report conformance --results results --sweep demo
    """
    with user_errors(), catalog(results) as cat:
        from reports.conformance import check_rows
        from reports.conformance import conformance as summary

        emit_rows(summary(cat, sweep), fmt, title="conformance summary per kernel pair")
        checks = check_rows(cat, sweep)
        if checks and fmt not in (Format.json, Format.csv):
            emit_rows(checks, fmt, title="kernel checks (worst verdict over trials and shapes)")
