"""Correct rounding into narrow formats, and the error-free transformations that feed it.

The kernels in ``tasks.kernels`` emulate fp32/bf16/fp16 arithmetic bit for bit.  They compute in
float64, carry the rounding error of each float64 operation as an exact remainder (``two_sum`` /
``two_prod``), and round the exact value ``hi + lo`` once into the target format with
:func:`round_to_format`.  Rounding ``hi`` alone would be double rounding (float64 first, then the
narrow format) and is wrong exactly at the ties that matter; ``lo`` carries the missing information.

:func:`round_fraction` is the slow oracle the fast path is tested against: plain Python integers and
``fractions.Fraction``, no floating point until the final (exact) conversion.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .formats import get_format

if TYPE_CHECKING:
    import torch

__all__ = [
    "NEAREST_EVEN",
    "NEAREST_AWAY",
    "ROUNDINGS",
    "check_rounding",
    "round_to_format",
    "round_fraction",
    "round_dyadic",
    "two_sum",
    "two_prod",
    "to_tensor",
    "as_float64",
    "is_representable",
]

FormatLike = Any  # str | torch.dtype | np.dtype | FloatFormat; see get_format
ArrayLike = npt.ArrayLike

_SPLITTER = float(2**27 + 1)  # Veltkamp: splits a 53-bit significand into two 26-bit halves

NEAREST_EVEN = "nearest_even"  # IEEE roundTiesToEven, the default everywhere
NEAREST_AWAY = "nearest_away"  # IEEE roundTiesToAway: ties go to the larger magnitude
ROUNDINGS = (NEAREST_EVEN, NEAREST_AWAY)

_ROUNDING_ALIASES = {
    "nearest_even": NEAREST_EVEN,
    "nearest": NEAREST_EVEN,
    "rne": NEAREST_EVEN,
    "ties_to_even": NEAREST_EVEN,
    "nearest_away": NEAREST_AWAY,
    "rna": NEAREST_AWAY,
    "ties_to_away": NEAREST_AWAY,
}
_DIRECTED = {
    "toward_zero", "towards_zero", "rtz", "rz", "truncate", "down", "up", "toward_positive",
    "towards_positive", "toward_negative", "towards_negative", "rd", "ru", "floor", "ceil",
    "ceiling",
}


def check_rounding(rounding: str) -> str:
    """Canonical name of a round-to-nearest mode: ``"nearest_even"`` or ``"nearest_away"``.

    Case-insensitive; ``NEAREST_EVEN``, ``rne``, ``nearest``, ``NEAREST_AWAY`` and ``rna`` are accepted.

    Raises:
        ValueError: for a directed rounding (toward zero, up, down), explaining why it has no
            useful bound, and for anything unknown, listing the valid names.
    """
    key = str(rounding).strip().lower().replace("-", "_").replace(" ", "_")
    key = key.removeprefix("round_").removeprefix("rounding.")
    if key in _ROUNDING_ALIASES:
        return _ROUNDING_ALIASES[key]
    if key in _DIRECTED:
        raise ValueError(
            f"rounding {rounding!r} is directed; only round-to-nearest is supported "
            f"({NEAREST_EVEN!r}, the default, or {NEAREST_AWAY!r}). Past its largest value a "
            "directed-rounding accumulator saturates instead of overflowing (round toward zero "
            "never reaches inf), which can move the result by up to the size of the terms, and "
            "no tolerance bounds that usefully"
        )
    raise ValueError(
        f"unknown rounding {rounding!r}; valid: {NEAREST_EVEN!r} (default) or {NEAREST_AWAY!r}"
    )


def round_to_format(
    hi: ArrayLike,
    fmt: FormatLike,
    lo: ArrayLike | None = None,
    rounding: str = NEAREST_EVEN,
) -> np.ndarray:
    """Round the exact real number ``hi + lo`` to ``fmt`` (round to nearest, ties to even by default).

    Args:
        hi: float64 array-like.
        fmt: target format (anything :func:`get_format` accepts).
        lo: exact remainder with ``|lo| <= ulp64(hi) / 2`` (what :func:`two_sum` / :func:`two_prod`
            return), same shape as ``hi``; None means the exact value is ``hi``.
        rounding: ``"nearest_even"`` (default) or ``"nearest_away"`` (ties to the larger
            magnitude); see :func:`check_rounding`.

    Returns:
        float64 array of values exactly representable in ``fmt``.  Subnormals are honoured; a value
        that rounds past ``max_finite`` gives +-inf (NaN for fp8_e4m3fn, the non-saturating
        convention of torch and ml_dtypes casts); NaN stays NaN; +-inf stays +-inf (NaN for
        fp8_e4m3fn); a negative value rounding to zero gives -0.0.

    Why ``lo`` only matters at ties: every midpoint between neighbours of ``fmt`` has at most
    ``precision + 1 <= 25`` significant bits, so it is a float64 number.  If ``hi`` is not exactly a
    midpoint, the nearest midpoint is at least one float64 spacing away and ``|lo|`` (half a spacing)
    cannot reach it, so ``rint(hi / q)`` already decides.  If ``hi`` is a midpoint, the sign of ``lo``
    says on which side the exact value lies.
    """
    f = get_format(fmt)
    away = check_rounding(rounding) == NEAREST_AWAY
    h = np.asarray(hi, dtype=np.float64)
    if lo is None:
        low = np.zeros_like(h)
    else:
        low = np.asarray(lo, dtype=np.float64)
        h, low = np.broadcast_arrays(h, low)
        # hi == 0 with lo != 0 is not a two_sum output, but the exact value is then lo itself.
        zero_hi = h == 0
        if np.any(zero_hi & (low != 0)):
            h, low = np.where(zero_hi, low, h), np.where(zero_hi, 0.0, low)
    with np.errstate(over="ignore", invalid="ignore"):
        _, e = np.frexp(h)  # h = m * 2**e, 0.5 <= |m| < 1: the leading bit has exponent e - 1
        # Quantum (spacing) of fmt in h's binade; below min_normal the spacing is fixed (subnormals).
        # The binade is not clamped above emax: the overflow test below catches what lands there.
        q = np.ldexp(1.0, np.maximum(e - 1, f.emin) - f.mantissa_bits)
        r = h / q  # exact: division by a power of two, r < 2**precision in magnitude
        n = np.rint(r)  # round half to even; keeps the sign of zero
        # r - n is exact (a multiple of ulp(r) no larger than 1/2, or Sterbenz when |r| < 1);
        # r - floor(r) is NOT: for r = -(1/2 - 2**-54) it rounds to exactly 0.5.
        half = np.abs(r - n) == 0.5
        if away:
            # An exact tie (no remainder) goes away from zero; r is a half-integer below 2**25
            # in magnitude, so r +- 1/2 is exact.
            exact_tie = half & (low == 0)
            if np.any(exact_tie):
                n = np.where(exact_tie, r + np.copysign(0.5, r), n)
        tie = half & (low != 0)
        if np.any(tie):
            # ceil/floor keep -0.0 for a negative value rounding to zero (ceil(-0.5) == -0.0).
            n = np.where(tie, np.where(low > 0, np.ceil(r), np.floor(r)), n)
        out = n * q
        over = np.abs(out) > f.max_finite  # also true for +-inf inputs
    if np.any(over):
        big = np.copysign(np.inf, h) if f.has_inf else np.nan
        out = np.where(over, big, out)
    return np.asarray(out)


def round_fraction(x: Fraction | int, fmt: FormatLike, rounding: str = NEAREST_EVEN) -> float:
    """Exact oracle: round the rational ``x`` to ``fmt`` to nearest, in Python integers.

    Same conventions as :func:`round_to_format`: overflow to +-inf (NaN for fp8_e4m3fn), and a
    negative value rounding to zero gives -0.0.  ``rounding`` is ``"nearest_even"`` (default) or
    ``"nearest_away"``.  Slow; meant for tests and tiny oracles.
    """
    f = get_format(fmt)
    away = check_rounding(rounding) == NEAREST_AWAY
    x = Fraction(x)
    if x == 0:
        return 0.0
    neg = x < 0
    a = -x if neg else x
    num, den = a.numerator, a.denominator
    # floor(log2(a)): start from the bit lengths and correct by one if needed.
    e = num.bit_length() - den.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    shift = max(e, f.emin) - f.mantissa_bits  # q = 2**shift
    # a / q = num * 2**-shift / den, as an integer quotient and remainder.
    if shift >= 0:
        n, rem = divmod(num, den << shift)
        d = den << shift
    else:
        n, rem = divmod(num << -shift, den)
        d = den
    if 2 * rem > d or (2 * rem == d and (away or n % 2 == 1)):
        n += 1
    value = Fraction(n) * Fraction(2) ** shift
    if value > Fraction(f.max_finite):
        return (-np.inf if neg else np.inf) if f.has_inf else float("nan")
    result = float(value)  # exact: value has <= 24 significant bits and is in float64's range
    return -result if neg else result


def round_dyadic(n: int, e: int, fmt: FormatLike, rounding: str = NEAREST_EVEN) -> float:
    """Round the exact value ``n * 2**e`` (Python ints) to ``fmt``: :func:`round_fraction` for
    dyadic rationals, in a few integer operations (no gcd), for per-element scalar paths.

    Same conventions: overflow to +-inf (NaN for fp8_e4m3fn), a negative value rounding to zero
    gives -0.0, and ``n == 0`` gives +0.0.
    """
    f = get_format(fmt)
    away = check_rounding(rounding) == NEAREST_AWAY
    if n == 0:
        return 0.0
    neg = n < 0
    a = -n if neg else n
    lead = a.bit_length() - 1 + e  # a * 2**e lies in [2**lead, 2**(lead + 1))
    q = max(lead, f.emin) - f.mantissa_bits  # exponent of the spacing there
    shift = q - e
    if shift > 0:
        keep = a >> shift
        rem = a - (keep << shift)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and (away or keep & 1)):
            keep += 1
    else:
        keep, q = a, e
    if keep.bit_length() + q > f.emax + 1 or math.ldexp(keep, q) > f.max_finite:
        return (-math.inf if neg else math.inf) if f.has_inf else math.nan
    value = math.ldexp(keep, q)
    return -value if neg else value


def two_sum(a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Knuth's TwoSum in float64: ``s = fl(a + b)`` and ``e`` with ``s + e == a + b`` exactly.

    Branch-free (no |a| >= |b| precondition).  Exact whenever ``a + b`` does not overflow.
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    s = x + y
    bv = s - x
    av = s - bv
    e = (x - av) + (y - bv)
    return s, e


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Veltkamp split: ``a == h + t`` with h, t of at most 26 significant bits each."""
    c = _SPLITTER * a
    h = c - (c - a)
    return h, a - h


