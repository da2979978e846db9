"""Exact sums and exact matrix products of float64 values, rounded once at the end.

The exact sum of many float64 numbers does not fit a float64, and Python fractions are far too slow
for a 256 x 4096 x 256 matmul.  This module keeps the exact value as a short vector of **digits**: each
digit is a float64 array holding an integer number of units of ``2**(base + 26*d)``.  While every
digit stays below ``2**52`` in magnitude, adding integers to it is exact; a carry pass
(:meth:`ExactSum.normalize`) moves the excess up before that limit is reached.

How values get in (:meth:`ExactSum.add`): a float64 array whose elements are all multiples of
``2**lsb`` is cut at the digit boundaries with ``trunc`` (exact: scaling by a power of two and
truncating drop no bits), and each 26-bit piece is added to its digit.

Exact matmul (:func:`exact_matmul`) uses BLAS: A is cut into windows of W bits on a lattice shared by
all its elements (``A = sum_u A_u``, each ``A_u`` a multiple of ``2**alpha_u`` below
``2**(alpha_u + W)``), B likewise, and each ``A_u @ B_v`` is a float64 matmul in which every product
and every partial sum is a multiple of ``2**(alpha_u + beta_v)`` below ``2**(alpha_u + beta_v + 51)``
when ``2W + ceil(log2 K) <= 51``.  No operation of that matmul can round, in any order, with or without
FMA, so BLAS's result is exact.  For fp32 randn data (about 43 significant bit positions between the
smallest and the largest element) and K = 4096 (W = 19) this takes 3 x 3 float64 matmuls.

Rounding (:meth:`ExactSum.round`): after the carry pass the digits are canonical (each in
``[0, 2**26)``) with a sign; the top two nonzero-led digits give ``hi`` (at most 52 bits, exact in
float64, and at least 27 significant bits), and every digit below only matters as a sticky bit, because
a format of at most 24 significant bits has its rounding midpoints at multiples of at least 4 units of
``hi``'s last digit.  ``round_to_format(hi, fmt, lo)`` with ``lo`` carrying the sticky bit's sign is then
the correctly rounded result.  Only finite values are handled here; callers deal with inf and NaN.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from .rounding import NEAREST_EVEN, FormatLike, round_to_format

if TYPE_CHECKING:
    import torch

__all__ = ["ExactSum", "exact_matmul", "exact_sum", "bit_range"]

DIGIT_BITS = 26
_R = float(2**DIGIT_BITS)
_LIMIT = float(2**52)  # digits stay below this magnitude, so adding a piece below 2**26 is exact
_FLOOR_EXP = -1000  # below 2**-1000 a total only needs its sign (no format has values there)


def bit_range(x: np.ndarray) -> tuple[int, int] | None:
    """``(lsb, top)`` over the nonzero finite elements of ``x``: every element is a multiple of
    ``2**lsb`` and below ``2**top`` in magnitude.  None if there is no nonzero element."""
    v = np.abs(np.asarray(x, dtype=np.float64))
    v = v[(v != 0) & np.isfinite(v)]
    if v.size == 0:
        return None
    m, e = np.frexp(v)  # v = m * 2**e, 1/2 <= m < 1
    sig = np.ldexp(m, 53).astype(np.int64)  # the 53-bit integer significand (exact)
    low = sig & -sig  # its lowest set bit
    tz = np.frexp(low.astype(np.float64))[1] - 1
    return int((e - 53 + tz).min()), int(e.max())


def _cut(x: np.ndarray, lsb: int, top: int, width: int) -> list[tuple[int, np.ndarray]]:
    """Cut ``x`` (multiples of 2**lsb, below 2**top) into windows of ``width`` bits, top down.

    Returns ``[(exponent of the window's unit, values)]``; the values sum to ``x`` exactly.
    """
    count = -(-(top - lsb) // width)
    out = []
    rem = x
    for u in range(count - 1, -1, -1):
        e = lsb + u * width
        piece = np.trunc(np.ldexp(rem, -e))  # |rem| < 2**(e + width): piece has <= width bits
        if np.any(piece):
            part = np.ldexp(piece, e)
            rem = rem - part  # exact: the bits below 2**e of a multiple of 2**lsb
            out.append((e, part))
    return out


class ExactSum:
    """An exact running sum of float64 arrays of one shape, as base-2**26 digits.

    ``base`` is the exponent of the unit of digit 0; every value added must be a multiple of
    ``2**base``.
    """

    def __init__(self, shape: tuple[int, ...], base: int) -> None:
        self.shape = tuple(shape)
        self.base = int(base)
        self.digits: list[np.ndarray] = []
        self._bound: list[float] = []  # upper bound on |digit| in units
        self._canonical = False

    def _digit(self, d: int) -> np.ndarray:
        while len(self.digits) <= d:
            self.digits.append(np.zeros(self.shape))
            self._bound.append(0.0)
        return self.digits[d]

    def add(self, x: np.ndarray, lsb: int, top: int, axis: int | None = None) -> None:
        """Add ``x`` (finite multiples of ``2**lsb``, below ``2**top`` in magnitude) exactly.

        With ``axis``, ``x`` has one more dimension and its sum over that axis is added.
        """
        x = np.asarray(x, dtype=np.float64)
        if top <= lsb or not np.any(x):
            return
        if lsb < self.base:
            raise ValueError(f"value lattice 2**{lsb} is below the sum's base 2**{self.base}")
        count = 1 if axis is None else x.shape[axis]
        if count >= 2**26:
            raise ValueError("at most 2**26 - 1 values per add (split the axis)")
        d_lo = (lsb - self.base) // DIGIT_BITS
        d_hi = (top - 1 - self.base) // DIGIT_BITS
        rem = x
        for d in range(d_hi, d_lo - 1, -1):
            e = self.base + d * DIGIT_BITS
            piece = np.trunc(np.ldexp(rem, -e))  # units of digit d, |piece| < 2**26
            if not np.any(piece):
                continue
            if d > d_lo:
                rem = rem - np.ldexp(piece, e)
            units = piece if axis is None else piece.sum(axis=axis)  # exact: < 2**52
            bound = _R * count
            self._digit(d)
            if self._bound[d] + bound >= _LIMIT:
                self.normalize()
            self.digits[d] += units
            self._bound[d] += bound
            self._canonical = False

    def normalize(self) -> None:
        """Carry pass (exact): every digit but the top into [0, 2**26); the top one, in
        (-2**26, 2**26), carries the sign (the lower digits add a non-negative amount below one
        unit of the top digit, so the sum is negative exactly when the top digit is)."""
        if self._canonical or not self.digits:
            return
        carry = np.zeros(self.shape)
        for d in range(len(self.digits)):
            v = self.digits[d] + carry
            if d == len(self.digits) - 1:
                self.digits[d] = v
                break
            carry = np.floor(v / _R)
            self.digits[d] = v - carry * _R
        while np.any(np.abs(self.digits[-1]) >= _R):
            v = self.digits[-1]
            carry = np.floor(v / _R)
            self.digits[-1] = v - carry * _R
            self.digits.append(carry)
        self._bound = [_R] * len(self.digits)
        self._canonical = True

    def _canonical_magnitude(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """Sign (+1/-1) and the digits of |sum|, each in [0, 2**26) (top digit included)."""
        self.normalize()
        if not self.digits:
            return np.ones(self.shape), []
        top = self.digits[-1]
        neg = top < 0  # lower digits are in [0, R): the sum is negative iff the top digit is
        if not np.any(neg):
            return np.ones(self.shape), list(self.digits)
        mag = [np.where(neg, -dg, dg) for dg in self.digits]
        carry = np.zeros(self.shape)
        out = []
        for dg in mag:
            v = dg + carry
            carry = np.floor(v / _R)
            out.append(v - carry * _R)
        while np.any(carry):
            v = carry
            carry = np.floor(v / _R)
            out.append(v - carry * _R)
        return np.where(neg, -1.0, 1.0), out

    def _top_two(
        self,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``sign, hi, below, rest, unit_exp, nonzero`` with ``|sum| = hi + below/2**26 + r`` in
        units of ``2**unit_exp``: ``hi = D_t*2**26 + D_(t-1)`` (D_t the top nonzero digit),
        ``below = D_(t-2)``, and ``0 <= r < 2**-26``, nonzero exactly where ``rest``."""
        sign, digs = self._canonical_magnitude()
        if not digs:
            z = np.zeros(self.shape)
            no = np.zeros(self.shape, bool)
            return sign, z, z, no, np.zeros(self.shape, dtype=np.int64), no
        stack = np.stack(digs)  # [T, ...]
        nz = stack != 0
        T = stack.shape[0]
        any_nz = nz.any(axis=0)
        t = T - 1 - np.argmax(nz[::-1], axis=0)  # index of the top nonzero digit
        t = np.where(any_nz, t, 0)
        pad = np.concatenate([np.zeros((2,) + self.shape), stack])  # index i -> digit i - 2

        def take(idx: np.ndarray) -> np.ndarray:
            return np.asarray(np.take_along_axis(pad, (idx + 2)[None], axis=0)[0])

        hi = take(t) * _R + take(t - 1)  # exact, < 2**52
        below = take(t - 2)
        # sticky: any digit below t-2
        idx = np.arange(T).reshape((T,) + (1,) * len(self.shape))
        rest = (nz & (idx < (t - 2))).any(axis=0)
        unit_exp = self.base + (t - 1) * DIGIT_BITS
        return sign, hi, below, rest, unit_exp.astype(np.int64), any_nz

    def round(self, fmt: FormatLike, rounding: str = NEAREST_EVEN) -> np.ndarray:
        """The exact sum rounded once to ``fmt`` (float64 values of fmt); an exact zero is +0."""
        sign, hi, below, rest, unit_exp, nonzero = self._top_two()
        sticky = (below != 0) | rest
        tiny = unit_exp + 52 < _FLOOR_EXP  # far below every format: only the sign matters
        e = np.where(tiny, 0, unit_exp)
        h = np.where(tiny, math.ldexp(1.0, _FLOOR_EXP), np.ldexp(hi, e))
        lo = np.where(sticky & ~tiny, np.ldexp(np.ones(self.shape), np.maximum(e - 2, -1074)), 0.0)
        out = round_to_format(h * sign, fmt, lo * sign, rounding)
        return np.where(nonzero, out, 0.0)

    def approx(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(hi, lo, err)`` with ``|sum - (hi + lo)| <= err``, ``hi = fl64(hi + lo)`` (so hi is
        within one float64 spacing of the sum) and ``err <= 2**-77 |hi|``."""
        sign, top, below, rest, unit_exp, nonzero = self._top_two()
        x1 = np.ldexp(top, unit_exp)
        x2 = np.ldexp(below, unit_exp - DIGIT_BITS)
        s = x1 + x2
        bv = s - x1
        e = (x1 - (s - bv)) + (x2 - bv)
        err = np.where(rest, np.ldexp(np.ones(self.shape), unit_exp - DIGIT_BITS), 0.0)
        return np.where(nonzero, s * sign, 0.0), np.where(nonzero, e * sign, 0.0), err

    def fraction(self, index: tuple[int, ...]) -> Fraction:
        """The exact sum at one index, as a Fraction (slow; for tests and inspection)."""
        self.normalize()
        total = Fraction(0)
        for d, digit in enumerate(self.digits):
            total += Fraction(int(digit[index])) * Fraction(2) ** (self.base + d * DIGIT_BITS)
        return total


def exact_sum(terms: np.ndarray, axis: int = -1) -> ExactSum:
    """The exact sum of finite float64 ``terms`` along ``axis``."""
    x = np.asarray(terms, dtype=np.float64)
    axis = axis % x.ndim
    shape = x.shape[:axis] + x.shape[axis + 1 :]
    rng = bit_range(x)
    if rng is None:
        return ExactSum(shape, 0)
    lsb, top = rng
    acc = ExactSum(shape, lsb)
    n = x.shape[axis]
    step = 2**25
    for i in range(0, max(n, 1), step):
        part = np.take(x, np.arange(i, min(n, i + step)), axis=axis)
        acc.add(part, lsb, top, axis=axis)
    return acc


def _window_width(k: int) -> int:
    return max(1, (51 - max(1, math.ceil(math.log2(max(k, 2))))) // 2)


def _integer_top(a64: np.ndarray, b64: np.ndarray, k: int) -> int | None:
    """``top`` (every sum of products is below ``2**top`` in magnitude, ``top <= 53``) when ``a`` and
    ``b`` hold integers whose ``k`` products' magnitudes sum below ``2**53``; else None."""
    if k == 0 or a64.size == 0 or b64.size == 0:
        return None
    ma, mb = float(np.max(np.abs(a64))), float(np.max(np.abs(b64)))
    bound = k * ma * mb
    if not bound < 2.0**53 or not (np.array_equal(a64, np.rint(a64)) and np.array_equal(b64, np.rint(b64))):
        return None  # NaN or inf compare unequal: the general path
    return max(1, math.ceil(math.log2(bound + 1.0)) + 1)


def exact_matmul(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> ExactSum:
    """The exact ``a @ b`` of finite float64 matrices ``a [M, K]``, ``b [K, N]`` (see module doc)."""
    import torch

    a64 = np.asarray(a.double().numpy() if isinstance(a, torch.Tensor) else a, dtype=np.float64)
    b64 = np.asarray(b.double().numpy() if isinstance(b, torch.Tensor) else b, dtype=np.float64)
    m, k = a64.shape
    n = b64.shape[1]
    top = _integer_top(a64, b64, k)
    if top is not None:
        # Integers whose products' magnitudes sum below 2**53 (int8 GEMMs): every partial sum of any
        # order is an integer float64 holds exactly, so one float64 matmul (any BLAS order, FMA or
        # not) is the exact product; no windows needed.
        acc = ExactSum((m, n), 0)
        acc.add((torch.from_numpy(a64) @ torch.from_numpy(b64)).numpy(), 0, top)
        return acc
    ra, rb = bit_range(a64), bit_range(b64)
    if ra is None or rb is None:
        return ExactSum((m, n), 0)
    acc = ExactSum((m, n), ra[0] + rb[0])
    kc = min(k, 2**24)  # chunks of K keep W >= 13
    for k0 in range(0, k, kc):
        ac, bc = a64[:, k0 : k0 + kc], b64[k0 : k0 + kc]
        kk = ac.shape[1]
        w = _window_width(kk)
        logk = max(1, math.ceil(math.log2(max(kk, 2))))
        wa = _cut(ac, ra[0], ra[1], w)
        wb = _cut(bc, rb[0], rb[1], w)
        if not wa or not wb:
            continue
        # all window products in one BLAS call: [U*M, K] @ [K, V*N], block (u, v) = A_u @ B_v
        big_a = torch.from_numpy(np.concatenate([p for _, p in wa], axis=0))
        big_b = torch.from_numpy(np.concatenate([p for _, p in wb], axis=1))
        c = torch.matmul(big_a, big_b).numpy()  # exact: see module docstring
        for u, (ea, _) in enumerate(wa):
            for v, (eb, _) in enumerate(wb):
                block = c[u * m : (u + 1) * m, v * n : (v + 1) * n]
                acc.add(block, ea + eb, ea + eb + 2 * w + logk)
    return acc
