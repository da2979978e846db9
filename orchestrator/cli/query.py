"""``swapcheck query``: read-only SQL over the results (DuckDB views), and the named queries."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    FormatOpt,
    ResultsOpt,
    TableFormat,
    emit_rows,
    user_errors,
)
from orchestrator.cli.reading import OutputOpt, output_to

if TYPE_CHECKING:
    from storage.catalog import QueryLimits


def _params(pairs: list[str], allowed: list[str], name: str) -> dict[str, str]:
    from orchestrator.errors import UsageError

    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise UsageError(f"--param {pair!r}: expected NAME=VALUE")
        if key not in allowed:
            raise UsageError(f"--param {key}: {name} takes {', '.join('$' + p for p in allowed) or 'no parameters'}")
        out[key] = value
    return out


def limits() -> QueryLimits:
    """``swapcheck query``'s limits: 900 s, three quarters of physical memory, a 1,024 MB result (each
    set by its variable: docs/duckdb.md)."""
    from storage.catalog import QUERY_RESULT_DEFAULT_MB, QUERY_TIMEOUT_DEFAULT_S, QueryLimits

    return QueryLimits.from_env(timeout_s=QUERY_TIMEOUT_DEFAULT_S, result_mb=QUERY_RESULT_DEFAULT_MB)


def query(
    sql: str = typer.Argument(None, help="SQL over the views kdepth, units, sweeps, launches, ...", show_default=False),
    results: ResultsOpt = DEFAULT_RESULTS,
    fmt: FormatOpt = TableFormat.table,
    named: str = typer.Option(None, "--named", help="Run storage/queries/NAME.sql instead of SQL (see --list)."),
    param: list[str] = typer.Option([], "--param", "-p", help="A $parameter of --named as NAME=VALUE (repeatable; unset ones are NULL)."),
    list_: bool = typer.Option(False, "--list", help="List the named queries, each with its first comment line and parameters."),
    output: OutputOpt = None,
) -> None:
    """Ask DuckDB a question about the results. Read-only: it cannot write, copy out or delete anything.

    SELECT, DESCRIBE, SHOW, SUMMARIZE and EXPLAIN (not EXPLAIN ANALYZE); of several statements the
    last one's rows are shown. Damaged or unrecorded result files are skipped with a warning.
    `--named NAME` runs one of the queries every report is built from (`--list` shows them), its
    `$parameters` bound from `--param k=v`; `--param sweep=NAME` must name a sweep that exists.

    Example: swapcheck query "SELECT impl_a, impl_b, sum(differing) FROM kdepth GROUP BY ALL" --format json
    Example: swapcheck query --named kdepth_summary --param sweep=kdepth-demo
    """
    with user_errors():  # a refused or failed query (QueryError) exits 2 with its message
        from orchestrator.cli.reading import catalog
        from orchestrator.errors import UsageError
        from storage.catalog import check_read_only, named_queries

        if list_:
            if sql is not None or named is not None:
                raise UsageError("--list takes no SQL and no --named")
            with output_to(output):
                emit_rows([{**q, "parameters": ", ".join(q["parameters"])} for q in named_queries()], fmt,
                          title="named queries (storage/queries/)")
            return
        if (sql is None) == (named is None):
            raise UsageError("give SQL or --named NAME (not both); --list shows the named queries")
        if named is None and param:
            raise UsageError("--param binds the $parameters of --named queries")
        if named is not None:
            known = {q["name"]: q["parameters"] for q in named_queries()}
            if named not in known:
                raise UsageError(f"--named {named}: no such query; available: {', '.join(known)}")
            bound = _params(param, known[named], named)
            with catalog(results, bound.get("sweep")) as cat, output_to(output):
                emit_rows(cat.named_arrow(named, limits=limits(), **bound).to_pylist(), fmt)
            return
        check_read_only(sql)  # refuse before listing the results tree
        with catalog(results) as cat:  # prints the catalog's warnings first
            rows = cat.query(sql, limits=limits()).to_pylist()
        with output_to(output):
            emit_rows(rows, fmt)
