"""One definition per fact, one catalog per command (reports/).

K-depth: `report conformance`, the HTML curves and the nightly metrics derive their per-pair numbers
from `kdepth_summary`, the query of `report kdepth`, so the "max N sp" of conformance is the largest
max_spacing over K that `report kdepth` shows (not max_spacing_significant). Check verdicts: the
conformance table and the nightly metrics come from one query. `report all` opens ONE catalog.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from reports import conformance, kdepth, metrics, predictions, render
from storage.catalog import Catalog, QueryError, open_catalog
from storage.store import ResultStore

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed


def _kdepth_row(k: int, seed: int, differing: int, max_spacing: int, significant: int, *,
                impl_a: str = "a-kernel", impl_b: str = "b-kernel", scale_mode: str = "real") -> dict[str, Any]:
    return {"unit_id": f"kd-{impl_a}-{impl_b}-{scale_mode}-{k}-{seed}", "experiment": "kdepth", "dtype": "int8",
            "out_dtype": "bf16", "m": 4, "n": 4, "k": k, "seed": seed, "scale_mode": scale_mode, "bias": False,
            "comparison": "pair", "impl_a": impl_a, "impl_b": impl_b, "kernel_a": impl_a, "kernel_b": impl_b,
            "elements": 1000, "differing": differing, "frac_differing": differing / 1000,
            "max_spacing": max_spacing, "max_spacing_significant": significant,
            "hist_0": 1000 - differing, "hist_1": differing, "hist_2": 0, "hist_gt2": 0, "nonfinite_mismatch": 0,
            "max_abs_error": 0.0}


def _check_row(table: str, kernel: str, trial: int, verdict: str) -> dict[str, Any]:
    return {"unit_id": f"{table}-{kernel}-{trial}", "experiment": table, "kernel": kernel, "kind": "int8",
            "dtype": "bf16", "trial": trial, "seed": trial, "verdict": verdict}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    store = ResultStore(root)
    # The largest distance (9 spacings, K=64 seed 1) lies where |reference| is small: the significant
    # maximum is 2. Conformance must show 9, the max over K of `report kdepth`'s max_spacing.
    store.write("kdepth", "s1", "kd", [
        _kdepth_row(16, 0, 3, 1, 1), _kdepth_row(16, 1, 0, 0, 0),
        _kdepth_row(64, 0, 5, 2, 2), _kdepth_row(64, 1, 7, 9, 2),
        _kdepth_row(16, 0, 0, 0, 0, scale_mode="pow2"), _kdepth_row(64, 0, 0, 0, 0, scale_mode="pow2"),
    ])
    store.write("exact_match", "s1", "em", [_check_row("exact_match", "a-kernel", 0, "IDENTICAL"),
                                            _check_row("exact_match", "a-kernel", 1, "DIFFERENT")])
    store.write("bounds", "s1", "b", [_check_row("bounds", "a-kernel", 0, "EPILOGUE_ROUNDING")])
    return root


def test_conformance_max_spacing_is_the_max_over_k_of_report_kdepth(results: Path) -> None:
    res = runner.invoke(app, ["report", "kdepth", "--results", str(results), "--format", "json"])
    assert res.exit_code == 0, res.output
    per_k = [r for r in json.loads(res.stdout) if r["scale_mode"] == "real"]
    assert [r["max_spacing"] for r in per_k] == [1, 9]
    true_max = max(r["max_spacing"] for r in per_k)
    res = runner.invoke(app, ["report", "conformance", "--results", str(results), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["scale_mode"]: r for r in json.loads(res.stdout)}
    assert {(r["kernel_a"], r["kernel_b"]) for r in rows.values()} == {("a-kernel", "b-kernel")}
    # The true largest spacing over K (not max_spacing_significant), as numbers with stable keys.
    assert (rows["real"]["kdepth_max_spacing"], rows["real"]["kdepth_differing"]) == (true_max, 15)
    assert rows["real"]["kdepth_ppm"] == 1e6 * 15 / 4000
    assert rows["pow2"]["verdict"] == "IDENTICAL" and rows["pow2"]["kdepth_differing"] == 0
    with open_catalog(results) as cat:
        (real,) = [t for t in kdepth.pair_totals(kdepth.summary(cat, "s1")) if t["scale_mode"] == "real"]
        assert (real["max_spacing"], real["max_spacing_significant"]) == (9, 2)
        m = metrics.sweep_metrics(cat, "s1")
    # The nightly metric is labelled significant and keeps that value, from the same totals.
    assert m["kdepth/int8/a-kernel~b-kernel/real/max_spacing_significant"]["value"] == 2
    assert m["kdepth/int8/a-kernel~b-kernel/real/differing_rate"]["value"] == pytest.approx(15 / 4000)


def test_check_verdicts_have_one_definition(results: Path) -> None:
    with open_catalog(results) as cat:
        rows = conformance.check_rows(cat, "s1")
        m = metrics.check_metrics(cat, "s1")
    assert [(r["check"], r["kernel"], r["verdict"]) for r in rows] == [
        ("exact_match", "a-kernel", "DIFFERENT"), ("bounds", "a-kernel", "EPILOGUE_ROUNDING")]
    assert {f"check/{r['check']}/{r['kernel']}/{r['output']}/verdict": r["verdict"] for r in rows} == \
        {k: v["value"] for k, v in m.items()}


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_report_all_opens_one_catalog(results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    opened: list[str] = []
    real_init = Catalog.__init__

    def counting_init(self: Catalog, root: str | Path) -> None:
        opened.append(str(root))
        real_init(self, root)

    monkeypatch.setattr(Catalog, "__init__", counting_init)
    before = Catalog.connections_opened
    args = ["report", "all", "--results", str(results), "--format", fmt]
    if fmt == "html":
        args += ["--out", str(tmp_path / "report.html")]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert len(opened) == 1
    assert Catalog.connections_opened - before == 1
    text = (tmp_path / "report.html").read_text() if fmt == "html" else res.stdout
    assert "a-kernel vs b-kernel" in text and "max 9 sp" in text


def test_documents_render_from_one_catalog(results: Path) -> None:
    with open_catalog(results) as cat:
        before = Catalog.connections_opened
        md = render.markdown_document(cat, "s1")
        assert Catalog.connections_opened == before
    assert md.startswith("# swapcheck report: s1") and "Kernel checks" in md


def test_sweep_metrics_wants_a_catalog(results: Path) -> None:
    with pytest.raises(TypeError):
        metrics.sweep_metrics(str(results), "s1")  # type: ignore[arg-type]


def _prediction(**fields: Any) -> predictions.Prediction:
    return predictions.Prediction(id="p", statement="a statement", **fields)


def test_prediction_fragments_stay_inside_one_select(results: Path) -> None:
    with open_catalog(results) as cat:
        ok = predictions.evaluate(cat, "s1", _prediction(table="kdepth", where="scale_mode = 'pow2'",
                                                           every="differing = 0", label="k"))
        assert (ok["status"], ok["support"]) == ("confirmed", "2/2")
        bad = predictions.evaluate(cat, "s1", _prediction(table="kdepth", where="scale_mode = 'real'",
                                                            every="differing = 0", label="k"))
        assert (bad["status"], bad["support"], bad["counterexample"]) == ("refuted", "1/4", "16")
        agg = predictions.evaluate(cat, "s1", _prediction(table="kdepth", aggregate="sum(differing) < 100",
                                                            measure="sum(differing)"))
        assert (agg["status"], agg["measured"]) == ("confirmed", 15)
        # the sweep is a bound parameter: a quote in it is a value, not SQL
        assert predictions.evaluate(cat, "s1' OR true OR '", _prediction(table="kdepth", every="true"))["support"] == "0/0"
        with pytest.raises(QueryError):
            predictions.evaluate(cat, "s1", _prediction(table="kdepth", where="true); DROP VIEW units; SELECT (1",
                                                        every="true"))
        with pytest.raises(QueryError):
            predictions.evaluate(cat, "s1", _prediction(table="read_csv('/etc/passwd')", every="true"))
        # nothing was changed: every view is still there
        assert len(cat.named("unit_status", sweep=None)) == 3  # one per committed table (ledgered_writes)


def test_conformance_terminal_view_is_one_short_line_per_pair_and_scale(results: Path) -> None:
    res = runner.invoke(app, ["report", "conformance", "--results", str(results), "--sweep", "s1"], env={"COLUMNS": "240"})
    assert res.exit_code == 0, res.output
    assert "a-kernel vs b-kernel" in res.output and "identical at every K" in res.output
    assert "not run" in res.output  # replay and end to end did not run here: said, never blank
    assert "kdepth_ppm_ci_low" not in res.output  # the raw numeric keys stay in --format json
