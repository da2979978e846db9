"""swapcheck's public API for other projects: tolerances derived from the error models, not widened by hand.

* :func:`swapcheck.testing.assert_within_bound` -- a kernel test's assertion: every output element of
  ``A @ B`` within the bound that the dtypes, K, the accumulation algorithm and the operands allow,
  around the exact product (docs/tolerance.md).
* :func:`swapcheck.tolerance` -- the same bound in closed form for a dtype, K, algorithm and operand
  magnitudes (what ``swapcheck tolerance`` prints), with the derivation's version and source.

Importing this package is cheap; :mod:`swapcheck.testing` imports torch and numba on first use.
This package is a facade: the arithmetic is ``tasks.numerics.tolerance`` and the names are resolved by
``tasks.checks.tolerance``; nothing inside swapcheck imports it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["tolerance", "DERIVATION_VERSION"]

#: The version of the derivation behind every bound (``tasks.numerics.tolerance.VERSION``).
DERIVATION_VERSION = 1


def tolerance(dtype: str, k: int, **options: Any) -> dict[str, Any]:
    """The closed-form bound of one GEMM output, as ``swapcheck tolerance --format json`` prints it.

    Options (keyword): ``algorithm`` ("any"), ``accumulate``, ``out_dtype``, ``max_abs_a``,
    ``max_abs_b``, ``sum_abs``, ``logit``, ``fma`` (:func:`tasks.checks.tolerance.tolerance`).
    Bad input raises ``ValueError`` naming the parameter and what is allowed.

    Example::

        >>> import swapcheck
        >>> t = swapcheck.tolerance("bf16", 4096)
        >>> t["rtol"], t["derivation_version"]
        (0.00390625, 1)
    """
    from tasks.checks.tolerance import tolerance as _tolerance

    return _tolerance(dtype, k, **options)
