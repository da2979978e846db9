"""Worst-case error models of accumulations (Higham, *Accuracy and Stability*, chapters 3 and 4).

An accumulation in a format with unit roundoff ``u`` whose terms each pass through at most ``n``
roundings, ``N`` roundings in all, has

    |computed - exact| <= gamma_n * sum |x_i| + N * eta * (1 + gamma_n),   gamma_n = n u / (1 - n u)

where ``eta`` is half the format's smallest subnormal (the largest absolute error of one rounding in
the subnormal range).  Derivation, per rounding ``fl(z) = z (1 + delta) + epsilon`` with
``|delta| <= u`` and ``|epsilon| <= eta``: unrolling the order, every term is multiplied by at most
``n`` factors ``(1 + delta)`` (``|prod - 1| <= gamma_n``, Higham Lemma 3.1), and every ``epsilon``
by at most ``n - 1`` of them (``<= 1 + gamma_n``).  Charging ``eta`` to *every* rounding is
conservative: under gradual underflow an addition of two values of the format is exact in the
subnormal range, so the textbook term charges only the roundings of products (``k * eta``).  See
docs/numerics.md for the counts each algorithm uses and why.

:class:`Bounds` turns a model plus the exact result into the elementwise checks (tolerance, finite
range, whether NaN / Inf / zero are possible, and whether an output is covered).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .formats import FloatFormat

__all__ = ["gamma", "ErrorModel", "Bounds", "KINDS"]

KINDS = ("nan", "inf", "zero")
_UP = 1.0 + 2.0**-50  # slack that turns a float64 evaluation of a bound into an upper bound


def gamma(n: int, u: float) -> float:
    """``gamma_n = n u / (1 - n u)``, rounded up; ``inf`` when ``n u >= 1`` (no useful bound)."""
    nu = n * u  # exact: u is a power of two
    if nu >= 1:
        return math.inf
    return math.nextafter(nu / (1.0 - nu), math.inf)


@dataclass(frozen=True)
class ErrorModel:
    """``gamma_n * (sum of magnitudes) + N * eta * (1 + gamma_n)`` for one algorithm and size.

    Attributes:
        roundings: n, the most roundings any term passes through.
        charged: N, the roundings charged the underflow unit ``eta``.
        unit_roundoff: u of the accumulation format.
        eta: half the accumulation format's smallest subnormal.
        terms: how the sum of magnitudes is written when printed.
    """

    roundings: int
    charged: int
    unit_roundoff: float
    eta: float
    terms: str = "sum over k of |A[i,k] * B[k,j]|"

    @property
    def relative(self) -> float:
        """gamma_n: the coefficient of the sum of magnitudes."""
        return gamma(self.roundings, self.unit_roundoff)

    @property
    def absolute(self) -> float:
        """The underflow term ``N * eta * (1 + gamma_n)``, rounded up."""
        if self.charged == 0:
            return 0.0
        return self.charged * self.eta * (1.0 + self.relative) * _UP

    def bound(self, abs_sum: np.ndarray | float) -> np.ndarray:
        """The bound for given sums of magnitudes (upper bounds themselves), rounded up."""
        s = np.asarray(abs_sum, dtype=np.float64)
        rel = self.relative
        with np.errstate(invalid="ignore", over="ignore"):
            t = np.where(s == 0, 0.0, rel * s) * _UP + self.absolute
        return np.asarray(t, dtype=np.float64)

    def __str__(self) -> str:
        return f"{self.relative:.3g} * {self.terms} + {self.absolute:.3g}"


@dataclass
class Bounds:
    """Elementwise bounds of one algorithm (or operation) on one input.

    ``hi + lo`` is the exact finite part (within ``err``); ``abs_sum``, ``pos_sum`` and ``neg_sum``
    are upper bounds on the sums of |terms|, of the positive terms and of |negative terms| over the
    finite terms; ``nan``, ``pinf``, ``ninf`` say whether some term is NaN (or inf * 0), +inf, -inf.
    """

    fmt: FloatFormat
    model: ErrorModel
    hi: np.ndarray
    lo: np.ndarray
    err: np.ndarray
    abs_sum: np.ndarray
    pos_sum: np.ndarray
    neg_sum: np.ndarray
    nan: np.ndarray
    pinf: np.ndarray
    ninf: np.ndarray

    def tolerance(self) -> np.ndarray:
        """Elementwise bound on |output - exact| for a finite exact result."""
        return self.model.bound(self.abs_sum)

    def _overflow(self, part: np.ndarray) -> np.ndarray:
        # A partial sum can reach the overflow threshold only if this side's terms (with their
        # rounding errors) can: every partial sum is at most sum|x| (1 + gamma_n) + U in magnitude.
        reach = self.model.bound(part) + part
        return np.asarray(reach >= self.fmt.max_finite)

    def _specials(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos_over, neg_over = self._overflow(self.pos_sum), self._overflow(self.neg_sum)
        exact_nan = self.nan | (self.pinf & self.ninf)
        up = self.pinf | pos_over  # some partial sum can be +inf
        down = self.ninf | neg_over
        if self.fmt.has_inf:
            may_nan = exact_nan | (up & down)
            may_pinf = ~exact_nan & ~self.ninf & up
            may_ninf = ~exact_nan & ~self.pinf & down
        else:  # e4m3fn: overflow and inf terms give NaN
            may_nan = exact_nan | up | down
            may_pinf = may_ninf = np.zeros_like(may_nan)
        return may_nan, may_pinf, may_ninf

    def _finite_possible(self) -> np.ndarray:
        return np.asarray(~(self.nan | self.pinf | self.ninf))

    def finite_range(self) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)``: a finite output is covered iff ``low <= output <= high``.

        Empty (``low = +inf > high = -inf``) where the result cannot be finite.
        """
        tol = self.tolerance()
        pad = tol + np.abs(self.lo) + self.err
        with np.errstate(over="ignore", invalid="ignore"):
            low = (self.hi - pad) - np.abs(self.hi) * 2.0**-52
            high = (self.hi + pad) + np.abs(self.hi) * 2.0**-52
        m = self.fmt.max_finite
        low, high = np.maximum(low, -m), np.minimum(high, m)
        ok = self._finite_possible() & (low <= high)
        return np.where(ok, low, np.inf), np.where(ok, high, -np.inf)

    def may_be(self, kind: str) -> np.ndarray:
        """Elementwise: can the output be NaN (``"nan"``), +-inf (``"inf"``) or +-0 (``"zero"``)?"""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if kind == "zero":
            low, high = self.finite_range()
            return np.asarray((low <= 0) & (high >= 0))
        may_nan, may_pinf, may_ninf = self._specials()
        return np.asarray(may_nan if kind == "nan" else (may_pinf | may_ninf))

    def covers(self, output: np.ndarray) -> np.ndarray:
        """Elementwise: is ``output`` (float64 values) within the bounds?"""
        out = np.asarray(output, dtype=np.float64)
        low, high = self.finite_range()
        may_nan, may_pinf, may_ninf = self._specials()
        with np.errstate(invalid="ignore"):
            finite_ok = np.isfinite(out) & (out >= low) & (out <= high)
        return np.asarray(
            finite_ok
            | (np.isnan(out) & may_nan)
            | ((out == np.inf) & may_pinf)
            | ((out == -np.inf) & may_ninf)
        )
