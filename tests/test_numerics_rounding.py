"""Correct rounding: round_to_format against the Fraction oracle, exhaustive tie checks, torch/ml_dtypes.

Three independent references are used: ``round_fraction`` (exact rationals), an exhaustive
enumeration of every value and every midpoint of the 8- and 16-bit formats (the tie goes to the
neighbour whose bit pattern is even), and the dtype conversions of torch and ml_dtypes where those
round once.  What those conversions do elsewhere (double rounding from float64, saturation) is a
fact about the library's version, recorded per version (tests/_library_facts.py).
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from _library_facts import fact
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.numerics import (
    FORMATS,
    FloatFormat,
    as_float64,
    round_fraction,
    round_to_format,
    to_tensor,
    two_prod,
    two_sum,
)

ALL = list(FORMATS.values())
IDS = [f.name for f in ALL]
SMALL = [f for f in ALL if f.bits <= 16]  # small enough to enumerate every bit pattern
F = Fraction


def same_each(a: object, b: object) -> np.ndarray:
    """Bitwise float64 equality, element by element: the sign of zero counts, any NaN equals any NaN."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    eq: np.ndarray = ((x == y) & (np.signbit(x) == np.signbit(y))) | (np.isnan(x) & np.isnan(y))
    return eq


def same(a: object, b: object) -> bool:
    """Bitwise float64 equality of all elements."""
    return bool(np.all(same_each(a, b)))


def oracle(hi: np.ndarray, lo: np.ndarray, f: FloatFormat) -> np.ndarray:
    flat = [
        round_fraction(F(float(h)) + F(float(lo_)), f)
        for h, lo_ in zip(hi.ravel(), lo.ravel(), strict=True)
    ]
    return np.array(flat, dtype=np.float64).reshape(hi.shape)


def check_against_oracle(hi: object, lo: object, f: FloatFormat) -> None:
    h, lo_ = np.broadcast_arrays(np.asarray(hi, dtype=np.float64), np.asarray(lo, np.float64))
    got = round_to_format(h, f, lo_)
    want = oracle(h, lo_, f)
    assert same(got, want), (h, lo_, got, want)


# ---------------------------------------------------------------------------------------------
# round_fraction on hand-checked values


@pytest.mark.parametrize(
    "fmt,x,want",
    [
        ("bf16", F(1) + F(1, 2**8), 1.0),  # tie, 1.0 has the even significand
        ("bf16", F(1) + F(3, 2**8), 1 + 2**-6),  # tie, rounds up to even
        ("bf16", F(1) + F(1, 2**8) + F(1, 2**60), 1 + 2**-7),  # just above the tie
        ("bf16", F(511, 2), 256.0),  # 255.5: spacing below 256 is 1, tie to even 256
        ("bf16", F(257), 256.0),  # spacing 2 above 256; tie to even 256
        ("bf16", F(259), 260.0),
        ("bf16", F(1, 2**134), 0.0),  # half the smallest subnormal: tie to zero
        ("bf16", F(-1, 2**134), -0.0),  # negative rounds to -0
        ("bf16", F(3, 2**134), 2**-132),  # 1.5 subnormal quanta: tie to even (2)
        ("bf16", F(1, 2**134) + F(1, 2**300), 2**-133),
        ("bf16", F(2**128), float("inf")),
        ("bf16", F(-(2**128)), float("-inf")),
        ("fp16", F(65504), 65504.0),
        ("fp16", F(65520) - F(1, 2**40), 65504.0),
        ("fp16", F(65520), float("inf")),  # threshold max + spacing/2: RNE picks the "even" 2**16
        ("fp16", F(-65520), float("-inf")),
        ("fp16", F(2049), 2048.0),
        ("fp16", F(2051), 2052.0),
        ("fp16", F(1, 2**25), 0.0),
        ("fp16", F(3, 2**25), 2**-23),
        ("fp8_e4m3fn", F(448), 448.0),
        ("fp8_e4m3fn", F(464), 448.0),  # midpoint 448|480: 448 = 1.110b is even, so no overflow
        ("fp8_e4m3fn", F(-464), -448.0),
        ("fp8_e4m3fn", F(464) + F(1, 2**40), float("nan")),  # rounds to 480, which is NaN's pattern
        ("fp8_e4m3fn", F(480), float("nan")),
        ("fp8_e4m3fn", F(17), 16.0),
        ("fp8_e4m3fn", F(19), 20.0),
        ("fp8_e4m3fn", F(1, 2**10), 0.0),
        ("fp8_e4m3fn", F(3, 2**10), 2**-8),
        ("fp8_e5m2", F(57344), 57344.0),
        ("fp8_e5m2", F(61440), float("inf")),
        ("fp8_e5m2", F(61439), 57344.0),
        ("fp8_e5m2", F(9), 8.0),
        ("fp8_e5m2", F(11), 12.0),
        ("fp32", F(1) + F(1, 2**24), 1.0),
        ("fp32", F(1, 2**150), 0.0),
        ("fp32", F(3, 2**150), 2**-148),
        ("fp32", F(2**24 + 1), 2.0**24),
        ("fp32", F(1, 10), float(np.float32(0.1))),
        ("bf16", F(0), 0.0),
        ("bf16", 3, 3.0),
    ],
)
def test_round_fraction_hand_checked(fmt: str, x: Fraction, want: float) -> None:
    got = round_fraction(x, fmt)
    assert same(got, want), (got, want)
    # the fast path agrees wherever x is a float64 number
    if F(float(x)) == F(x):
        assert same(round_to_format(float(x), fmt), want)


