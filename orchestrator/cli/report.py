"""``swapcheck report``: one command per registered report (``reports.registry``), and ``report all``.

Every command is generated from its :class:`~reports.registry.Report`: ``--results``, ``--sweep``,
``--format``, ``-o/--output``, the report's own options (and ``--table`` when it has several
tables), its help and example. A command builds one view per sweep (``--sweep``, or every sweep of
the results, each on its own: nothing is pooled) and renders them here, the one renderer of views.
"""

from __future__ import annotations

import inspect
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli import selection
from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    DocFormat,
    FormatOpt,
    ResultsOpt,
    SweepOpt,
    TableFormat,
    emit_rows,
    err,
    escape,
    out,
    user_errors,
)
from orchestrator.cli.reading import OutputOpt, catalog, output_to, write_json
from reports.registry import Report, View, builtin_report, merge_json, reports

app = typer.Typer(help="Reports over the results (tables, JSON for machines); one command per registered report.",
                  no_args_is_help=True)


def _views(report: Report, results: str, sweep: str | None, opts: dict[str, Any]) -> list[View]:
    with catalog(results, sweep) as cat:
        return [report.build(cat, sw, opts) for sw in ([sweep] if sweep else cat.all_sweeps())]


def _tagged(views: list[View], rows_of: Any) -> list[Any]:
    """Each sweep's rows, with a leading ``sweep`` where several sweeps are shown and a row lacks one."""
    def tag(v: View, rows: Any) -> Any:
        if len(views) == 1 or not isinstance(rows, list):
            return rows
        return [{"sweep": v.sweep, **r} if isinstance(r, dict) and "sweep" not in r else r for r in rows]

    return [tag(v, rows_of(v)) for v in views]


def _machine(report: Report, views: list[View], fmt: TableFormat, table: str) -> None:
    from orchestrator.errors import UsageError

    if report.tables and fmt is TableFormat.csv and table == "all":
        raise UsageError(f"--format csv holds one table: add --table {', '.join(report.tables)}")
    if report.tables and table != "all":
        rows = merge_json(_tagged(views, lambda v: v.rows[table]))
    elif fmt is TableFormat.json:
        write_json(merge_json(_tagged(views, lambda v: v.json if v.json is not None else v.rows)) if views else [])
        return
    else:
        rows = merge_json(_tagged(views, lambda v: v.rows))
    emit_rows(rows if views else [], fmt)


def _human(report: Report, views: list[View], fmt: TableFormat, table: str) -> None:
    md = fmt is TableFormat.markdown
    shown = [v for v in views if v.empty is None] if len(views) > 1 else views
    if not shown:
        out.print(views[0].empty if views else "no sweeps in these results yet (run `swapcheck sweep launch` first)",
                  highlight=False)
    for v in shown:
        if len(views) > 1:
            out.print(f"\n# sweep {v.sweep}\n" if md else f"\n[bold underline]sweep {escape(v.sweep)}[/]", highlight=False)
        if v.empty is not None:
            out.print(v.empty, highlight=False)
            continue
        for b in v.blocks:
            if b.key is not None and table not in ("all", b.key):
                continue
            if b.heading:
                out.print(f"\n## {b.heading}\n" if md else f"\n[bold]{escape(b.heading)}[/]", highlight=False)
            for line in b.lines:  # wrapped at the tables' width (Markdown: one line)
                out.print(f"{line}\n" if md else line, highlight=False, markup=False, soft_wrap=md)
            if b.rows is not None:
                emit_rows(b.rows, fmt, title=b.title)
            for line in b.after:
                out.print(f"- {line}" if md else f"  {line}", highlight=False, markup=False, soft_wrap=md)


def _run(report: Report, results: str, sweep: str | None, fmt: TableFormat, output: Path | None,
         opts: dict[str, Any]) -> None:
    opts = {k: getattr(v, "value", v) for k, v in opts.items()}
    with user_errors():
        views = _views(report, results, sweep, opts)
        with output_to(output):
            show = _machine if fmt in (TableFormat.json, TableFormat.csv) else _human
            show(report, views, fmt, opts.get("table", "all"))
    failures = [v.failure for v in views if v.failure]
    for line in failures:
        err.print(f"[bold red]error:[/] {escape(line)}", highlight=False)
    if failures:
        raise typer.Exit(1)


