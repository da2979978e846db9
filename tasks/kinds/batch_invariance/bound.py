"""The declared algorithm's bound on one probe row, and a batch-invariance cell judged against it.

Why a bound and not spacings.  A correct kernel whose accumulation order depends on M computes the
probe row differently in different batches; at fp32 output those differences are several output
spacings, at bf16 output most vanish on rounding.  Spacings alone cannot separate such a legitimate
order change from a defect.  The declared accumulation algorithm can: :func:`tasks.checks.bounds.algorithm`
(the ``bounds`` check's algorithms; ``any`` = any order of additions, products rounded or fused, in the
accumulation format) gives, for the probe's exact products ``a[k] * b[k, j]``, the exact sum and the
rigorous error bound ``tol`` of that algorithm (:class:`tasks.numerics.errormodel.Bounds`: ``gamma_n *
sum |a b| + N eta (1 + gamma_n)``).  Nothing here writes a second accumulation bound.

The epilogue.  The ``bounds`` check gives scaled kernels power-of-two scales, so scaling is exact; this
kind's operands carry real scales (``scale_mode = "real"``: fp32 values).  The bound on the scaled
output, epilogue roundings and the final rounding to the output format included, is the one
:mod:`tasks.checks.scaled_bound` derives (its module docstring), shared with ``kdepth``.

The judgement of a cell (the rigorous form).  The probe computed alone and in a batch of M are two
computations of the same row; a correct kernel puts *each* of them inside ``[lo, hi]``.  That is the
test: an element of either outside is a proof that the kernel did not compute it by the declared
algorithm (``outside_bound`` / ``reference_outside_bound``).  It implies the weaker statement on the
difference, ``|batch - alone| <= hi - lo`` (the sum of both computations' bounds around the exact
result, measured in output values), which alone could not catch a kernel wrong in both computations
by amounts that cancel in the difference, so it is reported, not judged: ``max_bound_ratio`` is the
largest ``|batch - alone| / (hi - lo)`` over the row's elements (0 where they agree; elements whose
bound allows a single output value are left out: a difference there always puts one computation
outside, and is counted there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.checks.scaled_bound import EPILOGUE_ROUNDINGS

__all__ = ["EPILOGUE_ROUNDINGS", "RowBound", "cell_stats", "row_bound"]

@dataclass(frozen=True)
class RowBound:
    """The outputs a kernel computing the probe row by the declared algorithm may produce.

    ``low``/``high``: float64 arrays ``[N]`` of values of the output format (the interval's ends,
    rounded to it); ``algorithm``/``accumulate``: the declared algorithm's name and format.
    """

    algorithm: str
    accumulate: str
    low: np.ndarray
    high: np.ndarray

    def covers(self, out: Any) -> np.ndarray:
        """Elementwise: is the output row (a ``[1, N]`` or ``[N]`` tensor) inside the bound?"""
        v = out.double().numpy().reshape(-1)
        with np.errstate(invalid="ignore"):
            return np.asarray(np.isfinite(v) & (v >= self.low) & (v <= self.high))


def row_bound(name: str, accumulate: str, a_row: Any, b: Any, scale_a_row: Any, scale_b: Any,
              out_fmt: Any) -> RowBound:
    """The bound of algorithm ``name`` in ``accumulate`` on ``a_row @ b`` times the scales (module docstring).

    ``a_row`` ``[1, K]`` and ``b`` ``[K, N]`` are int8 or e4m3 (exact in fp32, and so are their
    products); ``scale_a_row`` one fp32 scale, ``scale_b`` ``[N]`` fp32 scales.
    """
    from tasks.checks.scaled_bound import scaled_output_bound

    # The whole-output bound of tasks/checks/scaled_bound.py (the same formula, shared with kdepth) on one row.
    bound = scaled_output_bound(name, accumulate, a_row, b, scale_a_row, scale_b, out_fmt)
    return RowBound(name, bound.accumulate, bound.low.reshape(-1), bound.high.reshape(-1))


def cell_stats(bound: RowBound, batch_row: Any, alone_row: Any) -> dict[str, Any]:
    """The bound columns of one cell: elements of each computation outside, and the largest
    ``|batch - alone| / (high - low)`` (module docstring)."""
    vb = batch_row.double().numpy().reshape(-1)
    va = alone_row.double().numpy().reshape(-1)
    width = bound.high - bound.low
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(vb - va)
        # where the bound allows one output value a difference is always outside: no ratio there
        ok = (width > 0) & np.isfinite(diff)
        ratio = np.where(ok, diff / np.where(ok, width, 1.0), 0.0)
    return {"outside_bound": int((~bound.covers(batch_row)).sum()),
            "reference_outside_bound": int((~bound.covers(alone_row)).sum()),
            "max_bound_ratio": float(ratio.max(initial=0.0))}
