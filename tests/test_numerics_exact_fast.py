"""The compiled path of ``matmul_exact_accumulation`` (products._exact_compiled, kernels in
tasks/numerics/_nbexact.py) against the torch path (``compiled.disabled()``) and the Fraction oracle
(tests/_numerics_oracle.py): random shapes (K = 1 included), every input and output format, both
roundings, sums constructed on and next to midpoints, cancellation to an exact zero (+0) and
negative sums rounding to -0, subnormal results, large dynamic range, and the blocked BLAS call
(K >= 512).  Also the claims the certificate rests on: the norm and lattice statistics, the
TwoSum re-sum's bound, and the exact-lattice shortcut."""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.numerics import FORMATS, compiled, products, round_to_format
from tests import _numerics_oracle as O
from tests._numerics_strategies import matrices, values

# numba is a dependency: where it is missing or broken these tests fail (test_compiled_exact_path_is_on),
# they skip only when the compiled paths are switched off on purpose.
pytestmark = pytest.mark.skipif(os.environ.get("SWAPCHECK_NUMBA") == "0", reason="SWAPCHECK_NUMBA=0")


def test_compiled_exact_path_is_on() -> None:
    assert compiled.available() and products._nbexact() is not None

INPUTS = ["fp32", "bf16", "fp16", "fp8_e4m3fn"]
OUTPUTS = ["fp32", "bf16", "fp16", "fp8_e4m3fn", "fp8_e5m2"]
ROUNDINGS = ["nearest_even", "nearest_away"]


def _tensor(x: np.ndarray, name: str) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x, dtype=np.float64)).to(FORMATS[name].torch_dtype)


def _both(
    a: torch.Tensor, b: torch.Tensor, out: str, rounding: str
) -> tuple[np.ndarray, np.ndarray]:
    """(compiled, torch path) results as float64, checking that the compiled path ran."""
    alg = products.matmul_exact_accumulation(out, rounding=rounding)
    a32, b32, _, _, _ = products._operands32(a, b, alg.format)
    assert products._exact_compiled(a32, b32, alg.format, rounding) is not None
    got = alg.run(a, b)
    with compiled.disabled():
        old = alg.run(a, b)
    return got.double().numpy(), old.double().numpy()


def _check(a: np.ndarray, b: np.ndarray, fin: str, out: str, rounding: str) -> None:
    ta, tb = _tensor(a, fin), _tensor(b, fin)
    got, old = _both(ta, tb, out, rounding)
    want = O.matmul(ta.double().numpy(), tb.double().numpy(), FORMATS[out], rounding, "exact", True)
    assert O.same(got, want), (a, b, got, want)
    assert O.same(got, old), (a, b, got, old)


@pytest.mark.parametrize("fin", INPUTS)
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_random_shapes_match_torch_path_and_oracle(fin: str, data) -> None:
    out = data.draw(st.sampled_from(OUTPUTS))
    rounding = data.draw(st.sampled_from(ROUNDINGS))
    a, b = data.draw(matrices(FORMATS[fin], max_mn=4, max_k=24, specials=False))
    _check(a, b, fin, out, rounding)


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_constructed_midpoints_and_neighbours(data) -> None:
    """Row sums ``v + h + t - t (+ d)``: v a value of the output format, h half its spacing (an
    exact midpoint), t a large value that cancels (so stage one cannot decide), d a tiny nudge
    either way or none (ties to even or away, and just off them)."""
    out = data.draw(st.sampled_from(["fp32", "bf16", "fp16"]))
    f = FORMATS[out]
    rounding = data.draw(st.sampled_from(ROUNDINGS))
    rows = []
    for _ in range(data.draw(st.integers(1, 4))):
        mant = data.draw(st.integers(2**f.mantissa_bits, 2 ** (f.mantissa_bits + 1) - 1))
        e = data.draw(st.integers(max(f.emin, -60), min(f.emax, 60)))
        v = math.ldexp(mant, e - f.mantissa_bits) * data.draw(st.sampled_from([1.0, -1.0]))
        h = math.ldexp(1.0, e - f.mantissa_bits - 1)
        t = math.ldexp(1.0, data.draw(st.integers(0, 60))) * data.draw(st.sampled_from([1, 3]))
        nudge = data.draw(st.sampled_from([0.0, 1.0, -1.0])) * math.ldexp(h, -30)
        rows.append([v, h, t, -t, nudge])
    a = round_to_format(np.array(rows), "fp32")
    b = np.ones((5, 2))
    b[:, 1] = -1.0
    _check(a, b, "fp32", out, rounding)