@pytest.mark.parametrize("fmt,n,want", [("bf16", 300, 256.0), ("fp16", 3000, 2048.0)])
def test_sequential_sum_of_ones_sticks(fmt: str, n: int, want: float) -> None:
    """numerics.md §1: rounding each partial sum, bf16 sticks at 256 and fp16 at 2048."""
    s_frac, s_fast = 0.0, np.float64(0.0)
    for _ in range(n):
        s_frac = round_fraction(F(s_frac) + 1, fmt)
        s_fast = round_to_format(s_fast + 1.0, fmt)
    assert s_frac == want and float(s_fast) == want


def test_e4m3fn_overflow_rule() -> None:
    """464 (midpoint of 448 and the missing 480) rounds to 448; anything above it is NaN (the
    non-saturating rule of docs/numerics.md; what the libraries' casts do there is recorded below)."""
    x = np.array([448, 463.99, 464, 464.0000001, 465, 470, 480, 1000, 1e6, np.inf, -464, -465, -1e9,
                  np.nan])  # fmt: skip
    want = np.array([448, 448, 448, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan, -448, np.nan,
                     np.nan, np.nan])  # fmt: skip
    assert same(round_to_format(x, "fp8_e4m3fn"), want)


# ---------------------------------------------------------------------------------------------
# Exhaustive: every value is a fixed point, every midpoint goes to the even neighbour


def _all_values(f: FloatFormat) -> np.ndarray:
    """All non-NaN values of a small format, as float64, in increasing order (with -0 before +0)."""
    pats = np.arange(2 ** (f.bits - 1), dtype=np.uint32).astype(f.int_dtype)
    with np.errstate(invalid="ignore"):  # NaN patterns
        pos = pats.view(f.numpy_dtype).astype(np.float64)
    pos = pos[~np.isnan(pos)]
    return np.concatenate([-pos[::-1], pos])


@pytest.mark.parametrize("f", SMALL, ids=[f.name for f in SMALL])
def test_every_value_is_a_fixed_point(f: FloatFormat) -> None:
    v = _all_values(f)
    assert same(round_to_format(v, f), v)
    assert same(round_to_format(v, f, np.zeros_like(v)), v)


