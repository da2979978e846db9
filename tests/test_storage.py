"""Storage: atomic Parquet files, the ledger, and the read-only DuckDB catalog."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from storage.catalog import QueryError, connect, query_names, read_only_query, run_named
from storage.store import ResultStore


def _unit(uid: str, status: str = "ok") -> dict:
    now = datetime.now(UTC)
    return {"unit_id": uid, "kind": "kdepth", "experiment": "e", "description": "", "params_json": "{}",
            "status": status, "attempts": 1, "host": "h", "pid": 1, "node_id": "n", "started_at": now, "finished_at": now,
            "duration_s": 0.1, "error": None if status == "ok" else "boom", "tables": ["kdepth"], "rows": 3,
            "spec_sha256": "x", "swapcheck_version": "0", "torch_version": "2.13.0"}


def test_ledger_has_one_row_per_unit(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.record_unit("s", _unit("u1", "failed"))
    store.record_unit("s", _unit("u1", "ok"))
    store.record_unit("s", _unit("u2", "failed"))
    assert store.done_units("s") == {"u1"}
    table = read_only_query(tmp_path, "SELECT unit_id, status FROM units ORDER BY unit_id")
    assert table.to_pylist() == [{"unit_id": "u1", "status": "ok"}, {"unit_id": "u2", "status": "failed"}]
    assert not list(tmp_path.rglob("*.tmp-*")), "no temporary files left behind"


def test_undeclared_columns_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="undeclared columns"):
        ResultStore(tmp_path).write("units", "s", "x", [{**_unit("u"), "surprise": 1}])


def test_attempt_markers_count(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    assert store.attempts("s", "u") == 0
    assert store.mark_attempt("s", "u") == 1
    assert store.mark_attempt("s", "u") == 2


def test_empty_results_have_typed_empty_views(tmp_path: Path) -> None:
    con = connect(tmp_path)
    assert con.execute("SELECT count(*) FROM kdepth").fetchone() == (0,)
    cols = [r[0] for r in con.execute("DESCRIBE kdepth").fetchall()]
    assert "max_spacing" in cols and "sweep" in cols
    assert run_named(tmp_path, "kdepth_summary", sweep=None).num_rows == 0
    assert {"kdepth_summary", "unit_status"} <= set(query_names())


@pytest.mark.parametrize(
    "sql",
    [
        "COPY (SELECT 1) TO 'out.csv'",
        "CREATE TABLE t AS SELECT 1",
        "INSERT INTO units SELECT * FROM units",
        "DROP VIEW units",
        "ATTACH 'x.db'",
        "SET enable_external_access = true",
        "PRAGMA enable_profiling",
        "SELECT 1; DELETE FROM units",
    ],
)
def test_query_is_read_only(tmp_path: Path, sql: str) -> None:
    ResultStore(tmp_path).record_unit("s", _unit("u1"))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(QueryError):
        read_only_query(tmp_path, sql)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_query_cannot_read_outside_results(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with pytest.raises(QueryError, match="(?i)permission|access"):
        read_only_query(tmp_path / "r", f"SELECT * FROM read_csv('{secret}')")


def test_write_returns_the_record_of_exactly_the_bytes_written(tmp_path: Path) -> None:
    import hashlib

    rec = ResultStore(tmp_path).write("units", "s", "u1", [_unit("u1")])
    data = (tmp_path / "table=units/sweep=s/u1.parquet").read_bytes()
    assert rec.as_dict() == {"table": "units", "path": "table=units/sweep=s/u1.parquet", "rows": 1,
                             "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_old_ledger_files_without_files_column_still_read(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from storage.schemas import UNITS

    old = pa.schema([f for f in UNITS if f.name != "files"])
    part = tmp_path / "table=units/sweep=s"
    part.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([_unit("old")], schema=old), part / "old.parquet")
    store = ResultStore(tmp_path)
    store.record_unit("s", {**_unit("new"), "files": []})
    assert store.done_units("s") == {"old", "new"}
    records = store.ledger_records("s")
    assert records["old"]["files"] is None and records["new"]["files"] == []


def test_stale_temporaries_are_listed_and_removed(tmp_path: Path) -> None:
    import os
    import time

    store = ResultStore(tmp_path)
    store.record_unit("s", _unit("u1"))
    part = tmp_path / "table=units/sweep=s"
    stale, fresh = part / f".u2.parquet.tmp-{'0' * 32}", part / f".u3.parquet.tmp-{'1' * 32}"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert [rel for rel, _age in store.temporaries(3600)] == [f"table=units/sweep=s/{stale.name}"]
    assert len(store.temporaries()) == 2
    assert store.remove_stale_temporaries(older_than_s=3600) == [f"table=units/sweep=s/{stale.name}"]
    assert not stale.exists() and fresh.exists() and store.done_units("s") == {"u1"}
