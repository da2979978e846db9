"""Damaged results are never read silently: a warning naming the file and `sweep verify`, never a
traceback, never a short count without the damaged unit flagged; other tables keep working.

The tree: for every result table (every table a unit writes, so every one the demo writes), two
committed units of two rows each, with the ledger's ``files`` records (or, ``legacy``, without
them: rows written before integrity records existed). Then one file is damaged.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.catalog import UNMANAGED_TABLES, Catalog
from storage.schemas import TABLES
from storage.store import ResultStore

runner = CliRunner()
SWEEP = "s"
RESULT_TABLES = sorted(t for t in TABLES if t not in UNMANAGED_TABLES)
KINDS = ["truncated", "garbage", "deleted", "foreign", "orphan"]


def _value(t: pa.DataType, i: int) -> Any:
    if pa.types.is_list(t):
        return [_value(t.value_type, i)]
    if pa.types.is_timestamp(t):
        return datetime.now(UTC)
    if pa.types.is_boolean(t):
        return i % 2 == 0
    if pa.types.is_integer(t):
        return i
    if pa.types.is_floating(t):
        return i + 0.5
    return f"v{i}"


def _rows(table: str, uid: str, n: int = 2) -> list[dict[str, Any]]:
    return [{**{f.name: _value(f.type, i) for f in TABLES[table]}, "unit_id": uid, "experiment": "e"}
            for i in range(n)]


def _record(root: Path, rel: str) -> dict[str, Any]:
    data = (root / rel).read_bytes()
    return {"table": rel.split("/")[0][len("table="):], "path": rel, "rows": pq.read_metadata(root / rel).num_rows,
            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _ledger_row(uid: str, table: str, files: list[dict[str, Any]] | None) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"unit_id": uid, "kind": table, "experiment": "e", "description": "", "params_json": "{}",
            "status": "ok", "attempts": 1, "host": "h", "pid": 1, "node_id": "n", "started_at": now,
            "finished_at": now, "duration_s": 0.1, "error": None, "tables": [table], "rows": 2,
            "spec_sha256": "x", "swapcheck_version": "0", "torch_version": "2", "files": files}


def build(root: Path, legacy: bool = False) -> None:
    """Two ok units per result table, a spec record and a launch record."""
    store = ResultStore(root)
    store.write("sweeps", SWEEP, "spec", [{"spec_sha256": "x", "question": "q", "spec_path": "s.toml", "spec_toml": "",
                                           "n_units": 2 * len(RESULT_TABLES), "unit_ids": [],
                                           "created_at": datetime.now(UTC)}])
    store.write("launches", SWEEP, "l1", _rows("launches", "l1", 1) if "unit_id" in TABLES["launches"].names
                else [{**{f.name: _value(f.type, 0) for f in TABLES["launches"]}, "launch_id": "l1"}])
    for table in RESULT_TABLES:
        for j in range(2):
            uid = f"{table}-{j}"
            store.write(table, SWEEP, uid, _rows(table, uid))
            rel = f"table={table}/sweep={SWEEP}/{uid}.parquet"
            store.record_unit(SWEEP, _ledger_row(uid, table, None if legacy else [_record(root, rel)]))


def damage(root: Path, table: str, kind: str) -> str:
    """Damage the first unit's file of ``table`` (``orphan``: add a forged file); return its path."""
    rel = f"table={table}/sweep={SWEEP}/{table}-0.parquet"
    f = root / rel
    data = f.read_bytes()
    if kind == "truncated":
        f.write_bytes(data[: len(data) // 2])
    elif kind == "garbage":
        f.write_bytes(os.urandom(len(data)))  # same size: only the footer check can tell
    elif kind == "deleted":
        f.unlink()
    elif kind == "foreign":
        pq.write_table(pa.table({"surprise": [1, 2], "unit_id": ["a", "b"]}), f)
    elif kind == "orphan":
        rel = f"table={table}/sweep={SWEEP}/dup.parquet"
        pq.write_table(pa.Table.from_pylist(_rows(table, "forged", 5), schema=TABLES[table]), root / rel)
    else:
        raise AssertionError(kind)
    return rel


def _cli(*args: str) -> Any:
    res = runner.invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res


def _warned(stderr: str, rel: str) -> None:
    lines = [line for line in stderr.splitlines() if line.startswith("warning:") and rel in line]
    assert lines, f"no warning naming {rel}:\n{stderr}"
    assert all("swapcheck sweep verify --results" in line for line in lines), lines


def _json(root: Path, sql: str) -> tuple[list[dict[str, Any]], str]:
    res = _cli("query", sql, "--results", str(root), "--format", "json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), res.stderr


def _cases() -> list[Any]:
    """Every (table, damage, ledger) case; a truncated file of every table (and a garbage kdepth file)
    runs by default, the rest are slow (test_campaign.py reads every damage of a kdepth file by default)."""
    out = []
    for table in RESULT_TABLES:
        for kind in KINDS:
            for legacy in (False, True):
                fast = kind == "truncated" and not legacy or (table == "kdepth" and kind == "garbage" and not legacy)
                out.append(pytest.param(table, kind, legacy, id=f"{table}-{kind}-{'legacy' if legacy else 'records'}",
                                        marks=() if fast else pytest.mark.slow))
    return out


@pytest.mark.parametrize(("table", "kind", "legacy"), _cases())
def test_a_damaged_result_file_is_named_skipped_and_its_unit_flagged(
        tmp_path: Path, table: str, kind: str, legacy: bool) -> None:
    root = tmp_path / "results"
    build(root, legacy)
    rel = damage(root, table, kind)
    n_units = 2 * len(RESULT_TABLES)

    rows, stderr = _json(root, f'SELECT count(*) AS n FROM "{table}"')
    _warned(stderr, rel)
    assert rows == [{"n": 4 if kind == "orphan" else 2}], "forged rows are never read; damaged ones are skipped"

    flagged, _ = _json(root, "SELECT unit_id, status, damage FROM units WHERE damaged")
    if kind == "orphan":
        assert flagged == []
    else:
        assert [(r["unit_id"], r["status"]) for r in flagged] == [(f"{table}-0", "ok")]
        assert rel in flagged[0]["damage"]

    # other tables are untouched
    other = next(t for t in RESULT_TABLES if t != table)
    counts, _ = _json(root, f'SELECT (SELECT count(*) FROM "{other}") AS other, (SELECT count(*) FROM units) AS units')
    assert counts == [{"other": 4, "units": n_units}]

    rep = _cli("report", "units", "--results", str(root), "--format", "json")
    assert rep.exit_code == 0, rep.output
    _warned(rep.stderr, rel)
    assert sum(r["units"] for r in json.loads(rep.stdout)) == n_units
    if table == "kdepth":
        kd = _cli("report", "kdepth", "--results", str(root), "--format", "json")
        assert kd.exit_code == 0, kd.output
        _warned(kd.stderr, rel)
        json.loads(kd.stdout)


def test_warnings_come_first_and_name_the_unit(tmp_path: Path) -> None:
    root = tmp_path / "results"
    build(root)
    rel = damage(root, "kdepth", "truncated")
    with Catalog(root) as cat:
        assert len(cat.warnings) == 1
        (line,) = cat.warnings
        assert line.startswith(rel) and "unit kdepth-0 of sweep s is marked damaged" in line
        assert f"run `swapcheck sweep verify --results {root}`" in line
    res = _cli("report", "kdepth", "--results", str(root))
    assert res.exit_code == 0
    assert res.output.index("warning:") < res.output.index("kdepth"), "the warning precedes the table"


def test_a_resized_file_is_damage_when_the_ledger_knows_its_size(tmp_path: Path) -> None:
    root = tmp_path / "results"
    build(root)
    rel = "table=kdepth/sweep=s/kdepth-0.parquet"
    ResultStore(root).write("kdepth", SWEEP, "kdepth-0", _rows("kdepth", "kdepth-0", 7))  # valid, other rows
    rows, stderr = _json(root, "SELECT count(*) AS n FROM kdepth")
    _warned(stderr, rel)
    assert "the ledger recorded" in stderr and rows == [{"n": 2}]


@pytest.mark.parametrize("kind", ["truncated", "garbage", "foreign"])
def test_a_damaged_ledger_file_is_named_and_its_unit_shown_damaged(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "results"
    build(root)
    rel = "table=units/sweep=s/kdepth-0.parquet"
    f = root / rel
    if kind == "truncated":
        f.write_bytes(f.read_bytes()[:50])
    elif kind == "garbage":
        f.write_bytes(b"\0garbage" * 100)
    else:
        pq.write_table(pa.table({"x": [1]}), f)
    rows, stderr = _json(root, "SELECT unit_id, status, damaged FROM units WHERE unit_id = 'kdepth-0'")
    _warned(stderr, rel)
    assert rows == [{"unit_id": "kdepth-0", "status": "damaged", "damaged": True}]
    # its result file is no longer named by an ok ledger row: not read, and said so
    _warned(stderr, "table=kdepth/sweep=s/kdepth-0.parquet")
    counts, _ = _json(root, "SELECT count(*) AS n FROM kdepth")
    assert counts == [{"n": 2}]
    rep = _cli("report", "units", "--results", str(root), "--format", "json")
    assert rep.exit_code == 0 and {"damaged", "ok"} == {r["status"] for r in json.loads(rep.stdout)}


@pytest.mark.parametrize("table", ["sweeps", "launches"])
@pytest.mark.parametrize("kind", ["truncated", "garbage", "foreign"])
def test_damaged_bookkeeping_files_are_skipped_with_a_warning(tmp_path: Path, table: str, kind: str) -> None:
    root = tmp_path / "results"
    build(root)
    rel = next(str(p.relative_to(root)) for p in (root / f"table={table}").rglob("*.parquet"))
    f = root / rel
    if kind == "truncated":
        f.write_bytes(f.read_bytes()[:40])
    elif kind == "garbage":
        f.write_bytes(os.urandom(f.stat().st_size))
    else:
        pq.write_table(pa.table({"x": [1]}), f)
    rows, stderr = _json(root, f'SELECT (SELECT count(*) FROM "{table}") AS n, (SELECT count(*) FROM kdepth) AS k')
    _warned(stderr, rel)
    assert rows == [{"n": 0, "k": 4}]
    rep = _cli("report", "units", "--results", str(root), "--format", "json")
    assert rep.exit_code == 0
    _warned(rep.stderr, rel)


def test_sweeps_without_a_ledger_are_not_read_one_warning_names_the_partition(tmp_path: Path) -> None:
    """Files of a sweep with no ledger (written without the worker) are no committed results: never
    counted, one warning per partition (tests/faults/test_reads_ledger_only.py has the rest)."""
    root = tmp_path / "results"
    store = ResultStore(root)
    store.write("kdepth", "hand", "a", _rows("kdepth", "a"))
    store.write("kdepth", "hand", "b", _rows("kdepth", "b"))
    (root / "table=kdepth/sweep=hand/b.parquet").write_bytes(b"PAR1 not really")
    with Catalog(root) as cat:
        assert cat.query("SELECT count(*) AS n FROM kdepth").to_pylist() == [{"n": 0}]
        assert len(cat.warnings) == 1 and cat.warnings[0].startswith("table=kdepth/sweep=hand/: 2 file(s)")


@pytest.mark.slow
def test_a_real_sweep_with_a_deleted_and_a_truncated_file(ray_local, tmp_path: Path) -> None:
    from tests.conftest import tiny_spec_text

    spec = tmp_path / "tiny.toml"
    spec.write_text(tiny_spec_text(seeds=1))
    root = tmp_path / "results"
    res = _cli("sweep", "launch", str(spec), "--results", str(root), "--no-progress")
    assert res.exit_code == 0, res.output
    before, stderr = _json(root, "SELECT count(*) AS n FROM kdepth")
    assert "warning" not in stderr
    files = sorted((root / "table=kdepth").rglob("*.parquet"))
    files[0].unlink()
    files[1].write_bytes(files[1].read_bytes()[:100])
    after, stderr = _json(root, "SELECT count(*) AS n FROM kdepth")
    for f in files[:2]:
        _warned(stderr, str(f.relative_to(root)))
    flagged, _ = _json(root, "SELECT unit_id FROM units WHERE damaged ORDER BY unit_id")
    assert sorted(r["unit_id"] for r in flagged) == sorted(f.stem for f in files[:2])
    assert after[0]["n"] < before[0]["n"]
    kd = _cli("report", "kdepth", "--results", str(root), "--format", "json")
    assert kd.exit_code == 0
    for f in files[:2]:
        _warned(kd.stderr, str(f.relative_to(root)))