@pytest.mark.parametrize("f", SMALL, ids=[f.name for f in SMALL])
def test_every_midpoint_exhaustive(f: FloatFormat) -> None:
    pats = np.arange(2 ** (f.bits - 1), dtype=np.uint32).astype(f.int_dtype)
    with np.errstate(invalid="ignore"):  # NaN patterns
        vals = pats.view(f.numpy_dtype).astype(np.float64)
    keep = np.isfinite(vals)
    pats, vals = pats[keep], vals[keep]
    lo_v, hi_v = vals[:-1], vals[1:]
    mid = (lo_v + hi_v) / 2  # exact in float64
    even = np.where(pats[:-1] % 2 == 0, lo_v, hi_v)
    tiny = np.spacing(mid) / 4  # a valid remainder: |lo| <= ulp64(mid) / 2
    for sign in (1.0, -1.0):
        m, e, lo_n, hi_n = sign * mid, sign * even, sign * lo_v, sign * hi_v
        assert same(round_to_format(m, f), e)
        assert same(round_to_format(m, f, sign * tiny), hi_n)  # past the tie, away from zero
        assert same(round_to_format(m, f, -sign * tiny), lo_n)
        assert same(round_to_format(np.nextafter(m, 0), f), lo_n)
        assert same(round_to_format(np.nextafter(m, sign * np.inf), f), hi_n)
    # the midpoint above max_finite: the overflow threshold
    top = f.max_finite + (f.max_finite - vals[-2]) / 2
    big = np.inf if f.has_inf else np.nan
    if f.has_inf:
        assert same(round_to_format([top, -top], f), [np.inf, -np.inf])  # max_finite is odd
    else:
        assert same(round_to_format([top, -top], f), [f.max_finite, -f.max_finite])
    assert same(round_to_format(top, f, 1e-300), big)
    assert same(round_to_format(top, f, -1e-300), f.max_finite)
    assert same(round_to_format(np.nextafter(top, 0), f), f.max_finite)


def test_fp32_random_patterns_and_midpoints() -> None:
    rng = np.random.default_rng(1)
    pats = rng.integers(0, 0x7F7FFFFF, 200_000, dtype=np.uint32)  # positive finite, below max
    v = pats.view(np.float32).astype(np.float64)
    nxt = (pats + 1).view(np.float32).astype(np.float64)
    mid = (v + nxt) / 2
    even = np.where(pats % 2 == 0, v, nxt)
    assert same(round_to_format(v, "fp32"), v)
    assert same(round_to_format(mid, "fp32"), even)
    assert same(round_to_format(-mid, "fp32", np.spacing(mid) / 2), -v)
    assert same(round_to_format(mid, "fp32", np.spacing(mid) / 2), nxt)


# ---------------------------------------------------------------------------------------------
# Hypothesis: round_to_format == round_fraction on exact values hi + lo


def scaled(f: FloatFormat, below: int = 4, above: int = 2) -> st.SearchStrategy[float]:
    """Float64 values spread over fmt's range, from below min_subnormal to above max_finite."""
    return st.builds(
        lambda m, e, s: s * float(np.ldexp(m, e)),
        st.floats(1.0, 2.0, exclude_max=True),
        st.integers(f.emin - f.mantissa_bits - below, f.emax + above),
        st.sampled_from([1.0, -1.0]),
    )


fmts = st.sampled_from(ALL)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_two_sum_pairs_match_oracle(data: st.DataObject) -> None:
    f = data.draw(fmts)
    a = data.draw(scaled(f))
    b = data.draw(st.one_of(scaled(f), st.builds(lambda t: a * t, st.floats(-1e-9, 1e-9))))
    hi, lo = two_sum(a, b)
    assert F(float(hi)) + F(float(lo)) == F(a) + F(b)
    check_against_oracle(hi, lo, f)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_two_prod_pairs_match_oracle(data: st.DataObject) -> None:
    f = data.draw(fmts)
    a = data.draw(scaled(f, below=0, above=0))
    b = data.draw(st.floats(0.25, 4.0) | st.floats(-4.0, -0.25))
    hi, lo = two_prod(a, b)
    check_against_oracle(hi, lo, f)


