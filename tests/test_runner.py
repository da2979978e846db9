"""The runner end to end on a real embedded Ray instance: launch, resume, failures, crashes, SIGKILL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.catalog import read_only_query
from tests.conftest import tiny_spec_text

runner = CliRunner()
TIMING = {"seconds_a", "seconds_b"}


def launch(spec: Path, results: Path, *extra: str):
    return runner.invoke(app, ["sweep", "launch", str(spec), "--results", str(results), "--no-progress", *extra])


def kdepth_rows(results: Path) -> list[dict]:
    rows = read_only_query(results, "SELECT * FROM kdepth ORDER BY unit_id, impl_a, impl_b").to_pylist()
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_launch_report_and_resume(ray_local, tiny_spec: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    res = launch(tiny_spec, results)
    assert res.exit_code == 0, res.output
    assert "12 ok, 0 failed" in res.output
    rows = kdepth_rows(results)
    assert len(rows) == 12 * 3  # one pair + two implementations vs exact, per unit
    assert all(r["differing"] == 0 for r in rows if r["scale_mode"] == "pow2")
    assert all(r["max_spacing"] <= 1 for r in rows)
    files = sorted(p.relative_to(results) for p in results.rglob("*.parquet"))
    # The driver's torch facts are collected while the units run; the launch row written at the end has them.
    (prov,) = [json.loads(r["provenance_json"]) for r in read_only_query(results, "SELECT provenance_json FROM launches").to_pylist()]
    assert prov["versions"]["torch"] and prov["cuda_available"] is False and "torch_cuda" in prov

    again = launch(tiny_spec, results)
    assert again.exit_code == 0 and "12 skipped" in again.output and "0 ok" in again.output
    assert kdepth_rows(results) == rows
    assert sorted(p.relative_to(results) for p in results.rglob("*.parquet")) == files

    rep = runner.invoke(app, ["report", "kdepth", "--results", str(results), "--format", "json"])
    assert rep.exit_code == 0, rep.output
    summary = json.loads(rep.stdout)
    need = {"dtype", "impl_a", "impl_b", "scale_mode", "k", "elements", "differing", "max_spacing"}
    assert summary and all(need <= set(r) for r in summary)
    assert {r["impl_b"] for r in summary} == {"int8-triton-order", "exact"}
    assert {r["k"] for r in summary} == {32, 64, 128}
    first = next(r for r in summary if r["k"] == 32 and r["impl_b"] == "exact" and r["scale_mode"] == "real")
    assert first["elements"] == 2 * 16 * 24  # summed over both seeds

    table = runner.invoke(app, ["report", "kdepth", "--results", str(results)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "int8-cutlass-order vs int8-triton-order" in table.output


def test_changed_spec_under_the_same_name_is_refused(ray_local, tiny_spec: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    assert launch(tiny_spec, results).exit_code == 0
    changed = tmp_path / "changed.toml"
    changed.write_text(tiny_spec_text().replace("n = 24", "n = 8"))
    before = sorted(results.rglob("*"))
    res = launch(changed, results)
    assert res.exit_code == 2 and "different spec" in res.output
    assert sorted(results.rglob("*")) == before


def test_failing_unit_is_a_row_and_the_sweep_goes_on(ray_local, tmp_path: Path) -> None:
    spec = tmp_path / "fail.toml"
    spec.write_text(tiny_spec_text(name="fails", impls='["int8-cutlass-order", "tests.kernel_fixtures:FailingKernel"]'))
    results = tmp_path / "results"
    res = launch(spec, results)
    assert res.exit_code == 1, res.output
    units = read_only_query(results, "SELECT status, error, attempts FROM units").to_pylist()
    assert len(units) == 12 and all(u["status"] == "failed" for u in units)
    assert all("planted failure" in u["error"] for u in units)
    assert read_only_query(results, "SELECT count(*) AS n FROM kdepth").to_pylist() == [{"n": 0}]
    # Relaunching retries failed units; the ledger still has one row per unit.
    assert launch(spec, results).exit_code == 1
    again = read_only_query(results, "SELECT count(*) AS n, max(attempts) AS a FROM units").to_pylist()
    assert again == [{"n": 12, "a": 2}]
    rep = runner.invoke(app, ["report", "units", "--results", str(results), "--format", "json"])
    assert json.loads(rep.stdout)[0]["status"] == "failed"


@pytest.mark.slow  # 20 s (Ray restarts the crashed worker); the default run's budget is 6 minutes
def test_worker_crash_is_retried_by_ray(ray_local, tmp_path: Path) -> None:
    spec = tmp_path / "crash.toml"
    spec.write_text(tiny_spec_text(name="crash", impls='["int8-cutlass-order", "tests.kernel_fixtures:CrashOnceKernel"]', seeds=1))
    results = tmp_path / "results"
    res = launch(spec, results)
    assert res.exit_code == 0, res.output
    units = read_only_query(results, "SELECT status, attempts FROM units").to_pylist()
    assert len(units) == 6 and all(u["status"] == "ok" for u in units)
    assert max(u["attempts"] for u in units) == 2
