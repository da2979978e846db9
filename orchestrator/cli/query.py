"""``swapcheck query``: read-only SQL over the results (DuckDB views)."""

from __future__ import annotations

import typer

from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    Format,
    FormatOpt,
    ResultsOpt,
    emit_rows,
    user_errors,
)


def query(
    sql: str = typer.Argument(..., help="SQL over the views kdepth, units, sweeps, launches.", show_default=False),
    results: ResultsOpt = DEFAULT_RESULTS,
    fmt: FormatOpt = Format.table,
) -> None:
    """Ask DuckDB a question about the results. Read-only: it cannot write, copy out or delete anything.

    Example: swapcheck query "SELECT impl_a, impl_b, sum(differing) FROM kdepth GROUP BY ALL" --format json
    """
    with user_errors():  # a refused or failed query (QueryError) exits 2 with its message
        from orchestrator.errors import UsageError
        from storage.catalog import read_only_query
        from storage.store import open_store

        if not open_store(results).exists():
            raise UsageError(f"--results {results}: no such directory (run `swapcheck sweep launch` first)")
        emit_rows(read_only_query(results, sql).to_pylist(), fmt)
