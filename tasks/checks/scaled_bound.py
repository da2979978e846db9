"""The declared algorithm's bound on a scaled GEMM's whole output, and an output judged against it.

One bound for the kinds that judge a scaled kernel's outputs on real scales (``batch_invariance`` on
its probe row, ``kdepth`` on every output): the accumulation algorithm comes from
:func:`tasks.checks.bounds.algorithm` (the ``bounds`` check's algorithms), which gives, for the exact
products ``a[i, k] * b[k, j]`` (int8 or e4m3 values, exact in fp32), the exact sum and the rigorous
error bound ``tol`` of that algorithm (:class:`tasks.numerics.errormodel.Bounds`).  Nothing here
writes a second accumulation bound.

The epilogue.  The operands carry real scales (fp32 values), so a kernel's output is the accumulator
times ``sa * sb`` with at most :data:`EPILOGUE_ROUNDINGS` fp32 roundings (the int32 -> fp32 conversion
of an integer accumulator, ``* sa``, ``* sb``, in any order) and then one rounding to the output
format.  A kernel may also scale the operands before accumulating (each term then passes up to three
fp32 roundings: ``a * sa``, ``b * sb`` and their product).  Both are covered, with ``s = sa * sb``
(exact in float64) and ``S = sum |a b|``::

    |y - s * exact| <= s * (tol * (1 + g3) + g3 * S) + underflow,   g3 = gamma_3 in fp32

(scaling after: ``|acc - exact| <= tol`` and three relative roundings of ``acc * s``: ``s tol (1 +
g3) + g3 s |exact|``, and ``|exact| <= S``; scaling before: each term is ``p s (1 + t)``, ``|t| <=
gamma_3``, and the algorithm's bound on those terms is ``gamma_n (1 + gamma_3) s S``, both within the
line above).  ``underflow`` charges half fp32's smallest subnormal to every rounding a term or the
epilogue can pass through, times the largest scaled operand magnitude plus one: negligible unless
values reach fp32's subnormal range.  The allowed outputs are ``[rn(low), rn(high)]`` with ``low``,
``high`` the two ends of that interval (float64, widened by 2^-50 relative) and ``rn`` the rounding
to the output format (monotone, so every output a correct kernel can produce lies inside).

A bias is not modelled (an add in fp32 or in the output format, before or after the output rounding,
depending on the kernel): callers judge bias-free problems only and say so otherwise.

In units of the bound (:func:`judge`).  Every output, correct or not, carries the final rounding to
the output format, up to half a spacing: that part says nothing about the accumulation.  So an output
``y`` is ``max(0, |y - c| - spacing(y) / 2) / allowance`` bounds from the exact scaled value ``c = s *
exact`` (``spacing``: the gap above ``|y|`` in the output format, :func:`tasks.numerics.spacing.spacing`,
at least the gap on either side): 0 where the output is what rounding ``c`` once can give, at most 1
for an output inside the bound (``y`` within ``[rn(low), rn(high)]`` is within half a spacing of
``[low, high]``), and the larger the further the accumulation strayed.  Whether an output is outside
is decided by the interval (``outside_bound``), never by the ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["EPILOGUE_ROUNDINGS", "ScaledBound", "judge", "scaled_output_bound"]

#: fp32 roundings the epilogue may apply to the accumulator (int32 -> fp32, * scale_a, * scale_b).
EPILOGUE_ROUNDINGS = 3
_U32 = 2.0**-24
_ETA32 = 2.0**-150
_SLACK = 2.0**-50


@dataclass(frozen=True)
class ScaledBound:
    """The outputs a kernel computing ``(a @ b) * sa * sb`` by the declared algorithm may produce.

    ``center``: float64 ``[M, N]``, the exact scaled result (within float64's rounding, covered by the
    slack); ``allowance``: ``[M, N]``, the half-width of the interval before the output rounding;
    ``low``/``high``: ``[M, N]`` values of the output format ``out_format``, the allowed interval's ends;
    ``algorithm``/``accumulate``: the declared algorithm's name and format.
    """

    algorithm: str
    accumulate: str
    center: np.ndarray
    allowance: np.ndarray
    low: np.ndarray
    high: np.ndarray
    out_format: Any

    def covers(self, out: Any) -> np.ndarray:
        """Elementwise: is the output (a tensor of the bound's shape, or a row of it) inside the bound?"""
        v = out.double().cpu().numpy().reshape(self.low.shape)
        with np.errstate(invalid="ignore"):
            return np.asarray(np.isfinite(v) & (v >= self.low) & (v <= self.high))


def scaled_output_bound(name: str, accumulate: str, a: Any, b: Any, scale_a: Any, scale_b: Any,
                        out_fmt: Any) -> ScaledBound:
    """The bound of algorithm ``name`` in ``accumulate`` on ``(a @ b) * sa * sb`` (module docstring).

    ``a`` ``[M, K]`` and ``b`` ``[K, N]`` are int8 or e4m3 (exact in fp32, and so are their products);
    ``scale_a`` one fp32 scale or ``M`` (per token), ``scale_b`` one or ``N`` (per channel).
    """
    import torch

    from tasks.checks.bounds import algorithm
    from tasks.numerics import get_format, round_to_format
    from tasks.numerics.errormodel import gamma

    alg = algorithm(name, accumulate)
    af, bf = a.to(torch.float32).cpu(), b.to(torch.float32).cpu()
    m, k = int(af.shape[0]), int(af.shape[1])
    n = int(bf.shape[1])
    bnd = alg.bounds(af, bf)
    exact = np.asarray(bnd.hi, dtype=np.float64).reshape(m, n)
    tol = (np.asarray(bnd.tolerance()) + np.abs(np.asarray(bnd.lo)) + np.asarray(bnd.err)).reshape(m, n)
    abs_sum = np.asarray(bnd.abs_sum, dtype=np.float64).reshape(m, n)
    sa = scale_a.to(torch.float64).cpu().reshape(-1).numpy()
    sb = scale_b.to(torch.float64).cpu().reshape(-1).numpy()
    sa = np.broadcast_to(sa, (m,)) if sa.size == 1 else sa
    sb = np.broadcast_to(sb, (n,)) if sb.size == 1 else sb
    s = sa[:, None] * sb[None, :]  # two fp32 values: exact in float64
    g3 = gamma(EPILOGUE_ROUNDINGS, _U32)
    a_abs = af.abs().amax(dim=1).double().numpy() if k else np.zeros(m)
    big = (1.0 + float(np.max(np.abs(sa) * a_abs, initial=0.0))
           + float(np.max(np.abs(bf.double().numpy() * sb[None, :]), initial=0.0)))
    underflow = (3 * k + 2 * EPILOGUE_ROUNDINGS) * _ETA32 * big * (1.0 + g3)
    with np.errstate(over="ignore", invalid="ignore"):
        center = exact * s
        allowance = (s * (tol * (1.0 + g3) + g3 * abs_sum)) * (1.0 + _SLACK) + underflow
        low = center - allowance - np.abs(center) * _SLACK
        high = center + allowance + np.abs(center) * _SLACK
    lo_o = np.asarray(round_to_format(low, out_fmt), dtype=np.float64)
    hi_o = np.asarray(round_to_format(high, out_fmt), dtype=np.float64)
    return ScaledBound(name, alg.format.name, center, np.asarray(allowance, dtype=np.float64), lo_o, hi_o,
                       get_format(out_fmt))


def judge(bound: ScaledBound, out: Any) -> dict[str, Any]:
    """One output judged against its bound: ``outside_bound`` (elements outside, non-finite ones
    included), ``max_bound_ratio`` (the largest ratio of the module docstring over the finite outputs;
    0.0 for an empty output, None when none is finite) and the element it is at, ``worst_row`` /
    ``worst_col`` (None without a ratio)."""
    from tasks.numerics.spacing import spacing

    y = out.double().cpu().numpy().reshape(bound.low.shape)
    c = bound.center
    with np.errstate(invalid="ignore", over="ignore"):
        excess = np.maximum(np.abs(y - c) - spacing(y, bound.out_format) / 2.0, 0.0)
        finite = np.isfinite(excess) & np.isfinite(bound.allowance) & (bound.allowance > 0)
        ratio = np.where(finite, excess / np.where(finite, bound.allowance, 1.0), -1.0)
    outside = int((~bound.covers(out)).sum())
    if ratio.size == 0:
        return {"outside_bound": outside, "max_bound_ratio": 0.0, "worst_row": None, "worst_col": None}
    i, j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    if ratio[i, j] < 0:
        return {"outside_bound": outside, "max_bound_ratio": None, "worst_row": None, "worst_col": None}
    return {"outside_bound": outside, "max_bound_ratio": float(ratio[i, j]), "worst_row": int(i),
            "worst_col": int(j)}
