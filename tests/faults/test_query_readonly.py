"""`swapcheck query` cannot create, change or delete any file, on any path, by any route.

Every attempt goes through the real CLI and must exit 2 (refused) or 0 with a harmless read, and
leave every file under the test's directory (the results tree and the paths outside it) as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.store import ResultStore
from tests.test_catalog import _populate

runner = CliRunner()

#: Write attempts: ``{root}`` is the results root, ``{out}`` a directory outside it.
ATTEMPTS = [
    # the issue's own: EXPLAIN ANALYZE runs its COPY
    "EXPLAIN ANALYZE COPY (SELECT * EXCLUDE (sweep) FROM kdepth LIMIT 3) "
    "TO '{root}/table=kdepth/sweep=s1/dup.parquet' (FORMAT parquet)",
    "EXPLAIN ANALYZE COPY (SELECT * EXCLUDE (sweep) FROM units WHERE unit_id = 'u2') "
    "TO '{root}/table=units/sweep=s1/u1.parquet' (FORMAT parquet)",
    "EXPLAIN (ANALYZE, FORMAT json) COPY (SELECT 1 AS a) TO '{root}/x.parquet' (FORMAT parquet)",
    "EXPLAIN /* comment */ ANALYSE COPY (SELECT 1 AS a) TO '{out}/x.csv'",
    "EXPLAIN COPY (SELECT 1 AS a) TO '{root}/x.csv'",
    "COPY (SELECT * EXCLUDE (sweep) FROM kdepth) TO '{root}/table=kdepth/sweep=s1/u1.parquet' (FORMAT parquet)",
    "COPY (SELECT 1 AS a) TO '{out}/out.csv'",
    "COPY kdepth TO '{root}/kdepth.csv'",
    "EXPORT DATABASE '{out}/export'",
    "EXPORT DATABASE '{root}/export' (FORMAT parquet)",
    "ATTACH '{out}/evil.db' AS evil",
    "ATTACH '{root}/table=units/sweep=s1/evil.duckdb'",
    "ATTACH ':memory:' AS m",
    "SELECT 1 AS a; COPY (SELECT 1 AS a) TO '{root}/multi.csv'",
    "SELECT count(*) FROM units; EXPORT DATABASE '{out}/multi'",
    "SET profiling_output = '{root}/profile.json'; SELECT 1",
    "PRAGMA enable_profiling = 'json'",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "RESET enable_external_access",
    "SET temp_directory = '{root}/tmp'",
    "SET allowed_directories = ['{root}/']",
    "CALL pragma_version()",
    "INSTALL httpfs",
    "LOAD '{out}/evil.duckdb_extension'",
    "CREATE TABLE t AS SELECT 1 AS a",
    "CREATE PERSISTENT SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')",
    "INSERT INTO units SELECT * FROM units",
    "DELETE FROM units",
    "UPDATE kdepth SET differing = 0",
    "DROP VIEW units",
    "CHECKPOINT",
    "VACUUM",
    "PREPARE p AS COPY (SELECT 1 AS a) TO '{root}/prepared.csv'",
    "CALL enable_logging(storage = 'file', storage_path = '{root}/logs')",
    "SELECT * FROM query('COPY (SELECT 1 AS a) TO ''{root}/q.csv''')",
    "SELECT * FROM read_csv('{out}/secret.csv')",
    "SELECT * FROM read_parquet('{root}/table=kdepth/sweep=*/*.parquet')",
    "SELECT * FROM glob('{root}/*')",
    "SELECT * FROM read_text('{out}/secret.csv')",
]


def _snapshot(base: Path) -> dict[str, str]:
    """path -> SHA-256 of the bytes, for every file under ``base`` (the set of files is the keys)."""
    return {str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(base.rglob("*")) if p.is_file()}


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "results"
    _populate(ResultStore(root))
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.csv").write_text("a\n1\n")
    return root, out


def _query(root: Path, sql: str, *extra: str) -> object:
    return runner.invoke(app, ["query", sql, "--results", str(root), *extra])


@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_no_statement_writes_anything(tree: tuple[Path, Path], attempt: str) -> None:
    root, out = tree
    base = root.parent
    before = _snapshot(base)
    cwd = os.getcwd()
    os.chdir(base)  # relative paths, spill files and default database files would land here
    try:
        res = runner.invoke(app, ["query", attempt.format(root=root, out=out), "--results", str(root)])
    finally:
        os.chdir(cwd)
    assert res.exit_code in (0, 2), (res.exit_code, res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    if res.exit_code == 2:
        assert "error:" in res.stderr
    assert _snapshot(base) == before, "the tree changed"
    # and the results still read the same: nothing forged, nothing overwritten
    ok = runner.invoke(app, ["query", "SELECT unit_id, status FROM units ORDER BY ALL", "--results", str(root),
                             "--format", "json"])
    assert json.loads(ok.stdout) == [{"unit_id": "u1", "status": "ok"}, {"unit_id": "u2", "status": "failed"},
                                     {"unit_id": "v1", "status": "ok"}]


def test_issue_attack_is_refused_with_a_message(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    sql = ("EXPLAIN ANALYZE COPY (SELECT * EXCLUDE (sweep) FROM kdepth LIMIT 3) "
           f"TO '{root}/table=kdepth/sweep=s1/dup.parquet' (FORMAT parquet)")
    res = _query(root, sql)
    assert res.exit_code == 2 and "EXPLAIN ANALYZE" in res.stderr and "read-only" in res.stderr
    assert not (root / "table=kdepth" / "sweep=s1" / "dup.parquet").exists()


@pytest.mark.parametrize("sql", ["EXPLAIN SELECT * FROM kdepth", "DESCRIBE kdepth", "SHOW TABLES",
                                 "SUMMARIZE kdepth", "FROM kdepth SELECT unit_id",
                                 "WITH d AS (SELECT differing FROM kdepth) SELECT sum(differing) FROM d"])
def test_reading_statements_still_work(tree: tuple[Path, Path], sql: str) -> None:
    root, _ = tree
    before = _snapshot(root.parent)
    res = _query(root, sql, "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)
    assert _snapshot(root.parent) == before


def test_several_selects_return_the_last_result(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    res = _query(root, "SELECT 1 AS a; SELECT * FROM units; SELECT count(*) AS n FROM kdepth;", "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == [{"n": 2}]


@pytest.mark.parametrize("name", ["res[1]", "res*", "res?x", "r[!a]{b,c}**"])
def test_glob_characters_in_results_path(tmp_path: Path, name: str) -> None:
    root = tmp_path / name
    _populate(ResultStore(root))
    (tmp_path / "res1").mkdir()  # what the glob `res[1]` would match instead
    res = _query(root, "SELECT sweep, count(*) AS n FROM kdepth GROUP BY ALL ORDER BY ALL", "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == [{"sweep": "s1", "n": 1}, {"sweep": "s2", "n": 1}]
    rep = runner.invoke(app, ["report", "units", "--results", str(root), "--format", "json"])
    assert rep.exit_code == 0, rep.output
    assert sum(r["units"] for r in json.loads(rep.stdout)) == 3
    assert "warning" not in rep.stderr