@st.composite
def midpoint(draw: st.DrawFn, f: FloatFormat) -> tuple[float, float]:
    """An exact midpoint of fmt (subnormal or normal, up to the overflow threshold) and a remainder."""
    e = draw(st.integers(f.emin - 1, f.emax))  # emin - 1 stands for the subnormal binade
    if e < f.emin:
        k = draw(st.integers(0, 2**f.mantissa_bits - 1))
        e = f.emin
    else:
        k = draw(st.integers(2**f.mantissa_bits, 2 ** (f.mantissa_bits + 1) - 1))
    hi = float(np.ldexp(k + 0.5, e - f.mantissa_bits)) * draw(st.sampled_from([1.0, -1.0]))
    nudge = draw(st.sampled_from([0, 1, -1]))  # on the midpoint, or one float64 step off it
    hi = float(np.nextafter(hi, np.inf * nudge)) if nudge else hi
    j = draw(st.integers(1, 60))
    lo = draw(st.sampled_from([0.0, 1.0, -1.0])) * float(np.spacing(hi)) * 2.0**-j
    return hi, lo


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_midpoints_match_oracle(data: st.DataObject) -> None:
    f = data.draw(fmts)
    hi, lo = data.draw(midpoint(f))
    check_against_oracle(hi, lo, f)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_near_max_finite_match_oracle(data: st.DataObject) -> None:
    f = data.draw(fmts)
    step = f.max_finite - float(np.nextafter(np.float64(f.max_finite), 0).astype(np.float64))
    top_spacing = float(np.ldexp(1.0, f.emax - f.mantissa_bits))
    j = data.draw(st.integers(-16, 24))
    hi = (f.max_finite + j * top_spacing / 8) * data.draw(st.sampled_from([1.0, -1.0]))
    lo = data.draw(st.sampled_from([0.0, 1.0, -1.0])) * float(np.spacing(hi)) / 4
    assert step > 0
    check_against_oracle(hi, lo, f)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_subnormal_range_match_oracle(data: st.DataObject) -> None:
    f = data.draw(fmts)
    k = data.draw(st.integers(-(2 ** (f.mantissa_bits + 6)), 2 ** (f.mantissa_bits + 6)))
    hi = k * f.min_subnormal / 16
    lo = data.draw(st.sampled_from([0.0, 1.0, -1.0])) * float(np.spacing(hi)) / 2
    check_against_oracle(hi, lo if hi != 0 else 0.0, f)


def test_vectorized_batch_matches_oracle() -> None:
    """One big array (no per-element calls) against the oracle: the same numbers as above, batched."""
    rng = np.random.default_rng(7)
    for f in ALL:
        e = rng.integers(f.emin - f.mantissa_bits - 3, f.emax + 2, 400)
        a = np.ldexp(rng.random(400) + 1, e) * rng.choice([-1.0, 1.0], 400)
        b = a * rng.uniform(-1e-8, 1e-8, 400)
        hi, lo = two_sum(a.reshape(20, 20), b.reshape(20, 20))
        got = round_to_format(hi, f, lo)
        assert got.shape == (20, 20)
        assert same(got, oracle(hi, lo, f))


# ---------------------------------------------------------------------------------------------
# Special values, shapes


@pytest.mark.parametrize("f", ALL, ids=IDS)
def test_special_values(f: FloatFormat) -> None:
    big = np.inf if f.has_inf else np.nan
    x = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, -1e-300, 1e-300, 1e308, -1e308])
    want = np.array([0.0, -0.0, np.nan, big, -big, -0.0, 0.0, big, -big])
    assert same(round_to_format(x, f), want)
    # NaN in lo where hi is inf (what two_sum(inf, x) gives) still yields inf / NaN
    assert same(round_to_format(np.inf, f, np.nan), big)


def test_negative_rounding_to_zero_is_minus_zero() -> None:
    f = FORMATS["bf16"]
    half = f.min_subnormal / 2
    assert same(round_to_format([-half, -half / 3, half], f), [-0.0, -0.0, 0.0])
    assert same(round_to_format(-half, f, 1e-300), -0.0)  # exact value still negative
    assert same(round_to_format(-half, f, -1e-300), -f.min_subnormal)
    assert same(round_to_format(half, f, -1e-300), 0.0)


