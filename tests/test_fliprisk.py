"""The flip-risk model (reports/fliprisk.py) and `report flips`: synthetic teacher-forced data whose
flip probability falls with the margin, degenerate data, library intervals (scipy), the minimum
events for an AUC interval, the power note, per-pair reporting (never pooled) and the CLI's JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import binomtest
from sklearn.metrics import roc_auc_score
from typer.testing import CliRunner

from orchestrator.cli.main import app
from reports import fliprisk as fr
from storage.catalog import open_catalog
from storage.store import ResultStore

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed

TRUE_INTERCEPT, TRUE_SLOPE = -5.0, -1.5  # P(flip | m) = expit(b + w * log10(m + eps))


def synthetic(n_seq: int = 80, length: int = 50, seed: int = 0) -> fr.FlipData:
    """Margins log-uniform over 1e-6..10 plus a few exact ties; flips drawn from the true model."""
    rng = np.random.default_rng(seed)
    n = n_seq * length
    margin = 10.0 ** rng.uniform(-6, 1, n)
    margin[rng.choice(n, 20, replace=False)] = 0.0
    p = 1.0 / (1.0 + np.exp(-(TRUE_INTERCEPT + TRUE_SLOPE * np.log10(margin + fr.EPS))))
    flip = rng.random(n) < p
    return fr.FlipData(margin, flip, np.repeat(np.arange(n_seq), length))


def test_flips_concentrate_at_small_margins() -> None:
    data = synthetic()
    rep = fr.analyze(data, resamples=500, seed=1)
    assert rep["positions"] == len(data) and rep["flips"] == int(data.flip.sum())
    assert 0.05 < rep["flip_rate"] < 0.6
    assert rep["auc"] == pytest.approx(roc_auc_score(data.flip, -data.margin))
    assert rep["auc"] > 0.8
    lo, hi = rep["auc_ci"]
    assert lo < rep["auc"] < hi and hi - lo < 0.1
    assert rep["ci"]["used"] == 500 and rep["auc_note"] is None and rep["notes"] == []
    m = rep["model"]
    assert m["slope"] == pytest.approx(TRUE_SLOPE, abs=0.3)
    assert m["intercept"] == pytest.approx(TRUE_INTERCEPT, abs=1.5)
    # calibration: every position in one bin; the model's mean prediction tracks the observed rate
    cal = rep["calibration"]
    assert sum(b["positions"] for b in cal) == rep["positions"]
    assert sum(b["flips"] for b in cal) == rep["flips"]
    assert cal[0]["bin"] == "< 1e-06" and cal[-1]["bin"] == "[1, 10)"
    for b in cal:
        assert b["observed_ci"][0] <= b["observed_rate"] <= b["observed_ci"][1]
        if b["positions"] >= 200:
            assert b["predicted_rate"] == pytest.approx(b["observed_rate"], abs=0.06), b
    rates = [b["observed_rate"] for b in cal if b["positions"] >= 200]
    assert rates == sorted(rates, reverse=True)
    # concentration: 90% of flips below a margin under which far fewer than 90% of positions lie
    conc = {c["flip_share"]: c for c in rep["concentration"]}
    c90 = conc[0.9]
    assert rep["concentration_margin"] == c90["margin"]
    assert c90["margin"] in set(data.margin[data.flip])
    assert c90["share_of_flips"] >= 0.9 and c90["share_of_positions"] < 0.75
    assert c90["flip_rate_at_or_below"] > rep["flip_rate"] > c90["flip_rate_above"]
    assert conc[0.5]["margin"] <= c90["margin"] <= conc[0.99]["margin"]


def test_weighted_auc_matches_sklearn_with_ties() -> None:
    rng = np.random.default_rng(3)
    margin = np.round(rng.exponential(1.0, 3000), 1)  # many ties
    flip = rng.random(3000) < 0.3 * np.exp(-margin)
    order = np.argsort(margin, kind="stable")
    ms, fs = margin[order], flip[order]
    starts = np.flatnonzero(np.r_[True, ms[1:] != ms[:-1]])
    w = np.ones((1, ms.size))
    assert fr._weighted_auc(w * fs, w * ~fs, starts)[0] == pytest.approx(roc_auc_score(flip, -margin), abs=1e-12)
    # weights = an explicit resample: the same as scoring the resampled arrays
    idx = rng.integers(0, ms.size, ms.size)
    wr = np.bincount(idx, minlength=ms.size)[None, :].astype(float)
    assert fr._weighted_auc(wr * fs, wr * ~fs, starts)[0] == pytest.approx(roc_auc_score(fs[idx], -ms[idx]), abs=1e-12)


def test_bootstrap_is_seeded_and_both_units_work() -> None:
    d = synthetic(n_seq=40, length=40)
    a = fr.bootstrap_auc(d.margin, d.flip, d.sequence, resamples=300, seed=7)
    b = fr.bootstrap_auc(d.margin, d.flip, d.sequence, resamples=300, seed=7)
    c = fr.bootstrap_auc(d.margin, d.flip, d.sequence, resamples=300, seed=8)
    assert a == b and a["ci"] != c["ci"]
    pos = fr.bootstrap_auc(d.margin, d.flip, d.sequence, resamples=300, seed=7, unit="position")
    point = fr.auc(d.margin, d.flip)
    for ci in (a["ci"], pos["ci"]):
        assert ci[0] < point < ci[1]
    with pytest.raises(ValueError, match="unit"):
        fr.bootstrap_auc(d.margin, d.flip, unit="prompt")


def test_sequence_bootstrap_pair_matrix_equals_the_weighted_path(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    margin = np.round(rng.exponential(1.0, 1200), 2)  # ties across sequences
    flip = rng.random(1200) < 0.4 * np.exp(-margin)
    seq = rng.integers(0, 30, 1200)
    fast = fr.bootstrap_auc(margin, flip, seq, resamples=200, seed=3)
    monkeypatch.setattr(fr, "_SUFFICIENT_STATISTICS", False)
    slow = fr.bootstrap_auc(margin, flip, seq, resamples=200, seed=3)
    assert fast["used"] == slow["used"] == 200
    assert fast["ci"] == pytest.approx(slow["ci"], abs=1e-12)


def test_sequence_bootstrap_is_exact_and_never_groups_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many sequences (more than the 2048 groups an earlier version fell back to): every sequence is a
    resampled unit, and the sufficient statistics give exactly the per-position numbers, ties included."""
    rng = np.random.default_rng(11)
    n = 30_000
    margin = np.round(rng.lognormal(-3.0, 2.0, n), 3)  # many exact ties, flips among them
    flip = rng.random(n) < 0.05 * np.exp(-margin)
    seq = rng.integers(0, 3000, n)
    fast = fr.bootstrap_auc(margin, flip, seq, resamples=60, seed=2)
    monkeypatch.setattr(fr, "_SUFFICIENT_STATISTICS", False)
    slow = fr.bootstrap_auc(margin, flip, seq, resamples=60, seed=2)
    assert fast["sequences"] == np.unique(seq).size and "groups" not in fast
    assert fast["used"] == slow["used"] == 60 and fast["ci"] == slow["ci"]


