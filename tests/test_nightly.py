"""The nightly job: a second run against the first is clean; a changed kernel is a named regression."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from orchestrator.cli.main import app

runner = CliRunner()

SUITE = """
question = "Nightly conformance of the epilogue orders (test suite)."
name = "nightly-test"

[experiments.int8]
kind = "kdepth"
dtype = "int8"
implementations = ["int8-cutlass-order", {{ kernel = "tests.kernel_fixtures:EpilogueVariant", label = "candidate", params = {{ variant = "{variant}" }} }}]
scale_modes = ["real", "pow2"]
m = 32
n = 48
k = [64, 256]
seeds = 2
"""


def _nightly(suite: Path, baseline: Path, results: Path, *extra: str):
    return runner.invoke(app, ["nightly", str(suite), "--baseline", str(baseline), "--results", str(results), "--user-kernels", *extra],
                         env={"COLUMNS": "200"})


def test_nightly_baseline_clean_rerun_and_regression(ray_local, tmp_path: Path) -> None:
    suite, baseline, results = tmp_path / "suite.toml", tmp_path / "baseline.json", tmp_path / "results"
    suite.write_text(SUITE.format(variant="cutlass"))
    missing = _nightly(suite, baseline, results)
    assert missing.exit_code == 2 and "no baseline" in missing.output

    first = _nightly(suite, baseline, results, "--update-baseline")
    assert first.exit_code == 0, first.output
    metrics = json.loads(baseline.read_text())["metrics"]
    assert metrics["kdepth/int8/int8-cutlass-order~candidate/pow2/bit_identical"] == {"value": True, "rule": "exact"}

    second = _nightly(suite, baseline, results)
    assert second.exit_code == 0, second.output
    assert "no regression" in second.output
    report_dirs = sorted((results / "nightly").iterdir())
    assert len(report_dirs) == 2
    rep = json.loads((report_dirs[-1] / "report.json").read_text())
    assert rep["regressions"] == [] and rep["previous"] is not None and rep["since_previous"] == []
    # Both nights ran in this process: the same kernel identity, recorded and compared (issue #26).
    assert rep["identity"]["changed"] is False and rep["identity"]["today"] == rep["identity"]["previous"] is not None
    assert f"Unchanged since the previous night: {rep['identity']['today']}" in (report_dirs[-1] / "report.md").read_text()
    html = (report_dirs[-1] / "report.html").read_text()
    assert "<img" in html and "data:image/png;base64," in html

    suite.write_text(SUITE.format(variant="truncate"))
    third = _nightly(suite, baseline, results)
    assert third.exit_code == 1, third.output
    assert "REGRESSION" in third.output
    assert "kdepth/int8/candidate~exact/real/differing_rate" in third.output
    rep = json.loads(sorted((results / "nightly").iterdir())[-1].joinpath("report.json").read_text())
    reg = {r["metric"]: r for r in rep["regressions"]}
    changed = reg["kdepth/int8/int8-cutlass-order~candidate/pow2/bit_identical"]
    assert changed["baseline"] is True and changed["today"] is False
    md = sorted((results / "nightly").iterdir())[-1].joinpath("report.md").read_text()
    assert "| `kdepth/int8/int8-cutlass-order~candidate/pow2/bit_identical` | exact | True | False | changed | **yes** |" in md


def test_bad_baseline_is_bad_input(tmp_path: Path) -> None:
    suite, baseline = tmp_path / "suite.toml", tmp_path / "baseline.json"
    suite.write_text(SUITE.format(variant="cutlass"))
    baseline.write_text('{"metrics": {"x": {"value": 1, "rule": "fuzzy"}}}')
    res = _nightly(suite, baseline, tmp_path / "results")
    assert res.exit_code == 2 and "metrics.x" in res.output
    assert not (tmp_path / "results").exists()