def test_tie_detection_regression() -> None:
    """Found by hypothesis: a negative value a hair inside half the smallest subnormal.

    r = hi / q = -(1/2 - 2**-54); the first version tested ``r - floor(r) == 0.5``, and that
    subtraction rounds to exactly 0.5, so the "tie" was broken by lo's sign towards -min_subnormal.
    """
    hi, lo = -0.0009765624999999999, -5.421010862427522e-20
    assert round_fraction(F(hi) + F(lo), "fp8_e4m3fn") == 0.0
    assert same(round_to_format(hi, "fp8_e4m3fn", lo), -0.0)
    for f in ALL:
        h = -float(np.nextafter(f.min_subnormal / 2, 0))
        check_against_oracle([h, -h, h, -h], [np.spacing(h) / 2, np.spacing(h) / 2, 0.0, 0.0], f)


def test_zero_hi_with_lo_is_rounded_as_lo() -> None:
    assert same(round_to_format([0.0, 0.0], "bf16", [1 + 2**-9, -3.0]), [1.0, -3.0])


def test_shapes_and_broadcasting() -> None:
    assert round_to_format(1.5, "bf16").shape == ()
    assert round_to_format(np.ones((2, 3)), "bf16", 0.0).shape == (2, 3)
    assert round_to_format([[1.0], [2.0]], "fp16").dtype == np.float64
    assert round_to_format(np.float32(0.1), "bf16") == round_fraction(
        F(float(np.float32(0.1))), "bf16"
    )


# ---------------------------------------------------------------------------------------------
# torch / ml_dtypes conversions
#
# What round_to_format does is asserted unconditionally.  What a library's cast does is a fact about
# its version (tests/_library_facts.py), recorded as the model that describes the cast, in terms of
# round_to_format (cast_model):
#   "once"          one correct rounding, as round_to_format
#   "via fp32"      rounded to fp32 first, then to the format: double rounding (a value one float64
#                   ulp off a tie lands on the tie in fp32, then goes to even: the wrong side)
#   ", saturating"  past the overflow threshold: +-max_finite, where round_to_format gives inf / NaN

#: torch's CPU casts, by source dtype and target format.  Checked on torch 2.13.0+cpu.
TORCH_CASTS: dict[str, dict[str, dict[str, str]]] = {
    ">=2.13,<2.14": {
        "float32": {"fp8_e4m3fn": "once, saturating"},
        "float64": {"fp32": "once", "bf16": "via fp32", "fp16": "via fp32", "fp8_e5m2": "via fp32",
                    "fp8_e4m3fn": "via fp32, saturating"},
    },
}  # fmt: skip
#: ml_dtypes' casts (its fp16 and fp32 are numpy's).  Checked on 0.4.1, 0.5.4, 0.6.0 and 0.7.0.
ML_DTYPES_CASTS: dict[str, dict[str, dict[str, str]]] = {
    ">=0.4,<0.7": {
        "float32": {"fp8_e4m3fn": "once"},
        "float64": {"bf16": "via fp32", "fp8_e5m2": "via fp32", "fp8_e4m3fn": "via fp32"},
    },
    ">=0.7,<0.8": {
        "float32": {"fp8_e4m3fn": "once"},
        "float64": {"bf16": "once", "fp8_e5m2": "once", "fp8_e4m3fn": "once"},
    },
}
CAST_MODELS = ("once", "via fp32", "once, saturating", "via fp32, saturating")


def cast_model(how: str, x: object, f: FloatFormat) -> np.ndarray:
    """What a cast to fmt described by ``how`` (one of CAST_MODELS) gives for the float64 values x."""
    if how not in CAST_MODELS:
        raise ValueError(f"unknown cast model {how!r}: one of {CAST_MODELS}")
    v = np.asarray(x, dtype=np.float64)
    if how.startswith("via fp32"):
        v = round_to_format(v, "fp32")
    out = round_to_format(v, f)
    if how.endswith("saturating"):
        over = ~np.isnan(v) & (np.isinf(out) | np.isnan(out))
        out = np.where(over, np.copysign(f.max_finite, v), out)
    return out


