"""The ``exact`` kernel: the correctly rounded scaled GEMM, the reference for every comparison.

``out[i, j] = rn(sum_k a[i,k] * b[k,j] * sa[i] * sb[j] + bias[j])``: the exact real value, rounded
once (round-to-nearest-even) to the output dtype.  An exact zero gives +0.0.

How it stays exact and fast:

1. **Integer operands.**  int8 values are integers.  Every e4m3fn value is an integer times 2**-9
   (the smallest subnormal is 2**-9, the largest value 448 = 229376 * 2**-9), so ``a * 2**9`` is an
   integer matrix with entries below 2**18 in magnitude and each product ``a*b`` is an integer times
   2**-18.
2. **Exact accumulator.**  For int8 operands the accumulator is the INT8 kernels' own exact integers
   (:func:`.accumulator.exact_int8_accumulator`: the fastest exact path of this CPU, each path checked
   against an integer oracle; shared with the INT8 kernels of the same unit).  Otherwise a float64
   GEMM of integer matrices is exact when every partial sum, in whatever order and blocking the
   BLAS uses, is an integer of magnitude at most 2**53.  Every
   partial sum is bounded by ``sum_k |a_ik| |b_kj| <= K * max|a| * max|b|``; :func:`exact_accumulator`
   computes that bound from the actual operands and uses one float64 GEMM when it is <= 2**53
   (always for int8 below K = 2**39; for e4m3 at full range below K ~ 174 000).  Otherwise it splits
   K into chunks that each satisfy the bound, converts each chunk's (exact) result to int64 and
   adds the chunks in int64 (exact while the bound is below 2**63; :meth:`Exact.supports` refuses
   larger K).
3. **Exact scaling.**  ``s = sa * sb`` of two fp32 values is exact in float64 (48 bits).
   ``two_prod(acc, s)`` gives ``hi + lo == acc * s`` exactly (no overflow or underflow is possible:
   every nonzero term is a multiple of 2**-316 and below 2**310).
4. **Exact bias add.**  ``x = hi + lo + bias`` has three terms.  With Knuth's TwoSum:
   ``(s1, e1) = two_sum(hi, bias)``, ``(t, f) = two_sum(e1, lo)``, ``(u, g) = two_sum(s1, t)``, so
   ``x = u + g + f`` exactly, with ``|g| <= ulp(u)/2`` and ``|f|`` far below ``ulp(u)`` (if ``hi`` and
   ``bias`` cancel so much that ``s1`` is tiny, Sterbenz's lemma makes ``e1 = 0``, hence ``f = 0``).
   Rounding ``u + (g + f)`` to a format of at most 24 bits depends only on ``u`` and the *sign* of
   ``g + f`` (the remainder only breaks ties at midpoints, which are float64 numbers), and
   ``fl(g + f)`` has exactly that sign.  So ``round_to_format(u, fmt, fl(g + f))`` is the correctly
   rounded ``x``.
5. **Fallback.**  Elements whose int64 accumulator exceeds 2**53 (only possible on the chunked
   path) are finished in Python integers with :func:`tasks.numerics.round_fraction`.

The tests compare every element against ``round_fraction`` of the Fraction value.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from tasks.numerics import round_fraction, round_to_format, two_prod, two_sum

from .accumulator import FLOAT64_EXACT_K, accumulator_path, exact_int8_accumulator
from .operands import Operands
from .registry import Kernel, register_kernel

__all__ = ["Exact", "exact_accumulator", "FLOAT64_EXACT_INT", "MAX_INT_OPERAND"]

FLOAT64_EXACT_INT = 2**53  # every integer of magnitude <= 2**53 is a float64 number
INT64_LIMIT = 2**63 - 1
FP8_EXPONENT = 9  # e4m3 value = integer * 2**-9
MAX_INT_OPERAND = {torch.int8: 128, torch.float8_e4m3fn: 448 * 2**FP8_EXPONENT}
_OUT_FORMATS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def integer_operand(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x`` as a float64 matrix of integers and the power of two it is scaled by (0 or -9)."""
    if x.dtype == torch.int8:
        return x.to(torch.float64), 0
    if x.dtype == torch.float8_e4m3fn:
        return x.to(torch.float64) * float(2**FP8_EXPONENT), -FP8_EXPONENT  # exact
    raise TypeError(f"exact_accumulator takes int8 or float8_e4m3fn operands, got {x.dtype}")


