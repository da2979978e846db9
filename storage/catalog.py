"""DuckDB views over the Parquet tree, named queries, and a read-only query entry point.

Each table of ``storage.schemas.TABLES`` is a view with the same name (``kdepth``, ``units``,
``sweeps``, ``launches``, ...) plus its ``sweep`` partition column; a table with no files yet is an
empty view with the declared columns, so queries never fail for lack of results.

A command opens one :class:`Catalog` (one read-only DuckDB connection, the views created once) and
asks it every question it has; ``read_only_query`` and ``run_named`` are one-shot conveniences
(open, run one query, close) built on it.

**What a view reads.** Opening a catalog lists each table's partitions once and reads the ledger
(``units``). A result table's view is bound to exactly the files that ``ok`` ledger rows name (their
``files`` records; for rows written before those existed, ``<unit_id>.parquet`` of each table in
``tables``), each checked cheaply first: it exists, its size is the recorded ``bytes``, its Parquet
footer is readable, its row count is the recorded ``rows`` and its schema fits the declared one.
A file that fails is skipped and its unit marked: the ``units`` view adds ``damaged`` (bool) and
``damage`` (the first problem) to the ledger columns; a unit whose ledger file itself is unreadable
is a row with only ``unit_id``, ``sweep``, ``status = 'damaged'`` and those two.
A record whose path leaves its partition ``table=<t>/sweep=<s>/`` (``..``, absolute, a URI, a
symlink out of the root, another sweep or table: ``ResultStore.recorded``) is never bound: a
warning, and its unit is marked damaged. A file no ``ok`` ledger row names (an orphan) is not read. Every problem is one line of
:attr:`Catalog.warnings` naming the file and ``swapcheck sweep verify``; nothing is read silently.
The checks are metadata only: content checksums are ``swapcheck sweep verify``'s job. Tables that
are not a unit's results (``units``, ``sweeps``, ``launches``, ``preregistrations``), and sweeps
that have no ledger at all (trees written without the worker), are read whole, minus damaged files.

**Read-only by construction.** The views scan pyarrow datasets bound to explicit file lists (no
globbing, so ``[``, ``*``, ``?`` in ``--results`` are plain characters), registered with the
connection before it is locked: DuckDB itself never opens a result file. The connection's one
directory is a private spill directory (fresh, mode 0700, under ``$SWAPCHECK_SPILL_DIR`` or the
system's temporary directory, removed on close), so that a query larger than memory spills instead
of failing; then ``enable_external_access = false`` (COPY, EXPORT, ATTACH, INSTALL/LOAD,
``read_*``/``glob`` and every other file system route fail with a Permission Error on every path
but that spill directory, which DuckDB keeps reachable for itself) and ``lock_configuration =
true`` (no SET/PRAGMA/RESET can undo it). On top of that, user SQL passes an allow-list taken from DuckDB's own parse
(``duckdb.extract_statements``): SELECT (DESCRIBE, SHOW and SUMMARIZE parse as SELECT) and EXPLAIN
of a SELECT, never EXPLAIN ANALYZE (which runs its statement).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage.errors import PathEscape, QueryError
from storage.schemas import TABLES, UNITS, UNMANAGED_TABLES
from storage.store import ResultStore, open_store

__all__ = [
    "UNMANAGED_TABLES",
    "Catalog",
    "QueryError",
    "check_read_only",
    "connect",
    "lock_down",
    "named_queries",
    "named_query",
    "open_catalog",
    "query_names",
    "read_only_query",
    "run_named",
    "view_definitions",
    "write_views",
]

#: Statement kinds ``swapcheck query`` accepts: reading only (DESCRIBE, SHOW, SUMMARIZE parse as SELECT;
#: EXPLAIN only of a SELECT and never ANALYZE, checked separately).
READ_ONLY_STATEMENTS = {"SELECT", "EXPLAIN"}


#: Columns the ``units`` view adds to the ledger: whether a committed unit's files are damaged, and why.
DAMAGE_COLUMNS = [pa.field("damaged", pa.bool_()), pa.field("damage", pa.string())]

#: ``$name`` placeholders of a named query (after comments and string literals are removed).
_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_COMMENTS_AND_STRINGS = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'", re.DOTALL)
_ANALYZE = {"ANALYZE", "ANALYSE"}
_T = TypeVar("_T")
_R = TypeVar("_R")


def _arrow(result: Any) -> pa.Table:
    """The result as an Arrow table (DuckDB 2 calls it ``to_arrow_table``, 1.x ``fetch_arrow_table``)."""
    if result is None:  # a statement without a result set
        return pa.table({})
    fetch = getattr(result, "to_arrow_table", None) or result.arrow
    table = fetch()
    return table if isinstance(table, pa.Table) else table.read_all()


def sql_params(sql: str) -> list[str]:
    """The ``$name`` placeholders ``sql`` uses, in order of first use (comments and strings ignored)."""
    return list(dict.fromkeys(_PARAM.findall(_COMMENTS_AND_STRINGS.sub(" ", sql))))


# -- binding the views: which files each table reads ---------------------------------------------------

def _compatible(found: pa.DataType, declared: pa.DataType) -> bool:
    """Whether a column stored as ``found`` reads as ``declared`` without changing its meaning."""
    if found.equals(declared) or pa.types.is_null(found):
        return True
    same_family = (pa.types.is_integer, pa.types.is_floating, pa.types.is_timestamp, pa.types.is_boolean)
    if any(f(found) and f(declared) for f in same_family):
        return True
    if (pa.types.is_string(found) or pa.types.is_large_string(found)) and pa.types.is_string(declared):
        return True
    if pa.types.is_list(declared) and (pa.types.is_list(found) or pa.types.is_large_list(found)):
        return _compatible(found.value_type, declared.value_type)
    if pa.types.is_struct(declared) and pa.types.is_struct(found):
        names = {declared.field(i).name: declared.field(i).type for i in range(declared.num_fields)}
        return all(found.field(i).name in names and _compatible(found.field(i).type, names[found.field(i).name])
                   for i in range(found.num_fields))
    return False


def schema_problem(found: pa.Schema, declared: pa.Schema) -> str | None:
    """Why a file's schema is not ``declared``'s (a foreign file), or None if it reads as that table.

    A file may lack declared columns (older files: they read as NULL) but must hold at least one,
    and every column it has must be declared, with a compatible type.
    """
    types = {f.name: f.type for f in declared}
    foreign = [f"{f.name} ({f.type})" for f in found if f.name not in types]
    if foreign:
        return f"foreign schema: undeclared column(s) {', '.join(foreign)}"
    wrong = [f"{f.name} is {f.type}, declared {types[f.name]}" for f in found if not _compatible(f.type, types[f.name])]
    if wrong:
        return f"foreign schema: {'; '.join(wrong)}"
    if "unit_id" in types and "unit_id" not in found.names:
        return "foreign schema: no unit_id column"
    if not found.names:
        return "foreign schema: no columns"
    return None


@dataclass(frozen=True)
class _Want:
    """One file a view should read: where, its table and sweep, and what the ledger knows of it."""

    rel: str  # relative to the results root
    table: str
    sweep: str
    unit: tuple[str, str] | None = None  # (sweep, unit_id) of the ok ledger row naming it
    rows: int | None = None
    size: int | None = None


@dataclass
class _Bound:
    """What a catalog binds: each table's readable files, the ledger rows, and the warnings."""

    files: dict[str, list[_Want]] = field(default_factory=dict)  # "units": the readable ledger files
    ledger: list[pa.Table] = field(default_factory=list)  # _LEDGER_CHECKED columns + sweep
    lost: list[dict[str, Any]] = field(default_factory=list)  # units whose ledger file is unreadable
    damaged: dict[tuple[str, str], str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


#: The ledger columns read at open (the rest are read by queries of the ``units`` view).
_LEDGER_CHECKED = ["unit_id", "status", "tables", "files"]


def _parallel(fn: Callable[[_T], _R], items: list[_T], threads: bool) -> list[_R]:
    """``fn`` over ``items`` in order; on threads for a remote store (each read waits on the network)."""
    if not threads or len(items) < 16:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(fn, items))