def _param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _option(name: str, flags: str, help: str, default: Any, choices: tuple[str, ...] | None) -> inspect.Parameter:
    kind: Any = Enum(f"{name}_choice", {c: c for c in choices}, type=str) if choices else (
        type(default) if default is not None else str | None)
    return _param(name, Annotated[kind, typer.Option(flags, help=help)], kind(default) if choices else default)


def _command(report: Report) -> Any:
    """The typer command of ``report``: a function whose signature typer reads for the options."""
    own = [_option(o.name, o.flags, o.help, o.default, o.choices) for o in report.options]
    if report.tables:
        own.append(_option("table", "--table", f"all, {', '.join(report.tables)} (CSV: one of them).", "all",
                           ("all", *report.tables)))
    params = [_param("results", ResultsOpt, DEFAULT_RESULTS), _param("sweep", SweepOpt, None),
              _param("fmt", FormatOpt, TableFormat.table), *own, _param("output", OutputOpt, None)]

    def command(results: str, sweep: str | None, fmt: TableFormat, output: Path | None, **opts: Any) -> None:
        _run(report, results, sweep, fmt, output, opts)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = report.help + (f"\n\nExample: {report.example}" if report.example else "")
    command.__name__ = report.name.replace("-", "_")
    return command


def all_(
    results: ResultsOpt = DEFAULT_RESULTS,
    sweep: SweepOpt = None,
    fmt: DocFormat = typer.Option(DocFormat.markdown, "--format", help="markdown, html or json."),
    out_file: Path = typer.Option(None, "--output", "-o", "--out", dir_okay=False,
                                  help="Write here instead of standard output (required for html)."),
) -> None:
    """Everything in one document: each sweep's question and answer first, then the verdicts, figures and tables.

    Each sweep has sections of its own (nothing pooled), sweeps in the order their specs were launched.

    HTML is one self-contained page (images embedded): a summary line per sweep (its question; the
    verdict and answer of the pairs it names), contents, the verdict table (the question's pairs first,
    then by severity; spacing columns in a detail below), captioned figures, provenance. Markdown has
    the same summary and tables; JSON is one object: certificate rows, summary, every table, figures
    (title, caption), each with its sweep, provenance, generated_at. Rates in ppm; `--out` = `-o`.

    Example: swapcheck report all --results results --format html -o report.html
    """
    with user_errors():
        from orchestrator.errors import UsageError

        if fmt is DocFormat.html and out_file is None:
            raise UsageError("--format html needs --output FILE")
        with catalog(results, sweep) as cat:
            from reports.render import html_document, json_document, markdown_document

            if fmt is DocFormat.json:
                import json

                from orchestrator.cli.common import _json_default

                text = json.dumps(json_document(cat, sweep), default=_json_default, indent=1) + "\n"
            else:
                text = html_document(cat, sweep) if fmt is DocFormat.html else markdown_document(cat, sweep)
    if out_file is None:
        typer.echo(text, nl=False)
    else:
        out_file.write_text(text, encoding="utf-8")
        out.print(f"wrote {out_file}")


def _register() -> None:
    """Every report's command and ``report all``; or, in a process that runs one named built-in report
    (:mod:`orchestrator.cli.selection`), that one command alone."""
    want = selection.WANTED
    if want is not None and want.command == "report" and want.report is not None:
        if want.report == "all":
            app.command("all")(all_)
            return
        one = builtin_report(want.report)
        if one is not None:
            app.command(one.name)(_command(one))
            return
    for report in reports():
        app.command(report.name)(_command(report))
        if report.name == "quantize":  # `report all` sits where `report --help` has always listed it
            app.command("all")(all_)
    if "all" not in {c.name for c in app.registered_commands}:
        app.command("all")(all_)


_register()
