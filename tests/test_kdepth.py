"""The kdepth task: operands drawn like a W8A8 layer, comparisons in spacings, the INT8/FP8 signature."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.comparison import compare
from tasks.kinds.kdepth import run
from tasks.models.operands import draw_operands
from tasks.numerics import get_format

BF16 = get_format("bf16")


def _impl(name: str) -> dict:
    return {"name": name, "kernel": name, "params": {}, "version": "1"}


def _params(dtype: str, k: int, seed: int, mode: str, impls: list[str], m: int = 256) -> dict:
    return {"dtype": dtype, "m": m, "n": m, "k": k, "seed": seed, "scale_mode": mode, "out_dtype": "bf16",
            "bias": False, "implementations": [_impl(i) for i in impls], "reference": _impl("exact")}


def test_int8_operands_follow_scaled_int8_quant() -> None:
    ops = draw_operands("int8", 8, 5, 64, seed=3, scale_mode="real")
    assert ops["a"].dtype == torch.int8 and ops["b"].dtype == torch.int8
    assert ops["scale_a"].shape == (8, 1) and ops["scale_b"].shape == (5,)
    assert int(ops["b"].abs().max()) <= 127
    # Every row's absmax quantizes to +-127 (x * 127/absmax rounds to +-127 exactly at the max).
    assert (ops["a"].abs().amax(dim=1) == 127).all()


def test_pow2_scales_are_powers_of_two_and_pair_with_real() -> None:
    real = draw_operands("int8", 8, 5, 64, seed=3, scale_mode="real")
    pow2 = draw_operands("int8", 8, 5, 64, seed=3, scale_mode="pow2")
    for s in (pow2["scale_a"], pow2["scale_b"]):
        mant, _ = np.frexp(s.numpy())
        assert (mant == 0.5).all()
    # Same underlying draw: pow2 scales are the real ones rounded up, never more than 2x.
    ratio = pow2["scale_a"] / real["scale_a"]
    assert ((ratio >= 1) & (ratio < 2)).all()


def test_fp8_operands_are_finite_e4m3() -> None:
    ops = draw_operands("fp8_e4m3", 8, 5, 64, seed=0, scale_mode="real")
    assert ops["a"].dtype == torch.float8_e4m3fn
    assert torch.isfinite(ops["a"].float()).all() and ops["a"].float().abs().max() <= 448


def test_draws_are_deterministic() -> None:
    a = draw_operands("fp8_e4m3", 4, 4, 32, seed=1, scale_mode="real")
    b = draw_operands("fp8_e4m3", 4, 4, 32, seed=1, scale_mode="real")
    assert torch.equal(a["a"].view(torch.uint8), b["a"].view(torch.uint8))
    c = draw_operands("fp8_e4m3", 4, 4, 32, seed=2, scale_mode="real")
    assert not torch.equal(a["a"].view(torch.uint8), c["a"].view(torch.uint8))


def test_compare_counts_spacings_and_nonfinite() -> None:
    ref = torch.tensor([[1.0, 256.0, -0.0, 3.0], [1.0, 2.0, float("nan"), float("inf")]], dtype=torch.bfloat16)
    out = torch.tensor([[1.0078125, 258.0, 0.0, 3.0], [1.0, 2.0, 5.0, float("inf")]], dtype=torch.bfloat16)
    r = compare(out, ref, BF16)
    assert r["elements"] == 8 and r["differing"] == 4
    assert (r["hist_0"], r["hist_1"], r["hist_2"], r["hist_gt2"]) == (4, 3, 0, 0)
    assert r["nonfinite_mismatch"] == 1  # the NaN, compared by bits, never dropped
    assert r["max_spacing"] == 1 and r["max_abs_error"] == 2.0
    assert (r["worst_row"], r["worst_col"]) == (0, 0)


def test_compare_identical() -> None:
    x = torch.randn(3, 7).to(torch.bfloat16)
    r = compare(x, x.clone(), BF16)
    assert r["differing"] == 0 and r["max_spacing"] == 0 and r["hist_0"] == 21


def test_run_rows_cover_pairs_and_reference() -> None:
    rows = run(_params("int8", 64, 0, "real", ["int8-cutlass-order", "int8-triton-order", "int8-torch-channelwise"], m=16))["kdepth"]
    pairs = {(r["comparison"], r["impl_a"], r["impl_b"]) for r in rows}
    assert len(rows) == 6 and ("reference", "int8-triton-order", "exact") in pairs
    assert ("pair", "int8-cutlass-order", "int8-torch-channelwise") in pairs


def _sum(dtype: str, k: int, mode: str, impls: list[str], a: str, b: str, seeds: range) -> tuple[int, int, int]:
    diff = elems = worst = 0
    for seed in seeds:
        for r in run(_params(dtype, k, seed, mode, impls))["kdepth"]:
            if (r["impl_a"], r["impl_b"]) == (a, b):
                diff += r["differing"]
                elems += r["elements"]
                worst = max(worst, r["max_spacing"])
    return diff, elems, worst


@pytest.mark.parametrize("k", [256, 16384])
def test_int8_signature(k: int) -> None:
    """pow2: bit-identical; real: parts per million, never more than one spacing (numerics.md §4)."""
    impls = ["int8-cutlass-order", "int8-triton-order"]
    d, e, w = _sum("int8", k, "pow2", impls, *impls, seeds=range(4))
    assert d == 0 and w == 0
    d, e, w = _sum("int8", k, "real", impls, *impls, seeds=range(4))
    assert d / e < 1e-4 and w <= 1


def test_fp8_disagreement_with_exact_grows_with_k() -> None:
    impls = ["fp8-sequential"]
    low, e_low, _ = _sum("fp8_e4m3", 256, "real", impls, "fp8-sequential", "exact", seeds=range(4))
    high, e_high, _ = _sum("fp8_e4m3", 16384, "real", impls, "fp8-sequential", "exact", seeds=range(4))
    assert e_low == e_high and high > 3 * max(low, 1)