def exact_accumulator(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The exact ``a @ b`` as ``(acc, e)``: ``acc`` integer-valued, true value ``acc * 2**e``.

    ``acc`` is float64 when the bound ``K * max|a| * max|b| <= 2**53`` (in integer units) proves a
    single float64 GEMM exact, else int64 (K split into chunks that each satisfy the bound, summed
    in int64).  Raises OverflowError if even int64 cannot hold the bound.
    """
    if a.dtype == torch.int8 and b.dtype == torch.int8 and a.shape[1] <= FLOAT64_EXACT_K:
        # the INT8 kernels' own exact integers (:mod:`.accumulator`): the fastest exact path here,
        # shared with them inside one unit
        return exact_int8_accumulator(a, b), 0
    ai, ea = integer_operand(a)
    bi, eb = integer_operand(b)
    k = ai.shape[1]
    amax = int(ai.abs().max().item())
    bmax = int(bi.abs().max().item())
    pmax = amax * bmax  # largest |product| in integer units (exact: Python ints)
    if pmax == 0 or k * pmax <= FLOAT64_EXACT_INT:
        return ai @ bi, ea + eb
    if k * pmax > INT64_LIMIT:
        raise OverflowError(
            f"exact accumulator bound K*max|a|*max|b| = {k * pmax} exceeds int64; split K"
        )
    chunk = max(1, FLOAT64_EXACT_INT // pmax)  # >= 1 anyway: pmax <= 2**36 < 2**53
    acc = torch.zeros(ai.shape[0], bi.shape[1], dtype=torch.int64)
    for k0 in range(0, k, chunk):
        acc += (ai[:, k0 : k0 + chunk] @ bi[k0 : k0 + chunk]).to(torch.int64)
    return acc, ea + eb


def _round_exact(acc: np.ndarray, s: np.ndarray, bias: np.ndarray | None, fmt: str) -> np.ndarray:
    """Correctly rounded ``acc * s + bias`` (all float64, ``acc * s`` not yet rounded)."""
    hi, lo = two_prod(acc, s)
    if bias is None:
        u, low = hi, lo
    else:
        s1, e1 = two_sum(hi, bias)
        t, f = two_sum(e1, lo)
        u, g = two_sum(s1, t)
        low = g + f  # inexact at most in magnitude; its sign is exact
    out = round_to_format(u, fmt, low)
    return np.where((u == 0) & (low == 0), 0.0, out)  # exact zero -> +0.0


@register_kernel("exact")
class Exact(Kernel):
    """Correctly rounded ``rn(sum_k a*b * sa * sb + bias)``, int8 or e4m3 operands (module docs)."""

    operand_dtype = "any"
    device = "cpu"
    description = (
        "reference: rn(sum_k a*b*sa*sb + bias) rounded once, exact integer accumulator "
        "(vllm-kernels.md §2 notation; numerics.md §3, §5)"
    )

    def supports(
        self,
        m: int,
        n: int,
        k: int,
        scale_a_numel: int,
        scale_b_numel: int,
        has_bias: bool,
    ) -> tuple[bool, str | None]:
        worst = max(MAX_INT_OPERAND.values()) ** 2
        if k * worst > INT64_LIMIT:
            limit = INT64_LIMIT // worst
            return (
                False,
                f"K={k} can overflow the int64 accumulator for e4m3 operands (K <= {limit})",
            )
        return True, None

    @property
    def code_path(self) -> str:
        """The int8 accumulator's path in this process; e4m3 operands take one float64 GEMM of
        integers (chunked and summed in int64 past the 2**53 bound)."""
        return f"{accumulator_path().describe()}; e4m3: float64 GEMM of integers"

    def compute(self, ops: Operands) -> torch.Tensor:
        fmt = _OUT_FORMATS[ops.out_dtype]
        acc, e = exact_accumulator(ops.a, ops.b)
        s = (ops.scale_a.to(torch.float64) * ops.scale_b.to(torch.float64)).numpy()  # exact
        bias = None if ops.bias is None else ops.bias.to(torch.float64).numpy()
        if acc.dtype == torch.float64:
            accd = acc.numpy() * 2.0**e  # exact: a power-of-two shift of integers < 2**53
            out = _round_exact(accd, s, bias, fmt)
        else:
            acci = acc.numpy()
            big = np.abs(acci) > FLOAT64_EXACT_INT
            accd = np.where(big, 0, acci).astype(np.float64) * 2.0**e
            out = _round_exact(accd, s, bias, fmt)
            if big.any():
                out = out.copy()
                sa = ops.scale_a.reshape(-1).tolist()
                sb = ops.scale_b.reshape(-1).tolist()
                bl = None if ops.bias is None else ops.bias.to(torch.float64).tolist()
                for i, j in zip(*np.nonzero(big), strict=True):
                    x = Fraction(int(acci[i, j])) * Fraction(2) ** e
                    x *= Fraction(sa[i]) * Fraction(sb[j])
                    if bl is not None:
                        x += Fraction(bl[j])
                    out[i, j] = round_fraction(x, fmt)
        return torch.from_numpy(np.ascontiguousarray(out)).to(ops.out_dtype)
