"""Every number with its yardstick (issue #23): one spacing fact under one name everywhere.

A real FP8 K-depth sweep (fp8-torch-scaled-mm vs fp8-blocked-128, 2 seeds, K 1024 and 4096) has
outputs near zero that lie 4 or 5 spacings apart (by MKL's ISA) while every normal-range output (|reference| >= 5% of
the largest) is within 1 spacing. `report kdepth`, `report certificate`, the nightly metrics and
`report all` must give the same normal-range max spacing for that pair and sweep, with the
near-zero outputs beside it, and the raw maximum labelled raw. Also: the rule of the named query
(`_near_zero_totals.sql`) and of `reports.spacing.add` agree; the one Markdown table writer escapes
`|`; the quantize verdict; the noise floor's raw distances carry a yardstick.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from _library_facts import isa_fact
from typer.testing import CliRunner

from orchestrator.cli.main import app
from reports import kdepth, metrics, noise_floor, spacing
from reports.quantize import pair_verdict
from storage.catalog import open_catalog
from tasks.devices import mkl_isa

runner = CliRunner()

SWEEP = "fp8-facts"
PAIR = ("fp8-torch-scaled-mm", "fp8-blocked-128")
SPEC = f"""
question = "Do FP8 accumulation orders agree in the normal range, and how far apart are near-zero outputs?"
name = "{SWEEP}"

