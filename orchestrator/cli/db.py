"""``swapcheck db``: swapcheck's views for the ``duckdb`` shell (docs/duckdb.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchestrator.cli.common import DEFAULT_RESULTS, ResultsOpt, err, note, user_errors

if TYPE_CHECKING:
    from storage.store import ResultStore

#: The first line of every SQL file ``swapcheck db`` writes (storage.catalog.view_definitions).
_SQL_HEADER = "-- swapcheck db:"


def _ours(path: Path) -> str | None:
    """Why ``path`` (an existing file) is not an export of ``swapcheck db``, or None when it is one.

    A ``*.sql`` export opens with swapcheck's header line; a database export is a DuckDB file that
    holds views only, each named after one of swapcheck's tables, and no table or other object."""
    if not path.is_file() or path.is_symlink():
        return "not a regular file"
    if path.suffix.lower() == ".sql":
        try:
            with path.open("rb") as f:
                head = f.read(len(_SQL_HEADER))
        except OSError as exc:
            return f"cannot read it ({exc.strerror or exc})"
        return None if head == _SQL_HEADER.encode() else "its first line is not swapcheck db's header"
    try:
        with path.open("rb") as f:
            magic = f.read(12)[8:12]
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    if magic != b"DUCK":
        return "not a DuckDB database"
    import duckdb

    from storage.schemas import TABLES

    try:
        con = duckdb.connect(str(path), read_only=True)
        try:
            tables = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database()").fetchone()
            views = [r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal "
                                               "AND database_name = current_database()").fetchall()]
        finally:
            con.close()
    except Exception as exc:  # another DuckDB version, a locked or damaged file: not provably ours
        return f"a DuckDB database swapcheck cannot open ({type(exc).__name__})"
    if tables and tables[0]:
        return f"a DuckDB database holding {tables[0]} table(s), not only swapcheck's views"
    foreign = sorted(set(views) - set(TABLES))
    if foreign:
        return f"a DuckDB database with views swapcheck does not write ({', '.join(foreign[:5])})"
    return None


def _check_out(out_file: Path, store: ResultStore, results: str, force: bool) -> None:
    """Refuse an ``--out`` inside the results tree, or over a file that is not a previous export."""
    from orchestrator.errors import UsageError

    if not store.local and out_file.suffix.lower() != ".sql":
        # A database export binds its views as it creates them: DuckDB would have to read the objects
        # itself, through its httpfs extension (a download from the network) and credentials of its own.
        raise UsageError(f"--out {out_file}: a DuckDB database of views can only be written over local results; "
                         f"{results} is an object store, which DuckDB reads only through its httpfs extension and a "
                         "secret of its own. Write the SQL instead (--out views.sql) and run it in a duckdb shell "
                         "with httpfs loaded and a secret (CREATE SECRET). Nothing was written")
    target = Path(os.path.abspath(out_file))
    if store.local:
        root = Path(os.path.realpath(store.base))
        where = Path(os.path.realpath(target.parent)) / target.name
        if where == root or root in where.parents:
            raise UsageError(f"--out {out_file}: inside the results tree {results}; a file there would be "
                             "read as a damaged unit. Write the views outside --results (nothing was written)")
    if out_file.parent and not out_file.parent.is_dir():
        raise UsageError(f"--out {out_file}: no such directory {out_file.parent}")
    if os.path.lexists(out_file) and not force:
        why = _ours(out_file)
        if why is not None:
            raise UsageError(f"--out {out_file}: the file exists and is {why}; swapcheck db replaces only its own "
                             "exports (a *.sql file it wrote, or a DuckDB file holding only its views). Choose "
                             "another --out, or pass --force to replace it (nothing was written)")