def test_sequence_resamples_without_flips_are_left_out_and_said() -> None:
    margin = np.linspace(0.0, 1.0, 200)
    flip = np.zeros(200, dtype=bool)
    flip[:fr.AUC_CI_MIN_FLIPS] = True  # every flip in sequence 0 of 20 (enough flips for an interval)
    rep = fr.analyze(fr.FlipData(margin, flip, np.repeat(np.arange(20), 10)), resamples=200)
    assert 0 < rep["ci"]["used"] < 200 and rep["auc_ci"] is not None
    assert any("held only one class" in n for n in rep["notes"])
    assert any("only 1 reference sequences" in n for n in rep["notes"])
    assert rep["auc"] == 1.0


@pytest.mark.parametrize("kind", ["no flips", "all flips", "empty"])
def test_degenerate_data_gives_no_auc_and_says_why(kind: str) -> None:
    n = 0 if kind == "empty" else 500
    margin = np.geomspace(1e-6, 5.0, n)
    flip = np.full(n, kind == "all flips")
    rep = fr.analyze(fr.FlipData(margin, flip), resamples=100)
    assert rep["auc"] is None and rep["auc_ci"] is None and rep["model"] is None
    assert rep["auc_note"] and rep["notes"][0] == rep["auc_note"] and rep["auc_ci_note"] is None
    assert rep["positions"] == n and rep["flips"] == int(flip.sum())
    if kind == "empty":
        assert rep["flip_rate"] is None and rep["calibration"] == [] and rep["concentration"] == []
        assert rep["flip_rate_ci"] is None and rep["power"] is None and rep["notes"] == [rep["auc_note"]]
    elif kind == "all flips":
        assert rep["notes"] == [rep["auc_note"]] and rep["flip_rate_ci"][1] == 1.0
    else:
        assert sum(b["positions"] for b in rep["calibration"]) == n
        assert all(b["predicted_rate"] is None for b in rep["calibration"])
    if kind == "no flips":
        assert rep["concentration"] == [] and rep["concentration_margin"] is None
        assert {b["observed_rate"] for b in rep["calibration"]} == {0.0}
        assert "undefined" in rep["auc_note"]
        upper = rep["rate_ci"]["upper_one_sided"]
        assert upper == pytest.approx(1.0 - 0.05 ** (1.0 / n), rel=1e-9)  # the exact one-sided bound (~3/n)
        assert rep["notes"][1:] == [f"0 flips in {n} positions: the rate is below {upper:.3g} (95% one-sided, exact)"]
    json.dumps(rep, allow_nan=False)  # plain JSON, no NaN


