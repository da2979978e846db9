"""FP8 quantizer pairs measured downstream through an FP8 GEMM (the ``quantize`` kind).

Both FP8 quantizers run on the same captured activations; each side's ``(q, scale)`` goes through
the experiment's ``fp8_gemm_kernel`` with the layer's weights quantized once to FP8 e4m3 per output
channel. Every downstream figure of the rows is recomputed here from scratch: the captured inputs,
the weights (an oracle in float64 and ``round_to_format``), the two GEMM calls, and the output
distances from bit patterns ordered by hand.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
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
    question = "Do two FP8 activation quantizers agree downstream of an FP8 GEMM?"
    name = "qz8"

    [experiments.fp8]
    kind = "quantize"
    reference = "vllm-fp8"
    candidates = [{ quantizer = "vllm-fp8", label = "same" },
                  { quantizer = "vllm-fp8", label = "fp16-scale", params = { scale_dtype = "fp16" } },
                  "fp8-mul-inv"]
    prompts = { count = 2, length = 8, seed = 1 }
    """)


def _parquet(root: Path, table: str) -> list[dict[str, Any]]:
    files = sorted((root / f"table={table}").rglob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("quantize-fp8") / "results"
    spec = parse_spec(SPEC)
    (unit,) = make_plan(spec).units
    summary = launch_in_process(root, spec)
    assert summary.n_ok == summary.n_units == 1, summary.failures
    return root, unit


@pytest.fixture(scope="module")
def model() -> Any:
    """The unit's model (tiny-qwen3, seed 0, the default int8 GEMM kernel for the capture pass)."""
    from tasks.models import build_model

    return build_model("tiny-qwen3", kernel="int8-cutlass-order", scales="real", seed=0)


def _weights_oracle(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 e4m3 per-channel weights from the layer's int8 ones, computed apart from the code under test:
    fp32 dequantization in float64 rounded once to fp32 (the product of an 8-bit and a 24-bit value is
    exact in float64), scales and quotients in float64 rounded to fp32 (a correctly rounded quotient:
    53 >= 2*24 + 2, so rounding twice is rounding once), e4m3 by round_to_format."""
    from tasks.numerics.rounding import NEAREST_EVEN, round_to_format

    q = layer.weight.numpy().astype(np.float64)
    s = layer.weight_scale.numpy().astype(np.float64).reshape(-1, 1)
    w = (q * s).astype(np.float32).astype(np.float64)
    amax = np.abs(w).max(axis=1, keepdims=True)
    scale = (amax / 448.0).astype(np.float32).astype(np.float64)
    scale = np.where(amax == 0, 1.0, scale)
    v = np.clip((w / scale).astype(np.float32).astype(np.float64), -448.0, 448.0)
    e4m3 = round_to_format(v, "fp8_e4m3fn", rounding=NEAREST_EVEN)
    return torch.from_numpy(e4m3).to(torch.float8_e4m3fn), torch.from_numpy(scale.reshape(-1).astype(np.float32))


def _ordered(t: torch.Tensor) -> np.ndarray:
    """Bit patterns of a 16- or 32-bit float tensor as integers ordered like the values, -0 one step
    below +0 (two different bit patterns)."""
    width = {torch.bfloat16: (torch.int16, 0x7FFF), torch.float16: (torch.int16, 0x7FFF),
             torch.float32: (torch.int32, 0x7FFFFFFF)}[t.dtype]
    b = t.contiguous().view(width[0]).numpy().astype(np.int64).reshape(-1)
    return np.where(b < 0, -(b & width[1]) - 1, b)


def _recompute(model: Any, params: dict[str, Any], candidate: Any) -> dict[str, dict[str, Any]]:
    """Per layer call: the downstream figures of ``vllm-fp8`` vs ``candidate`` through fp8-sequential."""
    from tasks.kernels import get_kernel
    from tasks.prompts import prompts_from_payload
    from tasks.quantizers import get_quantizer
    from tasks.quantizers.model import capture_inputs

    prompts = prompts_from_payload(params["prompts"], int(model.config.vocab_size))
    with capture_inputs(model) as inputs:
        model.forward_tokens(prompts)
    kernel = get_kernel("fp8-sequential")
    ref = get_quantizer("vllm-fp8")
    out: dict[str, dict[str, Any]] = {}
    for li in inputs:
        w8, ws = _weights_oracle(li.layer)
        qa, sa = ref(li.x)
        qb, sb = candidate(li.x)
        oa = kernel(qa, w8.t(), sa.float(), ws, li.layer.out_dtype, li.layer.bias)
        ob = kernel(qb, w8.t(), sb.float(), ws, li.layer.out_dtype, li.layer.bias)
        d = np.abs(_ordered(oa) - _ordered(ob))
        va = oa.double().numpy().reshape(-1)
        big = np.abs(va) >= 0.05 * np.abs(va).max(initial=0.0)
        out[li.key] = {"out_elements": d.size, "out_differing": int((d != 0).sum()), "out_max_spacing": int(d.max()),
                       "out_max_spacing_significant": int(d[big].max(initial=0)),
                       "out_bitwise_equal": bool(torch.equal(oa.view(torch.int16), ob.view(torch.int16)))}
    return out


def test_weights_match_the_oracle(model: Any) -> None:
    from tasks.kinds.quantize import fp8_weights

    for layer in list(model.linears().values())[:7]:
        q, s = fp8_weights(layer)
        qo, so = _weights_oracle(layer)
        assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (layer.out_features,)
        assert torch.equal(q.view(torch.uint8), qo.view(torch.uint8)) and torch.equal(s.view(torch.int32), so.view(torch.int32))
        assert float(q.float().abs().max()) == 448.0  # each layer's largest weight lands on the top of e4m3


def test_quantize_weight_fp8_edges() -> None:
    from tasks.models.quantization import quantize_weight_fp8

    w = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5], [3e-3, -7e-3, 1e-3]])
    q, s = quantize_weight_fp8(w)
    assert s[0] == 1.0 and not bool(q[0].float().any())  # an all-zero channel: scale 1, q 0
    assert s[1] == torch.tensor(2.0) / 448.0 and q[1].float().tolist() == [224.0, -448.0, 112.0]
    with pytest.raises(ValueError, match="inf or NaN"):
        quantize_weight_fp8(torch.tensor([[float("inf"), 1.0]]))
    with pytest.raises(ValueError, match="2-D"):
        quantize_weight_fp8(torch.ones(3))


def test_downstream_figures_equal_a_direct_recomputation(results: tuple[Path, Any], model: Any) -> None:
    from tasks.kinds.quantize import FP8_WEIGHTS
    from tasks.quantizers import get_quantizer

    rows = _parquet(results[0], "quantize")
    assert {r["gemm_kernel"] for r in rows} == {"fp8-sequential"} and {r["gemm_weights"] for r in rows} == {FP8_WEIGHTS}
    assert {r["q_dtype"] for r in rows} == {"fp8_e4m3"}
    fp16 = [r for r in rows if r["candidate"] == "fp16-scale"]
    want = _recompute(model, results[1].params, get_quantizer("vllm-fp8", scale_dtype="fp16"))
    assert len(fp16) == len(want) == 28
    for r in fp16:
        assert {k: r[k] for k in want[r["layer"]]} == want[r["layer"]], r["layer"]
    # fp16 scales round nearly every token's scale differently: the GEMM outputs differ
    assert sum(r["scales_differing"] for r in fp16) > 0 and sum(r["out_differing"] for r in fp16) > 0
    same = [r for r in rows if r["candidate"] == "same"]
    assert len(same) == 28 and all(r["out_bitwise_equal"] and r["out_differing"] == 0 for r in same)


def test_verdicts_of_report_quantize_and_the_certificate(results: tuple[Path, Any]) -> None:
    from reports.quantize import pair_verdict

    root = results[0]
    res = runner.invoke(app, ["report", "quantize", "--results", str(root), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = _parquet(root, "quantize")
    from storage.catalog import open_catalog

    with open_catalog(str(root)) as cat:
        pairs = {p["candidate"]: p for p in cat.named("quantize_by_pair", sweep=None)}
    assert pair_verdict(pairs["same"]) == "IDENTICAL"
    p = pairs["fp16-scale"]
    mine = [r for r in rows if r["candidate"] == "fp16-scale"]
    differing, elements = sum(r["out_differing"] for r in mine), sum(r["out_elements"] for r in mine)
    assert (p["out_differing"], p["out_elements"]) == (differing, elements) and differing > 0
    rare = differing / elements <= 1e-3 and max(r["out_max_spacing"] for r in mine) <= 1
    assert pair_verdict(p) == ("EPILOGUE_ROUNDING" if rare else "DIFFERENT")
    cert = runner.invoke(app, ["report", "certificate", "--results", str(root), "--format", "json"])
    assert cert.exit_code == 0, cert.output
    data = json.loads(cert.stdout)
    certs = {c["kernel_b"]: c for c in (data if isinstance(data, list) else data["certificates"]) if c.get("swap") == "quantizer"}
    same = certs["vllm-fp8"]  # the "same" candidate is vllm-fp8 with its presets: named vllm-fp8 vs vllm-fp8
    assert same["verdict"] == "IDENTICAL" and same["gemm_kernel"] == "fp8-sequential"
    c16 = certs["vllm-fp8(scale_dtype=fp16)"]
    assert c16["verdict"] == pair_verdict(p) and c16["scale_modes"][0]["replay"]["differing"] == differing
    assert c16["fixed"].startswith("quantizer swap: FP8 GEMM kernel fp8-sequential fixed")
    assert c16["answer"].startswith("can vllm-fp8(scale_dtype=fp16) replace vllm-fp8 with GEMM kernel fp8-sequential fixed? ")


def test_unit_parameters_and_spec_problems() -> None:
    spec = parse_spec(SPEC + textwrap.dedent("""
        [experiments.int8]
        kind = "quantize"
        candidates = ["int8-half-away"]
        """))
    units = {u.experiment: u for u in make_plan(spec).units}
    assert units["fp8"].params["fp8_gemm_kernel"]["kernel"] == "fp8-sequential"
    assert "fp8_gemm_kernel" not in units["int8"].params  # INT8 units keep the ids they had
    bad = SPEC.replace('reference = "vllm-fp8"', 'reference = "vllm-fp8"\nfp8_gemm_kernel = "int8-cutlass-order"')
    with pytest.raises(SpecError, match=r"experiments\.fp8\.fp8_gemm_kernel: kernel 'int8-cutlass-order' takes int8 "
                                        r"operands, but this experiment's dtype is fp8_e4m3"):
        make_plan(parse_spec(bad))
