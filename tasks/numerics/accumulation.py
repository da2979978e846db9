"""Named accumulation orders for a list of terms: exact, sequential, pairwise, blocked.

Each constructor takes the accumulation format (any name :func:`get_format` accepts, e.g.
``"bfloat16"``) and a rounding (``"nearest_even"``, the default, or ``"nearest_away"``; a directed
rounding is a ``ValueError`` that says why).  An algorithm gives:

* ``run(terms, axis=-1)``: the sum along ``axis`` as that order computes it in that format, emulated
  exactly (vectorized over the other axes).  Terms are any float values; a term that is not a value of
  the format enters exactly and is rounded by the first addition that uses it (a fused multiply-add's
  product, for instance).  Returns the input's kind: a torch tensor of the format's dtype for a tensor,
  else a numpy array of the format's numpy dtype.
* ``roundings(n)``: the most roundings a term passes through; ``charged(n)``: the roundings that can
  add an absolute error in the subnormal range; ``error_model(n)``: the standard bound built on them,
  ``gamma_n * sum |x_i| + charged * eta * (1 + gamma_n)`` (:mod:`.errormodel`).
* ``bound(terms)``: that bound, elementwise; ``bounds(terms)`` the full :class:`Bounds` (finite range,
  ``may_be("nan" | "inf" | "zero")``, ``covers(value)``); ``covers(value, terms)``.

Every accumulator starts at +0.0 (the first addition, ``0 + x_0``, is exact for a value of the format).
:mod:`.products` builds the matmul algorithms on these orders.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch

from .errormodel import Bounds, ErrorModel
from .exactsum import exact_sum
from .formats import FloatFormat, get_format
from .orders import Arith, ArrayTerms, Terms
from .orders import blocked as _blocked
from .orders import pairwise as _pairwise
from .orders import sequential as _sequential
from .rounding import NEAREST_EVEN, FormatLike, check_rounding, is_representable

__all__ = [
    "AccumulationAlgorithm",
    "exact",
    "sequential",
    "pairwise",
    "blocked",
    "exact_round",
    "to_float64",
    "to_output",
]

_TERMS_TEXT = "sum over i of |x[i]|"


def to_float64(x: Any) -> tuple[np.ndarray, bool]:
    """Any array-like as float64 (exact for every float dtype), and whether it was a torch tensor."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu").to(torch.float64).numpy(), True
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiub":
        arr = arr.astype(np.float32)  # ml_dtypes (bf16, fp8): exact through float32
    return arr.astype(np.float64), False


def to_output(values: np.ndarray | torch.Tensor, fmt: FloatFormat, as_torch: bool) -> Any:
    """Values of ``fmt`` (any float tensor or array) in fmt's torch or numpy dtype, exactly."""
    if isinstance(values, torch.Tensor):
        if as_torch:
            return values if values.dtype == fmt.torch_dtype else values.to(fmt.torch_dtype)
        values = values.to(torch.float64).numpy()
    if as_torch:
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).to(fmt.torch_dtype)
    return np.asarray(values, dtype=np.float64).astype(fmt.numpy_dtype)