[experiments.fp8]
kind = "kdepth"
dtype = "fp8_e4m3"
implementations = ["fp8-torch-scaled-mm", "fp8-blocked-128"]
reference = "exact"
scale_modes = ["real"]
m = 128
n = 128
k = [1024, 4096]
seeds = 2
out_dtype = "bf16"
"""


@pytest.fixture(scope="module")
def results(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("facts")
    spec = root / "fp8.toml"
    spec.write_text(SPEC)
    res = runner.invoke(app, ["sweep", "launch", str(spec), "--results", str(root / "results"), "--no-progress"])
    assert res.exit_code == 0, res.output
    return root / "results"


#: The pair's raw max spacing over both K, per instruction set of MKL's fp32 GEMM (tasks.devices.mkl_isa),
#: torch 2.13.0+cpu: 5 with AVX-512 kernels (an Intel CPU with AMX, CI's); 4 with AVX2 ones (an AMD EPYC with
#: AVX-512, measured; an AVX2-only EPYC, as reported; MKL_ENABLE_INSTRUCTIONS=AVX2 on the AVX-512 EPYC, measured).
RAW_MAX_SPACING = {"AVX-512": 5, "AVX2": 4}


def _json(*args: str) -> Any:
    res = runner.invoke(app, [*args, "--format", "json"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _is_pair(r: dict[str, Any], a: str = "impl_a", b: str = "impl_b") -> bool:
    return {r[a], r[b]} == set(PAIR)


def test_one_normal_range_max_spacing_everywhere(results: Path) -> None:
    args = ("--results", str(results), "--sweep", SWEEP)
    per_k = [r for r in _json("report", "kdepth", *args) if r["comparison"] == "pair" and _is_pair(r)]
    assert [r["k"] for r in per_k] == [1024, 4096]
    normal = max(r["max_spacing_significant"] for r in per_k)
    raw = max(r["max_spacing"] for r in per_k)
    # The data this test is about: near-zero outputs farther apart than every normal-range one.
    assert normal == 1 and raw > normal
    # How far: fp8-torch-scaled-mm's fp32 matmul sums in MKL's order for the ISA (issue #35).
    assert raw == isa_fact(RAW_MAX_SPACING, what="the raw max spacing of torch._scaled_mm (CPU) vs fp8-blocked-128",
                           level=mkl_isa())
    near = sum(r["near_zero_beyond"] for r in per_k)  # both K rows have a normal-range max of 1
    assert near >= 1 and all(r["near_zero_beyond_exact"] for r in per_k)

    (cert,) = [c for c in _json("report", "certificate", *args) if _is_pair(c, "kernel_a", "kernel_b")]
    (kd,) = [s["kdepth"] for s in cert["scale_modes"]]
    assert cert["max_spacing_significant"] == kd["max_spacing_significant"] == normal
    assert cert["near_zero_beyond"] == kd["near_zero_beyond"] == near
    assert cert["max_spacing"] == kd["max_spacing"] == raw  # the raw max keeps its key and meaning
    # The answer leads with the normal-range max and puts the near-zero outputs beside it.
    assert f"max {normal} sp in the normal range" in cert["answer"]
    assert f"near-zero output{'s' if near > 1 else ''} farther apart: up to {raw} sp" in cert["answer"]
    assert f"max {raw} sp" not in cert["answer"]

    with open_catalog(results) as cat:
        m = metrics.sweep_metrics(cat, SWEEP)
    key = f"kdepth/fp8_e4m3/{PAIR[0]}~{PAIR[1]}/real"
    assert m[f"{key}/max_spacing_significant"]["value"] == normal
    assert m[f"{key}/near_zero_beyond"]["value"] == near

    doc = _json("report", "all", *args)
    (row,) = [r for r in doc["certificate"]["rows"] if _is_pair(r, "kernel_a", "kernel_b")]
    assert (row["max_spacing_significant"], row["near_zero_beyond"], row["max_spacing"]) == (normal, near, raw)
    (view,) = [v for v in doc["certificate"]["view"] if v["pair"] == f"{PAIR[0]} vs {PAIR[1]}"]
    assert (view[spacing.NORMAL], view[spacing.NEAR_ZERO], view[spacing.RAW]) == (normal, near, raw)

    conf = [r for r in _json("report", "conformance", *args) if _is_pair(r, "kernel_a", "kernel_b")]
    assert [(r["kdepth_max_spacing_significant"], r["kdepth_near_zero_beyond"]) for r in conf] == [(normal, near)]


def test_report_totals_follow_the_named_query_rule(results: Path) -> None:
    """reports.spacing.add re-derives the near-zero fields of a sum by the rule of _near_zero_totals.sql:
    summed back to the query's own grouping it gives the query's values."""
    keys = ("sweep", "dtype", "out_dtype", "comparison", "impl_a", "impl_b", "scale_mode", "k")
    with open_catalog(results) as cat:
        rows = kdepth.summary(cat, SWEEP)
    totals = {tuple(t[c] for c in keys): t for t in kdepth.pair_totals(rows, keys=keys)}
    fields = ("max_spacing", "max_spacing_significant", "near_zero_beyond", "near_zero_beyond_exact",
              "near_zero_max_spacing", "near_zero_worst_abs_error")
    for r in rows:
        t = totals[tuple(r[c] for c in keys)]
        assert {f: t[f] for f in fields} == {f: r[f] for f in fields}


def test_near_zero_count_rule() -> None:
    row = {"max_spacing": 7, "max_spacing_significant": 1, "hist_1": 10, "hist_2": 2, "hist_gt2": 1,
           "max_abs_error": 2.0, "near_zero_max_spacing": 7, "near_zero_worst_abs_error": 3e-5}
    t = spacing.empty()
    spacing.add(t, row)
    assert (t["near_zero_beyond"], t["near_zero_beyond_exact"], t["near_zero_max_spacing"]) == (3, True, 7)
    assert t["near_zero_worst_abs_error"] == 3e-5
    # A second group whose normal-range max is 3: beyond 3 the histogram cannot count -> a lower bound.
    spacing.add(t, {**row, "max_spacing": 9, "max_spacing_significant": 3, "near_zero_max_spacing": 9,
                    "near_zero_worst_abs_error": 1e-6})
    assert (t["near_zero_beyond"], t["near_zero_beyond_exact"], t["near_zero_max_spacing"]) == (1, False, 9)
    assert spacing.phrase(t).startswith("max 3 sp in the normal range; >= 1 near-zero outputs farther apart: up to 9 sp")
    # Nothing beyond the normal range: no near-zero clause.
    flat = spacing.empty()
    spacing.add(flat, {**row, "max_spacing": 1})
    assert flat["near_zero_beyond"] == 0 and spacing.phrase(flat) == "max 1 sp in the normal range"


def test_emit_rows_markdown_escapes_pipes() -> None:
    from orchestrator.cli.common import emit_rows
    from reports.render import md_table

    rows = [{"a|b": "x | y", "n": 3, "none": None}]
    buf = io.StringIO()
    with redirect_stdout(buf):
        emit_rows(rows, "markdown", title="t")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "### t"
    assert lines[2] == "| a\\|b | n | none |"
    assert lines[4] == "| x \\| y | 3 |  |"  # emit_rows' own cell formatter, the one writer's escaping
    assert md_table(rows).splitlines()[2] == "| x \\| y | 3 | — |"


def _qrow(**kw: Any) -> dict[str, Any]:
    base = {"out_elements": 1000, "out_differing": 0, "out_frac_differing": 0.0, "out_max_spacing": 0,
            "q_differing": 0, "scales_differing": 0}
    return {**base, **kw}


def test_quantize_pair_verdict() -> None:
    assert pair_verdict(_qrow()) == "IDENTICAL"
    assert pair_verdict(_qrow(q_differing=3, scales_differing=2)) == "IDENTICAL"  # downstream decides
    assert pair_verdict(_qrow(out_differing=1, out_frac_differing=1e-3, out_max_spacing=1)) == "EPILOGUE_ROUNDING"
    assert pair_verdict(_qrow(out_differing=2, out_frac_differing=2e-3, out_max_spacing=1)) == "DIFFERENT"
    assert pair_verdict(_qrow(out_differing=1, out_frac_differing=1e-6, out_max_spacing=4)) == "DIFFERENT"
    fp8 = _qrow(out_elements=None, out_differing=None, out_frac_differing=None, out_max_spacing=None)
    assert pair_verdict(fp8) == "IDENTICAL"
    assert pair_verdict({**fp8, "q_differing": 14}) == "not run (no downstream GEMM)"


def test_noise_floor_raw_distance_has_a_yardstick() -> None:
    assert noise_floor.raw_logit_cell(276969) == "276,969"
    assert noise_floor.raw_logit_cell(2050785249) == "2,050,785,249 (0.96 x the distance from -1.0 to +1.0)"
    row = {"sweep": "s", "kernel": "k", "scales": "real", "reductions": "fp32", "comparison": "decode", "batch": 8,
           "sequences": {"k": 0, "n": 4, "interval": None}, "positions_rate": {"k": 0, "n": 4, "interval": None},
           "positions_logits_differ": 4, "positions": 4, "max_spacing": 2050785249, "max_spacing_significant": 12,
           "positions_near_zero_max": 4, "max_argmax_spacing": 3, "max_flip_margin": None}
    (line,) = noise_floor.model_table([row])
    assert line["max fp32 spacings (normal range: logits >= 5% of the largest)"] == 12
    assert line[noise_floor.RAW_LOGIT_SPACING].startswith("2,050,785,249 (")
    assert line["positions whose max is at a near-zero logit"] == "4/4"


def test_attention_answer_says_why_the_verdict() -> None:
    from reports.attention import answer_detail

    section = {"dtypes": ["float32"], "lse_differing": 1, "lse_elements": 4, "lse_max_spacing": 2}
    dtypes = [{"dtype": "float32", "reference_max_spacing": {"a": 900, "b": 800},
               "reference_max_spacing_significant": {"a": 28, "b": 32}}]
    text = answer_detail(section, dtypes, {"a": "flash", "b": "plain"})
    assert "each kernel vs float64 (normal range): a 28 sp, b 32 sp" in text
    assert "the verdict's reason: a within the bounds of flash; b within the bounds of plain" in text
