"""`swapcheck tolerance` and `swapcheck.testing.assert_within_bound` (issue #41, docs/tolerance.md).

The closed form is checked against an independent evaluation of the formula in fractions; the
per-element check against kernels whose accumulation is known: fp32 accumulation in many orders
(torch's own matmuls, float64, split K, random permutations and chunkings) must always pass, and a
running sum rounded to bf16 at every step must fail for every shape of at least 64 outputs here.
"""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from orchestrator.cli.main import app
from swapcheck.testing import assert_within_bound, check_within_bound
from tasks.checks import operands as ops
from tasks.numerics.tolerance import VERSION

BF16 = torch.bfloat16
cli = CliRunner()


def _json(*args: str) -> dict:
    res = cli.invoke(app, ["tolerance", *args, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _gamma(n: int, u: Fraction) -> Fraction:
    return n * u / (1 - n * u)


# -- the CLI ------------------------------------------------------------------------------------------


def test_bf16_k4096_json_matches_the_formula() -> None:
    r = _json("--dtype", "bf16", "--k", "4096")
    assert r["derivation_version"] == VERSION and r["source"] == "tasks.numerics.tolerance.gemm_tolerance"
    assert (r["dtype"], r["accumulate"], r["out_dtype"], r["algorithm"], r["k"]) == ("bf16", "fp32", "bf16", "any", 4096)
    # any order, products possibly rounded: n = K + 1 roundings, N = 3K - 1 charged (docs/numerics.md)
    assert (r["roundings"], r["charged"]) == (4097, 3 * 4096 - 1)
    u, eta, u_out = Fraction(1, 2**24), Fraction(1, 2**150), Fraction(1, 2**8)
    g = _gamma(4097, u)
    e = g * 4096 + (3 * 4096 - 1) * eta * (1 + g)
    atol = e * (1 + u_out) + Fraction(1, 2**134)
    assert r["rtol"] == float(u_out)
    assert float(atol) <= r["atol"] <= float(atol) * (1 + 1e-12)
    assert float(atol + u_out * 4096) <= r["bound"] <= float(atol + u_out * 4096) * (1 + 1e-12)
    assert r["magnitudes"] == {"max_abs_a": 1.0, "max_abs_b": 1.0, "sum_abs": 4096.0, "from": "k * max_abs_a * max_abs_b"}
    assert "near_tie" not in r and r["overflow_possible"] is False


def test_magnitudes_algorithms_and_int8() -> None:
    big = _json("--dtype", "bf16", "--k", "4096", "--max-abs-a", "2", "--max-abs-b", "0.5")
    assert big["magnitudes"]["sum_abs"] == 4096.0
    s = _json("--dtype", "bf16", "--k", "4096", "--sum-abs", "100")
    assert s["magnitudes"]["from"] == "sum_abs" and s["bound"] < big["bound"]
    pw = _json("--dtype", "bf16", "--k", "4096", "--algorithm", "pairwise")
    assert pw["roundings"] == 2 + 12 and pw["atol"] < big["atol"] / 100  # a tree: log2 K deep
    assert _json("--dtype", "bf16", "--k", "4096", "--algorithm", "pairwise", "--fma")["roundings"] == 12
    fp32 = _json("--dtype", "fp32", "--k", "64", "--algorithm", "blocked-16")
    assert fp32["rtol"] == 0 and fp32["out_dtype"] == "fp32"  # the accumulator is the output
    i8 = _json("--dtype", "int8", "--k", "4096", "--out-dtype", "int32")
    assert (i8["accumulate"], i8["atol"], i8["rtol"], i8["bound"]) == ("int32", 0.0, 0.0, 0.0)
    i8b = _json("--dtype", "int8", "--k", "4096")
    assert i8b["out_dtype"] == "bf16" and i8b["rtol"] == 2.0**-8 and i8b["magnitudes"]["max_abs_a"] == 128.0
    assert _json("--dtype", "e4m3", "--k", "128")["dtype"] == "fp8_e4m3fn"


def test_near_tie_threshold() -> None:
    r = _json("--dtype", "bf16", "--k", "4096", "--sum-abs", "600", "--logit", "20")
    tie = r["near_tie"]
    assert r["magnitude"] == 20.0 and tie["logit"] == 20.0
    assert tie["bound"] == r["bound"] == pytest.approx(r["atol"] + r["rtol"] * 20, rel=1e-12)
    assert tie["vs_exact"] == pytest.approx(2 * r["bound"]) and tie["threshold"] == pytest.approx(4 * r["bound"])
    assert tie["spacing"] == 2.0**-3  # bf16 values in [16, 32) are 1/8 apart
    assert tie["threshold_spacings"] == pytest.approx(tie["threshold"] / 0.125)


def test_text_output() -> None:
    res = cli.invoke(app, ["tolerance", "--dtype", "bf16", "--k", "4096", "--logit", "3"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert out.startswith("bound: |out - exact| <= ")
    assert "gamma_4097" in out and "one rounding to bf16" in out and "near tie at |logit| = 3" in out
    assert f"derivation v{VERSION}: tasks.numerics.tolerance.gemm_tolerance" in out


@pytest.mark.parametrize("args,option,allowed", [
    (["--dtype", "bf8", "--k", "4"], "--dtype", "fp32, bf16, fp16, fp8_e4m3fn, int8"),
    (["--dtype", "bf16", "--k", "0"], "--k", ">= 1"),
    (["--dtype", "bf16", "--k", "4", "--algorithm", "fastest"], "--algorithm", "any, sequential, pairwise"),
    (["--dtype", "bf16", "--k", "4", "--accumulate", "fp64"], "--accumulate", "fp32, bf16, fp16, int32"),
    (["--dtype", "bf16", "--k", "4", "--accumulate", "int32"], "--accumulate", "int8 operands only"),
    (["--dtype", "bf16", "--k", "4", "--out-dtype", "int32"], "--out-dtype", "int32 output needs"),
    (["--dtype", "bf16", "--k", "4", "--max-abs-b", "nan"], "--max-abs-b", ">= 0"),
    (["--dtype", "bf16", "--k", "4", "--logit", "5"], "--logit", "exceeds the sum of magnitudes"),
    (["--dtype", "int8", "--k", "200000"], "--k", "2**31 - 1"),
])  # fmt: skip
def test_bad_input_exits_2_naming_the_option(args: list[str], option: str, allowed: str) -> None:
    res = cli.invoke(app, ["tolerance", *args])
    assert res.exit_code == 2, res.output
    assert f"{option}:" in res.output and allowed in res.output


# -- the library: correct kernels pass ------------------------------------------------------------------


def _operands(kind: str, m: int, k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = ops.generator("test_tolerance", kind, m, k, n, seed)
    if kind == "cancelling-runs":  # partial sums of hundreds, exact total a small integer
        a, b = ops.cancelling_runs(m, k, n, gen)
        return a.to(BF16), b.to(BF16)
    if kind == "near-cancel":  # sum_k x y - x' y with x' = x (1 + ~1%): |exact| << sum |a b|
        a, b = ops.general("randn", m, k // 2, n, BF16, gen)
        a2 = (a.float() * 1.01).to(BF16)
        return torch.cat([a, a2], 1), torch.cat([b, -b], 0)
    return ops.general(kind, m, k, n, BF16, gen)


def _split_k(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 partial products over 4 slices of K, added in fp32 (a split-K kernel), then bf16."""
    k = a.shape[1]
    step = max(1, k // 4)
    acc = torch.zeros(a.shape[0], b.shape[1])
    for s in range(0, k, step):
        acc += a[:, s:s + step].float() @ b[s:s + step, :].float()
    return acc.to(BF16)


CORRECT = {
    "torch bf16 matmul": lambda a, b: a @ b,
    "fp32 matmul then bf16": lambda a, b: (a.float() @ b.float()).to(BF16),
    "fp64 matmul then bf16": lambda a, b: (a.double() @ b.double()).to(BF16),
    "split-K fp32": _split_k,
    "reversed K": lambda a, b: (a.flip(1).float() @ b.flip(0).float()).to(BF16),
}


@pytest.mark.parametrize("kind", ["randn", "uniform-positive", "mixed-scale", "cancelling-runs", "near-cancel"])
@pytest.mark.parametrize("shape", [(1, 2, 1), (3, 7, 5), (8, 256, 8), (16, 1000, 4), (4, 4096, 16)])
def test_fp32_accumulated_bf16_gemms_pass(kind: str, shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    for seed in range(2):
        a, b = _operands(kind, m, k, n, seed)
        for name, kernel in CORRECT.items():
            result = check_within_bound(kernel(a, b), a, b, out_dtype=BF16, algorithm="any")
            assert result.passed, f"{name}: {result.message()}"


def _fp32_sum_in_order(a: torch.Tensor, b: torch.Tensor, order: list[int], chunks: list[int]) -> torch.Tensor:
    """Products (exact in fp32) summed in fp32 in ``order``: sequential within each chunk, then the
    chunk sums sequentially: IEEE fp32 adds, one rounding each."""
    p = a.float()[:, order].unsqueeze(2) * b.float()[order].unsqueeze(0)  # [M, K, N], exact
    parts, at = [], 0
    for c in chunks:
        acc = torch.zeros(a.shape[0], b.shape[1])
        for i in range(at, min(at + c, len(order))):
            acc = acc + p[:, i]
        parts.append(acc)
        at += c
    total = torch.zeros_like(parts[0])
    for part in parts:
        total = total + part
    return total


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_order_of_fp32_accumulation_passes(data: st.DataObject) -> None:
    m, k, n = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 300)), data.draw(st.integers(1, 3))
    seed = data.draw(st.integers(0, 2**16))
    scale = data.draw(st.sampled_from([2.0**-60, 2.0**-20, 1.0, 2.0**20, 2.0**60]))
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=gen) * scale).to(BF16)
    b = torch.randn(k, n, generator=gen).to(BF16)
    if data.draw(st.booleans()):  # cancellation: the second half repeats the first with B negated
        h = k // 2
        a[:, h:2 * h] = a[:, :h]
        b[h:2 * h] = -b[:h]
    order = data.draw(st.permutations(list(range(k))))
    chunk = data.draw(st.integers(1, k))
    out = _fp32_sum_in_order(a, b, order, [chunk] * (k // chunk + 1))
    out_dtype = data.draw(st.sampled_from([BF16, torch.float32, torch.float16]))
    with np.errstate(over="ignore"):
        assert_within_bound(out.to(out_dtype), a, b, out_dtype=out_dtype, algorithm="any")


def test_numpy_inputs_and_named_orders() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a, b = _operands("randn", 6, 512, 5, 0)
    an, bn = a.float().numpy().astype(ml_dtypes.bfloat16), b.float().numpy().astype(ml_dtypes.bfloat16)
    out = (an.astype(np.float32) @ bn.astype(np.float32)).astype(ml_dtypes.bfloat16)
    assert_within_bound(out, an, bn, out_dtype="bf16", algorithm="any")
    from tasks.numerics import products

    for name, alg in [("sequential", products.matmul_sequential("fp32")),
                      ("pairwise", products.matmul_pairwise("fp32")),
                      ("blocked-64", products.matmul_blocked("fp32", 64))]:  # fmt: skip
        assert_within_bound(alg.run(a, b).to(BF16), a, b, out_dtype=BF16, algorithm=name)


def test_int8_exact_accumulation() -> None:
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(-128, 128, (5, 2000), generator=gen, dtype=torch.int8)
    b = torch.randint(-127, 128, (2000, 4), generator=gen, dtype=torch.int8)
    exact = a.to(torch.int64) @ b.to(torch.int64)
    assert_within_bound(exact.to(torch.int32), a, b, out_dtype="int32", algorithm="any", accumulate="int32")
    assert_within_bound(exact.float().to(BF16), a, b, out_dtype=BF16, algorithm="any", accumulate="int32")
    wrong = exact.clone()
    wrong[2, 1] += 1
    with pytest.raises(AssertionError, match=r"\(row 2, col 1\)"):
        assert_within_bound(wrong.to(torch.int32), a, b, out_dtype="int32", algorithm="any", accumulate="int32")


def test_nan_where_a_product_is_nan() -> None:
    a, b = _operands("randn", 3, 64, 3, 1)
    a[1, 5] = float("nan")
    out = (a.float() @ b.float()).to(BF16)
    assert torch.isnan(out[1]).all()
    assert_within_bound(out, a, b, out_dtype=BF16, algorithm="any")
    out[0, 0] = float("nan")  # no NaN is possible in row 0
    with pytest.raises(AssertionError, match=r"(?s)1 of 9 elements .*\(row 0, col 0\): error beyond its bound, which allows no error on that side"):
        assert_within_bound(out, a, b, out_dtype=BF16, algorithm="any")


# -- the library: bf16 accumulation fails -----------------------------------------------------------------


def _bf16_running_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Products added one at a time to a bf16 accumulator (the sum rounded to bf16 at every step)."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=BF16)
    af, bf = a.float(), b.float()
    for i in range(a.shape[1]):
        acc = (acc.float() + af[:, i, None] * bf[None, i, :]).to(BF16)
    return acc


@pytest.mark.parametrize("kind", ["randn", "uniform-positive", "mixed-scale", "cancelling-runs"])
@pytest.mark.parametrize("shape", [(8, 256, 8), (16, 1024, 4), (4, 4096, 16), (64, 300, 1)])
def test_bf16_accumulation_fails(kind: str, shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    for seed in range(2):
        a, b = _operands(kind, m, k, n, seed)
        with pytest.raises(AssertionError, match="outside the bound"):
            assert_within_bound(_bf16_running_sum(a, b), a, b, out_dtype=BF16, algorithm="any")


def test_message_names_the_worst_element() -> None:
    a, b = _operands("randn", 8, 4096, 8, 0)
    bad = _bf16_running_sum(a, b)
    result = check_within_bound(bad, a, b, out_dtype=BF16, algorithm="any")
    r, c = result.worst()
    units = result.judgement.units
    assert units[r, c] == units.max() > 1
    with pytest.raises(AssertionError) as info:
        assert_within_bound(bad, a, b, out_dtype=BF16, algorithm="any")
    text = str(info.value)
    assert text.startswith(f"{result.outside} of 64 elements (")
    assert f"worst element (row {r}, col {c}): error {units[r, c]:.4g} times its bound" in text
    assert f"actual {float(bad[r, c])!r} vs exact " in text and "allowed [" in text
    assert "K = 4096" in text and f"derivation v{VERSION}" in text
    assert "any order (the matmul operation's bound) in fp32, then one rounding to bf16" in text


def test_bad_library_input_names_the_parameter() -> None:
    a, b = _operands("randn", 2, 8, 2, 0)
    with pytest.raises(ValueError, match="algorithm: unknown algorithm 'fastest'; allowed: any"):
        assert_within_bound(a @ b, a, b, out_dtype=BF16, algorithm="fastest")
    with pytest.raises(ValueError, match="out_dtype: 'fp64' is not allowed"):
        assert_within_bound(a @ b, a, b, out_dtype="fp64", algorithm="any")
    with pytest.raises(ValueError, match=r"actual: shape \(2, 3\) is not \[M, N\]"):
        assert_within_bound(torch.zeros(2, 3), a, b, out_dtype=BF16, algorithm="any")


def test_public_package_imports_lightly() -> None:
    import subprocess
    import sys

    code = "import sys, swapcheck; print(swapcheck.DERIVATION_VERSION, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(VERSION), "False"]
