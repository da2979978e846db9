"""``swapcheck db``: the views it writes open in plain DuckDB and read what ``swapcheck query`` reads."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.schemas import TABLES
from tests.conftest import launch_in_process, tiny_spec_text

cli = CliRunner()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("db") / "it's [results]"  # quotes and brackets are plain characters
    for name in ("kdepth-demo", "kdepth-other"):
        summary = launch_in_process(root, tiny_spec_text(name=name, seeds=1))
        assert summary.n_ok == summary.n_units, summary.failures
    # An orphan (no ledger row names it): the catalog does not read it, so neither may the export.
    part = root / "table=kdepth" / "sweep=kdepth-demo"
    shutil.copy(sorted(part.glob("*.parquet"))[0], part / "orphan.parquet")
    return root


def _query_count(results: Path, table: str) -> int:
    res = cli.invoke(app, ["query", f"SELECT count(*)::BIGINT AS n FROM {table}", "--results", str(results), "--format", "json"])
    assert res.exit_code == 0, res.output
    return int(json.loads(res.stdout)[0]["n"])


@pytest.mark.parametrize("suffix", [".duckdb", ".sql"])
def test_export_opens_in_duckdb_with_the_same_counts(results: Path, tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"swapcheck{suffix}"
    res = cli.invoke(app, ["db", "--results", str(results), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "orphan" in res.stderr  # the catalog's warning, as every command prints it
    if suffix == ".duckdb":
        con = duckdb.connect(str(out), read_only=True)
    else:
        con = duckdb.connect()
        con.execute(out.read_text())
    try:
        for table in ("kdepth", "units", "sweeps", "launches", "replay"):
            assert con.sql(f"SELECT count(*) FROM {table}").fetchall()[0][0] == _query_count(results, table), table
        sweeps = {r[0] for r in con.sql("SELECT DISTINCT sweep FROM kdepth").fetchall()}
        assert sweeps == {"kdepth-demo", "kdepth-other"}
        for table in TABLES:
            columns = [r[0] for r in con.sql(f"DESCRIBE {table}").fetchall()]
            assert "table" not in columns and "sweep" in columns, table
            assert columns[: len(TABLES[table].names)] == TABLES[table].names, table
        units = [r[0] for r in con.sql("DESCRIBE units").fetchall()]
        assert units[-2:] == ["damaged", "damage"]
        assert con.sql("SELECT count(*) FROM units WHERE damaged").fetchall()[0][0] == 0
    finally:
        con.close()


def test_same_rows_as_the_named_query(results: Path, tmp_path: Path) -> None:
    from storage.catalog import named_query

    out = tmp_path / "views.duckdb"
    assert cli.invoke(app, ["db", "--results", str(results), "-o", str(out)]).exit_code == 0
    via_cli = json.loads(cli.invoke(app, ["query", "--named", "kdepth_summary", "--results", str(results), "--format", "json"]).stdout)
    con = duckdb.connect(str(out), read_only=True)
    try:
        rel = con.sql(named_query("kdepth_summary"), params={"sweep": None})
        via_db = [dict(zip(rel.columns, row, strict=True)) for row in rel.fetchall()]
    finally:
        con.close()
    assert len(via_db) == len(via_cli) and [r["differing"] for r in via_db] == [r["differing"] for r in via_cli]


def test_export_refuses_a_missing_results_tree(tmp_path: Path) -> None:
    res = cli.invoke(app, ["db", "--results", str(tmp_path / "nothing"), "--out", str(tmp_path / "x.duckdb")])
    assert res.exit_code == 2 and "no such directory" in res.output
    assert not (tmp_path / "x.duckdb").exists()


def _units_per_sweep(results: Path) -> dict[str, int]:
    res = cli.invoke(app, ["query", "SELECT sweep, count(*)::BIGINT AS n FROM units GROUP BY ALL", "--results", str(results),
                           "--format", "json"])
    assert res.exit_code == 0, res.output
    return {r["sweep"]: int(r["n"]) for r in json.loads(res.stdout)}


#: The message's Python route: the command after this label, to the end of its line.
PYTHON_ROUTE = "no extra install): "


@pytest.mark.parametrize("name", ["swapcheck.duckdb", "views.sql", "it's \"my\" $HOME.duckdb"])
def test_the_message_names_a_python_command_that_opens_the_export(results: Path, tmp_path: Path, name: str) -> None:
    """The venv has no DuckDB shell; the command the message prints runs with the venv's own DuckDB."""
    out = tmp_path / name
    res = cli.invoke(app, ["db", "--results", str(results), "--out", str(out)])
    assert res.exit_code == 0, res.output
    line = next(line for line in res.stderr.splitlines() if PYTHON_ROUTE in line)
    command = line.split(PYTHON_ROUTE, 1)[1]
    assert "docs/duckdb.md" in res.stderr and "duckdb-cli" in res.stderr
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (command, run.stderr)
    for sweep, n in _units_per_sweep(results).items():
        assert re.search(rf"│\s*{re.escape(sweep)}\s*│\s*{n}\s*│", run.stdout), (sweep, n, run.stdout)


def _duckdb_shell() -> tuple[str, str] | None:
    """A DuckDB shell: the venv's (``pip install duckdb-cli`` there), else one on PATH; with its version."""
    venv_shell = Path(sys.executable).parent / "duckdb"
    shell = str(venv_shell) if venv_shell.is_file() else shutil.which("duckdb")
    if shell is None:
        return None
    out = subprocess.run([shell, "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.match(r"v?(\d+\.\d+\.\d+)", out.strip())
    return shell, (m.group(1) if m else out.strip())


@pytest.mark.parametrize("suffix", [".duckdb", ".sql"])
def test_export_opens_in_the_duckdb_shell(results: Path, tmp_path: Path, suffix: str) -> None:
    found = _duckdb_shell()
    if found is None:
        pytest.skip("no DuckDB shell (`duckdb`) in the venv or on PATH; the venv does not ship one: DuckDB's own "
                    f"install of {duckdb.__version__}, or `pipx install duckdb-cli` for the .sql export (docs/duckdb.md). "
                    "The export's Python route is tested above")
    shell, version = found
    if suffix == ".duckdb" and version != duckdb.__version__:
        pytest.skip(f"the DuckDB shell {shell} is {version}; a database file written by DuckDB {duckdb.__version__} "
                    "opens only in a shell that reads its storage version (the .sql export opens in any)")
    out = tmp_path / f"swapcheck{suffix}"
    assert cli.invoke(app, ["db", "--results", str(results), "--out", str(out)]).exit_code == 0
    sql = "SELECT sweep, count(*) AS n FROM units GROUP BY ALL ORDER BY sweep"
    opener = ["-readonly", str(out)] if suffix == ".duckdb" else ["-init", str(out)]
    run = subprocess.run([shell, "-csv", *opener, "-c", sql], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rows = [line.split(",") for line in run.stdout.splitlines() if line and not line.startswith("--")]
    assert rows[0] == ["sweep", "n"]
    assert {sweep: int(n) for sweep, n in rows[1:]} == _units_per_sweep(results)
