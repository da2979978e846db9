"""Quantizer swaps in the CLI and the reports: ``kernels quantizers``, the "Quantizer swaps" section
of ``report all`` and the quantizer-pair certificate.

Units run in this process through the worker's own code path (an in-process launch), no Ray. Every
certificate figure is recomputed here from the Parquet rows (quantize, sequences, teacher_forced).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from reports.quantizer_swap import identity
from tests.conftest import launch_in_process

runner = CliRunner()

GEMM = "int8-cutlass-order"
STATIC = "int8-static(static_scale=0.03125)"
STATIC_AWAY = "int8-static(rounding=away, static_scale=0.03125)"

SPEC = textwrap.dedent(f"""
    question = "Do quantizer swaps show up in the certificate and the report?"
    name = "qzr"

    [experiments.int8]
    kind = "quantize"
    reference = "vllm-int8"
    candidates = ["int8-half-away", "int8-fp16-scale"]
    gemm_kernel = "{GEMM}"
    prompts = {{ count = 2, length = 8, seed = 1 }}

    [experiments.static]
    kind = "quantize"
    reference = {{ quantizer = "int8-static", label = "s-rne", params = {{ static_scale = 0.03125 }} }}
    candidates = [{{ quantizer = "int8-static", label = "s-away", params = {{ static_scale = 0.03125, rounding = "away" }} }}]
    activation_dtype = "bf16"
    prompts = {{ count = 2, length = 8, seed = 1 }}

    [experiments.fp8]
    kind = "quantize"
    reference = "vllm-fp8"
    candidates = ["fp8-mul-inv"]
    prompts = {{ count = 2, length = 8, seed = 1 }}

    [experiments.e2e]
    kind = "generate"
    restarts = 1
    prompts = {{ count = 4, length = 8, seed = 0 }}
    max_new_tokens = 8

    [experiments.e2e.arms.base]
    kernel = "{GEMM}"

    [experiments.e2e.arms.fp16s]
    kernel = "{GEMM}"
    quantizer = "int8-fp16-scale"

    [experiments.e2e.arms.s-rne]
    kernel = "{GEMM}"
    quantizer = "int8-static"
    quantizer_params = {{ static_scale = 0.03125 }}

    [experiments.e2e.arms.s-away]
    kernel = "{GEMM}"
    quantizer = "int8-static"
    quantizer_params = {{ static_scale = 0.03125, rounding = "away" }}

    [experiments.e2e.arms.triton]
    kernel = "int8-triton-order"

    [[experiments.e2e.teacher_forced]]
    reference = "base"
    arms = ["fp16s"]

    [[experiments.e2e.teacher_forced]]
    reference = "s-rne"
    arms = ["s-away"]
    """)


def _parquet(root: Path, table: str) -> list[dict[str, Any]]:
    files = sorted((root / f"table={table}").rglob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("quantize-report") / "results"
    summary = launch_in_process(root, SPEC, restarts_here=True)  # stage by stage: teacher-forced units read what generate wrote
    assert summary.n_ok == summary.n_units, summary.failures
    return root, summary.sweep


@pytest.fixture(scope="module")
def certs(results: tuple[Path, str]) -> list[dict[str, Any]]:
    from reports.certificate import certificates
    from storage.catalog import open_catalog

    with open_catalog(str(results[0])) as cat:
        return certificates(cat, None)


def _cert(certs: list[dict[str, Any]], a: str, b: str) -> dict[str, Any]:
    (c,) = [c for c in certs if c.get("swap") == "quantizer" and {c["kernel_a"], c["kernel_b"]} == {a, b}]
    return c


# -- kernels quantizers -----------------------------------------------------------------------------

def test_kernels_quantizers_lists_the_registry() -> None:
    from tasks.quantizers import list_quantizers

    res = runner.invoke(app, ["kernels", "quantizers", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    registry = {q["name"]: q for q in list_quantizers()}
    assert set(rows) == set(registry)
    for name, q in registry.items():
        assert rows[name]["available"] is q["ok"]
        assert rows[name]["formula"] == (q["formula"] or "")
        assert rows[name]["params"] == q["params"] and rows[name]["version"] == q["version"]
    assert rows["int8-static"]["available"] is False and "static_scale" in rows["int8-static"]["reason"]
    assert rows["vllm-int8"]["output"] == "int8" and "round_even" in rows["vllm-int8"]["formula"]
    available = runner.invoke(app, ["kernels", "quantizers", "--available", "--format", "csv"])
    assert available.exit_code == 0, available.output
    assert "vllm-int8" in available.stdout and "int8-static" not in available.stdout
    table = runner.invoke(app, ["kernels", "quantizers", "--long"])
    assert table.exit_code == 0 and "activation quantizers" in table.stdout


# -- identities -------------------------------------------------------------------------------------

def test_identity_names_parameters_sorted() -> None:
    assert identity("vllm-int8", None) == identity("vllm-int8", "{}") == "vllm-int8"
    assert identity("int8-static", '{"static_scale": 0.03125, "rounding": "away"}') == STATIC_AWAY
    assert identity("int8-static", {"static_scale": 0.03125}) == STATIC


# -- the certificate --------------------------------------------------------------------------------

def _replay_figures(rows: list[dict[str, Any]], ref: str, cand: str) -> dict[str, Any]:
    mine = [r for r in rows if r["reference"] == ref and r["candidate"] == cand]
    return {"layers": len({r["layer"] for r in mine}),
            "identical_layers": len({r["layer"] for r in mine if r["out_bitwise_equal"]}),
            "elements": sum(r["out_elements"] for r in mine), "differing": sum(r["out_differing"] for r in mine),
            "max_spacing": max(r["out_max_spacing"] for r in mine),
            "max_spacing_significant": max(r["out_max_spacing_significant"] for r in mine),
            "q_elements": sum(r["elements"] for r in mine), "q_differing": sum(r["q_differing"] for r in mine),
            "tokens": sum(r["tokens"] for r in mine), "scales_differing": sum(r["scales_differing"] for r in mine)}


def _identical(seqs: list[dict[str, Any]], a: str, b: str) -> tuple[int, int]:
    x = {r["prompt_index"]: r["sequence_hash"] for r in seqs if r["arm"] == a and r["restart"] == 0}
    y = {r["prompt_index"]: r["sequence_hash"] for r in seqs if r["arm"] == b and r["restart"] == 0}
    return sum(x.get(i) == y.get(i) for i in set(x) | set(y)), len(set(x) | set(y))


def _verdict(rp: dict[str, Any], e2e_identical: bool) -> str:
    """The rules of docs/certificate.md, written again for one section with replay and end to end."""
    if rp["differing"] == 0 and rp["identical_layers"] == rp["layers"]:
        return "IDENTICAL" if e2e_identical else "INCONCLUSIVE"
    if rp["max_spacing"] <= 1 and rp["differing"] / rp["elements"] <= 1e-3:
        return "EPILOGUE_ROUNDING"
    return "DIFFERENT"


@pytest.mark.parametrize(("ref", "cand", "a", "b", "arm_a", "arm_b"), [
    ("vllm-int8", "int8-fp16-scale", "vllm-int8", "int8-fp16-scale", "base", "fp16s"),
    ("s-rne", "s-away", STATIC, STATIC_AWAY, "s-away", "s-rne"),
])
def test_quantizer_certificate_matches_the_rows(results: tuple[Path, str], certs: list[dict[str, Any]], ref: str,
                                               cand: str, a: str, b: str, arm_a: str, arm_b: str) -> None:
    root, sweep = results
    cert = _cert(certs, a, b)
    assert (cert["kernel_a"], cert["kernel_b"]) == (a, b)  # the quantize kind's order: reference first
    assert cert["swap"] == "quantizer" and cert["gemm_kernel"] == GEMM and GEMM in cert["fixed"]
    (sec,) = cert["scale_modes"]
    assert sec["scale_mode"] == "real" and sec["kdepth"]["status"] == "not run"
    want = _replay_figures(_parquet(root, "quantize"), ref, cand)
    rp = sec["replay"]
    assert {k: rp[k] for k in want} == want
    assert rp["ppm"] == pytest.approx(1e6 * want["differing"] / want["elements"])
    assert cert["max_spacing"] == want["max_spacing"]
    # end to end: the one arm pair that differs only in these two quantizers
    (p,) = sec["end_to_end"]["arm_pairs"]
    assert (p["arm_a"], p["arm_b"]) == (arm_a, arm_b) and {p["kernel_a"], p["kernel_b"]} == {a, b}
    assert (p["identical"], p["total"]) == _identical(_parquet(root, "sequences"), arm_a, arm_b)
    tf = [r for r in _parquet(root, "teacher_forced") if {r["ref_arm"], r["arm"]} == {arm_a, arm_b}]
    (f,) = p["flips"]
    assert (f["positions"], f["flips"], f["dropped"]) == (len(tf), sum(bool(r["flip"]) for r in tf), 0)
    from scipy.stats import binomtest

    ci = binomtest(f["flips"], f["positions"]).proportion_ci(method="exact")
    assert (f["flip_rate_ci_low"], f["flip_rate_ci_high"]) == pytest.approx((ci.low, ci.high))
    assert sec["verdict"] == cert["verdict"] == _verdict(want, p["identical"] == p["total"])
    assert cert["answer"].startswith(f"can {b} replace {a} with GEMM kernel {GEMM} fixed? ")
    assert f"{p['identical']}/{p['total']} sequences identical" in cert["answer"]
    assert f"{want['q_differing']:,}/{want['q_elements']:,} quantized values" in cert["answer"]


def test_fp8_pair_goes_through_an_fp8_gemm(certs: list[dict[str, Any]], results: tuple[Path, str]) -> None:
    cert = _cert(certs, "vllm-fp8", "fp8-mul-inv")
    rows = [r for r in _parquet(results[0], "quantize") if r["candidate"] == "fp8-mul-inv"]
    rp = cert["scale_modes"][0]["replay"]
    assert cert["gemm_kernel"] == rp["gemm_kernel"] == "fp8-sequential" and rp["status"] == "run"
    (q,) = cert["quantize"]
    assert (q["elements"], q["q_differing"], q["out_elements"], q["out_differing"]) == (
        sum(r["elements"] for r in rows), sum(r["q_differing"] for r in rows),
        sum(r["out_elements"] for r in rows), sum(r["out_differing"] for r in rows))
    assert cert["answer"].startswith("can fp8-mul-inv replace vllm-fp8 with GEMM kernel fp8-sequential fixed? ")


def test_arm_pairs_that_change_the_quantizer_leave_gemm_certificates(certs: list[dict[str, Any]]) -> None:
    (gemm,) = [c for c in certs if c.get("swap") is None and {c["kernel_a"], c["kernel_b"]} == {GEMM, "int8-triton-order"}]
    pairs = [(p["arm_a"], p["arm_b"]) for s in gemm["scale_modes"] for p in s["end_to_end"].get("arm_pairs", [])]
    assert pairs == [("base", "triton")]  # fp16s / s-* vs triton change both: in no certificate
    # an arm without a quantizer runs the engine's own (vllm-int8): it pairs with the quantizer arms
    assert _cert(certs, "vllm-int8", STATIC)["scale_modes"][0]["end_to_end"]["arm_pairs"][0]["arm_a"] == "base"
    quantizer_arms = {(p["arm_a"], p["arm_b"]) for c in certs if c.get("swap") == "quantizer"
                      for s in c["scale_modes"] for p in s["end_to_end"].get("arm_pairs", [])}
    assert not any("triton" in pair for pair in quantizer_arms)


def test_certificate_cli_shows_the_fixed_gemm(results: tuple[Path, str]) -> None:
    res = runner.invoke(app, ["report", "certificate", "--results", str(results[0]), "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    certs = data if isinstance(data, list) else data["certificates"]
    assert any(c.get("swap") == "quantizer" and c["gemm_kernel"] == GEMM for c in certs)
    table = runner.invoke(app, ["report", "certificate", "--results", str(results[0])])
    assert table.exit_code == 0, table.output
    assert f"quantizer swap: GEMM kernel {GEMM} fixed" in table.stdout
    assert f"can int8-fp16-scale replace vllm-int8 with GEMM kernel {GEMM} fixed?" in table.stdout


# -- report all -------------------------------------------------------------------------------------

@pytest.mark.slow  # slow set: the default run stays under 6 minutes on 2 cores (CI runs both)
def test_report_all_has_the_quantizer_section(results: tuple[Path, str], tmp_path: Path) -> None:
    root = results[0]
    res = runner.invoke(app, ["report", "all", "--results", str(root), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (table,) = [t for t in doc["tables"] if t["section"] == "quantizer-swaps"]
    rows = _parquet(root, "quantize")
    pairs = sorted({(r["experiment"], r["reference"], r["candidate"]) for r in rows})
    assert [(t["experiment"], t["pair (reference vs candidate)"]) for t in table["rows"]] == \
        [(e, f"{a} vs {b}") for e, a, b in pairs]
    assert GEMM in table["note"] and "FP8 pairs: fp8-sequential" in table["note"]
    for t, (e, a, b) in zip(table["rows"], pairs, strict=True):
        mine = [r for r in rows if (r["experiment"], r["reference"], r["candidate"]) == (e, a, b)]
        elements, differing = sum(r["elements"] for r in mine), sum(r["q_differing"] for r in mine)
        assert t["quantized values differing (%)"].startswith(f"{differing:,} of {elements:,} (")
        assert t["largest abs(q_ref - q_cand)"] == max(r["q_max_abs_diff"] for r in mine)
        tokens, scales = sum(r["tokens"] for r in mine), sum(r["scales_differing"] for r in mine)
        assert t["per-token scales differing (largest distance, spacings)"].startswith(f"{scales:,} of {tokens:,}")
        if mine[0]["out_elements"] is None:
            assert t["GEMM outputs differing (ppm)"] == "not run"
            continue
        out_n, out_d = sum(r["out_elements"] for r in mine), sum(r["out_differing"] for r in mine)
        assert t["GEMM outputs differing (ppm)"].startswith(f"{out_d:,} of {out_n:,} (")
        assert t["largest output distance, bf16 spacings (normal range: outputs >= 5% of largest / raw: all)"] == \
            f"{max(r['out_max_spacing_significant'] for r in mine):,} / {max(r['out_max_spacing'] for r in mine):,}"
        # The verdict per pair (reports.quantize.pair_verdict), the certificate's rule on the downstream GEMM.
        rate = out_d / out_n
        want = ("IDENTICAL" if out_d == 0 else "EPILOGUE_ROUNDING"
                if rate <= 1e-3 and max(r["out_max_spacing"] for r in mine) <= 1 else "DIFFERENT")
        assert t["verdict (downstream GEMM)"] == want
        assert t["layer calls bit-identical"] == f"{sum(bool(r['out_bitwise_equal']) for r in mine)} of {len(mine)}"
    md = runner.invoke(app, ["report", "all", "--results", str(root), "--format", "markdown"])
    assert md.exit_code == 0, md.output
    assert "## Quantizer swaps" in md.stdout and "| largest abs(q_ref - q_cand) |" in md.stdout
    out = tmp_path / "r.html"
    html = runner.invoke(app, ["report", "all", "--results", str(root), "--format", "html", "--out", str(out)])
    assert html.exit_code == 0, html.output
    assert 'id="quantizer-swaps"' in out.read_text()