def near_ties(f: FloatFormat, seed: int, n: int = 20_000) -> np.ndarray:
    """float64 values over fmt's range: random ones, fmt's midpoints, and values one float64 ulp off
    a midpoint (where a cast through fp32 rounds twice)."""
    rng = np.random.default_rng(seed)
    e = rng.integers(f.emin - f.mantissa_bits - 3, f.emax + 1, n)
    x = np.ldexp(rng.random(n) + 1, e) * rng.choice([-1.0, 1.0], n)
    q = np.ldexp(1.0, np.maximum(e, f.emin) - f.mantissa_bits)
    mid = (np.floor(x / q) + 0.5) * q
    near = np.nextafter(mid, mid * rng.choice([-np.inf, np.inf], n))
    return np.concatenate([x, mid, near])


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16", "fp8_e5m2", "fp8_e4m3fn"])
def test_single_rounding_casts_agree(name: str) -> None:
    """From float32-exact inputs, torch's and ml_dtypes' (numpy's for fp16) casts round once: they
    must match round_to_format exactly.  An agreement with the libraries' correct behaviour, kept as
    an independent check of round_to_format.  e4m3fn has no inf, so past its overflow threshold
    there is no IEEE answer: what the casts do there is recorded (test_*_e4m3fn_cast_overflow)."""
    f = FORMATS[name]
    rng = np.random.default_rng(3)
    n = 50_000
    e = rng.integers(max(f.emin - f.mantissa_bits - 3, -149), f.emax + 2, n)
    x = np.ldexp(rng.random(n) + 1, e) * rng.choice([-1.0, 1.0], n)
    q = np.ldexp(1.0, np.maximum(e, f.emin) - f.mantissa_bits)
    mids = (np.floor(x / q) + 0.5) * q  # exact midpoints of fmt
    with np.errstate(over="ignore"):  # values above fmt's range are part of the test
        x = np.concatenate([x, mids]).astype(np.float32).astype(np.float64)
    if not f.has_inf:
        x = x[np.abs(x) <= f.max_finite + float(np.ldexp(1.0, f.emax - f.mantissa_bits)) / 2]
    with np.errstate(over="ignore"):
        ml = x.astype(np.float32).astype(f.numpy_dtype).astype(np.float64)
    ours = round_to_format(x, f)
    assert same(ml, ours)
    tt = torch.from_numpy(x.astype(np.float32)).to(f.torch_dtype).double().numpy()
    assert same(tt, ours)


E4M3FN_EDGE = np.array([448, 463.99, 464, 465, 470, 480, 1000, 1e6, np.inf, -464, -465, -1e9, np.nan],
                       dtype=np.float32)  # fmt: skip


def test_ml_dtypes_e4m3fn_cast_overflow() -> None:
    """ml_dtypes' float32 -> float8_e4m3fn cast around the overflow threshold (0.4-0.7: one
    rounding, NaN past 464, the rule round_to_format follows: test_e4m3fn_overflow_rule)."""
    how = fact("ml_dtypes", ML_DTYPES_CASTS, what="float32 -> float8_e4m3fn casts")["float32"]["fp8_e4m3fn"]
    got = E4M3FN_EDGE.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert same(got, cast_model(how, E4M3FN_EDGE, FORMATS["fp8_e4m3fn"]))


