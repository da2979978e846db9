"""The ``quantize`` kind, its named queries and ``report quantize``; the ``quantizer`` arm field.

Units run in this process through the worker's own code path (an in-process launch), no Ray. The
figures the report prints are recomputed here from the Parquet rows.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.errors import SpecError
from orchestrator.plan import make_plan
from orchestrator.spec import parse_spec
from tests.conftest import launch_in_process

runner = CliRunner()

SPEC = textwrap.dedent("""
    question = "Do two activation quantizers agree on the tiny model's activations?"
    name = "qz"

    [experiments.int8]
    kind = "quantize"
    reference = "vllm-int8"
    candidates = ["int8-half-away", "int8-fp16-scale", { quantizer = "vllm-int8", label = "same" }]
    prompts = { count = 2, length = 8, seed = 1 }

    [experiments.fp8]
    kind = "quantize"
    reference = "vllm-fp8"
    candidates = ["fp8-mul-inv"]
    prompts = { count = 2, length = 8, seed = 1 }
    """)


def _run_all(root: Path, text: str) -> str:
    summary = launch_in_process(root, text)
    assert summary.n_ok == summary.n_units, summary.failures
    return summary.sweep


def _parquet(root: Path, table: str) -> list[dict[str, Any]]:
    files = sorted((root / f"table={table}").rglob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("quantize") / "results"
    _run_all(root, SPEC)
    return root


def test_rows_per_layer_and_pair(results: Path) -> None:
    rows = _parquet(results, "quantize")
    int8 = [r for r in rows if r["q_dtype"] == "int8"]
    layers = {r["layer"] for r in int8}
    assert len(layers) == 7 * 4  # seven W8A8 projections in each of tiny-qwen3's four decoder layers
    assert len(int8) == 3 * len(layers)
    same = [r for r in int8 if r["candidate"] == "same"]
    assert all(r["q_differing"] == 0 and r["scales_differing"] == 0 and r["out_bitwise_equal"] for r in same)
    # fp16 scales: the q formula (x * fl32(127/amax)) does not read the scale, so q is unchanged,
    # while nearly every token's scale moves (fp16 keeps 11 of fp32's 24 bits)
    f16 = [r for r in int8 if r["candidate"] == "int8-fp16-scale"]
    assert all(r["q_differing"] == 0 and r["scale_format"] == "fp32" for r in f16)
    assert sum(r["scales_differing"] for r in f16) > 0.9 * sum(r["tokens"] for r in f16)
    assert sum(r["out_differing"] for r in f16) > 0
    away = [r for r in int8 if r["candidate"] == "int8-half-away"]
    assert all(r["scales_differing"] == 0 and r["q_max_abs_diff"] <= 1 for r in away)
    assert all(r["out_bitwise_equal"] for r in away if r["q_differing"] == 0)  # same q and scale: same GEMM
    fp8 = [r for r in rows if r["q_dtype"] == "fp8_e4m3"]
    assert len(fp8) == len(layers) and all(r["gemm_kernel"] == "fp8-sequential" and r["out_elements"] for r in fp8)
    assert all(r["out_bitwise_equal"] for r in fp8 if r["q_differing"] == 0)  # same q and scale: same FP8 GEMM
    assert all(r["scales_differing"] == 0 for r in fp8)  # same scale formula; only q's formation differs


def test_report_quantize_matches_the_rows(results: Path) -> None:
    res = runner.invoke(app, ["report", "quantize", "--results", str(results), "--format", "json"])
    assert res.exit_code == 0, res.output
    per_layer = json.loads(res.stdout)
    rows = _parquet(results, "quantize")
    assert len(per_layer) == len(rows)
    from reports import quantize as qr
    from storage.catalog import open_catalog

    with open_catalog(str(results)) as cat:
        pairs = {(p["reference"], p["candidate"]): p for p in qr.by_pair(cat, None)}
    for (ref, cand), p in pairs.items():
        mine = [r for r in rows if r["reference"] == ref and r["candidate"] == cand]
        assert p["elements"] == sum(r["elements"] for r in mine)
        assert p["q_differing"] == sum(r["q_differing"] for r in mine)
        assert p["scales_differing"] == sum(r["scales_differing"] for r in mine)
        assert p["layers"] == len({r["layer"] for r in mine})
    table = runner.invoke(app, ["report", "quantize", "--results", str(results), "--layers"])
    assert table.exit_code == 0, table.output
    assert "vllm-int8 vs int8-half-away" in table.output and "quantizer pairs by layer call" in table.output


def test_bad_specs_name_the_field() -> None:
    bad = SPEC.replace('"int8-half-away"', '"int8-half-awy"')
    with pytest.raises(SpecError, match=r"experiments\.int8\.candidates\[0\]: unknown quantizer 'int8-half-awy'; did you mean 'int8-half-away'"):
        make_plan(parse_spec(bad))
    mixed = SPEC.replace('candidates = ["fp8-mul-inv"]', 'candidates = ["vllm-int8"]')
    with pytest.raises(SpecError, match=r"experiments\.fp8\.candidates\[0\]: 'vllm-int8' produces int8 but the reference produces fp8_e4m3"):
        make_plan(parse_spec(mixed))


E2E = textwrap.dedent("""
    question = "Does the quantizer change generations?"
    name = "qe2e"

    [experiments.e2e]
    kind = "generate"
    restarts = 1
    prompts = {{ count = 2, length = 6, seed = 0 }}
    max_new_tokens = 3

    [experiments.e2e.arms.a]
    kernel = "int8-cutlass-order"

    [experiments.e2e.arms.b]
    kernel = "int8-cutlass-order"
    {extra}
    """)


def _ids(text: str) -> dict[str, str]:
    plan = make_plan(parse_spec(text))
    return {u.params["arm"]["name"]: u.id for u in plan.units}


def test_arm_quantizer_keeps_ids_of_arms_without_it() -> None:
    without = _ids(E2E.format(extra=""))
    with_q = _ids(E2E.format(extra='quantizer = "int8-half-away"'))
    assert with_q["a"] == without["a"] and with_q["b"] != without["b"]
    plan = make_plan(parse_spec(E2E.format(extra='quantizer = "int8-half-away"')))
    arms = {u.params["arm"]["name"]: u.params["arm"] for u in plan.units}
    assert "quantizer" not in arms["a"]
    assert arms["b"]["quantizer"] == {"name": "int8-half-away", "quantizer": "int8-half-away", "params": {}, "version": "1"}


@pytest.mark.parametrize("extra, message", [
    ('quantizer = "vllm-fp8"', r"arms\.b\.quantizer: 'vllm-fp8' produces fp8_e4m3; the W8A8 engine takes int8"),
    ('quantizer = "int8-half-away"\n    scales = "pow2"', r"arms\.b\.quantizer: a quantizer forms its own scales"),
    ('quantizer = "vllm-int9"', r"arms\.b\.quantizer: unknown quantizer 'vllm-int9'"),
    ('quantizer_params = { rounding = "away" }', r"arms\.b\.quantizer_params: set only with `quantizer`"),
])
def test_arm_quantizer_problems(extra: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        make_plan(parse_spec(E2E.format(extra=extra)))


def test_engine_with_the_default_quantizer_is_bit_identical() -> None:
    from tasks.models import build_model
    from tasks.quantizers import get_quantizer
    from tasks.quantizers.model import install_quantizer

    prompts = [[1, 5, 9, 13, 2, 7], [4, 4, 8, 1, 3, 30]]
    model = build_model("tiny-qwen3", kernel="int8-cutlass-order", seed=0)
    base = model.forward_tokens(prompts)
    install_quantizer(model, get_quantizer("vllm-int8"))
    assert torch.equal(model.forward_tokens(prompts), base)
    install_quantizer(model, get_quantizer("int8-fp16-scale"))
    assert not torch.equal(model.forward_tokens(prompts), base)  # fp16 scales move the outputs
    install_quantizer(model, None)
    assert torch.equal(model.forward_tokens(prompts), base)
    with pytest.raises(ValueError, match="produces fp8_e4m3"):
        install_quantizer(model, get_quantizer("vllm-fp8"))