def two_prod(a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Dekker's TwoProduct in float64: ``p = fl(a * b)`` and ``e`` with ``p + e == a * b`` exactly.

    numpy has no fused multiply-add, so the product is split with Veltkamp's factor 2**27 + 1 and
    the four partial products (each exact in 53 bits) are subtracted in order.  Exact barring
    overflow (|a| or |b| above about 2**996, or the product overflowing) and underflow (the error
    term below 2**-1022 loses bits).
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    p = x * y
    xh, xl = _split(x)
    yh, yl = _split(y)
    e = ((xh * yh - p) + xh * yl + xl * yh) + xl * yl
    return p, e


def is_representable(values: ArrayLike, fmt: FormatLike) -> np.ndarray:
    """Elementwise: is this float64 value exactly a value of ``fmt``?  NaN counts as representable."""
    v = np.asarray(values, dtype=np.float64)
    r = round_to_format(v, fmt)
    return np.asarray((r == v) | (np.isnan(r) & np.isnan(v)))


def as_float64(x: Any, fmt: FormatLike) -> np.ndarray:
    """Convert a torch tensor, numpy array or array-like to float64, checking it lies in ``fmt``.

    Conversions to float64 from any narrower float dtype are exact, so only the membership check
    can fail.  Raises ValueError (never rounds silently) if an element is not representable.
    """
    f = get_format(fmt)
    if type(x).__module__.startswith("torch"):
        v = x.detach().to("cpu").double().numpy()
    else:
        arr = np.asarray(x)
        if arr.dtype.kind not in "fiub" and arr.dtype != f.numpy_dtype:
            try:
                arr = arr.astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"cannot read {arr.dtype} values as {f.name}") from exc
        v = arr.astype(np.float64)
        if arr.dtype.kind in "iu" and not np.array_equal(v.astype(arr.dtype), arr):
            raise ValueError(f"integers too large for float64 cannot be {f.name} values")
    ok = is_representable(v, f)
    if not np.all(ok):
        bad = v[~ok].ravel()[:5]
        raise ValueError(
            f"{int(np.size(ok) - np.count_nonzero(ok))} value(s) not representable in {f.name} "
            f"(e.g. {bad.tolist()}); round them first with round_to_format(values, {f.name!r})"
        )
    return np.asarray(v)


def to_tensor(values: Any, fmt: FormatLike) -> torch.Tensor:
    """Float64 values representable in ``fmt`` -> a tensor of fmt's torch dtype, exactly.

    Raises ValueError if any value is not representable (this function never rounds).
    """
    import torch

    f = get_format(fmt)
    v = as_float64(values, f)
    return torch.from_numpy(np.ascontiguousarray(v)).to(f.torch_dtype)
