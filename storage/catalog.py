"""DuckDB views over the Parquet tree, named queries, and a read-only query entry point.

Each table of ``storage.schemas.TABLES`` is a view with the same name (``kdepth``, ``units``,
``sweeps``, ``launches``, ...) plus its ``sweep`` partition column; a table with no files yet is an
empty view with the declared columns, so queries never fail for lack of results.

A command opens one :class:`Catalog` (one read-only DuckDB connection, the views created once) and
asks it every question it has; ``read_only_query`` and ``run_named`` are one-shot conveniences
(open, run one query, close) built on it.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

import duckdb
import pyarrow as pa

from storage.errors import QueryError
from storage.schemas import TABLES
from storage.store import ResultStore, is_uri, open_store

__all__ = [
    "Catalog",
    "QueryError",
    "connect",
    "lock_down",
    "named_query",
    "open_catalog",
    "query_names",
    "read_only_query",
    "run_named",
]

#: Statement kinds ``swapcheck query`` accepts: reading only (DESCRIBE and SHOW parse as SELECT).
READ_ONLY_STATEMENTS = {"SELECT", "EXPLAIN"}

#: ``$name`` placeholders of a named query (after comments and string literals are removed).
_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_COMMENTS_AND_STRINGS = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'", re.DOTALL)


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
    return str(results).rstrip("/") if is_uri(results) else str(Path(results).resolve())


def sql_params(sql: str) -> list[str]:
    """The ``$name`` placeholders ``sql`` uses, in order of first use (comments and strings ignored)."""
    return list(dict.fromkeys(_PARAM.findall(_COMMENTS_AND_STRINGS.sub(" ", sql))))


def connect(results: str | Path, store: ResultStore | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with one view per results table (local path or URI).

    Lists each table's sweep partitions once (``ResultStore.sweep_partitions``). The connection is
    not locked down yet: see :func:`lock_down`, or use :class:`Catalog`, which does both.
    """
    root = _root(results)
    store = store if store is not None else open_store(results)
    con = duckdb.connect(":memory:")
    Catalog.connections_opened += 1
    if is_uri(results) and not root.startswith("file://"):
        # s3:// gs:// https://: DuckDB's httpfs extension (credentials from the environment).
        con.execute("INSTALL httpfs; LOAD httpfs")
    for table, schema in TABLES.items():
        if any(store.parquet_files(table, sw) for sw in store.sweep_partitions(table)):
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


def lock_down(con: duckdb.DuckDBPyConnection, results: str | Path) -> None:
    """Forbid file access outside the results tree and any later change of that setting."""
    root = _root(results).rstrip("/") + "/"
    con.execute(f"SET allowed_directories = [{_sql_str(root)}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _read_only_statements(sql: str) -> list[Any]:
    """The statements of ``sql``; QueryError unless every one of them only reads."""
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
    return list(statements)


class Catalog:
    """One read-only DuckDB connection over a results tree; the views are created once."""

    #: Incremented for every DuckDB connection opened over a results tree (tests count it).
    connections_opened: ClassVar[int] = 0

    def __init__(self, results: str | Path) -> None:
        self.results = str(results)
        self.store = open_store(results)
        self._con: duckdb.DuckDBPyConnection | None = None
        con = connect(results, self.store)
        try:
            lock_down(con, results)
        except BaseException:
            con.close()
            raise
        self._con = con

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            raise QueryError(f"the catalog over {self.results} is closed")
        return self._con

    def named(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """Rows of ``storage/queries/<name>.sql`` with its ``$param`` placeholders bound from ``params``."""
        rows: list[dict[str, Any]] = self.named_arrow(name, **params).to_pylist()
        return rows

    def named_arrow(self, name: str, **params: Any) -> pa.Table:
        """``named`` as an Arrow table. Binds exactly the placeholders the SQL uses (missing ones as NULL)."""
        sql = named_query(name)
        bound = {p: params.get(p) for p in sql_params(sql)}
        try:
            return _arrow(self.con.sql(sql, params=bound or None))
        except duckdb.Error as exc:
            raise QueryError(f"named query {name!r} failed: {type(exc).__name__}: {exc}") from None

    def query(self, sql: str, **params: Any) -> pa.Table:
        """Run user ``sql`` (SELECT / EXPLAIN / DESCRIBE / SHOW only); return an Arrow table.

        ``params`` bind the ``$name`` placeholders of the last statement (values, never SQL text).
        """
        statements = _read_only_statements(sql)
        con = self.con
        try:
            for st in statements[:-1]:
                con.execute(st.query)
            last = statements[-1].query
            bound = {p: params.get(p) for p in sql_params(last)}
            return _arrow(con.sql(last, params=bound or None))
        except duckdb.Error as exc:
            raise QueryError(f"{type(exc).__name__}: {exc}") from None

    def sweeps(self) -> list[str]:
        """The sweeps that have a spec record."""
        return self.store.sweeps()

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def open_catalog(results: str | Path) -> Catalog:
    """The read-only catalog over ``--results`` (a local directory or a pyarrow filesystem URI)."""
    return Catalog(results)


def read_only_query(results: str | Path, sql: str) -> pa.Table:
    """Run ``sql`` (SELECT / EXPLAIN / DESCRIBE / SHOW only) over the results; return an Arrow table."""
    _read_only_statements(sql)  # refuse before listing the results tree
    with Catalog(results) as cat:
        return cat.query(sql)


def named_query(name: str) -> str:
    """The SQL text of ``storage/queries/<name>.sql``."""
    try:
        return resources.files("storage.queries").joinpath(f"{name}.sql").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError(f"no named query {name!r}; available: {', '.join(query_names())}") from None


def query_names() -> list[str]:
    return sorted(p.name[:-4] for p in resources.files("storage.queries").iterdir() if p.name.endswith(".sql"))


def run_named(results: str | Path, name: str, **params: Any) -> pa.Table:
    """Run a named query with ``$param`` placeholders bound from ``params`` (one-shot)."""
    with Catalog(results) as cat:
        return cat.named_arrow(name, **params)