def test_torch_e4m3fn_cast_overflow() -> None:
    """torch's CPU float32 -> float8_e4m3fn cast around the overflow threshold.  2.13: it SATURATES
    (465, 1e6 and even inf -> 448) where round_to_format gives NaN (test_e4m3fn_overflow_rule);
    kernels that want torch's behaviour must clamp explicitly."""
    how = fact("torch", TORCH_CASTS, what="CPU float32 -> float8_e4m3fn casts")["float32"]["fp8_e4m3fn"]
    got = torch.from_numpy(E4M3FN_EDGE).to(torch.float8_e4m3fn).double().numpy()
    assert same(got, cast_model(how, E4M3FN_EDGE, FORMATS["fp8_e4m3fn"]))


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16", "fp8_e5m2", "fp8_e4m3fn"])
def test_round_to_format_near_ties(name: str) -> None:
    """On the values the casts are tested with, round_to_format agrees with the Fraction oracle, and
    a cast through fp32 disagrees with it on about half of those one float64 ulp off a tie (so the
    cast tests below tell "once" from "via fp32"): there fl32(x) lands on the tie, and the tie then
    goes to even, the wrong side."""
    f = FORMATS[name]
    x = near_ties(f, 11)
    ours = round_to_format(x, f)
    for i in range(0, x.size, 211):
        assert same(round_fraction(F(float(x[i])), f), ours[i])
    bad = np.flatnonzero(~same_each(cast_model("via fp32", x, f), ours))
    if name == "fp32":
        assert bad.size == 0
        return
    assert bad.size > x.size // 12
    x32 = round_to_format(x[bad], "fp32")
    assert np.all(x32 != x[bad]) and same(round_to_format(x32, f), cast_model("via fp32", x[bad], f))
    for i in bad[:300]:
        assert same(round_fraction(F(float(x[i])), f), ours[i])


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16", "fp8_e5m2", "fp8_e4m3fn"])
def test_torch_float64_casts(name: str) -> None:
    """torch's CPU casts from float64.  2.13: fp32 rounds once; bf16, fp16 and fp8 go through fp32
    (double rounding; e4m3fn also saturates): do not round with them (docs/numerics.md)."""
    f = FORMATS[name]
    how = fact("torch", TORCH_CASTS, what=f"CPU float64 -> {name} casts")["float64"][name]
    x = near_ties(f, 11)
    tt = torch.from_numpy(x).to(f.torch_dtype).double().numpy()
    assert same(tt, cast_model(how, x, f))


@pytest.mark.parametrize("name", ["bf16", "fp8_e5m2", "fp8_e4m3fn"])
def test_ml_dtypes_float64_casts(name: str) -> None:
    """ml_dtypes' casts from float64.  Up to 0.6 bf16 and fp8 go through fp32 (double rounding);
    0.7 rounds once."""
    f = FORMATS[name]
    how = fact("ml_dtypes", ML_DTYPES_CASTS, what=f"float64 -> {name} casts")["float64"][name]
    x = near_ties(f, 11)
    with np.errstate(over="ignore", invalid="ignore"):  # values above fmt's range are part of the test
        ml = x.astype(f.numpy_dtype).astype(np.float64)
    assert same(ml, cast_model(how, x, f))


#: A hair above a bf16 tie (the correct answer rounds up) and a hair below one (rounds down).
DOUBLE_ROUNDING = [float(np.nextafter(1 + 2**-8, 2.0)), float(np.nextafter(1 + 3 * 2**-8, 0.0))]


def test_double_rounding_example() -> None:
    """round_to_format rounds both once, correctly; through fp32 both land on a tie and go to the
    even neighbour, the wrong side."""
    x, y = DOUBLE_ROUNDING
    assert round_fraction(F(x), "bf16") == 1 + 2**-7 == round_to_format(x, "bf16")
    assert round_fraction(F(y), "bf16") == 1 + 2**-7 == round_to_format(y, "bf16")
    assert round_to_format(DOUBLE_ROUNDING, "fp32").tolist() == [1 + 2**-8, 1 + 3 * 2**-8]
    assert cast_model("via fp32", DOUBLE_ROUNDING, FORMATS["bf16"]).tolist() == [1.0, 1 + 2**-6]


def test_torch_double_rounding_example() -> None:
    """2.13 (via fp32): [1.0, 1 + 2**-6], both wrong."""
    how = fact("torch", TORCH_CASTS, what="CPU float64 -> bf16 casts")["float64"]["bf16"]
    t = torch.tensor(DOUBLE_ROUNDING, dtype=torch.float64).to(torch.bfloat16).double().numpy()
    assert same(t, cast_model(how, DOUBLE_ROUNDING, FORMATS["bf16"]))


