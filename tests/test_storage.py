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


def test_shared_ctes_are_one_fragment_included_where_named_and_no_query_of_their_own() -> None:
    from storage.catalog import named_query

    fragment = "_generation_pairs"
    assert fragment not in query_names()
    for name in ("first_divergence", "position_agreement"):
        sql = named_query(name)
        assert "\n-- include:" not in sql and sql.count("cmp AS (") == 1 and "$sweep" in sql


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


# -- issue #14: the ledger read as one dataset, the unit commit, the attempt markers --------------

def test_ledger_is_one_scan_with_the_same_answers_last_row_wins(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from storage.schemas import UNITS

    store = ResultStore(tmp_path)
    assert store.ledger("s") == {} and store.done_units("s") == set() and store.ledger_records("s") == {}
    for i in range(30):
        store.record_unit("s", _unit(f"u{i:02d}", "ok" if i % 3 else "failed"))
    # A file holding two rows (of units named by their own files) is a damaged entry, never read (#24).
    part = tmp_path / "table=units/sweep=s"
    pq.write_table(pa.Table.from_pylist([_unit("u00", "ok"), _unit("u01", "failed")], schema=UNITS), part / "zz.parquet")
    want = {f"u{i:02d}": "ok" if i % 3 else "failed" for i in range(30)}
    assert [(d.path, d.kind) for d in store.read_ledger("s").damaged] == [("table=units/sweep=s/zz.parquet", "rows")]
    assert {u: r["status"] for u, r in store.ledger("s").items()} == want
    assert store.done_units("s") == {u for u, s in want.items() if s == "ok"}
    assert set(store.ledger("s")["u02"]) == {"unit_id", "status", "attempts", "error"}
    assert store.ledger_records("s")["u05"]["rows"] == 3


def test_a_damaged_ledger_file_is_a_damaged_entry_never_an_exception(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.record_unit("s", _unit("u1"))
    store.record_unit("s", _unit("u2"))
    bad = tmp_path / "table=units/sweep=s/u2.parquet"
    bad.write_bytes(bad.read_bytes()[:40])
    assert store.done_units("s") == {"u1"} and set(store.ledger("s")) == set(store.ledger_records("s")) == {"u1"}
    (damage,) = store.read_ledger("s").damaged
    assert (damage.unit_id, damage.path, damage.kind) == ("u2", "table=units/sweep=s/u2.parquet", "unreadable")


def test_commit_unit_renames_the_ledger_file_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    store = ResultStore(tmp_path)
    renamed: list[str] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        renamed.append(dst.split("/table=")[1])
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    tables = {"sequences": [{"prompt_index": 0}, {"prompt_index": 1}], "arm_runs": [{"arm": "a"}]}
    records = store.commit_unit("s", "u1", tables, lambda files: {**_unit("u1"), "files": [f.as_dict() for f in files]})
    assert renamed[-1] == "units/sweep=s/u1.parquet" and sorted(renamed[:-1]) == ["arm_runs/sweep=s/u1.parquet",
                                                                                "sequences/sweep=s/u1.parquet"]
    assert [r.rows for r in records] == [2, 1]
    assert [f["path"] for f in store.ledger_records("s")["u1"]["files"]] == [r.path for r in records]
    assert not list(tmp_path.rglob("*.tmp-*"))


def test_commit_unit_with_a_failing_result_file_writes_no_ledger_row(tmp_path: Path) -> None:
    from storage.errors import StorageFault

    (tmp_path / "table=arm_runs").write_text("a file where the partition directory goes")
    store = ResultStore(tmp_path)
    with pytest.raises(StorageFault) as info:
        store.commit_unit("s", "u1", {"sequences": [{"prompt_index": 0}], "arm_runs": [{"arm": "a"}]},
                          lambda files: _unit("u1"))
    assert "table=arm_runs" in info.value.path
    assert store.ledger("s") == {} and not list(tmp_path.rglob("*.tmp-*"))


def test_small_files_are_uncompressed_large_ones_zstd_all_with_page_checksums(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.worker import unit_table
    from storage.store import COMPRESS_FROM_BYTES

    store = ResultStore(tmp_path)
    small = store.write("sequences", "s", "small", [{"prompt_index": 1}, {"prompt_index": 2}])
    n = COMPRESS_FROM_BYTES // 4 + 1
    large = store.write("sequences", "s", "large", unit_table("sequences", pa.table({"prompt_index": pa.array(range(n), pa.int32())}), "u", "e"))
    meta = {rec.rows: pq.ParquetFile(tmp_path / rec.path).metadata.row_group(0).column(0).compression for rec in (small, large)}
    assert meta == {2: "UNCOMPRESSED", n: "ZSTD"}
    assert pq.read_table(tmp_path / large.path, page_checksum_verification=True).num_rows == n


def test_attempt_markers_are_empty_files_named_by_what_they_record_and_old_ones_still_count(tmp_path: Path) -> None:
    import json

    store = ResultStore(tmp_path)
    assert store.mark_attempt("s", "u", "node-1") == 1
    (marker,) = (tmp_path / "_state/attempts/sweep=s/u").iterdir()
    assert marker.suffix == ".attempt" and marker.stat().st_size == 0
    old = tmp_path / "_state/attempts/sweep=s/u/1-oldhost-7.json"  # a marker written before issue #14
    old.write_text(json.dumps({"host": "oldhost", "pid": 7, "node_id": None, "started_at": "2025-01-01T00:00:00+00:00"}))
    (tmp_path / f"_state/attempts/sweep=s/u/.x.attempt.tmp-{'0' * 32}").write_bytes(b"")  # not a marker
    assert store.attempts("s", "u") == 2 and store.mark_attempt("s", "u") == 3
    markers = sorted(store.attempt_markers("s"), key=lambda m: m["started_at"])
    assert markers[0] == {"host": "oldhost", "pid": 7, "node_id": None, "started_at": "2025-01-01T00:00:00+00:00", "unit_id": "u"}
    import os
    import socket

    assert {(m["host"], m["pid"], m["node_id"]) for m in markers[1:]} == {(socket.gethostname(), os.getpid(), "node-1"),
                                                                         (socket.gethostname(), os.getpid(), None)}
    assert all(datetime.fromisoformat(m["started_at"]).tzinfo is not None for m in markers)


def test_a_store_reads_each_unchanged_ledger_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch reads the ledger before its lock and again under it: the second read re-reads only
    files that changed (identity: size, mtime, ctime, inode), finds new, damaged and removed ones,
    and a new store object reads everything."""
    import storage.records as store_mod  # the ledger reader (storage.records.SweepRecords.read_ledger)

    store = ResultStore(tmp_path)
    for i in range(5):
        store.record_unit("s", _unit(f"u{i}", "ok" if i else "failed"))
    parsed: list[str] = []
    real = store_mod.parse_ledger_file

    def counting(source, rel):  # type: ignore[no-untyped-def]
        parsed.append(rel.rsplit("/", 1)[1])
        return real(source, rel)

    monkeypatch.setattr(store_mod, "parse_ledger_file", counting)
    assert store.done_units("s") == {"u1", "u2", "u3", "u4"} and len(parsed) == 5
    parsed.clear()
    first = store.ledger_records("s")
    first["u1"]["status"] = "changed by a caller"  # callers get their own rows
    assert store.done_units("s") == {"u1", "u2", "u3", "u4"} and parsed == []
    store.record_unit("s", _unit("u0", "ok"))  # rewritten (a new file: new inode and ctime)
    store.record_unit("s", _unit("u5", "ok"))  # a new file
    (tmp_path / "table=units" / "sweep=s" / "u2.parquet").unlink()
    victim = tmp_path / "table=units" / "sweep=s" / "u3.parquet"
    victim.write_bytes(victim.read_bytes()[:100])  # damaged in place after it was read: same inode, new ctime
    read = store.read_ledger("s")
    assert sorted(parsed) == ["u0.parquet", "u3.parquet", "u5.parquet"]
    assert set(read.rows) == {"u0", "u1", "u4", "u5"} and [d.unit_id for d in read.damaged] == ["u3"]
    assert read.rows["u1"]["status"] == "ok"
    parsed.clear()
    assert len(ResultStore(tmp_path).read_ledger("s").rows) == 4 and len(parsed) == 5