def test_cancellation_zero_signs_subnormals_and_range() -> None:
    """Exact zeros by cancellation give +0 (also from -0 products), negative sums below the
    smallest subnormal give -0, subnormal results, 2**+-100 in one sum, overflow to inf."""
    tiny = 2.0**-149
    rows = [
        [3.0, -3.0, 2.0**100, -(2.0**100)],  # exact zero: +0
        [-0.0, -0.0, -0.0, -0.0],  # products of -0: +0
        [-(2.0**-140), 2.0**-140, -(2.0**-126), 2.0**-126],  # exact zero at the bottom
        [2.0**-100, 0.0, 0.0, 0.0],  # times 2**-60 below: -0 / +0 after rounding
        [3 * tiny, -tiny, 5 * tiny, 0.0],  # subnormal result
        [2.0**100, 2.0**-100, -(2.0**100), 1.0],  # large dynamic range
        [3e38, 3e38, -1.0, 0.0],  # overflow to inf
        [1.0, 2.0**-24, 2.0**-100, -(2.0**-100)],  # tie after cancellation far below
    ]
    a = round_to_format(np.array(rows), "fp32")
    b = np.array([[1.0, -1.0, 2.0**-60, -(2.0**-60)]] * 4)
    for out in OUTPUTS:
        for rounding in ROUNDINGS:
            _check(a, b, "fp32", out, rounding)


@pytest.mark.parametrize("k", [1, 2, 511, 512, 1024, 4096])
def test_randn_and_integer_ties_with_blocks(k: int) -> None:
    """randn (stage two decides the hard ones) and integers with many exact ties (stage three),
    at K where the BLAS call is split into blocks (``_k_blocks``) and where it is not."""
    rng = np.random.default_rng(k)
    a = rng.standard_normal((5, k)).astype(np.float32)
    b = rng.standard_normal((k, 4)).astype(np.float32)
    got, old = _both(torch.from_numpy(a), torch.from_numpy(b), "fp32", "nearest_even")
    assert O.same(got, old)
    want = O.matmul(a.astype(np.float64), b.astype(np.float64), FORMATS["fp32"], "nearest_even",
                    "exact", True)  # fmt: skip
    assert O.same(got, want)
    ai = rng.integers(-(2**12), 2**12, (5, k)).astype(np.float32)
    bi = rng.integers(-4, 5, (k, 4)).astype(np.float32)
    ai[:, 0] = 2.0**24
    bi[0] = 4.0
    for out, rounding in (("fp32", "nearest_even"), ("bf16", "nearest_away")):
        got, old = _both(torch.from_numpy(ai), torch.from_numpy(bi), out, rounding)
        want = O.matmul(ai.astype(np.float64), bi.astype(np.float64), FORMATS[out], rounding,
                        "exact", True)  # fmt: skip
        assert O.same(got, want) and O.same(got, old)