def test_quantile_bins() -> None:
    d = synthetic()
    cal = fr.calibration(d.margin, d.flip, fr.fit_logistic(d.margin, d.flip), bins="quantile")
    assert len(cal) == 10 and sum(b["positions"] for b in cal) == len(d)
    assert all(abs(b["positions"] - len(d) / 10) <= 1 for b in cal)
    assert cal[-1]["bin"].endswith("]")
    with pytest.raises(ValueError, match="bins"):
        fr.calibration(d.margin, d.flip, bins="octaves")


def write_teacher_forced(root: Path, sweep: str, ref_arm: str, arm: str, data: fr.FlipData,
                         length: int = 50) -> None:
    """teacher_forced rows as the task writes them: one file per (reference sequence, arm) unit."""
    rows = [{"unit_id": f"{ref_arm}-{arm}", "experiment": "e2e", "ref_arm": ref_arm, "ref_restart": 0, "arm": arm,
             "prompt_index": int(i // length), "position": int(i % length), "ref_token": 7, "ref_argmax": 7,
             "ref_margin": float(m), "arm_argmax": 8 if f else 7, "arm_margin": float(m), "flip": bool(f)}
            for i, (m, f) in enumerate(zip(data.margin, data.flip, strict=True))]
    ResultStore(root).write("teacher_forced", sweep, f"{ref_arm}-{arm}", rows)


def _load(results: Path, **filters: Any) -> fr.FlipData:
    """``fliprisk.load`` over a catalog opened for this one call (the tests write between calls)."""
    with open_catalog(results) as cat:
        return fr.load(cat, **filters)


def _flip_report(results: Path, **options: Any) -> dict[str, Any]:
    with open_catalog(results) as cat:
        return fr.flip_report(cat, **options)


@pytest.fixture
def tf_results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    d = synthetic(n_seq=40)
    write_teacher_forced(root, "e2e", "cutlass", "triton", d)
    n = len(d)
    write_teacher_forced(root, "e2e", "cutlass-pow2", "triton-pow2", fr.FlipData(d.margin, np.zeros(n, bool)))
    return root


def test_load_pulls_margins_and_flips_with_duckdb(tf_results: Path) -> None:
    d = _load(tf_results)
    assert len(d) == 4000 and [p["ref_arm"] for p in d.pairs] == ["cutlass", "cutlass-pow2"]
    assert len(np.unique(d.sequence)) == 80  # 40 reference sequences per reference arm
    one = _load(tf_results, ref_arm="cutlass", arm="triton")
    assert len(one) == 2000 and one.flip.sum() == synthetic(n_seq=40).flip.sum()
    # a missing margin is dropped and counted; a reference argmax != its own token is counted
    ResultStore(tf_results).write("teacher_forced", "e2e", "odd", [
        {"unit_id": "odd", "experiment": "e2e", "ref_arm": "cutlass", "ref_restart": 0, "arm": "triton",
         "prompt_index": 99, "position": 0, "ref_token": 1, "ref_argmax": 2, "ref_margin": None,
         "arm_argmax": 2, "arm_margin": 0.1, "flip": False}])
    d = _load(tf_results, arm="triton")
    assert (len(d), d.dropped, d.ref_mismatch) == (2000, 1, 1)


def test_report_flips_json(tf_results: Path) -> None:
    res = runner.invoke(app, ["report", "flips", "--results", str(tf_results), "--sweep", "e2e", "--ref-arm", "cutlass",
                              "--arm", "triton", "--format", "json", "--resamples", "300"])
    assert res.exit_code == 0, res.output
    top = json.loads(res.stdout)
    assert set(top) == {"filters", "pairs", "notes"}  # no figure at the top level, even for one pair
    assert top["filters"] == {"sweep": "e2e", "ref_arm": "cutlass", "arm": "triton"}
    assert [(p["ref_arm"], p["arm"], p["positions"]) for p in top["pairs"]] == [("cutlass", "triton", 2000)]
    rep = top["pairs"][0]
    for key in ("positions", "flips", "flip_rate", "flip_rate_ci", "rate_ci", "power", "auc", "auc_ci", "auc_note",
                "auc_ci_note", "ci", "calibration", "calibration_ci", "concentration_margin", "concentration", "model",
                "dropped", "ref_mismatch", "notes"):
        assert key in rep
    assert rep["positions"] == 2000 and rep["auc"] > 0.8 and rep["auc_ci"][0] < rep["auc"] < rep["auc_ci"][1]
    assert rep["ci"]["unit"] == "sequence" and rep["ci"]["resamples"] == 300
    assert rep["rate_ci"]["method"] == "exact (Clopper-Pearson)" and rep["rate_ci"]["unit"] == "position"


def test_report_flips_per_pair_never_pooled_and_degenerate(tf_results: Path) -> None:
    res = runner.invoke(app, ["report", "flips", "--results", str(tf_results), "--format", "json", "--resamples", "100"])
    rep = json.loads(res.stdout)
    assert set(rep) == {"filters", "pairs", "notes"} and rep["notes"] == []
    pairs = {p["arm"]: p for p in rep["pairs"]}
    # the zero-flip pow2 pair does not halve the cutlass pair's rate: its rate is its own flips / positions
    own = synthetic(n_seq=40)
    assert (pairs["triton"]["positions"], pairs["triton"]["flips"]) == (2000, int(own.flip.sum()))
    assert pairs["triton"]["flip_rate"] == int(own.flip.sum()) / 2000
    assert pairs["triton"]["flip_rate_ci"] == list(_exact(int(own.flip.sum()), 2000))
    assert pairs["triton"]["calibration"] == _flip_report(tf_results, ref_arm="cutlass", resamples=10)["pairs"][0]["calibration"]
    assert pairs["triton-pow2"]["flips"] == 0 and pairs["triton-pow2"]["auc"] is None
    assert pairs["triton-pow2"]["auc_ci"] is None and "no flips" in pairs["triton-pow2"]["auc_note"]
    assert pairs["triton"]["auc"] > 0.8
    res = runner.invoke(app, ["report", "flips", "--results", str(tf_results), "--arm", "triton-pow2", "--format", "json"])
    assert res.exit_code == 0
    (rep,) = json.loads(res.stdout)["pairs"]
    assert (rep["flips"], rep["auc"], rep["auc_ci"]) == (0, None, None) and "no flips" in rep["auc_note"]
    assert any(n.startswith("0 flips in 2000 positions: the rate is below") for n in rep["notes"])


def test_report_flips_for_people_and_csv(tf_results: Path) -> None:
    res = runner.invoke(app, ["report", "flips", "--results", str(tf_results), "--resamples", "100"],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "ROC-AUC" in res.output and "calibration by margin bin" in res.output and "90% of flips" in res.output
    assert "per arm pair" in res.output and "undefined" in res.output and "nothing pooled" in res.output
    assert "cutlass -> triton (sweep e2e)" in res.output and "cutlass-pow2 -> triton-pow2 (sweep e2e)" in res.output
    assert "exact Clopper-Pearson, unit: positions" in res.output and "power: " in res.output
    res = runner.invoke(app, ["report", "flips", "--results", str(tf_results), "--format", "csv", "--resamples", "10"])
    assert res.exit_code == 0 and res.stdout.splitlines()[0].startswith("sweep,ref_arm,arm,bin,positions,flips,observed")
    assert {line.split(",")[2] for line in res.stdout.splitlines()[1:]} == {"triton", "triton-pow2"}
    for bad in (["--bins", "octaves"], ["--ci-unit", "prompt"], ["--resamples", "0"]):
        assert runner.invoke(app, ["report", "flips", "--results", str(tf_results), *bad]).exit_code == 2
    empty = runner.invoke(app, ["report", "flips", "--results", str(tf_results), "--arm", "nope"])
    assert empty.exit_code == 0 and "no teacher-forced positions" in empty.output


def test_docs_queries_recompute_the_reports(tmp_path: Path) -> None:
    """Every `swapcheck query` in docs/agreement.md runs and gives the numbers the reports give."""
    import re

    from storage.catalog import read_only_query, run_named
    from tests.conftest import REPO
    from tests.test_agreement import write_generate_fixture

    root = tmp_path / "results"
    write_generate_fixture(root)
    d = synthetic(n_seq=40)
    write_teacher_forced(root, "s1", "cutlass", "triton", d)
    write_teacher_forced(root, "s2", "a-pow2", "b-pow2", fr.FlipData(d.margin, np.zeros(len(d), bool)))
    text = (REPO / "docs" / "agreement.md").read_text()
    queries = re.findall(r'\$ swapcheck query "(.*?)"\n', text, flags=re.S)
    assert len(queries) == 8
    q = [read_only_query(root, sql).to_pylist() for sql in queries]

    self_rows = run_named(root, "self_reproducibility", sweep=None).to_pylist()
    assert [(r["sweep"], r["arm"], r["identical"], r["total"]) for r in q[0]] == \
        [(r["sweep"], r["arm"], r["identical"], r["total"]) for r in self_rows]
    assert [r["processes"] for r in q[1]] == [r["distinct_processes"] for r in self_rows]
    cross = run_named(root, "cross_arm", sweep=None).to_pylist()
    assert [(r["arm_a"], r["identical"], r["total"]) for r in q[2]] == [(r["arm_a"], r["identical"], r["total"]) for r in cross]
    first = run_named(root, "first_divergence", sweep=None).to_pylist()
    assert [r["first_divergence"] for r in q[3]] == [r["first_divergence"] for r in first]

    rep = _flip_report(root, resamples=10)
    pairs = rep["pairs"]
    assert [(r["positions"], r["flips"]) for r in q[4]] == [(p["positions"], p["flips"]) for p in pairs]
    assert [r["flip_rate"] for r in q[4]] == pytest.approx([p["flip_rate"] for p in pairs])
    assert q[5][0]["auc"] == pytest.approx(pairs[0]["auc"], abs=1e-12) and q[5][1]["auc"] is None
    (one,) = _flip_report(root, ref_arm="cutlass", arm="triton", resamples=10)["pairs"]
    c90 = next(c for c in one["concentration"] if c["flip_share"] == 0.9)
    assert len(q[6]) == 1 and q[6][0]["margin_90"] == c90["margin"] == pairs[0]["concentration_margin"]
    assert q[6][0]["share_of_positions"] == pytest.approx(c90["share_of_positions"])
    assert [(r["positions"], r["flips"]) for r in q[7]] == [(b["positions"], b["flips"]) for b in one["calibration"]]
    assert [r["margin_lo"] for r in q[7]] == pytest.approx([b["margin_lo"] for b in one["calibration"]])


# -- honest statistics: library intervals, minimum events, power, no pooling -------------------------

def _exact(k: int, n: int) -> tuple[float, float]:
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return float(ci.low), float(ci.high)


def few_flips(n_flips: int, n: int = 2000, length: int = 50) -> fr.FlipData:
    """``n_flips`` flips at the smallest margins, one per sequence (so none shares a sequence)."""
    margin = np.geomspace(1e-5, 5.0, n)
    seq = np.repeat(np.arange(n // length), length)
    flip = np.zeros(n, dtype=bool)
    flip[np.argsort(margin)[:n_flips]] = True
    order = np.argsort(margin)
    seq[order[:n_flips]] = np.arange(n_flips) % (n // length)
    return fr.FlipData(margin, flip, seq)


def test_three_flips_give_no_auc_interval_and_say_why() -> None:
    rep = fr.analyze(few_flips(3), resamples=200)
    assert rep["auc"] == 1.0  # the point estimate is still shown
    assert rep["auc_ci"] is None and rep["ci"]["used"] == 0
    assert rep["auc_ci_note"] == "too few flips (3) for an interval: at least 10 are needed"
    assert rep["auc_ci_note"] in rep["notes"]
    assert (rep["ci"]["min_flips"], rep["ci"]["min_non_flips"]) == (fr.AUC_CI_MIN_FLIPS, fr.AUC_CI_MIN_NON_FLIPS) == (10, 10)
    # too few unflipped positions: the same rule, the other class
    margin = np.geomspace(1e-5, 5.0, 200)
    flip = np.arange(200) < 195  # 5 unflipped positions, at the largest margins
    rep = fr.analyze(fr.FlipData(margin, flip), resamples=50)
    assert rep["auc_ci"] is None and rep["auc_ci_note"] == (
        f"too few unflipped positions ({int((~flip).sum())}) for an interval: at least 10 are needed")


@pytest.mark.parametrize("n_flips", [9, 10])
def test_auc_interval_needs_ten_flips(n_flips: int) -> None:
    rep = fr.analyze(few_flips(n_flips), resamples=200, ci_unit="position")
    if n_flips < fr.AUC_CI_MIN_FLIPS:
        assert rep["auc_ci"] is None and rep["auc_ci_note"].startswith(f"too few flips ({n_flips})")
    else:
        assert rep["auc_ci"] is not None and rep["auc_ci_note"] is None and rep["ci"]["used"] == 200


def test_report_flips_with_three_flips_prints_no_auc_interval(tmp_path: Path) -> None:
    root = tmp_path / "results"
    write_teacher_forced(root, "demo", "cutlass", "triton", few_flips(3))
    res = runner.invoke(app, ["report", "flips", "--results", str(root), "--resamples", "50", "--format", "markdown"],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    (auc_line,) = [line for line in res.output.splitlines() if line.startswith("ROC-AUC")]
    assert auc_line == "ROC-AUC of -margin: 1.0000 (no interval: see the note)"
    assert "note: too few flips (3) for an interval: at least 10 are needed" in res.output
    assert "none: too few flips (3)" in res.output  # the per-pair table's AUC interval column
    rate_line = next(line for line in res.output.splitlines() if line.startswith("3 flips in 2000 positions"))
    lo, hi = _exact(3, 2000)
    assert f"95% CI {lo:.3g} - {hi:.3g} (exact Clopper-Pearson, unit: positions, 3/2000)" in rate_line


def test_intervals_are_the_libraries() -> None:
    d = synthetic(n_seq=20)
    k, n = int(d.flip.sum()), len(d)
    rep = fr.analyze(d, resamples=50)
    assert rep["flip_rate_ci"] == list(_exact(k, n)) == rep["rate_ci"]["interval"]
    assert (rep["rate_ci"]["flips"], rep["rate_ci"]["positions"], rep["rate_ci"]["level"]) == (k, n, 0.95)
    assert rep["calibration_ci"]["method"] == "Wilson score"
    for b in rep["calibration"]:
        ci = binomtest(b["flips"], b["positions"]).proportion_ci(confidence_level=0.95, method="wilson")
        assert b["observed_ci"] == pytest.approx([max(0.0, ci.low), min(1.0, ci.high)], abs=1e-12)
    zero = fr.rate_interval(0, 300)
    one_sided = binomtest(0, 300, alternative="less").proportion_ci(confidence_level=0.95, method="exact").high
    assert zero["upper_one_sided"] == one_sided and zero["interval"] == list(_exact(0, 300))


def test_power_note_positions_needed() -> None:
    assert [fr.positions_needed(p) for p in (1e-3, 1e-4)] == [2995, 29956]
    for p in (0.3, 1e-3, 2.5e-4, 1e-5):
        n = fr.positions_needed(p)
        assert 1 - (1 - p) ** n >= 0.95 > 1 - (1 - p) ** (n - 1)
        assert n == int(np.ceil(np.log(0.05) / np.log1p(-p)))
    assert fr.positions_needed(1.0) == 1
    with pytest.raises(ValueError, match="rate"):
        fr.positions_needed(0.0)
    rep = fr.analyze(few_flips(3), resamples=10)
    rows = {r["basis"]: r for r in rep["power"]["rows"]}
    assert rows["observed"]["rate"] == 3 / 2000 and rows["observed"]["positions_needed"] == fr.positions_needed(3 / 2000)
    assert rows["upper end of the exact interval"]["rate"] == rep["flip_rate_ci"][1]
    assert [r["rate"] for r in rep["power"]["rows"] if r["basis"] == "reference"] == list(fr.POWER_RATES)
    assert all(r["enough"] == (2000 >= r["positions_needed"]) for r in rep["power"]["rows"])
    assert "2,995" in rep["power"]["note"] and "this pair has 2,000" in rep["power"]["note"]


def test_pairs_are_never_pooled(tf_results: Path) -> None:
    both = _load(tf_results)
    with pytest.raises(ValueError, match="never pooled"):
        fr.analyze(both)
    rep = _flip_report(tf_results, resamples=10)
    own = _flip_report(tf_results, ref_arm="cutlass", arm="triton", resamples=10)["pairs"][0]
    cut = next(p for p in rep["pairs"] if p["arm"] == "triton")
    for key in ("positions", "flips", "flip_rate", "flip_rate_ci", "auc", "auc_ci", "model", "calibration", "power"):
        assert cut[key] == own[key], key
    assert cut["flip_rate"] == cut["flips"] / cut["positions"] == int(synthetic(n_seq=40).flip.sum()) / 2000
    assert not {"positions", "flips", "flip_rate", "auc"} & set(rep)
