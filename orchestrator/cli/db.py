"""``swapcheck db``: swapcheck's views for the ``duckdb`` shell (docs/duckdb.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.common import DEFAULT_RESULTS, ResultsOpt, err, note, user_errors


def db(
    results: ResultsOpt = DEFAULT_RESULTS,
    out_file: Path = typer.Option(Path("swapcheck.duckdb"), "--out", "--output", "-o", dir_okay=False,
                                  help="A DuckDB database holding the views (*.duckdb), or their SQL (*.sql)."),
) -> None:
    """Write view definitions that open swapcheck's tables in the `duckdb` shell.

    One view per table (kdepth, units, replay, ...), each over `read_parquet([...], hive_partitioning
    = false, union_by_name = true)` of exactly the files `swapcheck query` reads now (damaged,
    orphaned and foreign files are left out, with a warning), plus a `sweep` column. The file lists
    are fixed: export again after new results. The views read the Parquet files in place, so the
    database is small and the results must stay where they are.

    Example: swapcheck db --results results --out swapcheck.duckdb && duckdb swapcheck.duckdb -c "SELECT sweep, count(*) FROM units GROUP BY ALL"
    """
    from rich.markup import escape

    with user_errors():
        from orchestrator.errors import UsageError
        from storage.catalog import write_views
        from storage.store import open_store

        if not open_store(results).exists():
            raise UsageError(f"--results {results}: no such directory (run `swapcheck sweep launch` first)")
        if out_file.parent and not out_file.parent.is_dir():
            raise UsageError(f"--out {out_file}: no such directory {out_file.parent}")
        views, warnings = write_views(results, out_file)
        for line in warnings:
            err.print(f"[bold yellow]warning:[/] {escape(line)}", highlight=False, markup=True)
        opener = f"duckdb -init {out_file}" if out_file.suffix.lower() == ".sql" else f"duckdb {out_file}"
        note(f"wrote {len(views)} views ({', '.join(views)}) to {out_file}; open them with `{opener}`")
