"""The swap certificate (reports/certificate.py, `report certificate`): numbers, per pair, per sweep.

Rows are written with ResultStore.write into tmp_path: a sweep `s1` with kernels a/b/c (int8), a K-depth
series flat in K for a~b (real) and growing in K for a~c (real), bit-identical pow2 rows, reference rows,
generate arms and two teacher-forced pairs, and a kernel `d` with only a check (its pairs: not run);
a sweep `s2` with other counts for a~b, to show that sweeps are never pooled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import binomtest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from reports import certificate as cf
from reports import fliprisk
from storage.catalog import open_catalog
from storage.store import ResultStore

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed
KS = (256, 1024, 4096, 16384)


def _kd(a: str, b: str, k: int, differing: int, max_spacing: int, *, scale: str = "real",
        comparison: str = "pair", elements: int = 100_000) -> dict[str, Any]:
    return {"unit_id": f"kd-{a}-{b}-{scale}-{k}", "experiment": "kdepth", "dtype": "int8", "out_dtype": "bf16",
            "m": 4, "n": 4, "k": k, "seed": 0, "scale_mode": scale, "bias": False, "comparison": comparison,
            "impl_a": a, "impl_b": b, "kernel_a": a, "kernel_b": b, "elements": elements, "differing": differing,
            "frac_differing": differing / elements, "max_spacing": max_spacing, "max_spacing_significant": max_spacing,
            "hist_0": elements - differing, "hist_1": differing, "hist_2": 0, "hist_gt2": 0, "nonfinite_mismatch": 0,
            "max_abs_error": 0.0}


def _arm(arm: str, kernel: str, scales: str, restart: int) -> dict[str, Any]:
    return {"unit_id": f"run-{arm}-{restart}", "experiment": "e2e", "arm": arm, "restart": restart, "model": "m",
            "engine": "cpu", "configured_kernel": kernel, "scales": scales, "env_json": "{}", "host": "h",
            "pid": 100 + restart, "observed_kernels": [kernel], "kernel_calls_json": "{}", "evidence_ok": True,
            "weights_sha256": "w" * 64}


def _seq(arm: str, restart: int, prompt: int, seq: str) -> dict[str, Any]:
    return {"unit_id": f"seq-{arm}-{restart}", "experiment": "e2e", "arm": arm, "restart": restart,
            "prompt_index": prompt, "prompt_hash": f"p{prompt}", "sequence_hash": seq, "n_tokens": 3, "tokens": [1, 2, 3]}


def _tf(ref: str, arm: str, n: int, flips: int) -> list[dict[str, Any]]:
    return [{"unit_id": f"tf-{ref}-{arm}", "experiment": "e2e", "ref_arm": ref, "ref_restart": 0, "arm": arm,
             "prompt_index": i % 4, "position": i, "ref_token": 1, "ref_argmax": 1, "ref_margin": 0.01 * i,
             "arm_argmax": 2 if i < flips else 1, "arm_margin": 0.1, "flip": i < flips} for i in range(n)]


def _check(kernel: str, verdict: str) -> dict[str, Any]:
    return {"unit_id": f"em-{kernel}", "experiment": "exact_match", "kernel": kernel, "kind": "int8",
            "dtype": "bf16", "trial": 0, "seed": 0, "verdict": verdict}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cert") / "results"
    store = ResultStore(root)
    flat = [6, 5, 7, 6]          # a~b: flat in K
    growing = [2, 8, 32, 128]     # a~c: rate ~ K^1
    rows = [_kd("a", "b", k, d, 1) for k, d in zip(KS, flat, strict=True)]
    rows += [_kd("a", "c", k, d, 3 if k == 16384 else 1) for k, d in zip(KS, growing, strict=True)]
    rows += [_kd("b", "c", k, 0, 0) for k in KS]
    rows += [_kd(x, y, k, 0, 0, scale="pow2") for x, y in (("a", "b"), ("a", "c"), ("b", "c")) for k in KS]
    rows += [_kd(x, "exact", k, 1, 1 if x != "c" or k < 16384 else 2, comparison="reference")
             for x in "abc" for k in KS]
    rows += [_kd(x, "exact", k, 0, 0, scale="pow2", comparison="reference") for x in "abc" for k in KS]
    store.write("kdepth", "s1", "kd", rows)
    store.write("arm_runs", "s1", "runs", [_arm(a, k, "real", r) for a, k in (("xa", "a"), ("xb", "b"), ("xc", "c"))
                                           for r in (0, 1)])
    seqs = [_seq(arm, r, p, f"s{p}") for arm in ("xa", "xb", "xc") for r in (0, 1) for p in range(4)]
    seqs = [s if not (s["arm"] == "xb" and s["prompt_index"] == 3) else {**s, "sequence_hash": "other"} for s in seqs]
    store.write("sequences", "s1", "seqs", seqs)
    # and five rows the flip-risk model drops (no margin, a NaN, an infinite or a negative one, no flag)
    odd = [{**_tf("xa", "xb", 1, 1)[0], "position": 1000 + i, "ref_margin": m, "flip": f}
           for i, (m, f) in enumerate([(None, True), (float("nan"), True), (float("inf"), False), (-0.5, True),
                                       (0.5, None)])]
    store.write("teacher_forced", "s1", "tf-ab", _tf("xa", "xb", 200, 3) + odd)
    store.write("teacher_forced", "s1", "tf-ac", _tf("xa", "xc", 200, 40))
    store.write("exact_match", "s1", "em", [_check("a", "IDENTICAL"), _check("d", "IDENTICAL")])
    store.write("kdepth", "s2", "kd", [_kd("a", "b", k, 50, 2) for k in KS])
    return root


@pytest.fixture(scope="module")
def certs(results: Path) -> list[dict[str, Any]]:
    with open_catalog(results) as cat:
        return cf.certificates(cat, None)


def _cert(certs: list[dict[str, Any]], a: str, b: str, sweep: str = "s1") -> dict[str, Any]:
    (c,) = [c for c in certs if c["sweep"] == sweep and {c["kernel_a"], c["kernel_b"]} == {a, b}]
    return c


def _mode(c: dict[str, Any], mode: str) -> dict[str, Any]:
    (s,) = [s for s in c["scale_modes"] if s["scale_mode"] == mode]
    return s


def test_one_certificate_per_pair_of_the_kernels_a_sweep_ran(certs: list[dict[str, Any]]) -> None:
    s1 = [{c["kernel_a"], c["kernel_b"]} for c in certs if c["sweep"] == "s1"]
    assert sorted(map(sorted, s1)) == [["a", "b"], ["a", "c"], ["a", "d"], ["b", "c"], ["b", "d"], ["c", "d"]]
    assert [(c["kernel_a"], c["kernel_b"]) for c in certs if c["sweep"] == "s2"] == [("a", "b")]


def test_max_spacing_equals_the_sql_max(results: Path, certs: list[dict[str, Any]]) -> None:
    with open_catalog(results) as cat:
        (row,) = cat.query("SELECT max(max_spacing) AS m FROM kdepth WHERE sweep = 's1' AND comparison = 'pair' "
                           "AND impl_a = 'a' AND impl_b = 'c'").to_pylist()
    c = _cert(certs, "a", "c")
    assert c["max_spacing"] == row["m"] == 3
    assert _mode(c, "real")["kdepth"]["max_spacing"] == 3
    # beyond the reference's own error: at K=16384 the pair is 3 apart, c is 2 from exact -> 1
    assert c["max_spacing_beyond_reference_error"] == 1
    assert _cert(certs, "a", "b")["max_spacing_beyond_reference_error"] == 0


def test_k_trend_for_every_pair(certs: list[dict[str, Any]]) -> None:
    for c in certs:
        for s in c["scale_modes"]:
            if s["kdepth"]["status"] != "run":
                continue
            t = s["kdepth"]["trend"]
            if s["kdepth"]["differing"] == 0:
                assert (t["kind"], t["slope"]) == ("identical", None)
            else:
                assert t["slope"] is not None and t["slope_ci_low"] is not None and t["slope_ci_high"] is not None
    flat = _mode(_cert(certs, "a", "b"), "real")["kdepth"]["trend"]
    assert flat["kind"] == "no_trend" and flat["slope_ci_low"] < 0 < flat["slope_ci_high"]
    grow = _mode(_cert(certs, "a", "c"), "real")["kdepth"]["trend"]
    assert grow["kind"] == "grows" and grow["slope"] == pytest.approx(1.0, abs=0.1) and grow["slope_ci_low"] > 0
    assert "no clear trend in K" in _cert(certs, "a", "b")["answer"]
    assert "grows like K^1" in _cert(certs, "a", "c")["answer"]


def test_k_trend_edge_cases() -> None:
    assert cf.k_trend([(256, 0, 10), (1024, 0, 10)])["kind"] == "identical"
    assert cf.k_trend([(256, 3, 10)])["kind"] == "single_k"
    only_top = cf.k_trend([(256, 0, 1000), (1024, 0, 1000), (4096, 9, 1000)])
    assert only_top["kind"] == "grows" and only_top["slope"] is None and only_top["slope_ci_low"] > 0


def test_intervals_come_from_scipy(certs: list[dict[str, Any]]) -> None:
    kd = _mode(_cert(certs, "a", "b"), "real")["kdepth"]
    ci = binomtest(kd["differing"], kd["elements"]).proportion_ci(confidence_level=0.95, method="exact")
    assert (kd["ppm_ci_low"], kd["ppm_ci_high"]) == (pytest.approx(1e6 * ci.low), pytest.approx(1e6 * ci.high))
    (pair,) = _mode(_cert(certs, "a", "b"), "real")["end_to_end"]["arm_pairs"]
    (f,) = pair["flips"]
    ci = binomtest(f["flips"], f["positions"]).proportion_ci(confidence_level=0.95, method="exact")
    assert (f["flip_rate_ci_low"], f["flip_rate_ci_high"]) == (ci.low, ci.high)


def test_flip_figures_are_those_of_the_pair_alone(results: Path, certs: list[dict[str, Any]]) -> None:
    with open_catalog(results) as cat:
        alone = fliprisk.load(cat, sweep="s1", ref_arm="xa", arm="xb")
    (pair,) = _mode(_cert(certs, "a", "b"), "real")["end_to_end"]["arm_pairs"]
    (f,) = pair["flips"]
    assert (f["ref_arm"], f["arm"], f["positions"], f["flips"]) == ("xa", "xb", len(alone), int(alone.flip.sum()))
    assert f["dropped"] == alone.dropped == 5  # counted by SQL exactly as the flip-risk model drops them
    assert (f["positions"], f["flips"], f["flip_rate"]) == (200, 3, 3 / 200)   # not 43/400, the pooled figure
    assert (pair["identical"], pair["total"]) == (3, 4)
    assert pair["self_reproducibility_a"] == {"identical": 4, "total": 4, "restarts": 2}


def test_sweeps_are_never_pooled(results: Path, certs: list[dict[str, Any]]) -> None:
    s1, s2 = _cert(certs, "a", "b", "s1"), _cert(certs, "a", "b", "s2")
    assert _mode(s1, "real")["kdepth"]["differing"] == 24 and _mode(s2, "real")["kdepth"]["differing"] == 200
    with open_catalog(results) as cat:
        assert cf.certificates(cat, "s1") == [c for c in certs if c["sweep"] == "s1"]


def test_not_run_cells_and_verdicts(certs: list[dict[str, Any]]) -> None:
    ad = _cert(certs, "a", "d")
    assert ad["verdict"] == cf.NOT_RUN and ad["scale_modes"] == [] and ad["answer"].startswith("not run")
    assert ad["checks_b"] == {"exact_match": "IDENTICAL", "bounds": cf.NOT_RUN, "fuzz": cf.NOT_RUN, "precision": cf.NOT_RUN}
    ab = _cert(certs, "a", "b")
    assert _mode(ab, "pow2")["verdict"] == "IDENTICAL"
    assert _mode(ab, "pow2")["end_to_end"] == {"status": cf.NOT_RUN}
    assert _mode(ab, "real")["replay"] == {"status": cf.NOT_RUN}
    assert _mode(ab, "real")["verdict"] == "EPILOGUE_ROUNDING" and ab["verdict"] == "EPILOGUE_ROUNDING"
    assert _mode(_cert(certs, "a", "c"), "real")["verdict"] == "DIFFERENT"   # grows in K, max 3 sp, no bounds
    bc = _cert(certs, "b", "c")                # bit-identical at every K, yet xb~xc sequences differ
    assert (_mode(bc, "pow2")["verdict"], _mode(bc, "real")["verdict"]) == ("IDENTICAL", "INCONCLUSIVE")


def test_summary_rows_one_per_certificate(certs: list[dict[str, Any]]) -> None:
    rows = cf.summary_rows(certs)
    assert len(rows) == len(certs)
    assert {"pair", "scales", "verdict", "answer", "max_spacing"} <= set(rows[0])


def test_cli_json_and_pair(results: Path) -> None:
    res = runner.invoke(app, ["report", "certificate", "--results", str(results), "--sweep", "s1", "--format", "json",
                              "--pair", "c,a"])
    assert res.exit_code == 0, res.output
    (c,) = json.loads(res.stdout)
    assert (c["sweep"], c["kernel_a"], c["kernel_b"], c["max_spacing"]) == ("s1", "a", "c", 3)
    assert isinstance(_mode(c, "real")["kdepth"]["ppm"], float)
    res = runner.invoke(app, ["report", "certificate", "--results", str(results), "--sweep", "s1"])
    assert res.exit_code == 0, res.output
    assert res.stdout.index("interchangeable within 1 bf16 spacing") < res.stdout.index("evidence")
    res = runner.invoke(app, ["report", "conformance", "--results", str(results), "--sweep", "s1", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    (row,) = [r for r in rows if (r["kernel_a"], r["kernel_b"], r["scale_mode"]) == ("a", "c", "real")]
    assert row["kdepth_max_spacing"] == 3 and row["k_trend_slope_ci_low"] > 0


def test_k_trend_estimates_dispersion_across_seeds() -> None:
    """Seeds that vary by +-30% around a K^0.1 trend: the per-K totals alone read "grows" (dispersion 1),
    the (K, seed) cells estimate the dispersion and the interval holds 0: "no clear trend" (issue #26)."""
    cells = [(k, round(1000 * (k / 256) ** 0.1 * (1.3, 0.7)[(s + i) % 2]), 1_000_000)
             for i, k in enumerate(KS) for s in (0, 1)]
    per_seed = cf.k_trend(cells)
    totals: dict[int, list[int]] = {}
    for k, d, n in cells:
        totals.setdefault(k, [0, 0])
        totals[k][0] += d
        totals[k][1] += n
    pooled = cf.k_trend([(k, d, n) for k, (d, n) in totals.items()])
    assert pooled["kind"] == "grows" and pooled["slope_ci_low"] > 0 and pooled["dispersion"] == 1.0
    assert per_seed["kind"] == "no_trend" and per_seed["slope_ci_low"] < 0 < per_seed["slope_ci_high"]
    assert per_seed["slope"] == pytest.approx(pooled["slope"], abs=1e-6) and per_seed["dispersion"] > 100
    assert (per_seed["cells"], per_seed["ks"], per_seed["differing"], per_seed["elements"]) == (8, 4, 9967, 8_000_000)
    assert cf.trend_phrase(per_seed) == "no clear trend in K"
    words = cf.trend_counts(per_seed)
    assert "quasi-likelihood" in words and "F(1, cells - 2)" in words and "9967 differing of 8000000" in words


def test_certificate_trend_rests_on_seed_cells(certs: list[dict[str, Any]]) -> None:
    t = _mode(_cert(certs, "a", "c"), "real")["kdepth"]["trend"]
    assert (t["cells"], t["ks"], t["method"]) == (4, 4, cf.TREND_METHOD)  # one seed per K in this sweep
    row = cf.evidence_rows(_cert(certs, "a", "c"))
    (real,) = [r for r in row if r["scales"] == "real"]
    assert "quasi-likelihood" in real["K-trend slope [95%]"] and "170 differing of 400000" in real["K-trend slope [95%]"]


def test_conformance_table_says_no_clear_trend_with_its_dispersion(certs: list[dict[str, Any]]) -> None:
    from reports.conformance import table_rows

    rows = cf.matrix_rows(certs)
    (ab,) = [r for r, t in zip(rows, table_rows(rows), strict=True)
             if r["sweep"] == "s1" and {r["kernel_a"], r["kernel_b"]} == {"a", "b"} and r["scale_mode"] == "real"]
    assert ab["k_trend_cells"] == 4 and ab["k_trend_method"] == cf.TREND_METHOD and ab["k_trend_dispersion"] >= 1
    (line,) = [t for r, t in zip(rows, table_rows(rows), strict=True) if r is ab]
    assert ": no clear trend (dispersion" in line["K-trend (slope, 95%)"] and "4 K x seed cells" in line["K-trend (slope, 95%)"]
