"""bits / ordered / distance / spacing: hand-checked values per format, exhaustive and metric properties."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.numerics import (
    FORMATS,
    NOT_COMPARABLE,
    FloatFormat,
    bits,
    distance,
    is_nan_bits,
    ordered,
    spacing,
)

ALL = list(FORMATS.values())
IDS = [f.name for f in ALL]
SMALL = [f for f in ALL if f.bits <= 16]

BF16, FP16, FP32 = FORMATS["bf16"], FORMATS["fp16"], FORMATS["fp32"]
E4M3, E5M2 = FORMATS["fp8_e4m3fn"], FORMATS["fp8_e5m2"]
INF = float("inf")


def d(a: float, b: float, f: FloatFormat | str) -> int:
    return int(distance(a, b, f))


# ---------------------------------------------------------------------------------------------
# hand-checked


@pytest.mark.parametrize(
    "fmt,a,b,want",
    [
        ("bf16", 1.0, 1.0078125, 1),
        ("bf16", 255.0, 256.0, 1),
        ("bf16", 256.0, 258.0, 1),
        ("bf16", 256.0, 260.0, 2),
        ("bf16", 1.0, 2.0, 128),  # one binade = 2**mantissa_bits spacings
        ("bf16", -(2**-133), 2**-133, 3),  # -min_sub, -0, +0, +min_sub
        ("bf16", -0.0, 0.0, 1),
        ("bf16", 0.0, 0.0, 0),
        ("bf16", -0.0, -0.0, 0),
        ("bf16", BF16.max_finite, INF, 1),
        ("bf16", -BF16.max_finite, -INF, 1),
        ("bf16", 0.0, 2**-126, 128),  # the subnormals: 127 of them, then min_normal
        ("fp16", 1.0, 1 + 2**-10, 1),
        ("fp16", 2047.0, 2048.0, 1),
        ("fp16", 2048.0, 2050.0, 1),
        ("fp16", 65504.0, INF, 1),
        ("fp16", -(2**-24), 2**-24, 3),
        ("fp16", 0.0, 2**-14, 1024),
        ("fp16", -1.0, 1.0, 2 * 0x3C00 + 1),
        ("fp32", 1.0, 1 + 2**-23, 1),
        ("fp32", 2.0**24, 2.0**24 + 2, 1),
        ("fp32", -(2**-149), 2**-149, 3),
        ("fp32", 0.0, 2**-126, 2**23),
        ("fp32", FP32.max_finite, INF, 1),
        ("fp8_e4m3fn", 1.0, 1.125, 1),
        ("fp8_e4m3fn", 15.0, 16.0, 1),
        ("fp8_e4m3fn", 16.0, 18.0, 1),
        ("fp8_e4m3fn", 416.0, 448.0, 1),
        ("fp8_e4m3fn", -(2**-9), 2**-9, 3),
        ("fp8_e4m3fn", -0.0, 0.0, 1),
        ("fp8_e4m3fn", 0.0, 2**-6, 8),
        ("fp8_e4m3fn", -448.0, 448.0, 2 * 0x7E + 1),
        ("fp8_e5m2", 1.0, 1.25, 1),
        ("fp8_e5m2", 8.0, 10.0, 1),
        ("fp8_e5m2", 49152.0, 57344.0, 1),
        ("fp8_e5m2", 57344.0, INF, 1),
        ("fp8_e5m2", -(2**-16), 2**-16, 3),
        ("fp8_e5m2", -INF, INF, 2 * 0x7C + 1),
    ],
)
def test_distance_hand_checked(fmt: str, a: float, b: float, want: int) -> None:
    assert d(a, b, fmt) == want
    assert d(b, a, fmt) == want


@pytest.mark.parametrize(
    "fmt,x,want",
    [
        ("bf16", 1.0, 2**-7),
        ("bf16", 255.0, 1.0),
        ("bf16", 256.0, 2.0),
        ("bf16", 300.0, 2.0),
        ("bf16", 1000.0, 4.0),
        ("bf16", 4096.0, 32.0),
        ("bf16", -256.0, 2.0),
        ("bf16", 0.0, 2**-133),
        ("bf16", -0.0, 2**-133),
        ("bf16", 2**-126, 2**-133),
        ("bf16", 2**-130, 2**-133),
        ("fp16", 1.0, 2**-10),
        ("fp16", 2047.0, 1.0),
        ("fp16", 2048.0, 2.0),
        ("fp16", 65504.0, 32.0),  # top binade's spacing (not the gap to inf)
        ("fp16", 2**-20, 2**-24),
        ("fp32", 1.0, 2**-23),
        ("fp32", 2.0**24, 2.0),
        ("fp32", 0.0, 2**-149),
        ("fp8_e4m3fn", 1.0, 0.125),
        ("fp8_e4m3fn", 16.0, 2.0),
        ("fp8_e4m3fn", 448.0, 32.0),
        ("fp8_e4m3fn", 2**-9, 2**-9),
        ("fp8_e5m2", 1.0, 0.25),
        ("fp8_e5m2", 8.0, 2.0),
        ("fp8_e5m2", 57344.0, 8192.0),
        ("bf16", INF, float("nan")),
        ("bf16", float("nan"), float("nan")),
        ("fp8_e4m3fn", float("nan"), float("nan")),
    ],
)
def test_spacing_hand_checked(fmt: str, x: float, want: float) -> None:
    got = float(spacing(x, fmt))
    assert got == want or (np.isnan(got) and np.isnan(want))


def test_bits_and_ordered_hand_checked() -> None:
    assert int(bits(1.0, "bf16")) == 0x3F80
    assert int(bits(-0.0, "fp32")) == 0x80000000
    assert int(bits(448.0, "e4m3")) == 0x7E
    assert int(bits(-INF, "fp16")) == 0xFC00
    assert bits([1.0], "fp8_e5m2").dtype == np.uint8
    assert bits([1.0], "bf16").dtype == np.uint16
    assert bits([1.0], "fp32").dtype == np.uint32
    assert ordered([-0.0, 0.0, 2**-133, -(2**-133)], "bf16").tolist() == [-1, 0, 1, -2]
    assert int(ordered(INF, "bf16")) == 0x7F80 == int(ordered(BF16.max_finite, "bf16")) + 1
    assert int(ordered(-INF, "bf16")) == -0x7F80 - 1
    assert ordered([1.0], "fp32").dtype == np.int64


# ---------------------------------------------------------------------------------------------
# NaN semantics


def test_nan_same_bits_zero_different_bits_sentinel() -> None:
    nan_a = torch.tensor([0x7FC0, 0x7FC0, 0x7FC1, 0x7FC0, 0x7FC0], dtype=torch.int16)
    nan_b = torch.tensor(
        [0x7FC0, 0x7FC1, 0x7FC1, -0x0040, 0x3F80], dtype=torch.int16
    )  # -0x40: 0xFFC0
    a, b = nan_a.view(torch.bfloat16), nan_b.view(torch.bfloat16)
    assert distance(a, b, "bf16").tolist() == [0, NOT_COMPARABLE, 0, NOT_COMPARABLE, NOT_COMPARABLE]
    assert NOT_COMPARABLE == -1
    # fp8 e4m3fn: the only NaNs are 0x7F and 0xFF
    x = np.array([0x7F, 0x7F, 0xFF, 0x7E], dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    y = np.array([0x7F, 0xFF, 0xFF, 0x7F], dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    assert distance(x, y, "fp8_e4m3fn").tolist() == [0, -1, 0, -1]
    # NaN vs inf is not comparable; plain float NaN inputs are converted to fmt's canonical NaN
    assert d(float("nan"), INF, "fp16") == -1
    assert d(float("nan"), float("nan"), "fp16") == 0


@pytest.mark.parametrize("f", SMALL, ids=[f.name for f in SMALL])
def test_is_nan_bits_exhaustive(f: FloatFormat) -> None:
    pats = np.arange(2**f.bits, dtype=np.uint32).astype(f.int_dtype)
    with np.errstate(invalid="ignore"):
        want = np.isnan(pats.view(f.numpy_dtype).astype(np.float64))
    assert np.array_equal(is_nan_bits(pats, f), want)


# ---------------------------------------------------------------------------------------------
# exhaustive: consecutive values are one apart; spacing is the gap to the next value


def _ascending(f: FloatFormat) -> tuple[np.ndarray, np.ndarray]:
    """All non-NaN bit patterns of a small format in increasing value order (-0 just below +0)."""
    pos = np.arange(f.top_non_nan_bits + 1, dtype=np.int64)
    neg = (pos[::-1] | f.sign_mask).astype(np.int64)
    pats = np.concatenate([neg, pos]).astype(f.int_dtype)
    return pats, pats.view(f.numpy_dtype)


@pytest.mark.parametrize("f", SMALL, ids=[f.name for f in SMALL])
def test_consecutive_values_one_apart(f: FloatFormat) -> None:
    pats, vals = _ascending(f)
    o = ordered(vals, f)
    assert np.array_equal(np.diff(o), np.ones(len(o) - 1, dtype=np.int64))
    assert o[0] == -f.top_non_nan_bits - 1 and o[-1] == f.top_non_nan_bits
    assert np.array_equal(bits(vals, f), pats)
    assert np.all(distance(vals[:-1], vals[1:], f) == 1)
    # the same through float64 values (-0 survives the conversion)
    v64 = vals.astype(np.float64)
    assert np.array_equal(ordered(v64, f), o)
    assert np.all(distance(v64[1:], v64[:-1], f) == 1)


@pytest.mark.parametrize("f", SMALL, ids=[f.name for f in SMALL])
def test_spacing_is_gap_to_next(f: FloatFormat) -> None:
    _, vals = _ascending(f)
    v = vals.astype(np.float64)
    pos = v[np.flatnonzero(~np.signbit(v))]  # +0 .. top
    fin = pos[np.isfinite(pos)]
    gaps = np.diff(fin)
    assert np.array_equal(spacing(fin[:-1], f), gaps)
    assert np.array_equal(spacing(-fin[:-1], f), gaps)
    assert float(spacing(f.max_finite, f)) == 2.0 ** (f.emax - f.mantissa_bits)


def test_fp32_random_patterns() -> None:
    rng = np.random.default_rng(2)
    pats = rng.integers(0, 0x7F7FFFFF, 100_000, dtype=np.uint32)  # positive, below max_finite
    v = pats.view(np.float32)
    nxt = np.nextafter(v, np.float32(np.inf))
    assert np.all(distance(v, nxt, "fp32") == 1)
    assert np.all(distance(-v, -nxt, "fp32") == 1)
    assert np.array_equal(spacing(v, "fp32"), nxt.astype(np.float64) - v.astype(np.float64))
    assert np.array_equal(ordered(-v, "fp32"), -pats.astype(np.int64) - 1)


# ---------------------------------------------------------------------------------------------
# metric properties (hypothesis over bit patterns)


def _value(f: FloatFormat, pat: int) -> np.ndarray:
    return np.array([pat], dtype=np.uint32).astype(f.int_dtype).view(f.numpy_dtype)


@st.composite
def non_nan(draw: st.DrawFn, f: FloatFormat) -> np.ndarray:
    mag = draw(st.integers(0, f.top_non_nan_bits))
    return _value(f, mag | (f.sign_mask if draw(st.booleans()) else 0))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_distance_is_a_metric(data: st.DataObject) -> None:
    f = data.draw(st.sampled_from(ALL))
    a, b, c = (data.draw(non_nan(f)) for _ in range(3))
    dab, dba = int(distance(a, b, f)[0]), int(distance(b, a, f)[0])
    dbc, dac = int(distance(b, c, f)[0]), int(distance(a, c, f)[0])
    assert dab == dba >= 0
    assert (dab == 0) == (int(bits(a, f)[0]) == int(bits(b, f)[0]))
    assert dac <= dab + dbc
    oa, ob, oc = (int(ordered(x, f)[0]) for x in (a, b, c))
    if oa <= ob <= oc or oc <= ob <= oa:  # b between a and c on the ordered line: equality
        assert dac == dab + dbc


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_distance_to_next_value_is_one(data: st.DataObject) -> None:
    f = data.draw(st.sampled_from(ALL))
    x = data.draw(non_nan(f))
    top = np.array([f.max_finite], dtype=f.numpy_dtype)  # e4m3fn has no inf to step towards
    if x[0] == top[0] or np.isinf(x[0]):
        return
    nxt = np.nextafter(x, top)  # numpy / ml_dtypes nextafter: -0 steps straight to +min_subnormal
    want = 2 if (x[0] == 0 and np.signbit(x[0])) else 1  # ... skipping +0, one of our steps
    assert int(distance(x, nxt, f)[0]) == want
    if not np.signbit(x[0]):  # upwards from a non-negative value, the gap is the spacing
        assert float(spacing(x, f)[0]) == float(nxt[0]) - float(x[0])


# ---------------------------------------------------------------------------------------------
# inputs


def test_input_kinds() -> None:
    t = torch.tensor([1.0, 1.0078125, -0.0], dtype=torch.bfloat16)
    assert distance(t, t.float(), "bf16").tolist() == [0, 0, 0]  # fp32 tensor with bf16 values
    assert distance(t, np.array([1.0, 1.0, 0.0]), "bf16").tolist() == [0, 1, 1]
    assert distance([[1.0, 2.0], [3.0, 4.0]], 1.0, "fp16").shape == (2, 2)  # broadcasting
    assert np.array_equal(bits(t, "bf16"), t.view(torch.int16).numpy().view(np.uint16))
    fp8 = torch.tensor([1.0, 448.0]).to(torch.float8_e4m3fn)
    assert distance(fp8, [1.125, 416.0], "fp8_e4m3fn").tolist() == [1, 1]
    with pytest.raises(ValueError, match="not representable in bf16"):
        distance(1.001, 1.0, "bf16")
    with pytest.raises(ValueError, match="not representable in fp8_e4m3fn"):
        spacing(torch.tensor([INF]), "fp8_e4m3fn")
    with pytest.raises(ValueError, match="not representable in fp16"):
        ordered(np.array([1e-10], dtype=np.float32), "fp16")
