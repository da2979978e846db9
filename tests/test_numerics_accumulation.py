"""Accumulation orders over lists of terms, and the nearest-away rounding they can use.

Every ``run`` is compared bit for bit with the Fraction oracle of tests/_numerics_oracle.py, for
fp32, bf16, fp16 and e4m3 accumulators, both roundings, terms that are values of the format and
terms that are not (exact products), with NaN, inf, signed zeros, subnormals and overflow.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.numerics import FORMATS, accumulation, round_fraction, round_to_format
from tasks.numerics.rounding import NEAREST_AWAY, NEAREST_EVEN, check_rounding, round_dyadic
from tests import _numerics_oracle as O
from tests._numerics_strategies import values

FMTS = [FORMATS[n] for n in ("fp32", "bf16", "fp16", "fp8_e4m3fn")]
ROUNDINGS = [NEAREST_EVEN, NEAREST_AWAY]
SETTINGS = settings(max_examples=40, deadline=None)


def _algorithms(f, r):
    return [
        ("sequential", accumulation.sequential(f, rounding=r)),
        ("pairwise", accumulation.pairwise(f, rounding=r)),
        ("blocked", accumulation.blocked(f, 3, rounding=r)),
        ("exact", accumulation.exact(f, rounding=r)),
    ]


def _oracle(name: str, terms: list, f, r) -> float:
    if name == "blocked":
        return O.blocked(terms, f, r, 3)
    return getattr(O, name)(terms, f, r)


# ---------------------------------------------------------------------------------------------
# Nearest-away rounding (round_to_format / round_fraction) and the rounding names


@pytest.mark.parametrize("f", [FORMATS[n] for n in ("bf16", "fp16", "fp8_e4m3fn", "fp8_e5m2")],
                         ids=lambda f: f.name)  # fmt: skip
def test_nearest_away_every_midpoint(f) -> None:
    pats = np.arange(2 ** (f.bits - 1), dtype=np.uint32).astype(f.int_dtype)
    with np.errstate(invalid="ignore"):
        vals = pats.view(f.numpy_dtype).astype(np.float64)
    vals = vals[np.isfinite(vals)]
    mid = (vals[:-1] + vals[1:]) / 2
    for sign in (1.0, -1.0):
        got = round_to_format(sign * mid, f, rounding="nearest_away")
        assert O.same(got, sign * vals[1:])  # ties go to the larger magnitude
        tiny = np.spacing(mid) / 4
        assert O.same(round_to_format(sign * mid, f, -sign * tiny, "nearest_away"), sign * vals[:-1])
    top = f.max_finite + (f.max_finite - vals[-2]) / 2  # the overflow threshold ties away: out
    want = math.inf if f.has_inf else math.nan
    assert O.same(round_to_format(top, f, rounding="nearest_away"), want)
    assert O.same(round_to_format(-top, f, rounding="nearest_away"), -want)


@given(st.integers(-(2**40), 2**40), st.integers(1, 2**30), st.sampled_from(FMTS),
       st.sampled_from(ROUNDINGS))  # fmt: skip
@settings(max_examples=150, deadline=None)
def test_round_to_format_matches_round_fraction(num: int, den_exp: int, f, r) -> None:
    x = Fraction(num, 2 ** (den_exp % 200))
    hi = float(x)
    lo = float(x - Fraction(hi))
    got = round_to_format(hi, f, lo, r)
    want = round_fraction(x, f, r) if x != 0 else 0.0
    assert O.same(got, want)


def test_round_fraction_ties() -> None:
    assert round_fraction(Fraction(257), "bf16", "nearest_away") == 258.0
    assert round_fraction(Fraction(257), "bf16") == 256.0
    assert round_fraction(Fraction(-1, 2**134), "bf16", "nearest_away") == -(2.0**-133)
    assert round_fraction(Fraction(464), "e4m3", "nearest_away") != 448.0  # NaN: 480 is NaN


def test_rounding_names_and_directed_roundings_refused() -> None:
    assert check_rounding("NEAREST_EVEN") == NEAREST_EVEN
    assert check_rounding("rna") == NEAREST_AWAY
    for directed in ("toward_zero", "up", "down", "TOWARD_NEGATIVE"):
        with pytest.raises(ValueError, match="saturates"):
            accumulation.sequential("float32", rounding=directed)
    with pytest.raises(ValueError, match="valid"):
        check_rounding("stochastic")


# ---------------------------------------------------------------------------------------------
# Emulations against the oracle


@pytest.mark.parametrize("f", FMTS, ids=lambda f: f.name)
@given(data=st.data())
@SETTINGS
def test_orders_match_oracle_terms_in_format(f, data) -> None:
    rows = data.draw(st.integers(1, 3))
    n = data.draw(st.integers(1, 11))
    r = data.draw(st.sampled_from(ROUNDINGS))
    x = np.array(data.draw(st.lists(values(f), min_size=rows * n, max_size=rows * n)))
    x = x.reshape(rows, n)
    for name, alg in _algorithms(f, r):
        got = alg.run(x)
        assert got.dtype == f.numpy_dtype
        want = [_oracle(name, list(map(float, row)), f, r) for row in x]
        assert O.same(got.astype(np.float64), want), (name, r, x, got, want)
        assert alg.covers(got, x).all(), (name, x, got)


@pytest.mark.parametrize("f", FMTS, ids=lambda f: f.name)
@given(data=st.data())
@SETTINGS
def test_orders_match_oracle_exact_terms(f, data) -> None:
    """Terms outside the format (products of two values), rounded by their first addition."""
    n = data.draw(st.integers(1, 9))
    r = data.draw(st.sampled_from(ROUNDINGS))
    v = values(f, specials=False)
    a = data.draw(st.lists(v, min_size=n, max_size=n))
    b = data.draw(st.lists(v, min_size=n, max_size=n))
    x = np.array(a) * np.array(b)  # exact in float64
    terms = [O.prod(p, q) for p, q in zip(a, b, strict=True)]
    for name, alg in _algorithms(f, r):
        got = alg.run(torch.from_numpy(x))
        assert got.dtype == f.torch_dtype
        want = _oracle(name, terms, f, r)
        assert O.same(got.double().numpy(), want), (name, r, a, b, got, want)
        assert alg.covers(got, x).all()


@pytest.mark.parametrize("n", [1, 2, 3, 63, 64, 65, 127, 129, 200])
def test_pairwise_chunk_boundaries(n: int) -> None:
    rng = np.random.default_rng(n)
    f = FORMATS["bf16"]
    x = round_to_format(rng.standard_normal((2, n)) * 8, f)
    e = rng.standard_normal((2, n)) * rng.standard_normal((2, n))  # exact products, not bf16
    for terms in (x, e):
        for name, alg in _algorithms(f, NEAREST_EVEN):
            got = alg.run(terms).astype(np.float64)
            want = [_oracle(name, [Fraction(t) if t else t for t in map(float, row)], f,
                            NEAREST_EVEN) for row in terms]  # fmt: skip
            assert O.same(got, want), (name, n)


# ---------------------------------------------------------------------------------------------
# Counts, bounds and the seed's example


def test_three_hundred_bf16_ones() -> None:
    ones = np.ones(300)
    assert accumulation.exact("bfloat16").run(ones) == 300
    assert accumulation.sequential("bfloat16").run(ones) == 256
    assert accumulation.pairwise("bfloat16").run(ones) == 300
    assert accumulation.sequential("float16").run(np.ones(3000)) == 2048


@pytest.mark.parametrize(
    "ctor,n,inf,want",
    [
        (accumulation.sequential, 64, True, 63),
        (accumulation.sequential, 64, False, 64),
        (accumulation.pairwise, 64, True, 6),
        (accumulation.pairwise, 65, True, 7),
        (accumulation.pairwise, 1, False, 1),
        (accumulation.pairwise, 1, True, 0),
        (accumulation.exact, 64, True, 1),
    ],
)
def test_rounding_counts(ctor, n: int, inf: bool, want: int) -> None:
    assert ctor("float32").roundings(n, terms_in_format=inf) == want


def test_blocked_counts() -> None:
    alg = accumulation.blocked("float32", 32)
    assert alg.roundings(4096) == 31 + 127
    assert alg.roundings(4096, terms_in_format=False) == 32 + 127
    assert alg.charged(4096) == 4095
    assert alg.charged(100, terms_in_format=False) == 99 + 4
    assert alg.roundings(10) == 9
    with pytest.raises(ValueError, match="block_size"):
        accumulation.blocked("float32", 0)


def test_error_model_text_and_values() -> None:
    m = accumulation.pairwise("float32").error_model(64)
    assert (m.roundings, m.charged) == (6, 63)
    assert str(m) == "3.58e-07 * sum over i of |x[i]| + 4.41e-44"
    assert accumulation.sequential("bfloat16").error_model(300).relative == math.inf


def test_bound_is_attained_order_of_magnitude_and_covers() -> None:
    """Sequential fp32 of 1 followed by 2**24 - ... : each small term is lost; the error is
    within the bound, and a value one bound away is not covered."""
    x = np.array([2.0**24] + [1.0] * 15)
    alg = accumulation.sequential("float32")
    got = alg.run(x)
    assert got == 2.0**24  # each +1 ties back to 2**24 (even)
    tol = alg.bound(x)
    assert 15 <= tol < 1000
    assert alg.covers(got, x)
    assert not alg.covers(np.float32(2.0**24 + 15 + 2 * float(tol)), x)


def test_leading_dims_axis_and_kinds() -> None:
    rng = np.random.default_rng(1)
    x = round_to_format(rng.standard_normal((2, 5, 3)), "bf16")
    alg = accumulation.pairwise("float32")
    got = alg.run(x, axis=1)
    assert got.shape == (2, 3) and got.dtype == np.float32
    want = alg.run(np.moveaxis(x, 1, -1))
    assert O.same(got, want)
    t = alg.run(torch.from_numpy(x).to(torch.bfloat16), axis=1)
    assert t.dtype == torch.float32 and O.same(t.numpy(), want)
    assert alg.run(np.zeros((4, 0))).tolist() == [0.0] * 4


def test_specials_may_be() -> None:
    alg = accumulation.sequential("float16")
    x = np.array([[60000.0, 60000.0, -60000.0], [1.0, math.nan, 2.0], [-0.0, -0.0, -0.0]])
    got = alg.run(x).astype(np.float64)
    assert got[0] == math.inf and math.isnan(got[1]) and got[2] == 0 and not np.signbit(got[2])
    b = alg.bounds(x)
    assert b.may_be("inf")[0] and b.may_be("nan")[1] and b.may_be("zero")[2]
    assert alg.covers(got, x).all()
    assert not alg.covers(np.array([1.0, 1.0, 1.0]), x).any()


@given(st.integers(-(2**80), 2**80), st.integers(-1200, 200), st.sampled_from(FMTS),
       st.sampled_from(ROUNDINGS))  # fmt: skip
@settings(max_examples=300, deadline=None)
def test_round_dyadic_matches_round_fraction(n: int, e: int, f, r) -> None:
    x = Fraction(n) * Fraction(2) ** e
    want = round_fraction(x, f, r) if n else 0.0
    assert O.same(round_dyadic(n, e, f, r), want)
