"""Slow exact oracle for the accumulation orders: Python fractions, explicit IEEE rules, one rounding
per operation.  Shares nothing with the implementation except ``round_fraction`` (itself tested
exhaustively in test_numerics_rounding.py).

A value is a Python float (a value of the format, a signed zero, +-inf or NaN) or a ``Fraction``
(an exact, finite, nonzero number that need not be a value of the format: an unrounded product).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from tasks.numerics import FloatFormat, round_fraction

Value = float | Fraction


def rnd(x: Value, f: FloatFormat, rounding: str) -> float:
    """One rounding to the format, IEEE conventions (inf -> NaN in a format without inf)."""
    if isinstance(x, float):
        if math.isnan(x):
            return math.nan
        if math.isinf(x):
            return x if f.has_inf else math.nan
        if x == 0:
            return x
    return round_fraction(Fraction(x), f, rounding)


def add(x: Value, y: Value, f: FloatFormat, rounding: str) -> float:
    """``round(x + y)`` with IEEE rules for NaN, inf and signed zeros."""
    xs, ys = isinstance(x, float), isinstance(y, float)
    if (xs and math.isnan(x)) or (ys and math.isnan(y)):
        return math.nan
    xi, yi = xs and math.isinf(x), ys and math.isinf(y)
    if xi and yi:
        return x if x == y else math.nan  # type: ignore[return-value]
    if xi or yi:
        return rnd(x if xi else y, f, rounding)
    total = Fraction(x) + Fraction(y)
    if total == 0:
        both_neg = xs and ys and x == 0 and y == 0 and math.copysign(1, x) < 0 \
            and math.copysign(1, y) < 0  # fmt: skip
        return -0.0 if both_neg else 0.0
    return round_fraction(total, f, rounding)


def prod(a: float, b: float) -> Value:
    """The exact product of two floats, IEEE rules for specials."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if math.isinf(a) or math.isinf(b):
        if a == 0 or b == 0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1, b)
    if a == 0 or b == 0:
        return math.copysign(0.0, a) * math.copysign(1.0, b)
    return Fraction(a) * Fraction(b)


def sequential(terms: list[Value], f: FloatFormat, r: str) -> float:
    acc: Value = 0.0
    for t in terms:
        acc = add(acc, t, f, r)
    return float(acc)


def pairwise(terms: list[Value], f: FloatFormat, r: str) -> float:
    level = list(terms)
    if not level:
        return 0.0
    while len(level) > 1:
        nxt: list[Value] = [add(level[i], level[i + 1], f, r) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return add(0.0, level[0], f, r)


def blocked(terms: list[Value], f: FloatFormat, r: str, b: int) -> float:
    sums = [sequential(terms[i : i + b], f, r) for i in range(0, len(terms), b)]
    return sequential(sums, f, r)


def exact(terms: list[Value], f: FloatFormat, r: str) -> float:
    floats = [t for t in terms if isinstance(t, float)]
    if any(math.isnan(t) for t in floats):
        return math.nan
    pinf, ninf = math.inf in floats, -math.inf in floats
    if pinf and ninf:
        return math.nan
    if pinf or ninf:
        return rnd(math.inf if pinf else -math.inf, f, r)
    total = sum((Fraction(t) for t in terms), Fraction(0))
    return 0.0 if total == 0 else round_fraction(total, f, r)


def slot(x: float, f: FloatFormat) -> int:
    if math.isnan(x) or math.isinf(x):
        return 15
    if x == 0:
        return 0
    lo = f.emin - f.mantissa_bits
    width = -(-(f.emax - lo + 1) // 16)
    e = math.frexp(abs(x))[1] - 1
    return min(15, max(0, (e - lo) // width))


def slots16(terms: list[float], f: FloatFormat, r: str) -> float:
    across: Value = 0.0
    for s in range(16):
        mine = [t for t in terms if slot(t, f) == s]
        pos = sorted((t for t in mine if not math.copysign(1, t) < 0), key=abs)
        neg = sorted((t for t in mine if math.copysign(1, t) < 0), key=abs)
        order: list[float] = []
        for i in range(max(len(pos), len(neg))):
            order += pos[i : i + 1] + neg[i : i + 1]
        if order:
            across = add(across, sequential(order, f, r), f, r)
    return float(across)


def matmul(a: np.ndarray, b: np.ndarray, f: FloatFormat, r: str, order: str, fma: bool,
           block: int = 0) -> np.ndarray:  # fmt: skip
    """The oracle for one matmul algorithm: ``order`` in sequential/pairwise/blocked/exact/slots16."""
    m, k = a.shape
    n = b.shape[1]
    out = np.empty((m, n))
    for i in range(m):
        for j in range(n):
            ps = [prod(float(a[i, q]), float(b[q, j])) for q in range(k)]
            if order == "slots16" or (not fma and order != "exact"):
                ps = [rnd(p, f, r) for p in ps]
            if order == "sequential":
                v = sequential(ps, f, r)
            elif order == "pairwise":
                v = pairwise(ps, f, r)
            elif order == "blocked":
                v = blocked(ps, f, r, block)
            elif order == "exact":
                v = exact(ps, f, r)
            else:
                v = slots16([float(p) for p in ps], f, r)
            out[i, j] = v
    return out


def same(x: object, y: object) -> bool:
    """Bitwise float64 equality: the sign of zero counts, any NaN equals any NaN."""
    p, q = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    eq = ((p == q) & (np.signbit(p) == np.signbit(q))) | (np.isnan(p) & np.isnan(q))
    return bool(np.all(eq))
