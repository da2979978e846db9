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

    SELECT, DESCRIBE, SHOW, SUMMARIZE and EXPLAIN (not EXPLAIN ANALYZE); of several statements the
    last one's rows are shown. Damaged or unrecorded result files are skipped with a warning.

    Example: swapcheck query "SELECT impl_a, impl_b, sum(differing) FROM kdepth GROUP BY ALL" --format json
    """
    with user_errors():  # a refused or failed query (QueryError) exits 2 with its message
        from orchestrator.cli.report_options import catalog
        from storage.catalog import check_read_only

        check_read_only(sql)  # refuse before listing the results tree
        with catalog(results) as cat:  # prints the catalog's warnings first
            rows = cat.query(sql).to_pylist()
        emit_rows(rows, fmt)