class _Binder:
    """One pass over a results tree: list partitions once, read the ledger, check each file's metadata."""

    def __init__(self, store: ResultStore, label: str) -> None:
        self.store = store
        self.verify = f"run `swapcheck sweep verify --results {label}`"
        self.out = _Bound()

    def _abs(self, rel: str) -> str:
        return f"{self.store.base}/{rel}"

    def _listing(self) -> dict[str, dict[str, dict[str, int | None]]]:
        """table -> sweep -> {relative path: size} of every Parquet file, each table listed once."""
        out: dict[str, dict[str, dict[str, int | None]]] = {}
        for table in TABLES:
            out[table] = {}
            for sweep in self.store.sweep_partitions(table):
                rel_dir = f"table={table}/sweep={sweep}"
                try:
                    infos = self.store.fs.get_file_info(pafs.FileSelector(self._abs(rel_dir), allow_not_found=True))
                except OSError:
                    infos = []
                out[table][sweep] = {
                    f"{rel_dir}/{i.base_name}": (int(i.size) if i.size is not None else None)
                    for i in infos
                    if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                    and not i.base_name.startswith(".")
                }
        return out

    def _inspect(self, want: _Want, read: bool) -> tuple[str | None, pa.Table | None]:
        """Why ``want`` must not be read (footer, rows, schema), or None; and its rows when ``read``."""
        try:
            with self.store.fs.open_input_file(self._abs(want.rel)) as fh:
                pf = pq.ParquetFile(fh)
                if want.rows is not None and pf.metadata.num_rows != want.rows:
                    return f"holds {pf.metadata.num_rows} rows, the ledger recorded {want.rows}", None
                found = pf.schema_arrow
                problem = schema_problem(found, TABLES[want.table])
                if not read or problem is not None:
                    return problem, None
                cols = [c for c in _LEDGER_CHECKED if c in found.names]
                return None, pf.read(columns=cols, use_threads=False)
        except FileNotFoundError:
            return "missing (deleted?)", None
        except Exception as exc:  # noqa: BLE001 - any unreadable file is damage, never a traceback
            return f"not a readable Parquet file ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})", None

    def _warn(self, rel: str, problem: str, consequence: str) -> None:
        self.out.warnings.append(f"{rel}: {problem}; {consequence}; {self.verify}")

    def _check(self, wants: list[_Want], sizes: dict[str, int | None],
               read: bool = False) -> list[tuple[_Want, pa.Table | None]]:
        """The files of ``wants`` that pass the checks (with their rows when ``read``); a warning,
        and a damaged unit, for each other."""
        def inspect(w: _Want) -> tuple[str | None, pa.Table | None]:
            if w.rel not in sizes:
                return "missing (deleted?)", None
            if w.size is not None and sizes[w.rel] is not None and sizes[w.rel] != w.size:
                return f"is {sizes[w.rel]} bytes, the ledger recorded {w.size}", None
            return self._inspect(w, read)

        good = []
        for w, (p, rows) in zip(wants, _parallel(inspect, wants, threads=not self.store.local), strict=True):
            if p is None:
                good.append((w, rows))
                continue
            if w.unit is not None:
                self.out.damaged.setdefault(w.unit, f"{w.rel}: {p}")
                self._warn(w.rel, p, f"skipped, unit {w.unit[1]} of sweep {w.unit[0]} is marked damaged")
            else:
                self._warn(w.rel, p, "skipped")
        return good

    def _read_ledger(self, sizes: dict[str, dict[str, int | None]]) -> None:
        """Read what the checks need of every ledger file; a damaged one is a warning and a
        ``damaged`` row of its unit (``units`` shows the unit even though its row is lost)."""
        wants = [_Want(rel, "units", sweep, (sweep, rel.rsplit("/", 1)[1][: -len(".parquet")]))
                 for sweep, files in sizes.items() for rel in files]
        good = self._check(wants, {rel: size for files in sizes.values() for rel, size in files.items()}, read=True)
        self.out.files["units"] = [w for w, _ in good]
        parts = [t.append_column("sweep", pa.array([w.sweep] * len(t), pa.string())) for w, t in good if t is not None]
        if parts:
            t = pa.concat_tables(parts, promote_options="permissive")
            fields = [UNITS.field(c) for c in _LEDGER_CHECKED] + [pa.field("sweep", pa.string())]
            self.out.ledger.append(pa.Table.from_arrays(
                [t.column(f.name).cast(f.type) if f.name in t.column_names else pa.nulls(len(t), f.type)
                 for f in fields], schema=pa.schema(fields)))
        read = {w.rel for w, _ in good}
        self.out.lost = [{"unit_id": w.unit[1], "status": "damaged", "sweep": w.sweep}
                         for w in wants if w.rel not in read and w.unit is not None]

    def _expected(self) -> dict[str, list[_Want]]:
        """table -> the files ``ok`` ledger rows name (legacy rows: ``<unit_id>.parquet`` per table)."""
        out: dict[str, list[_Want]] = {t: [] for t in TABLES if t not in UNMANAGED_TABLES}
        for t in self.out.ledger:
            for row in t.select(["unit_id", "status", "tables", "files", "sweep"]).to_pylist():
                if row["status"] != "ok":
                    continue
                unit = (row["sweep"], row["unit_id"])
                records = row["files"]
                if records is None:
                    records = [{"table": tb, "path": f"table={tb}/sweep={row['sweep']}/{row['unit_id']}.parquet",
                                "rows": None, "bytes": None} for tb in row["tables"] or []]
                for i, rec in enumerate(records):
                    table, rel = rec.get("table"), str(rec.get("path") or "")
                    try:  # the one check of a recorded path (storage.store.ResultStore.recorded): never followed
                        self.store.recorded(row["sweep"], rec)
                    except PathEscape as exc:
                        self.out.damaged.setdefault(unit, f"{rel}: path_escape: {exc.why}")
                        field_name = f"files[{i}].path" if row["files"] is not None else "tables"
                        self._warn(rel or "(empty path)", f"ledger row of unit {unit[1]}, {field_name}: path_escape: {exc}",
                                   f"not read, unit {unit[1]} of sweep {unit[0]} is marked damaged")
                        continue
                    out[table].append(_Want(rel, table, row["sweep"], unit, rec.get("rows"), rec.get("bytes")))
        return out

    def bind(self) -> _Bound:
        listing = self._listing()
        self._read_ledger(listing["units"])
        ledgered = set(listing["units"])  # sweeps that have a ledger (even an unreadable one)
        expected = self._expected()
        for table in TABLES:
            if table == "units":
                continue  # read above
            flat = {rel: size for files in listing[table].values() for rel, size in files.items()}
            wants = list({w.rel: w for w in reversed(expected.get(table, []))}.values())[::-1]  # once each
            named = {w.rel for w in wants}
            for sweep, files in listing[table].items():
                for rel in files:
                    if rel in named:
                        continue
                    if table in UNMANAGED_TABLES or sweep not in ledgered:
                        wants.append(_Want(rel, table, sweep))  # nothing names these files: read them whole
                    else:
                        self._warn(rel, "not named by any ok ledger row (an orphan)", "not read")
            self.out.files[table] = [w for w, _ in self._check(wants, flat)]
        return self.out


