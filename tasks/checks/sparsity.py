"""How sparse the binary operands of the exact-match check must be: the zero-probability ``p``.

Each operand entry is 0 with probability ``p`` and 1 otherwise, independently.  An output
``C[i, j] = sum_k A[i, k] B[k, j]`` then counts the ``k`` where both are 1, so it is
``Binomial(K, q)`` with ``q = (1 - p)**2`` and mean ``K q`` (docs/reference/numerics.md §6.1).

The check needs the reference sums inside the output format's exact-integer range ``[0, L]``: every
integer up to ``L = 2**precision`` is a value of the format (fp16 2048, bf16 256, fp32 2**24;
:attr:`tasks.numerics.FloatFormat.max_exact_integer`).  Because the terms are 0 or 1, every partial
sum of an output lies between 0 and the output itself, so *any* order of additions in the format is
exact for an output ``<= L`` (the seed's conditions 1 to 3).  :func:`min_zero_probability` is the
smallest ``p`` for which at most a fraction ``overflow`` of the outputs is expected above ``L``;
:func:`zero_probability` uses it, but never goes below ``floor`` (0.5): a denser draw would make the
operands nearly all ones, and a matrix of equal outputs hides transposed or permuted tiles.

Numbers to compare with docs/reference/numerics.md §6.1 (overflow 0.01): K = 4096 needs p >= 0.3058
(fp16) and 0.7671 (bf16); K = 16384 needs 0.6549 (fp16) and 0.8837 (bf16).  Asking that *all* of
1024 x 1024 outputs stay in range with probability 0.99 is ``overflow = 1 - 0.99**(1 / 1024**2)``
and gives 0.3245 and 0.7912 at K = 4096.
"""

from __future__ import annotations

import math

import numpy as np

from tasks.numerics import get_format
from tasks.numerics.rounding import FormatLike

__all__ = [
    "DEFAULT_OVERFLOW",
    "DEFAULT_FLOOR",
    "exact_limit",
    "overflow_probability",
    "min_zero_probability",
    "zero_probability",
]

#: Expected fraction of outputs above the exact range (the "99 % of outputs <= L" of §6.1).
DEFAULT_OVERFLOW = 0.01
#: The zero-probability never drops below this (q = 1/4: the draw with the most varied outputs
#: that still has a quarter of the products nonzero).
DEFAULT_FLOOR = 0.5


def exact_limit(fmt: FormatLike) -> int:
    """``L``: every integer ``0..L`` is a value of ``fmt`` and ``L + 1`` is not (fp16 2048, bf16 256,
    fp32 2**24, fp8 e4m3 16)."""
    return get_format(fmt).max_exact_integer


def _log_binomial_pmf(k: int, q: float) -> np.ndarray:
    """log P(X = j), j = 0..k, for X ~ Binomial(k, q) with 0 < q < 1 (log-space, no overflow)."""
    j = np.arange(1, k + 1, dtype=np.float64)
    log_choose = np.concatenate(([0.0], np.cumsum(np.log((k - j + 1) / j))))
    jj = np.arange(k + 1, dtype=np.float64)
    return log_choose + jj * math.log(q) + (k - jj) * math.log1p(-q)


def overflow_probability(k: int, p: float, limit: int) -> float:
    """``P(C > limit)`` for one output: ``Binomial(k, (1 - p)**2)`` above ``limit``."""
    if k < 0 or limit < 0:
        raise ValueError(f"k and limit must be >= 0, got k={k}, limit={limit}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    q = (1.0 - p) ** 2
    if k <= limit or q == 0.0:
        return 0.0
    if q == 1.0:
        return 1.0
    logp = _log_binomial_pmf(k, q)[limit + 1 :]
    top = float(logp.max())
    return float(min(1.0, math.exp(top) * float(np.exp(logp - top).sum())))


def min_zero_probability(k: int, limit: int, overflow: float = DEFAULT_OVERFLOW) -> float:
    """The smallest ``p`` (to 1e-9, rounded up) with ``overflow_probability(k, p, limit) <= overflow``.

    0 when ``k <= limit`` (no output can leave the range).
    """
    if not 0.0 < overflow < 1.0:
        raise ValueError(f"overflow must be in (0, 1), got {overflow}")
    if k <= limit:
        return 0.0
    lo, hi = 0.0, 1.0  # tail(lo) > overflow >= tail(hi) = 0; the tail falls as p grows
    while hi - lo > 1e-9:
        mid = 0.5 * (lo + hi)
        if overflow_probability(k, mid, limit) <= overflow:
            hi = mid
        else:
            lo = mid
    return hi


def zero_probability(
    k: int, limit: int, overflow: float = DEFAULT_OVERFLOW, floor: float = DEFAULT_FLOOR
) -> float:
    """The ``p`` the exact-match check draws with: ``max(floor, min_zero_probability(...))``."""
    if not 0.0 <= floor < 1.0:
        raise ValueError(f"floor must be in [0, 1), got {floor}")
    return max(floor, min_zero_probability(k, limit, overflow))
