"""``swapcheck query``: read-only SQL over the results (DuckDB views)."""

from __future__ import annotations

import typer

from orchestrator.cli.common import DEFAULT_RESULTS, RESULTS_HELP, Format, emit_rows, user_errors


def query(
    sql: str = typer.Argument(..., help="SQL over the views kdepth, units, sweeps, launches.", show_default=False),
    results: str = typer.Option(DEFAULT_RESULTS, "--results", help=RESULTS_HELP),
    fmt: Format = typer.Option(Format.table, "--format", help="table, json, csv or markdown."),
) -> None:
    """Ask DuckDB a question about the results. Read-only: it cannot write, copy out or delete anything.

    Example: swapcheck query "SELECT impl_a, impl_b, sum(differing) FROM kdepth GROUP BY ALL" --format json
    """
    with user_errors():
        from orchestrator.errors import UsageError
        from storage.catalog import QueryError, read_only_query
        from storage.store import open_store

        if not open_store(results).exists():
            raise UsageError(f"--results {results}: no such directory (run `swapcheck sweep launch` first)")
        try:
            table = read_only_query(results, sql)
        except QueryError as exc:
            raise UsageError(str(exc)) from None
        emit_rows(table.to_pylist(), fmt)