# -- the connection ---------------------------------------------------------------------------------

def _dataset(store: ResultStore, table: str, wants: list[_Want]) -> pa.Table | pads.Dataset:
    schema = TABLES[table].append(pa.field("sweep", pa.string()))
    if not wants:
        return pa.Table.from_pylist([], schema=schema)
    # Page CRCs (written by the store) are verified on every read: a file whose bytes changed under an
    # intact footer fails the query instead of feeding it wrong numbers.
    fmt = pads.ParquetFileFormat(
        default_fragment_scan_options=pads.ParquetFragmentScanOptions(page_checksum_verification=True))
    return pads.FileSystemDataset.from_paths(
        [f"{store.base}/{w.rel}" for w in wants], schema=schema, format=fmt,
        filesystem=store.fs, partitions=[pads.field("sweep") == w.sweep for w in wants])


def _bind_units(con: duckdb.DuckDBPyConnection, store: ResultStore, bound: _Bound) -> None:
    """The ``units`` view: the readable ledger files, plus ``damaged`` / ``damage`` (why) of each unit,
    plus a ``damaged`` row for each unit whose ledger file is unreadable."""
    full = UNITS.append(pa.field("sweep", pa.string()))
    con.register("_units_ledger", _dataset(store, "units", bound.files["units"]))
    con.register("_units_damage", pa.Table.from_pylist(
        [{"sweep": k[0], "unit_id": k[1], "damage": v} for k, v in bound.damaged.items()],
        schema=pa.schema([("sweep", pa.string()), ("unit_id", pa.string()), ("damage", pa.string())])))
    lost = [{**row, "damaged": True, "damage": bound.damaged.get((row["sweep"], row["unit_id"]))} for row in bound.lost]
    con.register("_units_lost", pa.Table.from_pylist(lost, schema=pa.schema([*full, *DAMAGE_COLUMNS])))
    con.execute(
        "CREATE VIEW units AS SELECT l.*, d.unit_id IS NOT NULL AS damaged, d.damage "
        "FROM _units_ledger AS l LEFT JOIN _units_damage AS d ON l.sweep = d.sweep AND l.unit_id = d.unit_id "
        "UNION ALL BY NAME SELECT * FROM _units_lost"
    )


