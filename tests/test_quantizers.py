"""Activation quantizers: each preset bit for bit against a slow exact oracle (fractions), the
registry's errors, and the engine's default quantizer being the registry's ``vllm-int8``."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.numerics import get_format
from tasks.numerics.rounding import NEAREST_AWAY, NEAREST_EVEN, round_fraction
from tasks.quantizers import (
    DEFAULT_QUANTIZER,
    QuantizerError,
    get_quantizer,
    list_quantizers,
    quantizer_names,
)
from tests._numerics_strategies import values

DYNAMIC = [n for n in quantizer_names() if "static" not in n]
STATIC = {"int8-static": 0.0123, "fp8-static": 0.0071}
INPUT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# -- the exact oracle: IEEE fp32 operations from fractions, specials by hand -----------------------

def _sign(v: float) -> float:
    return math.copysign(1.0, v)


def _round(r: Fraction, sign: float, fmt: str = "fp32") -> float:
    return sign * 0.0 if r == 0 else round_fraction(r, fmt)


def o_mul(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if math.isinf(a) or math.isinf(b):
        return math.nan if a == 0 or b == 0 else _sign(a) * _sign(b) * math.inf
    return _round(Fraction(a) * Fraction(b), _sign(a) * _sign(b))


def o_div(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b) or (math.isinf(a) and math.isinf(b)) or (a == 0 and b == 0):
        return math.nan
    if math.isinf(a) or b == 0:
        return _sign(a) * _sign(b) * math.inf
    if math.isinf(b):
        return _sign(a) * _sign(b) * 0.0
    return _round(Fraction(a) / Fraction(b), _sign(a) * _sign(b))


def fl32(v: float | Fraction) -> float:
    return round_fraction(Fraction(v), "fp32")


def oracle(x: list[list[float]], p: dict[str, Any], fp8: bool) -> tuple[list[list[float]], list[float]]:
    """(q as floats, stored scale as floats) per the formula in tasks/quantizers/per_token.py."""
    c = 448.0 if fp8 else 127.0
    qs, scales = [], []
    for row in x:
        amax = max(abs(v) for v in row)
        if p["eps"] > 0:
            amax = max(amax, fl32(p["eps"]))
        if p["mode"] == "static":
            s = fl32(p["static_scale"])
        else:
            s = o_div(amax, c) if p["scale"] == "divide" else o_mul(amax, fl32(1 / Fraction(c)))
            if p["min_scale"] > 0:
                s = max(s, fl32(p["min_scale"]))
        su = s if p["scale_dtype"] == "fp32" else (s if s == 0 else round_fraction(Fraction(s), "fp16"))
        out = []
        for v in row:
            if p["apply"] == "inv-amax":
                w = o_mul(v, o_div(c, amax))
            elif p["apply"] == "divide":
                w = o_div(v, su)
            else:
                w = o_mul(v, o_div(1.0, su))
            out.append(_q8(w, p["rounding"]) if fp8 else float(_qint(w, p["rounding"])))
        qs.append(out)
        scales.append(su)
    return qs, scales


def _qint(w: float, rounding: str) -> int:
    if math.isnan(w):
        return 0
    if math.isinf(w):
        return 127 if w > 0 else -128
    f = Fraction(w)
    n = math.floor(f)
    rem = f - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and (n % 2 == 1 if rounding == "even" else f > 0)):
        n += 1
    return max(-128, min(127, n))


def _q8(w: float, rounding: str) -> float:
    if math.isnan(w):
        w = 448.0
    w = max(-448.0, min(448.0, w))
    if w == 0:
        return w  # keeps the sign of zero
    return round_fraction(Fraction(w), "fp8_e4m3fn", NEAREST_EVEN if rounding == "even" else NEAREST_AWAY)


def check_exact(name: str, x: torch.Tensor, **params: Any) -> None:
    qz = get_quantizer(name, **params)
    q, scale = qz(x)
    rows = x.to(torch.float32).tolist()
    fp8 = qz.out_dtype == "fp8_e4m3"
    want_q, want_s = oracle(rows, qz.params, fp8)
    sdt = torch.float16 if qz.params["scale_dtype"] == "fp16" else torch.float32
    assert scale.dtype == sdt and tuple(scale.shape) == (x.shape[0], 1)
    want_scale = torch.tensor(want_s, dtype=torch.float64).to(sdt).reshape(-1, 1)
    assert torch.equal(scale.view(torch.int16 if sdt == torch.float16 else torch.int32),
                       want_scale.view(torch.int16 if sdt == torch.float16 else torch.int32)), (name, rows)
    if fp8:
        assert q.dtype == torch.float8_e4m3fn
        want = torch.tensor(want_q, dtype=torch.float64).reshape(q.shape).to(torch.float8_e4m3fn)
        assert torch.equal(q.view(torch.uint8), want.view(torch.uint8)), (name, rows, q, want)
    else:
        assert q.dtype == torch.int8
        assert q.tolist() == [[int(v) for v in r] for r in want_q], (name, rows, q.tolist(), want_q)


@st.composite
def activations(draw: st.DrawFn, dtype: str) -> torch.Tensor:
    f = get_format(dtype)
    m = draw(st.integers(1, 3))
    k = draw(st.integers(1, 6))
    rows = []
    for _ in range(m):
        if draw(st.integers(0, 9)) == 0:
            rows.append([draw(st.sampled_from([0.0, -0.0])) for _ in range(k)])  # a zero row
        else:
            rows.append(draw(st.lists(values(f, specials=False), min_size=k, max_size=k)))
    return torch.tensor(rows, dtype=torch.float64).to(INPUT_DTYPES[dtype])


@st.composite
def ties(draw: st.DrawFn, fp8: bool) -> torch.Tensor:
    """Rows whose scale is a power of two 2**e (amax = C * 2**e), so every x / scale is exact: values
    k + 1/2 (INT8) or midpoints between neighbouring e4m3 values (FP8) are exact ties."""
    e = draw(st.integers(-20, 10))
    c = 448.0 if fp8 else 127.0
    k = draw(st.integers(1, 6))
    if fp8:
        grid = sorted({float(v) for v in torch.arange(0, 127, dtype=torch.int16).to(torch.uint8)
                       .view(torch.float8_e4m3fn).float().tolist()})
        mids = [(a + b) / 2 for a, b in zip(grid, grid[1:], strict=False)]
        pool = st.sampled_from(mids)
    else:
        pool = st.integers(-127, 126).map(lambda n: n + 0.5)
    vals = [draw(pool) * draw(st.sampled_from([1.0, -1.0])) for _ in range(k)]
    return torch.tensor([[c, *vals]], dtype=torch.float64).mul(2.0**e).to(torch.float32)


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", DYNAMIC)
@pytest.mark.parametrize("dtype", list(INPUT_DTYPES))
@FAST
@given(data=st.data())
def test_dynamic_quantizers_equal_the_exact_oracle(name: str, dtype: str, data: st.DataObject) -> None:
    check_exact(name, data.draw(activations(dtype)))


@pytest.mark.parametrize("name", sorted(STATIC))
@FAST
@given(data=st.data())
def test_static_quantizers_equal_the_exact_oracle(name: str, data: st.DataObject) -> None:
    check_exact(name, data.draw(activations("fp32")), static_scale=STATIC[name])


@pytest.mark.parametrize("name", DYNAMIC)
@FAST
@given(data=st.data())
def test_exact_ties_follow_the_stated_rule(name: str, data: st.DataObject) -> None:
    fp8 = get_quantizer(name).out_dtype == "fp8_e4m3"
    check_exact(name, data.draw(ties(fp8)))


@FAST
@given(data=st.data(), rounding=st.sampled_from(["even", "away"]), scale=st.sampled_from(["divide", "mul-recip"]),
       apply=st.sampled_from(["inv-amax", "divide", "mul-inv"]), scale_dtype=st.sampled_from(["fp32", "fp16"]),
       eps=st.sampled_from([0.0, 1e-10, 0.3]), fp8=st.booleans())
def test_every_parameter_combination_equals_the_oracle(data: st.DataObject, rounding: str, scale: str, apply: str,
                                                      scale_dtype: str, eps: float, fp8: bool) -> None:
    x = data.draw(activations(data.draw(st.sampled_from(list(INPUT_DTYPES)))))
    check_exact("vllm-fp8" if fp8 else "vllm-int8", x, rounding=rounding, scale=scale, apply=apply,
                scale_dtype=scale_dtype, eps=eps)


def test_ties_differ_between_even_and_away() -> None:
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -2.5, -0.5]])
    q_even, _ = get_quantizer("vllm-int8")(x)
    q_away, _ = get_quantizer("int8-half-away")(x)
    assert q_even.tolist() == [[127, 0, 2, 2, -2, 0]]
    assert q_away.tolist() == [[127, 1, 2, 3, -3, -1]]


def test_zero_rows() -> None:
    x = torch.zeros(2, 4)
    q, s = get_quantizer("vllm-int8")(x)
    assert q.eq(0).all() and s.eq(0).all()
    q, s = get_quantizer("int8-eps")(x)
    assert q.eq(0).all() and s.gt(0).all()
    q, s = get_quantizer("vllm-fp8")(x)
    assert q.float().eq(0).all() and s.eq(torch.tensor(1 / (448 * 512), dtype=torch.float32)).all()


# -- the engine's quantizer is the registry default ----------------------------------------------

@settings(max_examples=150, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(list(INPUT_DTYPES)))
def test_default_is_the_engine_quantizer_bit_for_bit(data: st.DataObject, dtype: str) -> None:
    from tasks.models.quantization import quantize_activations

    x = data.draw(activations(dtype))
    q, s = get_quantizer(DEFAULT_QUANTIZER)(x)
    q0, s0 = quantize_activations(x, "real")
    assert torch.equal(q, q0) and torch.equal(s.view(torch.int32), s0.view(torch.int32))


def test_default_is_the_engine_quantizer_on_random_activations() -> None:
    from tasks.models.quantization import quantize_activations

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 512, generator=g) * torch.logspace(-3, 3, 64).reshape(-1, 1)
    q, s = get_quantizer(DEFAULT_QUANTIZER)(x)
    q0, s0 = quantize_activations(x, "real")
    assert torch.equal(q, q0) and torch.equal(s, s0)


# -- the registry ---------------------------------------------------------------------------------

def test_unknown_name_suggests_and_lists() -> None:
    with pytest.raises(QuantizerError) as err:
        get_quantizer("vllm-int9")
    msg = str(err.value)
    assert "did you mean 'vllm-int8'" in msg and "int8-half-away" in msg


def test_bad_parameters_say_what_is_allowed() -> None:
    with pytest.raises(QuantizerError, match="rounding='up' is not allowed; choose one of 'even', 'away'"):
        get_quantizer("vllm-int8", rounding="up")
    with pytest.raises(QuantizerError, match="unknown parameter"):
        get_quantizer("vllm-int8", bits=4)
    with pytest.raises(QuantizerError, match="needs static_scale"):
        get_quantizer("int8-static")
    with pytest.raises(QuantizerError, match="takes a 2-D"):
        get_quantizer("vllm-int8")(torch.zeros(3))
    with pytest.raises(QuantizerError, match="inf or NaN"):
        get_quantizer("vllm-int8")(torch.tensor([[1.0, math.inf]]))


def test_list_quantizers_rows() -> None:
    rows = {r["name"]: r for r in list_quantizers()}
    assert set(rows) == set(quantizer_names())
    assert rows["vllm-int8"]["ok"] and rows["vllm-int8"]["out_dtype"] == "int8"
    assert "fl32(x * fl32(127 / amax))" in rows["vllm-int8"]["formula"]
    assert not rows["int8-static"]["ok"] and "static_scale" in rows["int8-static"]["reason"]
    assert rows["vllm-fp8"]["formula"].startswith("s = fl32(amax / 448); s = max(s, fl32(")


def test_identity_feeds_ids() -> None:
    a = get_quantizer("int8-half-away").identity
    b = get_quantizer("vllm-int8", rounding="away").identity
    assert a["params"] == b["params"] and a["name"] != b["name"]
    assert np.isfinite(get_quantizer("vllm-fp8").params["min_scale"])


def test_the_oracle_tells_the_variants_apart() -> None:
    """The oracle is not vacuous: on a tie row, on a scale that rounds differently in fp16, and on
    values where x / s and x * fl32(127/amax) round differently, it separates the variants."""
    x = torch.tensor([[127.0, 0.5, 2.5, -3.5]])
    base = get_quantizer("vllm-int8").params
    q_even, _ = oracle(x.tolist(), base, fp8=False)
    q_away, _ = oracle(x.tolist(), {**base, "rounding": "away"}, fp8=False)
    assert q_even != q_away
    y = torch.tensor([[1.1, 0.3]])
    _, s32 = oracle(y.tolist(), base, fp8=False)
    _, s16 = oracle(y.tolist(), {**base, "scale_dtype": "fp16"}, fp8=False)
    assert s32 != s16
    # found in randn data (4 of 4M values differ): x * fl32(127/amax) and x / fl32(amax/127) fall on
    # either side of -24.5
    z = torch.tensor([[3.0591812133789062, -0.5901570320129395]])
    assert get_quantizer("vllm-int8")(z)[0].tolist() == [[127, -25]]
    assert get_quantizer("int8-divide")(z)[0].tolist() == [[127, -24]]
    check_exact("vllm-int8", z)
    check_exact("int8-divide", z)
