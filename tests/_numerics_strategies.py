"""Hypothesis strategies for values of a format, weighted towards the cases that break emulations:
ties (small integers, halves), subnormals, values near overflow, signed zeros, and a few NaN/inf."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from tasks.numerics import FloatFormat, round_to_format


def _from_bits(f: FloatFormat, pattern: int) -> float:
    with np.errstate(invalid="ignore"):
        return float(np.array(pattern, dtype=f.int_dtype).view(f.numpy_dtype).astype(np.float64))


def values(f: FloatFormat, specials: bool = True) -> st.SearchStrategy[float]:
    """Values of ``f`` (as Python floats)."""
    sub = f.min_subnormal
    big = [float(round_to_format(v, f)) for v in
           (f.max_finite, -f.max_finite, f.max_finite / 2, -f.max_finite / 4, f.max_finite * 0.75)]
    spec = [math.inf, -math.inf, math.nan] if f.has_inf else [math.nan]

    def pick(i: int) -> st.SearchStrategy[float]:
        if i < 3 and specials:
            return st.sampled_from(spec)
        if i < 15:
            return st.integers(0, 2**f.bits - 1).map(lambda p: _from_bits(f, p)).filter(
                lambda v: specials or math.isfinite(v)
            )
        if i < 42:
            return st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, 3.0, -3.0, 0.5, -0.5, 1.5, 0.25])
        if i < 55:
            return st.integers(-6, 6).map(lambda j: j * sub)
        if i < 62:
            return st.sampled_from(big)
        return st.floats(-20, 20).map(lambda v: float(round_to_format(v, f)))

    return st.integers(0, 99).flatmap(pick)


@st.composite
def matrices(draw: st.DrawFn, f: FloatFormat, max_mn: int = 3, max_k: int = 9,
             specials: bool = True) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``A [m, k]`` and ``B [k, n]`` of values of ``f`` (float64 arrays)."""
    m = draw(st.integers(1, max_mn))
    n = draw(st.integers(1, max_mn))
    k = draw(st.integers(1, max_k))
    v = values(f, specials)
    a = np.array(draw(st.lists(v, min_size=m * k, max_size=m * k)), dtype=np.float64)
    b = np.array(draw(st.lists(v, min_size=k * n, max_size=k * n)), dtype=np.float64)
    return a.reshape(m, k), b.reshape(k, n)
