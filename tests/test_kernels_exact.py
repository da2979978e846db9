"""The ``exact`` kernel equals round_fraction(sum_k a*b * sa * sb + bias) for every element."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from _kernel_oracle import (
    exact_oracle,
    fp8_matrix,
    int8_matrix,
    out_dtypes,
    rn,
    same_bits,
    scale_tensors,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.kernels import exact as exact_mod
from tasks.kernels import get_kernel

EXACT = get_kernel("exact")


@st.composite
def exact_problem(draw):
    m, n, k = draw(st.integers(1, 5)), draw(st.integers(1, 5)), draw(st.integers(1, 40))
    matrix = draw(st.sampled_from([int8_matrix, fp8_matrix]))
    a = draw(matrix(m, k))
    b = draw(matrix(k, n))
    sa, sb = draw(scale_tensors(m, n))
    out = draw(out_dtypes)
    mode = draw(st.sampled_from(["none", "random", "cancel", "tiny", "huge"]))
    if mode == "none":
        bias = None
    elif mode == "cancel":
        # bias = -(the value itself rounded to out): catastrophic cancellation, exact-zero results
        # and remainders that decide the rounding
        ref = exact_oracle(a, b, sa, sb, out, None).to(torch.float64)
        nudge = draw(st.sampled_from([0.0, 2.0**-20, -(2.0**-20)]))
        bias = (-(ref[0]) + nudge).to(out)
        bias = torch.where(torch.isfinite(bias), bias, torch.zeros_like(bias))
    else:
        scale = {"random": 4.0, "tiny": 2.0**-30, "huge": 2.0**20}[mode]
        vals = [draw(st.floats(-scale, scale, allow_nan=False, width=32)) for _ in range(n)]
        bias = torch.tensor(vals, dtype=torch.float32).to(out)
        bias = torch.where(torch.isfinite(bias), bias, torch.zeros_like(bias))
    return a, b, sa, sb, out, bias


@settings(max_examples=300, deadline=None)
@given(problem=exact_problem())
def test_exact_matches_fraction_oracle(problem):
    a, b, sa, sb, out, bias = problem
    got = EXACT(a, b, sa, sb, out, bias)
    want = exact_oracle(a, b, sa, sb, out, bias)
    assert same_bits(got, want), (got, want)


@settings(max_examples=100, deadline=None)
@given(problem=exact_problem(), limit=st.sampled_from([2**14, 2**20, 2**30]))
def test_exact_chunked_int64_path_and_fraction_fallback(problem, limit):
    """Shrink the float64 exactness limit so the chunked int64 path and the Fraction fallback
    run on small problems (the arithmetic is the same; only the thresholds move)."""
    a, b, sa, sb, out, bias = problem
    saved = exact_mod.FLOAT64_EXACT_INT
    exact_mod.FLOAT64_EXACT_INT = limit
    try:
        got = EXACT(a, b, sa, sb, out, bias)
    finally:
        exact_mod.FLOAT64_EXACT_INT = saved
    assert same_bits(got, exact_oracle(a, b, sa, sb, out, bias))


def test_float64_bound_decides_the_path():
    a = torch.full((2, 3), 448.0).to(torch.float8_e4m3fn)
    acc, e = exact_mod.exact_accumulator(a, a.t().contiguous())
    assert acc.dtype == torch.float64 and e == -18
    assert acc[0, 0].item() == 3 * (448 * 512) ** 2
    a8 = torch.full((2, 5), -128, dtype=torch.int8)
    acc8, e8 = exact_mod.exact_accumulator(a8, a8.t().contiguous())
    assert acc8.dtype == torch.float64 and e8 == 0 and acc8[0, 0].item() == 5 * 16384


def test_exact_beyond_float64_at_large_k():
    # K * 448^2 * 2^18 > 2^53: chunked int64 accumulation; the big element goes through Fractions
    k = 200_000
    a = torch.full((2, k), 448.0)
    a[1, ::2] = -448.0  # row 1 alternates: its sums are 0
    b = torch.full((k, 2), 448.0)
    b[:, 1] = 0.5
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    acc, e = exact_mod.exact_accumulator(a8, b8)
    assert acc.dtype == torch.int64 and e == -18 and abs(int(acc[0, 0])) > 2**53
    sums = [[Fraction(448 * 448 * k), Fraction(224 * k)], [Fraction(0), Fraction(0)]]
    assert int(acc[0, 0]) == 448 * 448 * k * 2**18
    sa = torch.tensor([[1.0 + 2**-20], [0.75]])
    sb = torch.tensor([0.3, 1.0 + 2**-23])
    bias = torch.tensor([1.0, -3.0], dtype=torch.float32)
    got = EXACT(a8, b8, sa, sb, torch.float32, bias)
    for i in range(2):
        for j in range(2):
            x = sums[i][j] * Fraction(sa[i, 0].item()) * Fraction(sb[j].item()) + Fraction(
                bias[j].item()
            )
            assert got[i, j].item() == rn(x, torch.float32)


def test_exact_zero_is_plus_zero():
    a = torch.tensor([[3, -3]], dtype=torch.int8)
    b = torch.tensor([[5], [5]], dtype=torch.int8)
    out = EXACT(a, b, torch.tensor(-0.5), torch.tensor(2.0), torch.bfloat16)
    assert out.item() == 0.0 and not torch.signbit(out).item()
    c = EXACT(
        torch.tensor([[1]], dtype=torch.int8),
        torch.tensor([[2]], dtype=torch.int8),
        torch.tensor(0.25),
        torch.tensor(1.0),
        torch.bfloat16,
        torch.tensor([-0.5], dtype=torch.bfloat16),
    )
    assert c.item() == 0.0 and not torch.signbit(c).item()


def test_exact_tie_broken_by_bias_remainder():
    # acc * s = 257 (a bf16 tie between 256 and 258); a tiny bias decides the side
    a = torch.tensor([[1]], dtype=torch.int8)
    b = torch.tensor([[1]], dtype=torch.int8)
    s = torch.tensor(257.0)
    one = torch.tensor(1.0)
    for bias, want in ((2.0**-30, 258.0), (-(2.0**-30), 256.0), (0.0, 256.0)):
        got = EXACT(a, b, s, one, torch.bfloat16, torch.tensor([bias], dtype=torch.bfloat16))
        assert got.item() == want


@pytest.mark.parametrize("out", [torch.bfloat16, torch.float16])
def test_exact_overflow_to_inf(out):
    a = torch.full((1, 40), 127, dtype=torch.int8)
    got = EXACT(a, a.t().contiguous(), torch.tensor(2.0**126), torch.tensor(1.0), out)
    assert got.item() == float("inf")


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_float64_gemm_path_equals_int64_at_medium_size(dtype):
    # the BLAS float64 GEMM (blocked, multithreaded) against torch's int64 matmul
    g = torch.Generator().manual_seed(8)
    if dtype == torch.int8:
        a = torch.randint(-128, 128, (64, 4099), dtype=torch.int8, generator=g)
        b = torch.randint(-128, 128, (4099, 48), dtype=torch.int8, generator=g)
        ai, bi = a.long(), b.long()
    else:
        a = (torch.randn(64, 4099, generator=g) * 100).to(dtype)
        b = (torch.randn(4099, 48, generator=g) * 100).to(dtype)
        ai, bi = (a.double() * 512).long(), (b.double() * 512).long()
    acc, _ = exact_mod.exact_accumulator(a, b)
    assert acc.dtype == torch.float64
    assert torch.equal(acc.long(), ai @ bi)


def test_exact_speed_budget():
    # the K-depth demo's largest call; ~0.1 s measured on 2 cores (budget: about 1 s)
    import time

    g = torch.Generator().manual_seed(9)
    a = (torch.randn(256, 16384, generator=g) * 100).to(torch.float8_e4m3fn)
    b = (torch.randn(16384, 256, generator=g) * 100).to(torch.float8_e4m3fn)
    t0 = time.perf_counter()
    EXACT(a, b, torch.rand(256, 1), torch.rand(256), torch.bfloat16, torch.zeros(256).bfloat16())
    assert time.perf_counter() - t0 < 5.0
