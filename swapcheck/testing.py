"""Assertions for kernel tests: :func:`assert_within_bound` instead of a hand-picked ``rtol``/``atol``.

A GEMM kernel's output is judged element by element against the **exact** product of its operands
(computed exactly, in integer digits: ``tasks.numerics.exactsum.exact_matmul``), widened by the error
model of the accumulation it claims (``tasks.numerics.products``: ``gamma_n * sum_k |a b| + N * eta``)
and by one round-to-nearest conversion to the output dtype.  The bound is a worst case, not a
statistic: a kernel that does what it claims never fails it, on any inputs.  K, the magnitudes and the
exact result all come from the operands.  docs/tolerance.md shows a test rewritten with it.

Example::

    import torch
    from swapcheck.testing import assert_within_bound

    a = torch.randn(64, 4096).bfloat16()
    b = torch.randn(4096, 32).bfloat16()
    out = my_kernel(a, b)                       # bf16 in, fp32 accumulation, bf16 out
    assert_within_bound(out, a, b, out_dtype=torch.bfloat16, algorithm="any")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.checks.tolerance import BoundCheck

__all__ = ["assert_within_bound", "check_within_bound"]


def check_within_bound(actual: Any, a: Any, b: Any, *, out_dtype: Any, algorithm: str,
                       accumulate: Any = "fp32") -> BoundCheck:  # fmt: skip
    """The per-element verdict without raising: ``.passed``, ``.outside``, ``.worst()``, ``.message()``,
    and ``.judgement`` (``covered``, ``exact``, ``low``, ``high``, ``units`` per element)."""
    from tasks.checks.tolerance import check_within_bound as _check

    return _check(actual, a, b, out_dtype=out_dtype, algorithm=algorithm, accumulate=accumulate)


def assert_within_bound(actual: Any, a: Any, b: Any, *, out_dtype: Any, algorithm: str,
                        accumulate: Any = "fp32") -> None:  # fmt: skip
    """Assert that ``actual`` is ``a @ b`` as the named accumulation computes it, within its bound.

    Args:
        actual: the kernel's output ``[M, N]``: a torch tensor (any device) or a numpy array.
        a: the left operand ``[M, K]``, ``b`` the right one ``[K, N]``, in their own dtypes (fp32,
            bf16, fp16, fp8, int8 tensors or numpy/ml_dtypes arrays).
        out_dtype: the dtype the kernel rounds its result to (``torch.bfloat16``, ``"bf16"``, ...;
            ``"int32"`` with ``accumulate="int32"``).
        algorithm: how the kernel adds the K products: ``"any"`` (any order, with or without FMA:
            the right choice when the order is not known), ``"sequential"``, ``"pairwise"``,
            ``"blocked-<b>"``, ``"exact"`` or ``"slots16"`` (docs/numerics.md).
        accumulate: the accumulator's format: ``"fp32"`` (default), ``"bf16"``, ``"fp16"`` or
            ``"int32"`` (int8 operands, exact below overflow).

    Raises:
        AssertionError: some element is outside; the message names the worst element (row, col),
            its error in units of its bound, actual vs exact, the allowed range, and how many
            elements exceed.
        ValueError: bad input (unknown dtype or algorithm, shapes that do not multiply), naming the
            parameter and what is allowed.
    """
    result = check_within_bound(actual, a, b, out_dtype=out_dtype, algorithm=algorithm, accumulate=accumulate)
    if not result.passed:
        raise AssertionError(result.message())