#: The parent of each connection's private spill directory (default: the system's temporary directory).
SPILL_DIR_ENV = "SWAPCHECK_SPILL_DIR"
#: DuckDB's memory limit for a catalog's connection (e.g. ``8GB``); default :func:`default_memory_limit`.
MEMORY_LIMIT_ENV = "SWAPCHECK_DUCKDB_MEMORY"


def default_memory_limit() -> str:
    """Half the machine's physical memory. DuckDB's own default (80%) leaves too little for what it
    does not count: the views scan pyarrow datasets, whose batches live outside DuckDB's buffer
    manager, so ``report all`` over 100M rows at 80% was killed by the kernel's OOM killer (24 GiB
    machine); with half, DuckDB spills (:func:`_spill_dir`) instead."""
    import os

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return ""
    return f"{max(256, total // 2 // 2**20)}MB"


def _spill_dir() -> str:
    """A fresh private (0700) directory for DuckDB to spill to, removed when the process exits
    (and by :meth:`Catalog.close`). Without one, a query larger than memory (the agreement grid at
    100M rows) fails with DuckDB's Out of Memory error instead of spilling."""
    import atexit
    import os
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="swapcheck-spill-", dir=os.environ.get(SPILL_DIR_ENV) or None)
    atexit.register(shutil.rmtree, path, True)
    return path


