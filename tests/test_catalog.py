"""The catalog (one read-only DuckDB connection per command) and the one store over pyarrow.fs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest
from _library_facts import fact

from storage.catalog import Catalog, QueryError, open_catalog, read_only_query, run_named
from storage.errors import StorageError
from storage.schemas import TABLES
from storage.store import ResultStore, open_store


def _unit(uid: str, status: str = "ok") -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"unit_id": uid, "kind": "kdepth", "experiment": "e", "description": "", "params_json": "{}",
            "status": status, "attempts": 1, "host": "h", "pid": 1, "node_id": "n", "started_at": now,
            "finished_at": now, "duration_s": 0.5, "error": None if status == "ok" else "boom",
            "tables": ["kdepth"], "rows": 1, "spec_sha256": "x", "swapcheck_version": "0", "torch_version": "2"}


def _kdepth(uid: str, differing: int) -> dict[str, Any]:
    return {"unit_id": uid, "experiment": "e", "dtype": "int8", "m": 16, "n": 24, "k": 32, "seed": 0,
            "impl_a": "a", "impl_b": "b", "elements": 384, "differing": differing}


def _sweep_record() -> dict[str, Any]:
    return {"spec_sha256": "x", "question": "q", "spec_path": "s.toml", "spec_toml": "", "n_units": 2,
            "unit_ids": ["u1", "u2"], "created_at": datetime.now(UTC)}


def _populate(store: ResultStore) -> None:
    """Two sweeps: s1 (one ok unit, one failed unit, a spec record) and s2 (one ok unit, no record)."""
    store.write("sweeps", "s1", "spec", [_sweep_record()])
    store.write("kdepth", "s1", "u1", [_kdepth("u1", 3)])
    store.record_unit("s1", _unit("u1", "ok"))
    store.record_unit("s1", _unit("u2", "failed"))
    store.write("kdepth", "s2", "v1", [_kdepth("v1", 0)])
    store.record_unit("s2", _unit("v1", "ok"))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    _populate(ResultStore(root))
    return root


def test_named_queries_with_and_without_sweep(results: Path) -> None:
    with open_catalog(results) as cat:
        assert cat.results == str(results)
        every = cat.named("unit_status", sweep=None)
        assert {(r["sweep"], r["status"], r["units"]) for r in every} == {("s1", "ok", 1), ("s1", "failed", 1), ("s2", "ok", 1)}
        assert cat.named("unit_status") == every, "a parameter the SQL uses but nobody gave is NULL"
        only = cat.named("unit_status", sweep="s1", unused="ignored")
        assert {(r["sweep"], r["status"]) for r in only} == {("s1", "ok"), ("s1", "failed")}
        assert cat.named_arrow("unit_status", sweep="s2").num_rows == 1
        assert cat.query("SELECT sum(differing) AS d FROM kdepth").to_pylist() == [{"d": 3}]
        assert cat.sweeps() == ["s1"], "only sweeps with a spec record"
        with pytest.raises(QueryError, match="no named query"):
            cat.named("no_such_query")
    assert run_named(results, "unit_status", sweep="s2").num_rows == 1


@pytest.mark.parametrize("sql", ["INSERT INTO units SELECT * FROM units", "COPY (SELECT 1) TO 'out.csv'",
                                 "ATTACH 'x.db'", "SELECT 1; DROP VIEW units"])
def test_catalog_query_refuses_writes(results: Path, sql: str) -> None:
    before = sorted(p.name for p in results.parent.rglob("*"))
    with Catalog(results) as cat:
        with pytest.raises(QueryError):
            cat.query(sql)
        # the connection is still usable, and nothing changed
        assert cat.query("SELECT count(*) AS n FROM units").to_pylist() == [{"n": 3}]
    assert sorted(p.name for p in results.parent.rglob("*")) == before
    assert issubclass(QueryError, StorageError)


def test_catalog_cannot_read_outside_results(results: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with Catalog(results) as cat, pytest.raises(QueryError, match="(?i)permission|access"):
        cat.query(f"SELECT * FROM read_csv('{secret}')")


def test_views_exist_for_empty_tables(results: Path, tmp_path: Path) -> None:
    for root in (results, tmp_path / "empty"):
        root.mkdir(exist_ok=True)
        with Catalog(root) as cat:
            for table, schema in TABLES.items():
                cols = [r["column_name"] for r in cat.query(f'DESCRIBE "{table}"').to_pylist()]
                assert set(schema.names) | {"sweep"} <= set(cols), table
            assert cat.query("SELECT count(*) AS n FROM replay").to_pylist() == [{"n": 0}]


def test_opening_a_catalog_lists_each_table_once_and_opens_one_connection(
        results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listed: list[str] = []
    real = ResultStore.sweep_partitions

    def counting(self: ResultStore, table: str) -> list[str]:
        listed.append(table)
        return real(self, table)

    opened: list[str] = []
    real_connect = duckdb.connect

    def counting_connect(*args: Any, **kwargs: Any) -> duckdb.DuckDBPyConnection:
        opened.append(str(args[0] if args else kwargs.get("database")))
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(ResultStore, "sweep_partitions", counting)
    monkeypatch.setattr(duckdb, "connect", counting_connect)
    before = Catalog.connections_opened
    with Catalog(results) as cat:
        assert sorted(listed) == sorted(TABLES), "each table's partitions listed exactly once"
        assert Catalog.connections_opened == before + 1 and len(opened) == 1
        listed.clear()
        for _ in range(3):
            cat.named("unit_status", sweep=None)
            cat.query("SELECT count(*) FROM kdepth")
        assert listed == [] and len(opened) == 1, "queries reuse the views and the connection"
    with pytest.raises(QueryError, match="closed"):
        cat.query("SELECT 1")


@pytest.mark.parametrize("kind", ["path", "file_uri"])
def test_path_and_file_uri_give_the_same_answers(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "r"
    store = open_store(root if kind == "path" else f"file://{root}")
    assert isinstance(store, ResultStore) and not store.exists()
    _populate(store)
    assert store.mark_attempt("s1", "u1", "node") == 1 and store.mark_attempt("s1", "u1") == 2
    assert store.exists()
    assert store.ledger("s1") == {"u1": {"unit_id": "u1", "status": "ok", "attempts": 1, "error": None},
                                  "u2": {"unit_id": "u2", "status": "failed", "attempts": 1, "error": "boom"}}
    assert store.done_units("s1") == {"u1"} and store.done_units("s2") == {"v1"} and store.done_units("s3") == set()
    assert store.sweeps() == ["s1"]
    assert store.sweep_partitions("units") == ["s1", "s2"] and store.sweep_partitions("replay") == []
    assert store.read_unit("kdepth", "s1", "u1", columns=["unit_id", "differing"]) == [{"unit_id": "u1", "differing": 3}]
    assert store.read_unit("kdepth", "s1", "nope") == [] and store.read_unit("replay", "s9", "u1") == []
    assert store.attempts("s1", "u1") == 2 and store.attempts("s1", "u2") == 0
    assert [m["unit_id"] for m in store.attempt_markers("s1")] == ["u1", "u1"]
    assert (store.sweep_record("s1") or {})["question"] == "q" and store.sweep_record("s2") is None
    assert [Path(p).name for p in store.parquet_files("units", "s1")] == ["u1.parquet", "u2.parquet"]
    # What one wrote, the other reads: they are the same files.
    other = open_store(f"file://{root}" if kind == "path" else root)
    assert other.ledger("s1") == store.ledger("s1") and other.sweeps() == store.sweeps()
    assert read_only_query(root, "SELECT count(*) AS n FROM units").to_pylist() == [{"n": 3}]


@pytest.mark.parametrize("kind", ["path", "file_uri"])
def test_local_writes_are_atomic_and_leave_no_temporary_files(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "r"
    store = open_store(root if kind == "path" else f"file://{root}")
    store.record_unit("s", _unit("u1", "failed"))
    store.record_unit("s", _unit("u1", "ok"))  # replaces the file: still one row
    store.mark_attempt("s", "u1")
    where = store.put_bytes("nightly/x/report.md", b"# hi")
    assert where.endswith("nightly/x/report.md") and (root / "nightly" / "x" / "report.md").read_bytes() == b"# hi"
    store.write_text("nightly/x/report.md", "# again")
    assert (root / "nightly" / "x" / "report.md").read_text() == "# again"
    names = [p.name for p in root.rglob("*") if p.is_file()]
    assert not [n for n in names if ".tmp" in n], names
    assert store.ledger("s") == {"u1": {"unit_id": "u1", "status": "ok", "attempts": 1, "error": None}}


@pytest.mark.parametrize("sql", [
    "COPY (SELECT * EXCLUDE (sweep) FROM kdepth) TO '{root}/table=kdepth/sweep=s1/dup.parquet' (FORMAT parquet)",
    "EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{root}/x.csv'",
    "EXPORT DATABASE '{tmp}/export'",
    "ATTACH '{tmp}/x.db' AS x",
    "SELECT * FROM read_parquet('{root}/table=kdepth/sweep=s1/u1.parquet')",
    "SELECT * FROM glob('{tmp}/*')",
    "INSTALL httpfs",
])
def test_the_connection_itself_cannot_touch_files(results: Path, tmp_path: Path, sql: str) -> None:
    """Below the allow-list: DuckDB, with its configuration locked, refuses every file access."""
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with Catalog(results) as cat:
        with pytest.raises(duckdb.PermissionException):
            cat.con.execute(sql.format(root=results, tmp=tmp_path))
        settings = dict(cat.con.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN "
            "('enable_external_access', 'lock_configuration', 'temp_directory', 'allowed_directories')").fetchall())
        spill = Path(settings.pop("temp_directory"))  # the one directory: private, fresh, outside the results
        assert spill.is_dir() and spill.stat().st_mode & 0o777 == 0o700 and list(spill.iterdir()) == []
        assert not spill.is_relative_to(results) and not spill.is_relative_to(tmp_path)
        allowed = [d for d in settings.pop("allowed_directories").strip("[]").split(", ") if d]
        assert all(Path(d) == spill for d in allowed)  # no directory but the spill directory
        assert settings == {"enable_external_access": "false", "lock_configuration": "true"}
        with pytest.raises(duckdb.Error, match="locked"):
            cat.con.execute("SET enable_external_access = true")
    assert not spill.exists()  # removed on close
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


#: Whether DuckDB, its external access off, keeps its temp_directory in allowed_directories (reachable
#: for its own spilling).  Checked on duckdb 2.0.1.
DUCKDB_ALLOWS_ITS_SPILL_DIRECTORY = {">=2.0,<2.1": True}


def test_duckdb_keeps_its_spill_directory_allowed(results: Path) -> None:
    keeps = fact("duckdb", DUCKDB_ALLOWS_ITS_SPILL_DIRECTORY,
                 what="allowed_directories with enable_external_access = false and a temp_directory")
    with Catalog(results) as cat:
        spill, allowed = cat.con.sql("SELECT current_setting('temp_directory'), "
                                     "current_setting('allowed_directories')::VARCHAR").fetchall()[0]
    assert (allowed == f"[{spill}/]") == keeps


def test_a_query_larger_than_memory_spills_to_the_private_directory(results: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """At 100M per-position rows the agreement grid needs more than this machine's memory: without a
    spill directory DuckDB failed with Out of Memory; with one the query completes."""
    from storage.catalog import MEMORY_LIMIT_ENV, SPILL_DIR_ENV

    monkeypatch.setenv(MEMORY_LIMIT_ENV, "40MB")
    monkeypatch.setenv(SPILL_DIR_ENV, str(tmp_path))
    sql = "SELECT count(*) AS n, sum(x) AS s FROM (SELECT i % 3000000 AS k, max(i) AS x FROM range(6000000) t(i) GROUP BY k)"
    with Catalog(results) as cat:
        spill = Path(cat.con.sql("SELECT current_setting('temp_directory')").fetchall()[0][0])
        assert spill.parent == tmp_path
        assert cat.query(sql).to_pylist() == [{"n": 3000000, "s": sum(range(3000000, 6000000))}]
    assert not spill.exists()


@pytest.mark.parametrize("sql", ["EXPLAIN ANALYZE SELECT 1", "EXPLAIN (ANALYZE) SELECT 1", "explain -- c\n analyse SELECT 1",
                                 "EXPLAIN (FORMAT json, ANALYZE) SELECT 1", "EXPLAIN COPY (SELECT 1) TO 'x.csv'",
                                 "PIVOT kdepth ON dtype", "CALL pragma_version()", "SELECT 1; CREATE TABLE t (a INT)"])
def test_allow_list_from_duckdbs_parse(results: Path, sql: str) -> None:
    with Catalog(results) as cat:
        with pytest.raises(QueryError, match="read-only"):
            cat.query(sql)
        assert cat.query("EXPLAIN (FORMAT json) SELECT * FROM kdepth").num_rows == 1
        assert cat.query("SELECT 1 AS a; SELECT 2 AS b").to_pylist() == [{"b": 2}]


def test_clean_tree_has_no_warnings_and_no_damaged_units(results: Path) -> None:
    with Catalog(results) as cat:
        assert cat.warnings == []
        assert cat.query("SELECT count(*) FILTER (WHERE damaged) AS d, count(*) AS n FROM units").to_pylist() == \
            [{"d": 0, "n": 3}]


def test_orphans_and_failed_units_files_are_not_read(results: Path) -> None:
    store = ResultStore(results)
    store.write("kdepth", "s1", "dup", [_kdepth("forged", 1000)])  # an orphan: no ledger row names it
    store.write("kdepth", "s1", "u2", [_kdepth("u2", 1000)])  # u2's ledger row says failed
    with Catalog(results) as cat:
        assert cat.query("SELECT sum(differing) AS d FROM kdepth WHERE sweep = 's1'").to_pylist() == [{"d": 3}]
        assert sorted(w.split(":")[0] for w in cat.warnings) == ["table=kdepth/sweep=s1/dup.parquet",
                                                                  "table=kdepth/sweep=s1/u2.parquet"]
        assert all("orphan" in w and "sweep verify" in w for w in cat.warnings)


def test_the_static_duckdb_types_are_duckdbs_own_reading_of_every_declared_column() -> None:
    """``_duck_types`` names each declared column's DuckDB type without a connection: for every table's
    schema (and its ``sweep`` column) the types are the ones DuckDB gives the Arrow schema itself."""
    import duckdb
    import pyarrow as pa

    from storage.catalog import _duck_type
    from storage.schemas import TABLES

    con = duckdb.connect()
    for table, schema in TABLES.items():
        schema = schema.append(pa.field("sweep", pa.string()))
        rel = con.from_arrow(pa.Table.from_pylist([], schema=schema))
        for field, want in zip(schema, rel.types, strict=True):
            mine = _duck_type(field.type)
            assert mine is not None, (table, field)
            assert str(con.sql(f"SELECT CAST(NULL AS {mine}) AS x").types[0]) == str(want), (table, field.name, mine)