def _sums(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Upper bounds on sum |x|, sum of positive x, sum of |negative x| along the last axis."""
    fin = np.where(np.isfinite(x), x, 0.0)
    n = x.shape[-1]
    up = 1.0 + 2.0 * (n + 1) * 2.0**-53
    pos = np.maximum(fin, 0.0).sum(axis=-1) * up
    neg = np.maximum(-fin, 0.0).sum(axis=-1) * up
    return (pos + neg) * (1 + 2.0**-52), pos, neg


class AccumulationAlgorithm(ABC):
    """An order of additions in one format and rounding (see the module docstring)."""

    name = "accumulation"

    def __init__(self, fmt: FormatLike, *, rounding: str = NEAREST_EVEN) -> None:
        self.format = get_format(fmt)
        self.rounding = check_rounding(rounding)
        self.arith = Arith(self.format, self.rounding)

    def __repr__(self) -> str:
        return f"{self.name}({self.format.name!r}, rounding={self.rounding!r})"

    # -- counts -----------------------------------------------------------------------------
    @abstractmethod
    def roundings(self, n: int, *, terms_in_format: bool = True) -> int:
        """Most roundings any one of ``n`` terms passes through in this order."""

    @abstractmethod
    def charged(self, n: int, *, terms_in_format: bool = True) -> int:
        """Roundings of the whole sum that can add an absolute error (all of them, conservatively)."""

    def error_model(self, n: int, *, terms_in_format: bool = True) -> ErrorModel:
        """The standard bound for ``n`` terms: ``gamma_n * sum |x_i| + N * eta * (1 + gamma_n)``."""
        return ErrorModel(
            self.roundings(n, terms_in_format=terms_in_format),
            self.charged(n, terms_in_format=terms_in_format),
            self.format.unit_roundoff,
            self.format.min_subnormal / 2,
            _TERMS_TEXT,
        )

    # -- emulation --------------------------------------------------------------------------
    @abstractmethod
    def _sum(self, terms: Terms) -> torch.Tensor:
        """The sums of a :class:`Terms` provider, ``[size]`` in ``self.arith.dtype``."""

    def _prepare(self, terms: Any, axis: int) -> tuple[np.ndarray, bool]:
        x, as_torch = to_float64(terms)
        if x.ndim == 0:
            raise ValueError("terms must have at least one dimension (the summation axis)")
        return np.moveaxis(x, axis, -1), as_torch

    def _in_format(self, x: np.ndarray) -> bool:
        return bool(np.all(is_representable(x, self.format)))

    def run(self, terms: Any, axis: int = -1) -> Any:
        """The sum along ``axis``, as this order computes it in this format (exactly emulated)."""
        x, as_torch = self._prepare(terms, axis)
        batch = x.shape[:-1]
        flat = np.ascontiguousarray(x.reshape(math.prod(batch), x.shape[-1]).T)  # [n, B]
        exact_terms = not self._in_format(flat)
        t = torch.from_numpy(flat)
        if not exact_terms:
            t = t.to(self.arith.dtype)
        out = self._sum(ArrayTerms(t, exact_terms))
        return to_output(out.reshape(batch), self.format, as_torch)

    def bounds(self, terms: Any, axis: int = -1) -> Bounds:
        """Elementwise bounds (:class:`Bounds`) of this order's sum of ``terms``."""
        x, _ = self._prepare(terms, axis)
        n = x.shape[-1]
        model = self.error_model(n, terms_in_format=self._in_format(x))
        finite = np.where(np.isfinite(x), x, 0.0)
        hi, lo, err = exact_sum(finite, axis=-1).approx()
        abs_sum, pos, neg = _sums(x)
        return Bounds(
            self.format, model, hi, lo, err, abs_sum, pos, neg,
            np.isnan(x).any(axis=-1), (x == np.inf).any(axis=-1), (x == -np.inf).any(axis=-1),
        )  # fmt: skip

    def bound(self, terms: Any, axis: int = -1) -> np.ndarray:
        """Elementwise worst-case ``|sum - exact sum|`` (float64) for finite terms."""
        return self.bounds(terms, axis).tolerance()

    def covers(self, value: Any, terms: Any, axis: int = -1) -> np.ndarray:
        """Elementwise: is ``value`` within this order's bounds for ``terms``?"""
        v, _ = to_float64(value)
        return self.bounds(terms, axis).covers(v)


def _u(terms_in_format: bool) -> int:
    return 0 if terms_in_format else 1


class Exact(AccumulationAlgorithm):
    """The exact sum, rounded once to the format (an exact zero gives +0)."""

    name = "exact"

    def roundings(self, n: int, *, terms_in_format: bool = True) -> int:
        return 0 if n == 0 or (n == 1 and terms_in_format) else 1

    def charged(self, n: int, *, terms_in_format: bool = True) -> int:
        return self.roundings(n, terms_in_format=terms_in_format)

    def _sum(self, terms: Terms) -> torch.Tensor:
        x = terms.chunk(0, terms.n).to(torch.float64).numpy().T  # [B, n]
        return torch.from_numpy(exact_round(x, self.format, self.rounding))


def exact_round(x: np.ndarray, fmt: FloatFormat, rounding: str) -> np.ndarray:
    """IEEE semantics of the exact sum of ``x`` along the last axis, rounded once to ``fmt``.

    NaN if a term is NaN or +inf and -inf both occur; +-inf if only one of them occurs (NaN in a
    format without inf); otherwise the exact finite sum rounded once (an exact zero gives +0).
    """
    fin = np.isfinite(x)
    out = exact_sum(np.where(fin, x, 0.0), axis=-1).round(fmt, rounding)
    pinf, ninf = (x == np.inf).any(axis=-1), (x == -np.inf).any(axis=-1)
    nan = np.isnan(x).any(axis=-1) | (pinf & ninf)
    inf = np.where(pinf, np.inf, np.where(ninf, -np.inf, 0.0))
    big = inf if fmt.has_inf else np.where(inf != 0, np.nan, 0.0)
    return np.asarray(np.where(nan, np.nan, np.where(inf != 0, big, out)), dtype=np.float64)


class Sequential(AccumulationAlgorithm):
    """``((0 + x_0) + x_1) + ... + x_{n-1}``: term 0 passes through n - 1 roundings (n if it
    is not a value of the format)."""

    name = "sequential"

    def roundings(self, n: int, *, terms_in_format: bool = True) -> int:
        return 0 if n == 0 else n - 1 + _u(terms_in_format)

    def charged(self, n: int, *, terms_in_format: bool = True) -> int:
        return self.roundings(n, terms_in_format=terms_in_format)

    def _sum(self, terms: Terms) -> torch.Tensor:
        return _sequential(terms, self.arith)


class Pairwise(AccumulationAlgorithm):
    """Level-by-level pairwise (odd element carried), then ``0 + sum``: ceil(log2 n) roundings;
    the same tree as ``tasks.kernels``' fp8-pairwise."""

    name = "pairwise"

    def roundings(self, n: int, *, terms_in_format: bool = True) -> int:
        if n <= 1:
            return 0 if n == 0 else _u(terms_in_format)
        return math.ceil(math.log2(n))

    def charged(self, n: int, *, terms_in_format: bool = True) -> int:
        return n - 1 if n >= 2 else self.roundings(n, terms_in_format=terms_in_format)

    def _sum(self, terms: Terms) -> torch.Tensor:
        return _pairwise(terms, self.arith)


class Blocked(AccumulationAlgorithm):
    """Sequential within blocks of ``block_size`` consecutive terms, then sequential across the
    block sums: (min(b, n) - 1) + (ceil(n / b) - 1) roundings (+1 for terms outside the format)."""

    name = "blocked"

    def __init__(self, fmt: FormatLike, block_size: int, *, rounding: str = NEAREST_EVEN) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        super().__init__(fmt, rounding=rounding)
        self.block_size = block_size

    def __repr__(self) -> str:
        return f"blocked({self.format.name!r}, {self.block_size}, rounding={self.rounding!r})"

    def roundings(self, n: int, *, terms_in_format: bool = True) -> int:
        if n == 0:
            return 0
        return (min(self.block_size, n) - 1 + _u(terms_in_format)) + (-(-n // self.block_size) - 1)

    def charged(self, n: int, *, terms_in_format: bool = True) -> int:
        if n == 0:
            return 0
        return n - 1 + _u(terms_in_format) * -(-n // self.block_size)

    def _sum(self, terms: Terms) -> torch.Tensor:
        return _blocked(terms, self.arith, self.block_size)


def exact(fmt: FormatLike, *, rounding: str = NEAREST_EVEN) -> Exact:
    """The exact sum rounded once to ``fmt``."""
    return Exact(fmt, rounding=rounding)


def sequential(fmt: FormatLike, *, rounding: str = NEAREST_EVEN) -> Sequential:
    """Terms added one at a time, in index order, each addition rounded to ``fmt``."""
    return Sequential(fmt, rounding=rounding)


def pairwise(fmt: FormatLike, *, rounding: str = NEAREST_EVEN) -> Pairwise:
    """Terms added as a balanced binary tree, level by level (the odd element carried)."""
    return Pairwise(fmt, rounding=rounding)


def blocked(fmt: FormatLike, block_size: int, *, rounding: str = NEAREST_EVEN) -> Blocked:
    """Sequential within blocks of ``block_size`` terms, then sequential across the block sums."""
    return Blocked(fmt, block_size, rounding=rounding)
