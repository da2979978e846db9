"""Tolerances other projects can import: the error bound of a GEMM output, closed form and per element.

A kernel computes ``out = rn_out(acc)`` where ``acc`` is ``A @ B`` accumulated by some algorithm in an
accumulation format (:mod:`.products`), and ``rn_out`` rounds once to the output format.  The
algorithm's error model (:class:`.errormodel.ErrorModel`, docs/numerics.md "Error models") bounds
the accumulator:

    |acc - exact| <= E,   E = gamma_n * S + N * eta * (1 + gamma_n),   S = sum_k |a_k b_k|

and a round-to-nearest conversion adds at most ``u_out |acc| + eta_out`` with ``|acc| <= |exact| + E``
(``u_out`` the output format's unit roundoff, ``eta_out`` half its smallest subnormal).  So

    |out - exact| <= atol + rtol * |exact|,   atol = E (1 + u_out) + eta_out,   rtol = u_out

which is the form of ``torch.testing.assert_close(out, exact, rtol=rtol, atol=atol)``
(:func:`gemm_tolerance`).  When the output format *is* the accumulation format there is no
conversion (``rtol = 0``, ``atol = E``).  int8 operands accumulated in int32 are exact while no
partial sum can overflow (``S <= 2**31 - 1``): ``E = 0``.

Per element (:func:`judge`), with the exact result in hand (:class:`.errormodel.Bounds`, whose centre
is :func:`.exactsum.exact_matmul`), the check is tighter than the closed form: the accumulator lies in
``[low, high]`` (``Bounds.finite_range``) and rounding is monotone, so a round-to-nearest output lies
in ``[rn(low), rn(high)]``, taking ties either way (nearest-even and nearest-away both allowed).
An element's error "in units of its bound" is ``|out - exact|`` over the distance from the exact
result to that end of the interval on the error's side: above 1 exactly when it is outside.

Near ties (:func:`near_tie`).  The flip-risk model (reports/fliprisk.py, docs/agreement.md) reads a
position's margin as the top-1 minus top-2 logit and a flip as the other arm's argmax differing; a
flip happens when the kernels' perturbation of the logit difference exceeds the margin.  With each
logit of magnitude ``L`` within ``b(L) = atol + rtol L`` of its exact value, one kernel can reorder
two logits whose exact margin is at most ``2 b(L)``, and two kernels both within the bound (a swap) can
disagree on the argmax where the reference arm's margin is at most ``4 b(L)``: the threshold.

:data:`VERSION` is bumped whenever a formula here (or a count it takes from the error models) changes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .errormodel import Bounds, ErrorModel
from .formats import FloatFormat
from .rounding import NEAREST_AWAY, NEAREST_EVEN, round_to_format

__all__ = ["VERSION", "SOURCE", "INT32_MAX", "GemmTolerance", "Judgement", "gemm_tolerance",
           "exact_model", "near_tie", "judge"]  # fmt: skip

#: The derivation's version: bump it when a formula here or a count of the error models changes.
VERSION = 1
#: The function that computes the closed-form bound (reported with every tolerance).
SOURCE = "tasks.numerics.tolerance.gemm_tolerance"
#: An int32 accumulator holds every partial sum exactly while the sum of |products| stays at or below this.
INT32_MAX = 2**31 - 1


def exact_model() -> ErrorModel:
    """The error model of an exact accumulation (int8 products in int32 below overflow): zero."""
    return ErrorModel(0, 0, 0.0, 0.0)


@dataclass(frozen=True)
class GemmTolerance:
    """The closed-form bound of one GEMM output: ``|out - exact| <= atol + rtol * |exact|``.

    ``accumulation`` is E (the accumulator's bound at ``sum_abs``), ``bound`` the total at
    ``|exact| = magnitude`` (default ``sum_abs``, the largest the exact result can be).
    """

    k: int
    sum_abs: float
    magnitude: float
    roundings: int
    charged: int
    unit_roundoff: float
    eta: float
    relative: float
    absolute: float
    accumulation: float
    out_unit_roundoff: float
    out_eta: float
    atol: float
    rtol: float
    bound: float
    overflow_possible: bool
    version: int = VERSION
    source: str = SOURCE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _up(x: float) -> float:
    """A float64 evaluation of a bound, nudged up by more than its rounding error."""
    return float(np.nextafter(x * (1 + 2.0**-50), np.inf))


def gemm_tolerance(model: ErrorModel, k: int, sum_abs: float, out_format: FloatFormat | None,
                   magnitude: float | None = None,
                   acc_format: FloatFormat | None = None) -> GemmTolerance:  # fmt: skip
    """The bound of one output of a K-term GEMM whose ``sum_k |a_k b_k|`` is at most ``sum_abs``.

    Args:
        model: the accumulation's error model for this K (``alg.error_model(k)``, :func:`exact_model`).
        k: the number of products (reported only).
        sum_abs: an upper bound on ``sum_k |a_k b_k|`` (e.g. ``K * max|a| * max|b|``).
        out_format: the output format, or None when the output is the accumulator itself.
        magnitude: ``|exact|`` at which to evaluate the total (at most ``sum_abs``; default ``sum_abs``).
        acc_format: the accumulation format (None: int32), for ``overflow_possible`` only.

    Raises:
        ValueError: a negative or non-finite magnitude, or ``magnitude > sum_abs``.
    """
    if not (np.isfinite(sum_abs) and sum_abs >= 0):
        raise ValueError(f"the sum of magnitudes must be finite and >= 0, got {sum_abs!r}")
    mag = sum_abs if magnitude is None else magnitude
    if not (np.isfinite(mag) and 0 <= mag <= sum_abs):
        raise ValueError(f"|exact| = {mag!r} must lie in [0, sum of magnitudes = {sum_abs!r}]: "
                         "a GEMM output is never larger than sum_k |a_k b_k|")  # fmt: skip
    exact = model.roundings == 0 and model.charged == 0  # gamma_0 is rounded up to the least subnormal
    acc = 0.0 if exact else float(model.bound(sum_abs))
    top = acc_format.max_finite if acc_format is not None else float(INT32_MAX)
    if out_format is None:
        u_o = eta_o = 0.0
        atol, rtol = acc, 0.0
    else:
        u_o, eta_o = out_format.unit_roundoff, out_format.min_subnormal / 2
        atol, rtol = _up(acc * (1 + u_o) + eta_o), u_o
        top = min(top, out_format.max_finite)
    bound = _up(atol + rtol * mag) if rtol else atol
    return GemmTolerance(
        k=k, sum_abs=float(sum_abs), magnitude=float(mag), roundings=model.roundings,
        charged=model.charged, unit_roundoff=model.unit_roundoff, eta=model.eta,
        relative=0.0 if exact else model.relative, absolute=model.absolute, accumulation=acc,
        out_unit_roundoff=u_o, out_eta=eta_o, atol=atol, rtol=rtol, bound=bound,
        overflow_possible=bool(sum_abs + acc > top),
    )  # fmt: skip


def near_tie(tol: GemmTolerance, out_format: FloatFormat | None) -> dict[str, float]:
    """The margins (top-1 minus top-2 logit) that a kernel within ``tol`` can flip, at ``tol.magnitude``.

    ``vs_exact`` = 2 b: one kernel against the exact logits; ``threshold`` = 4 b: a swap of two
    kernels both within the bound (the flip-risk model's reference-arm margin); ``spacing`` one
    spacing of the logit's format at that magnitude, and the threshold counted in those spacings.
    """
    b = tol.bound
    one = _spacing_at(tol.magnitude, out_format) if out_format is not None else np.nan
    return {"logit": tol.magnitude, "bound": b, "vs_exact": _up(2 * b), "threshold": _up(4 * b),
            "spacing": one, "threshold_spacings": _up(4 * b) / one if one == one else np.nan}  # fmt: skip


def _spacing_at(x: float, fmt: FloatFormat) -> float:
    """One spacing of ``fmt`` in the binade of ``|x|`` (as :func:`.spacing.spacing` for values of fmt)."""
    _, e = np.frexp(abs(x))
    e = fmt.emin if x == 0 else int(e)
    return float(np.ldexp(1.0, max(e - 1, fmt.emin) - fmt.mantissa_bits))


@dataclass
class Judgement:
    """Per element: covered?, the exact result, the allowed output range and the error in bound units."""

    covered: np.ndarray
    exact: np.ndarray
    low: np.ndarray
    high: np.ndarray
    units: np.ndarray
    sum_abs: np.ndarray


def _round_ends(low: np.ndarray, high: np.ndarray, fmt: FloatFormat) -> tuple[np.ndarray, ...]:
    """``[low, high]`` rounded outward to ``fmt`` by round-to-nearest (ties either way), and where
    an end can overflow (to inf, or to NaN in e4m3fn); an empty range stays empty."""
    ok = low <= high
    lo_in, hi_in = np.where(ok, low, 0.0), np.where(ok, high, 0.0)
    with np.errstate(invalid="ignore"):
        lo = np.fmin(round_to_format(lo_in, fmt, rounding=NEAREST_EVEN),
                     round_to_format(lo_in, fmt, rounding=NEAREST_AWAY))  # fmt: skip
        hi = np.fmax(round_to_format(hi_in, fmt, rounding=NEAREST_EVEN),
                     round_to_format(hi_in, fmt, rounding=NEAREST_AWAY))  # fmt: skip
    over_lo = ok & (np.isnan(lo) | (lo == -np.inf))
    over_hi = ok & (np.isnan(hi) | (hi == np.inf))
    lo = np.where(ok, np.where(np.isnan(lo), -np.inf, lo), np.inf)
    hi = np.where(ok, np.where(np.isnan(hi), np.inf, hi), -np.inf)
    return lo, hi, over_lo, over_hi


def judge(actual: np.ndarray, bounds: Bounds, out_format: FloatFormat | None) -> Judgement:
    """Judge float64 outputs against an algorithm's :class:`Bounds` and one rounding to ``out_format``.

    ``out_format`` None (or the bounds' own format): the output is the accumulator (``bounds.covers``).
    """
    obs = np.asarray(actual, dtype=np.float64)
    low, high = bounds.finite_range()
    may_nan, may_inf = bounds.may_be("nan"), bounds.may_be("inf")
    if out_format is None or out_format == bounds.fmt:
        covered = np.asarray(bounds.covers(obs))
    else:
        low, high, over_lo, over_hi = _round_ends(low, high, out_format)
        if out_format.has_inf:
            may_inf = may_inf | over_lo | over_hi
        else:
            may_nan = may_nan | may_inf | over_lo | over_hi
            may_inf = np.zeros_like(may_inf)
        with np.errstate(invalid="ignore"):
            finite_ok = np.isfinite(obs) & (obs >= low) & (obs <= high)
        covered = finite_ok | (np.isnan(obs) & may_nan) | (np.isinf(obs) & may_inf)
    exact = np.asarray(bounds.hi + bounds.lo, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = obs - exact
        allowed = np.where(err >= 0, high - exact, exact - low)
        units = np.where(err == 0, 0.0, np.abs(err) / np.maximum(allowed, 0.0))
    units = np.where(np.isfinite(obs), units, np.where(covered, 0.0, np.inf))
    units = np.where(np.isnan(units), np.inf, units)
    # The verdict is exact (interval comparisons); the ratio is float64 arithmetic: keep it on the
    # verdict's side of 1.
    units = np.where(covered, np.minimum(units, 1.0), np.maximum(units, np.nextafter(1.0, 2.0)))
    return Judgement(np.asarray(covered), exact, np.asarray(low), np.asarray(high), units,
                     np.asarray(bounds.abs_sum))  # fmt: skip
