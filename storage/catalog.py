"""DuckDB views over the Parquet tree, named queries, and a read-only query entry point.

Each table of ``storage.schemas.TABLES`` is a view with the same name (``kdepth``, ``units``,
``sweeps``, ``launches``) plus its ``sweep`` partition column; a table with no files yet is an empty
view with the declared columns, so queries never fail for lack of results.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from storage.errors import QueryError
from storage.schemas import TABLES

__all__ = ["QueryError", "connect", "lock_down", "named_query", "query_names", "read_only_query", "run_named"]

#: Statement kinds ``swapcheck query`` accepts: reading only (DESCRIBE and SHOW parse as SELECT).
READ_ONLY_STATEMENTS = {"SELECT", "EXPLAIN"}


def _arrow(result: Any) -> pa.Table:
    """The result as an Arrow table (DuckDB 2 calls it ``to_arrow_table``, 1.x ``fetch_arrow_table``)."""
    if result is None:  # a statement without a result set
        return pa.table({})
    fetch = getattr(result, "to_arrow_table", None) or result.arrow
    table = fetch()
    return table if isinstance(table, pa.Table) else table.read_all()


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _root(results: str | Path) -> str:
    """The results root as DuckDB reads it: an absolute local path, or the URI as given."""
    from storage.store import is_uri

    return str(results).rstrip("/") if is_uri(results) else str(Path(results).resolve())


def connect(results: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with one view per results table (local path or URI)."""
    from storage.store import is_uri, open_store

    root = _root(results)
    con = duckdb.connect(":memory:")
    if is_uri(results) and not root.startswith("file://"):
        # s3:// gs:// https://: DuckDB's httpfs extension (credentials from the environment).
        con.execute("INSTALL httpfs; LOAD httpfs")
    store = open_store(results)
    for table, schema in TABLES.items():
        files = [f for sw in _table_sweeps(store, table) for f in store.parquet_files(table, sw)]
        if files:
            glob = _sql_str(f"{root}/table={table}/sweep=*/*.parquet")
            con.execute(
                f'CREATE VIEW "{table}" AS SELECT * EXCLUDE ("table") FROM read_parquet({glob}, '
                "hive_partitioning = true, union_by_name = true)"
            )
        else:
            empty = pa.Table.from_pylist([], schema=schema.append(pa.field("sweep", pa.string())))
            con.register(f"_empty_{table}", empty)
            con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM "_empty_{table}"')
    return con


def _table_sweeps(store: Any, table: str) -> list[str]:
    """Sweep partitions present under ``table=<table>``."""
    from storage.store import ObjectStore

    if isinstance(store, ObjectStore):
        import pyarrow.fs as pafs

        try:
            infos = store.fs.get_file_info(pafs.FileSelector(store._p(f"table={table}"), allow_not_found=True))
        except (FileNotFoundError, OSError):
            return []
        return [i.base_name.split("=", 1)[1] for i in infos if i.base_name.startswith("sweep=")]
    d = Path(store.root) / f"table={table}"
    return [p.name.split("=", 1)[1] for p in d.iterdir() if p.name.startswith("sweep=")] if d.is_dir() else []


def lock_down(con: duckdb.DuckDBPyConnection, results: str | Path) -> None:
    """Forbid file access outside the results tree and any later change of that setting."""
    root = _root(results).rstrip("/") + "/"
    con.execute(f"SET allowed_directories = [{_sql_str(root)}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def read_only_query(results: str | Path, sql: str) -> pa.Table:
    """Run ``sql`` (SELECT / EXPLAIN / DESCRIBE / SHOW only) over the results; return an Arrow table."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse the query: {exc}") from None
    if not statements:
        raise QueryError("the query is empty")
    for st in statements:
        kind = str(st.type).rsplit(".", 1)[-1]
        if kind not in READ_ONLY_STATEMENTS:
            raise QueryError(
                f"refused a {kind} statement: `swapcheck query` is read-only "
                f"(allowed: {', '.join(sorted(READ_ONLY_STATEMENTS))}, DESCRIBE, SHOW); nothing was changed"
            )
    con = connect(results)
    lock_down(con, results)
    try:
        for st in statements[:-1]:
            con.execute(st.query)
        return _arrow(con.sql(statements[-1].query))
    except duckdb.Error as exc:
        raise QueryError(f"{type(exc).__name__}: {exc}") from None
    finally:
        con.close()


def named_query(name: str) -> str:
    """The SQL text of ``storage/queries/<name>.sql``."""
    try:
        return resources.files("storage.queries").joinpath(f"{name}.sql").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError(f"no named query {name!r}; available: {', '.join(query_names())}") from None


def query_names() -> list[str]:
    return sorted(p.name[:-4] for p in resources.files("storage.queries").iterdir() if p.name.endswith(".sql"))


def run_named(results: str | Path, name: str, **params: Any) -> pa.Table:
    """Run a named query with ``$param`` placeholders bound from ``params``."""
    con = connect(results)
    lock_down(con, results)
    try:
        return _arrow(con.sql(named_query(name), params=params or None))
    except duckdb.Error as exc:
        raise QueryError(f"named query {name!r} failed: {type(exc).__name__}: {exc}") from None
    finally:
        con.close()