def _python_command(code: str) -> str:
    """A shell command running ``code`` with this Python (the venv's, relative to the cwd inside it)."""
    import shlex
    import sys

    python = sys.executable
    rel = os.path.relpath(python)
    if not rel.startswith(".."):
        python = rel if os.sep in rel else f".{os.sep}{rel}"
    # Double quotes keep the code's single-quoted strings readable; anything the shell would expand
    # inside them falls back to full quoting.
    quoted = f'"{code}"' if not set(code) & set('"$`\\!') else shlex.quote(code)
    return f"{shlex.quote(python)} -c {quoted}"


def how_to_open(out_file: Path) -> str:
    """Where an export opens: this venv's Python (its DuckDB, nothing to install), or a DuckDB shell,
    which the venv does not have (docs/duckdb.md says where one comes from)."""
    import shlex

    import duckdb

    path = str(out_file)
    query = "con.sql('SELECT sweep, count(*) AS units FROM units GROUP BY ALL').show()"
    if out_file.suffix.lower() == ".sql":
        code = f"import duckdb; con = duckdb.connect(); con.execute(open({path!r}).read()); {query}"
        shell = (f"`duckdb -init {shlex.quote(path)}` in any recent DuckDB shell (none in the venv: "
                 "`pipx install duckdb-cli` from PyPI, or DuckDB's own install; docs/duckdb.md)")
    else:
        code = f"import duckdb; con = duckdb.connect({path!r}, read_only=True); {query}"
        shell = (f"`duckdb -readonly {shlex.quote(path)}` in a DuckDB {duckdb.__version__} shell, the version "
                 "that wrote it (none in the venv: DuckDB's own install, or PyPI's duckdb-cli where it has "
                 f"{duckdb.__version__}; docs/duckdb.md)")
    return f"open them with this venv's Python (its DuckDB, no extra install): {_python_command(code)}\nor with {shell}"


def db(
    results: ResultsOpt = DEFAULT_RESULTS,
    out_file: Path = typer.Option(Path("swapcheck.duckdb"), "--out", "--output", "-o", dir_okay=False,
                                  help="A DuckDB database holding the views (*.duckdb), or their SQL (*.sql). Must be outside --results; "
                                       "an existing file is replaced only if swapcheck db wrote it."),
    force: bool = typer.Option(False, "--force",
                               help="Replace --out even if it exists and is not an export of swapcheck db."),
) -> None:
    """Write view definitions that open swapcheck's tables in the `duckdb` shell.

    One view per table (kdepth, units, replay, ...), each over `read_parquet([...], hive_partitioning
    = false, union_by_name = true)` of exactly the files `swapcheck query` reads now (damaged,
    orphaned and foreign files are left out, with a warning), plus a `sweep` column. The file lists
    are fixed: export again after new results. The views read the Parquet files in place, so the
    database is small and the results must stay where they are.

    An existing --out is replaced only when it is an earlier export (a *.sql file that opens with
    swapcheck's header, or a DuckDB database holding nothing but swapcheck's views); any other file
    is refused (exit 2) unless --force is given. --out inside the results tree is always refused.

    The venv has no DuckDB shell: the export opens in its Python (`import duckdb`), and the message
    prints that command; a `duckdb` shell comes from DuckDB's own install or PyPI's duckdb-cli
    (docs/duckdb.md).

    Example: swapcheck db --results results --out swapcheck.duckdb && .venv/bin/python -c "import duckdb; duckdb.connect('swapcheck.duckdb', read_only=True).sql('SELECT sweep, count(*) FROM units GROUP BY ALL').show()"
    """
    from rich.markup import escape

    with user_errors():
        from orchestrator.errors import UsageError
        from storage.catalog import write_views
        from storage.store import open_store

        store = open_store(results)
        if not store.exists():
            raise UsageError(f"--results {results}: no such directory (run `swapcheck sweep launch` first)")
        _check_out(out_file, store, str(results), force)
        views, warnings = write_views(results, out_file)
        for line in warnings:
            err.print(f"[bold yellow]warning:[/] {escape(line)}", highlight=False, markup=True)
        note(f"wrote {len(views)} views ({', '.join(views)}) to {out_file}; {how_to_open(out_file)}")