def test_k_blocks() -> None:
    assert [products._k_blocks(k) for k in (1, 255, 512, 1000, 1024, 4096, 3 * 2**14)] == [
        1, 1, 2, 2, 4, 16, 16]  # fmt: skip
    for k in range(1, 3000, 37):
        p = products._k_blocks(k)
        assert k % p == 0 and p <= 16 and (p == 1 or k // p >= products._BLOCK_K)


def test_nonfinite_operands_fall_back() -> None:
    a = torch.tensor([[1.0, math.inf], [2.0, 3.0]])
    b = torch.tensor([[1.0, 0.0], [math.nan, 1.0]])
    a32, b32, _, _, _ = products._operands32(a, b, FORMATS["fp32"])
    assert products._exact_compiled(a32, b32, FORMATS["fp32"], "nearest_even") is None
    got = products.matmul_exact_accumulation("float32").run(a, b)
    want = O.matmul(a.double().numpy(), b.double().numpy(), FORMATS["fp32"], "nearest_even",
                    "exact", True)  # fmt: skip
    assert O.same(got.double().numpy(), want)


def test_empty_shapes() -> None:
    alg = products.matmul_exact_accumulation("float32")
    for m, k, n in ((0, 3, 2), (2, 3, 0), (2, 0, 3)):
        got = alg.run(torch.ones(m, k), torch.ones(k, n))
        with compiled.disabled():
            old = alg.run(torch.ones(m, k), torch.ones(k, n))
        assert got.shape == (m, n) and torch.equal(got, old)
        assert not torch.signbit(got).any()


# ---------------------------------------------------------------------------------------------
# the claims behind the certificate


def _stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    nbx = products._nbexact()
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    m, k = x32.shape
    out = np.empty((m, k))
    st_ = np.empty(m), np.empty(m, np.int32), np.empty(m, np.int32), np.empty(m, np.int32)
    nbx.prep_rows(x32, x32.view(np.int32), out, *st_)
    assert np.array_equal(out, x32.astype(np.float64))
    xt = np.ascontiguousarray(x32.T)
    out_t = np.empty((k, m))
    st_t = np.empty(m), np.empty(m, np.int32), np.empty(m, np.int32), np.empty(m, np.int32)
    nbx.prep_cols(xt, xt.view(np.int32), out_t, *st_t)
    assert np.array_equal(out_t, xt.astype(np.float64))
    for u, v in zip(st_, st_t, strict=True):
        if u.dtype == np.int32:
            assert np.array_equal(u, v)
    grow = 1.0 + (k + 8) * 2.0**-52
    norms, lat = products._norm_lattice(*st_[:3], grow)
    norms_t, lat_t = products._norm_lattice(*st_t[:3], grow)
    assert np.array_equal(lat, lat_t)
    return np.minimum(norms, norms_t), lat


@pytest.mark.parametrize("fin", ["fp32", "bf16", "fp8_e5m2"])
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_norm_bounds_and_lattices_hold(fin: str, data) -> None:
    """Each norm is at least the exact 2-norm; each element is a multiple of 2**lattice."""
    f = FORMATS[fin]
    a, _ = data.draw(matrices(f, max_mn=3, max_k=40, specials=False))
    a = _tensor(a, fin).double().numpy()
    norms, lat = _stats(a)
    for i in range(a.shape[0]):
        sq = sum((Fraction(float(v)) ** 2 for v in a[i]), Fraction(0))
        assert Fraction(float(norms[i])) ** 2 >= sq
        for v in a[i]:
            if v != 0:
                assert (Fraction(float(v)) / Fraction(2) ** int(lat[i])).denominator == 1


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_sum2_bound_holds(data) -> None:
    """Stage two's claim: |r - exact| <= e for exact products of fp32 values of any magnitude,
    and e == 0 only where r is the exact sum (+0 for an exact zero)."""
    f = FORMATS["fp32"]
    k = data.draw(st.integers(1, 40))
    v = values(f, specials=False)
    x = np.array(data.draw(st.lists(v, min_size=2 * k, max_size=2 * k))).reshape(2, k)
    grow = 1.0 + (k + 8) * 2.0**-52
    r, e = products._nbexact()._sum2(x[0], x[1], (k + 16) * 2.0**-53 * grow)
    exact = sum((Fraction(float(p)) * Fraction(float(q)) for p, q in zip(x[0], x[1], strict=True)),
                Fraction(0))  # fmt: skip
    assert abs(Fraction(r) - exact) <= Fraction(e), (x, r, e)
    if e == 0:
        assert Fraction(r) == exact and not (r == 0 and math.copysign(1.0, r) < 0)


def test_lattice_shortcut_decides_narrow_inputs_exactly() -> None:
    """Small integers (and bf16 values of a narrow range): the stage-one bound is 0 for every
    output, so nothing is left undecided even where the exact sum is a midpoint."""
    rng = np.random.default_rng(3)
    a = rng.integers(-8, 9, (6, 700)).astype(np.float32)
    b = rng.integers(-8, 9, (700, 5)).astype(np.float32)
    a[:, 0] = 2.0**24
    b[0] = 1.0
    nbx = products._nbexact()
    calls: list[int] = []
    real = nbx.resum

    def spy(*args: object) -> None:
        calls.append(1)
        real(*args)

    nbx.resum = spy
    try:
        got = products.matmul_exact_accumulation("float32").run(a, b)
    finally:
        nbx.resum = real
    assert not calls
    want = O.matmul(a.astype(np.float64), b.astype(np.float64), FORMATS["fp32"], "nearest_even",
                    "exact", True)  # fmt: skip
    assert O.same(got, want)
