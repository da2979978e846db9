"""``swapcheck report predictions``, ``report all`` and ``report conformance``: the documents."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    DocFormat,
    FormatOpt,
    ResultsOpt,
    SweepOpt,
    TableFormat,
    emit_rows,
    out,
    user_errors,
)
from orchestrator.cli.report_options import catalog


def predictions(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: str = typer.Option(None, "--sweep", help="Only this sweep (default: every sweep with predictions)."),
    fmt: FormatOpt = TableFormat.table,
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
        if fmt in (TableFormat.json, TableFormat.csv):
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
    fmt: DocFormat = typer.Option(DocFormat.markdown, "--format", help="markdown, html or json."),
    out_file: Path = typer.Option(None, "--output", "-o", "--out", dir_okay=False,
                                  help="Write here instead of standard output (required for html)."),
) -> None:
    """Everything in one document: verdicts per kernel pair first, then figures and tables, provenance last.

    HTML is one self-contained page (images embedded; a table of contents; each figure with its
    question and caption; the date in the header and the provenance at the end). Markdown carries
    the same tables for terminals and PRs; JSON is one object: the certificate rows, every table,
    the list of figures (title and caption), the provenance and generated_at. Rates are in ppm.
    `--out` is an alias of `-o/--output`.

    Example: swapcheck report all --results results --format html -o report.html
    """
    from orchestrator.errors import UsageError

    if fmt is DocFormat.html and out_file is None:
        with user_errors():
            raise UsageError("--format html needs --output FILE")
    with user_errors(), catalog(results, sweep) as cat:
        import json

        from orchestrator.cli.common import _json_default
        from reports.render import html_document, json_document, markdown_document

        if fmt is DocFormat.json:
            text = json.dumps(json_document(cat, sweep), default=_json_default, indent=1) + "\n"
        else:
            text = html_document(cat, sweep) if fmt is DocFormat.html else markdown_document(cat, sweep)
    if out_file is None:
        typer.echo(text, nl=False)
    else:
        out_file.write_text(text, encoding="utf-8")
        out.print(f"wrote {out_file}")


def conformance(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    fmt: FormatOpt = TableFormat.table,
) -> None:
    """One page per kernel pair: what each experiment says about swapping one kernel for the other.

    K-depth (bit-identical or ppm differing and the largest spacing, per dtype and scale mode),
    per-layer replay (k/N layers identical), end to end (k/N sequences identical across arms), and
    each kernel's check verdicts.

    Example: swapcheck report conformance --results results --sweep demo
    """
    with user_errors(), catalog(results) as cat:
        from reports.conformance import check_rows, table_rows
        from reports.conformance import conformance as summary

        rows = summary(cat, sweep)
        if fmt in (TableFormat.json, TableFormat.csv):
            emit_rows(rows, fmt)
        else:
            emit_rows(table_rows(rows), fmt, title="conformance summary per kernel pair "
                      "(every number: --format json; the full evidence: swapcheck report certificate)")
        checks = check_rows(cat, sweep)
        if checks and fmt not in (TableFormat.json, TableFormat.csv):
            emit_rows(checks, fmt, title="kernel checks (worst verdict over trials and shapes)")
