"""Bit patterns, the ordered integer line, distances in spacings, and the spacing (ulp) itself.

Results are compared in *spacings of the output format*: how many representable values lie between
two outputs.  That count comes from the bit patterns, not from float arithmetic, so it is exact and
works across zero and across binades (where the float gap changes by a factor of two).

Conventions (docs/reference/design.md asks for one to be stated):

* ``ordered`` maps a sign-magnitude pattern to a monotone integer: +x -> its magnitude bits m,
  -x -> -m - 1.  Hence +0 -> 0 and -0 -> -1: **+0 and -0 are one spacing apart**, so a distance of 0
  means identical bits for every non-NaN pair (a kernel that returns -0 where another returns +0 is
  reported, at distance 1).  +inf is one step above max_finite.
* ``distance`` is ``|ordered(a) - ordered(b)|``.  Where either side is NaN the line has no meaning:
  the distance is 0 if the two bit patterns are equal and the sentinel **-1** otherwise.  Callers
  count -1 as a NaN/Inf mismatch; they must never drop it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .formats import FloatFormat, get_format
from .rounding import FormatLike, as_float64

__all__ = ["bits", "ordered", "distance", "spacing", "is_nan_bits", "NOT_COMPARABLE"]

NOT_COMPARABLE = -1  # distance sentinel: a NaN is involved and the bit patterns differ

_TORCH_INT = {8: "int8", 16: "int16", 32: "int32"}


def bits(x: Any, fmt: FormatLike) -> np.ndarray:
    """Raw bit patterns of ``x`` in ``fmt`` as unsigned integers (uint8 / uint16 / uint32).

    A tensor or array already of fmt's dtype is viewed directly, so NaN payloads survive.  Anything
    else is read as float64 values, which must be representable in ``fmt`` (ValueError otherwise).
    """
    f = get_format(fmt)
    if type(x).__module__.startswith("torch") and x.dtype == f.torch_dtype:
        import torch

        signed = x.detach().to("cpu").contiguous().view(getattr(torch, _TORCH_INT[f.bits]))
        return np.asarray(signed.numpy().view(f.int_dtype))
    if isinstance(x, np.ndarray) and x.dtype == f.numpy_dtype:
        return np.ascontiguousarray(x).view(f.int_dtype)
    v = as_float64(x, f)
    return v.astype(f.numpy_dtype).view(f.int_dtype)


def _ordered_from_bits(b: np.ndarray, f: FloatFormat) -> np.ndarray:
    b64 = b.astype(np.int64)
    mag = b64 & (f.sign_mask - 1)
    return np.where(b64 & f.sign_mask, -mag - 1, mag)


def is_nan_bits(b: np.ndarray, fmt: FormatLike) -> np.ndarray:
    """Elementwise NaN test on bit patterns (magnitude above inf, or above max_finite for e4m3fn)."""
    f = get_format(fmt)
    return (b.astype(np.int64) & (f.sign_mask - 1)) > f.top_non_nan_bits


def ordered(x: Any, fmt: FormatLike) -> np.ndarray:
    """Monotone int64 line of ``x``'s bit patterns: +x -> m, -x -> -m - 1 (so -0 -> -1, +0 -> 0).

    Adjacent representable values differ by exactly 1, across zero and binade boundaries.  NaN
    patterns map beyond +-inf and carry no order; :func:`distance` treats them separately.
    """
    f = get_format(fmt)
    return _ordered_from_bits(bits(x, f), f)


def distance(a: Any, b: Any, fmt: FormatLike) -> np.ndarray:
    """Elementwise int64 distance in spacings of ``fmt``: ``|ordered(a) - ordered(b)|``.

    With a NaN on either side: 0 if the bit patterns are equal, else -1 (:data:`NOT_COMPARABLE`).
    """
    f = get_format(fmt)
    ba, bb = np.broadcast_arrays(bits(a, f), bits(b, f))
    d = np.abs(_ordered_from_bits(ba, f) - _ordered_from_bits(bb, f))
    nan = is_nan_bits(ba, f) | is_nan_bits(bb, f)
    if np.any(nan):
        d = np.where(nan, np.where(ba == bb, 0, NOT_COMPARABLE), d)
    return np.asarray(d.astype(np.int64))


def spacing(x: Any, fmt: FormatLike) -> np.ndarray:
    """Float64 gap from ``|x|`` to the next larger-magnitude value of ``fmt`` (the ulp above |x|).

    ``2**(floor(log2|x|) - mantissa_bits)`` for normal x; ``min_subnormal`` for |x| < min_normal
    (zero included); NaN for NaN and +-inf.  At max_finite it is the spacing of the top binade
    (the step to the value that would come next), not the distance to inf.  At a power of two the
    spacing *below* is half of this.
    """
    f = get_format(fmt)
    v = as_float64(x, f)
    _, e = np.frexp(v)
    e = np.where(v == 0, f.emin, e)  # frexp(0) gives e == 0, which would read as binade -1
    q = np.ldexp(1.0, np.maximum(e - 1, f.emin) - f.mantissa_bits)
    return np.where(np.isfinite(v), q, np.nan)