def test_ml_dtypes_double_rounding_example() -> None:
    """0.4-0.6 (via fp32): [1.0, 1 + 2**-6], both wrong; 0.7 (once): 1 + 2**-7 for both."""
    how = fact("ml_dtypes", ML_DTYPES_CASTS, what="float64 -> bf16 casts")["float64"]["bf16"]
    m = np.array(DOUBLE_ROUNDING).astype(ml_dtypes.bfloat16).astype(np.float64)
    assert same(m, cast_model(how, DOUBLE_ROUNDING, FORMATS["bf16"]))


# ---------------------------------------------------------------------------------------------
# two_sum / two_prod / to_tensor


finite = st.floats(-1e300, 1e300, allow_nan=False)
moderate = st.one_of(st.just(0.0), st.floats(1e-140, 1e140), st.floats(-1e140, -1e-140))


@settings(max_examples=300, deadline=None)
@given(finite, finite)
def test_two_sum_exact(a: float, b: float) -> None:
    s, e = two_sum(a, b)
    assert float(s) == a + b
    assert F(float(s)) + F(float(e)) == F(a) + F(b)
    assert abs(float(e)) <= abs(float(np.spacing(s))) / 2


@settings(max_examples=300, deadline=None)
@given(moderate, moderate)
def test_two_prod_exact(a: float, b: float) -> None:
    p, e = two_prod(a, b)
    assert float(p) == a * b
    assert F(float(p)) + F(float(e)) == F(a) * F(b)


def test_two_sum_two_prod_vectorized() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 64, 64)) * 2.0 ** rng.integers(-30, 30, (2, 64, 64))
    s, e = two_sum(a, b)
    p, f = two_prod(a, b)
    assert s.shape == e.shape == p.shape == f.shape == (64, 64)
    for i in range(0, 64 * 64, 97):
        x, y = float(a.flat[i]), float(b.flat[i])
        assert F(float(s.flat[i])) + F(float(e.flat[i])) == F(x) + F(y)
        assert F(float(p.flat[i])) + F(float(f.flat[i])) == F(x) * F(y)


@pytest.mark.parametrize("f", ALL, ids=IDS)
def test_to_tensor_exact(f: FloatFormat) -> None:
    v = np.array(
        [
            0.0,
            -0.0,
            1.0,
            -2.5 if f.mantissa_bits >= 2 else -3.0,
            f.max_finite,
            -f.min_subnormal,
            f.min_normal,
            np.nan,
        ]
    )
    t = to_tensor(v, f)
    assert t.dtype == f.torch_dtype and t.shape == v.shape
    assert same(t.double().numpy(), v)
    assert same(to_tensor(v.reshape(2, 4), f.name).double().numpy(), v.reshape(2, 4))
    with pytest.raises(ValueError, match="not representable"):
        to_tensor([1.0, 1.0 + f.eps / 2], f)
    with pytest.raises(ValueError, match="not representable"):
        to_tensor([f.max_finite * 2], f)
    if not f.has_inf:
        with pytest.raises(ValueError, match="not representable"):
            to_tensor([np.inf], f)
    else:
        assert to_tensor([np.inf], f).double().item() == np.inf


def test_as_float64_inputs() -> None:
    assert same(as_float64(torch.tensor([1.0, 2.0], dtype=torch.bfloat16), "bf16"), [1.0, 2.0])
    assert same(as_float64(torch.tensor([1.5], dtype=torch.float32), "fp8_e4m3fn"), [1.5])
    assert same(as_float64(np.array([3], dtype=np.int8), "bf16"), [3.0])
    assert same(as_float64(np.array([1.0], dtype=ml_dtypes.bfloat16), "bf16"), [1.0])
    with pytest.raises(ValueError, match="not representable in fp8_e4m3fn"):
        as_float64(torch.tensor([1.1]), "fp8_e4m3fn")
    with pytest.raises(ValueError):
        as_float64(np.array(["a"]), "bf16")