def _open(store: ResultStore, bound: _Bound, spill: str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory connection that cannot touch a file outside its private spill directory
    ``spill`` (none: no spilling), with one view per table over ``bound``."""
    import os

    config: dict[str, str | bool | int | float | list[str]] = {"temp_directory": spill or ""}
    limit = os.environ.get(MEMORY_LIMIT_ENV) or default_memory_limit()
    if limit:
        config["memory_limit"] = limit
    con = duckdb.connect(":memory:", config=config)
    Catalog.connections_opened += 1
    try:
        if not spill:
            con.execute("SET max_temp_directory_size = '0B'")
        con.execute("SET enable_external_access = false")  # no allowed directory: no file, any path
        _bind_units(con, store, bound)
        for table in TABLES:
            if table != "units":
                con.register(table, _dataset(store, table, bound.files[table]))  # DuckDB opens no file
    except BaseException:
        con.close()
        raise
    return con


def connect(results: str | Path, store: ResultStore | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with one view per results table (local path or URI).

    File access is already off; :func:`lock_down` locks the configuration (:class:`Catalog` does
    both, and keeps the warnings this drops).
    """
    store = store if store is not None else open_store(results)
    return _open(store, _Binder(store, str(results)).bind())


def lock_down(con: duckdb.DuckDBPyConnection, results: str | Path | None = None) -> None:
    """Forbid every file system access and any later change of the configuration (``results``: unused)."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


# -- the allow-list -----------------------------------------------------------------------------------

def _kind(st: Any) -> str:
    return str(st.type).rsplit(".", 1)[-1]


def _explained(query: str) -> str:
    """The statement an EXPLAIN explains; QueryError for EXPLAIN ANALYZE (it runs the statement)."""
    starts = [pos for pos, _kind_ in duckdb.tokenize(query)]
    tokens = [(pos, query[pos:end].strip().upper()) for (pos, kind), end in
              zip(duckdb.tokenize(query), [*starts[1:], len(query)], strict=True)
              if kind != duckdb.token_type.comment]
    i, depth = 1, 0  # tokens[0] is EXPLAIN
    while i < len(tokens):
        word = tokens[i][1]
        if word in _ANALYZE:
            raise QueryError("refused EXPLAIN ANALYZE: it runs its statement; `swapcheck query` is read-only "
                             "(use EXPLAIN); nothing was changed")
        if word == "(":
            depth += 1
        elif word == ")":
            depth -= 1
        elif depth == 0:
            return query[tokens[i][0]:]
        i += 1
    return ""


def check_read_only(sql: str) -> list[Any]:
    """The statements of ``sql``; QueryError unless every one of them only reads (DuckDB's own parse)."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse the query: {exc}") from None
    if not statements:
        raise QueryError("the query is empty")
    for st in statements:
        kind = _kind(st)
        if kind == "EXPLAIN":
            inner = check_read_only(_explained(st.query))
            kind = "EXPLAIN " + _kind(inner[0]) if len(inner) != 1 or _kind(inner[0]) != "SELECT" else kind
        if kind not in READ_ONLY_STATEMENTS:
            raise QueryError(
                f"refused a {kind} statement: `swapcheck query` is read-only "
                "(allowed: SELECT, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN of a SELECT); nothing was changed"
            )
    return list(statements)


class Catalog:
    """One read-only DuckDB connection over a results tree; the views are created once.

    ``warnings`` lists every file the views do not read (damaged, missing, foreign, orphaned), one
    line each naming the file and ``swapcheck sweep verify``; commands print them before the output.
    """

    #: Incremented for every DuckDB connection opened over a results tree (tests count it).
    connections_opened: ClassVar[int] = 0

    def __init__(self, results: str | Path) -> None:
        self.results = str(results)
        self.store = open_store(results)
        self._con: duckdb.DuckDBPyConnection | None = None
        self._spill: str | None = None
        bound = _Binder(self.store, self.results).bind()
        self.warnings: list[str] = bound.warnings
        self._spill = _spill_dir()
        con = _open(self.store, bound, self._spill)
        try:
            lock_down(con)
        except BaseException:
            con.close()
            raise
        self._con = con

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            raise QueryError(f"the catalog over {self.results} is closed")
        return self._con

    def _failed(self, what: str, exc: duckdb.Error) -> QueryError:
        text = f"{what}{type(exc).__name__}: {exc}"
        if any(w in str(exc).lower() for w in ("arrow", "parquet", "checksum", "ioerror")):
            text += f" (a result file may be damaged: run `swapcheck sweep verify --results {self.results}`)"
        return QueryError(text)

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
            raise self._failed(f"named query {name!r} failed: ", exc) from None

    def query(self, sql: str, **params: Any) -> pa.Table:
        """Run user ``sql`` (SELECT / EXPLAIN / DESCRIBE / SHOW / SUMMARIZE only); return an Arrow table.

        Several statements run in order and the last one's result is returned. ``params`` bind the
        ``$name`` placeholders of the last statement (values, never SQL text).
        """
        statements = check_read_only(sql)
        con = self.con
        try:
            for st in statements[:-1]:
                con.execute(st.query).fetchall()
            last = statements[-1].query
            bound = {p: params.get(p) for p in sql_params(last)}
            return _arrow(con.sql(last, params=bound or None))
        except duckdb.Error as exc:
            raise self._failed("", exc) from None

    def sweeps(self) -> list[str]:
        """The sweeps that have a spec record."""
        return self.store.sweeps()

    def all_sweeps(self) -> list[str]:
        """Every sweep of the results, sorted: those with a spec record and those that only the
        partitions of a table name (a tree written without spec records)."""
        from storage.schemas import TABLES

        known = set(self.sweeps())
        known.update(s for table in TABLES for s in self.store.sweep_partitions(table))
        return sorted(known)

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
        if self._spill is not None:
            import shutil

            shutil.rmtree(self._spill, ignore_errors=True)
            self._spill = None

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
    check_read_only(sql)  # refuse before listing the results tree
    with Catalog(results) as cat:
        return cat.query(sql)


#: ``-- include: <fragment>``: a line of a named query replaced by ``storage/queries/<fragment>.sql``
#: (CTEs that several queries share; a fragment's name starts with ``_`` and it is no query of its own).
_INCLUDE = re.compile(r"^-- include: (_[a-z0-9_]+)$", re.MULTILINE)


def named_query(name: str) -> str:
    """The SQL text of ``storage/queries/<name>.sql``, its ``-- include:`` lines replaced by the fragments."""
    try:
        sql = resources.files("storage.queries").joinpath(f"{name}.sql").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError(f"no named query {name!r}; available: {', '.join(query_names())}") from None
    return _INCLUDE.sub(lambda m: _fragment(m.group(1)).rstrip("\n"), sql)


def _fragment(name: str) -> str:
    return resources.files("storage.queries").joinpath(f"{name}.sql").read_text(encoding="utf-8")


def query_names() -> list[str]:
    """The named queries (fragments, ``_*.sql``, are not queries)."""
    return sorted(p.name[:-4] for p in resources.files("storage.queries").iterdir()
                  if p.name.endswith(".sql") and not p.name.startswith("_"))


def run_named(results: str | Path, name: str, **params: Any) -> pa.Table:
    """Run a named query with ``$param`` placeholders bound from ``params`` (one-shot)."""
    with Catalog(results) as cat:
        return cat.named_arrow(name, **params)


def named_queries() -> list[dict[str, Any]]:
    """The named queries a user can run (``swapcheck query --list``): name, the first line of its header
    comment, and its ``$parameters``. Templates with ``{{fragments}}`` (``prediction_*``) are left out:
    they run only as ``reports.predictions`` fills them."""
    out = []
    for name in query_names():
        sql = named_query(name)
        if "{{" in sql:
            continue
        first = next((line.lstrip("- ").strip() for line in sql.splitlines() if line.startswith("--")), "")
        out.append({"name": name, "summary": first, "parameters": sql_params(sql)})
    return out


# -- swapcheck db: the same views for the `duckdb` shell ------------------------------------------------

def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _typed_empty(schema: pa.Schema) -> str:
    """``SELECT CAST(NULL AS <type>) AS <col>, ... WHERE false``: the declared columns, in order, no rows."""
    con = duckdb.connect(":memory:")
    try:
        rel = con.from_arrow(pa.Table.from_pylist([], schema=schema))
        cols = [f"CAST(NULL AS {t}) AS {_ident(c)}" for c, t in zip(rel.columns, rel.types, strict=True)]
    finally:
        con.close()
    return f"SELECT {', '.join(cols)} WHERE false"


def _scan(paths: list[str], wants: list[_Want], schema: pa.Schema) -> str:
    """The declared columns plus ``sweep`` over exactly ``wants``: one ``read_parquet`` per sweep, the
    partition directories never parsed (``hive_partitioning = false``: no ``table`` column)."""
    parts = [_typed_empty(schema.append(pa.field("sweep", pa.string())))]
    by_sweep: dict[str, list[str]] = {}
    for path, w in zip(paths, wants, strict=True):
        by_sweep.setdefault(w.sweep, []).append(path)
    for sweep, files in sorted(by_sweep.items()):
        listed = ", ".join(_literal(f) for f in files)
        parts.append(f"SELECT *, {_literal(sweep)} AS sweep FROM read_parquet([{listed}], "
                     "hive_partitioning = false, union_by_name = true)")
    return "\nUNION ALL BY NAME\n".join(parts)


def _rows(columns: list[str], rows: list[tuple[str | None, ...]]) -> str:
    """A literal VALUES table of VARCHAR columns (``WHERE false`` when empty)."""
    if not rows:
        return "SELECT " + ", ".join(f"CAST(NULL AS VARCHAR) AS {_ident(c)}" for c in columns) + " WHERE false"
    values = ", ".join("(" + ", ".join("NULL" if v is None else _literal(v) for v in r) + ")" for r in rows)
    return f"SELECT * FROM (VALUES {values}) AS v({', '.join(_ident(c) for c in columns)})"


def view_definitions(results: str | Path) -> tuple[str, list[str]]:
    """``CREATE VIEW`` statements that open the catalog's tables in any DuckDB (``swapcheck db``), and
    the catalog's warnings.

    Each view reads exactly the files a :class:`Catalog` binds now (same checks, same skips: the
    lists are fixed, so export again after new results), with the declared columns and ``sweep``;
    ``units`` adds ``damaged`` and ``damage`` as the catalog's view does.
    """
    store = open_store(results)
    bound = _Binder(store, str(results)).bind()
    text = str(results)
    prefix = text.split("://", 1)[0] + "://" if "://" in text and not store.local else ""

    def paths(wants: list[_Want]) -> list[str]:
        return [f"{prefix}{store.base}/{w.rel}" for w in wants]

    statements = []
    for table in TABLES:
        wants = bound.files[table]
        body = _scan(paths(wants), wants, TABLES[table])
        if table == "units":
            damage = _rows(["sweep", "unit_id", "damage"], [(k[0], k[1], v) for k, v in bound.damaged.items()])
            lost = _rows(["unit_id", "status", "sweep", "damage"],
                         [(r["unit_id"], "damaged", r["sweep"], bound.damaged.get((r["sweep"], r["unit_id"])))
                          for r in bound.lost])
            body = (f"SELECT l.*, d.unit_id IS NOT NULL AS damaged, d.damage FROM (\n{body}\n) AS l\n"
                    f"LEFT JOIN ({damage}) AS d ON l.sweep = d.sweep AND l.unit_id = d.unit_id\n"
                    f"UNION ALL BY NAME SELECT *, true AS damaged FROM ({lost})")
        statements.append(f"CREATE OR REPLACE VIEW {_ident(table)} AS\n{body};")
    header = (f"-- swapcheck db: one view per table of {text}, over the files the catalog binds now\n"
              "-- (export again after new results). Open with: duckdb -init views.sql, or .read views.sql\n")
    return header + "\n\n".join(statements) + "\n", bound.warnings


def write_views(results: str | Path, out: str | Path) -> tuple[list[str], list[str]]:
    """Write :func:`view_definitions` to ``out``: SQL text for ``*.sql``, else a DuckDB database file
    holding the views (replaced whole). Returns the view names and the catalog's warnings."""
    import os

    sql, warnings = view_definitions(results)
    target = Path(out)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    if target.suffix.lower() == ".sql":
        tmp.write_text(sql, encoding="utf-8")
    else:
        tmp.unlink(missing_ok=True)
        con = duckdb.connect(str(tmp))
        try:
            con.execute(sql)
        finally:
            con.close()
    tmp.replace(target)
    return list(TABLES), warnings
