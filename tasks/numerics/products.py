"""Matmul algorithms (orders of accumulation in a format) and the matmul operation's reference.

===============================================  ===============================================
constructor                                      how the K products of one output are added
===============================================  ===============================================
``matmul_sequential(format, *, fma=True)``       one at a time, in index order, from +0
``matmul_pairwise(format, *, fma=True)``         balanced tree, level by level, odd one carried
``matmul_blocked(format, block_size, *, fma)``   in order within blocks, then the block sums
``matmul_exact_accumulation(format)``            exactly, then rounded once to format
``matmul_slots16(format)``                       rounded, then summed in 16 slots by magnitude
===============================================  ===============================================

With ``fma=True`` the exact products are added (each addition that uses a product is one fused
rounding); with ``fma=False`` each product is first rounded to the format.  Every constructor takes
``rounding=`` (``"nearest_even"``, the default, or ``"nearest_away"``; directed roundings are a
``ValueError``).  The orders are those of :mod:`.accumulation` (pairwise is the same tree as
``tasks.kernels``' fp8-pairwise).  Each algorithm has

* ``run(A, B)``: what that implementation computes, emulated exactly and vectorized; ``A [M, K]`` and
  ``B [K, N]`` are numpy arrays or torch tensors of values of their own dtype (fp32, bf16, fp16, fp8;
  float64 arrays must hold values of the algorithm's format).  Returns the inputs' kind in the
  accumulation format's dtype.
* ``error_model(k)``: its formula for k products, e.g.
  ``4.77e-07 * sum over k of |A[i,k] * B[k,j]| + 1.34e-43`` for
  ``matmul_pairwise("float32", fma=False).error_model(64)`` (docs/numerics.md derives the counts).
* ``tolerance(A, B)``, ``finite_range(A, B)``, ``may_be(kind, A, B)`` with kind ``"nan"``, ``"inf"``
  or ``"zero"``, and ``covers(output, A, B)``: the bounds, elementwise, around the exact result.

:func:`matmul` is the operation itself: ``.exact``, ``.rounded`` (the exact result rounded once to the
output format) and the operation's tolerance, which covers every implementation that rounds only where
the operation requires (products and sums in the output format, in any order, with or without FMA).
"""

from __future__ import annotations

import math
import operator
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from . import accumulation as acc_mod
from . import compiled
from .accumulation import AccumulationAlgorithm, to_float64, to_output
from .errormodel import Bounds, ErrorModel
from .exactsum import ExactSum, exact_matmul, exact_sum
from .formats import FORMATS, FloatFormat, get_format
from .orders import Arith
from .orders import blocked as _blocked
from .orders import pairwise as _pairwise
from .orders import sequential as _sequential
from .orders import slots16 as _slots16
from .rounding import NEAREST_EVEN, FormatLike, check_rounding, is_representable, round_to_format

__all__ = [
    "MatmulAlgorithm",
    "MatmulResult",
    "matmul",
    "matmul_sequential",
    "matmul_pairwise",
    "matmul_blocked",
    "matmul_exact_accumulation",
    "matmul_slots16",
]

_TERMS_TEXT = "sum over k of |A[i,k] * B[k,j]|"
_F32 = FORMATS["fp32"]


# ---------------------------------------------------------------------------------------------
# Operands


def _operand(x: Any, default: FloatFormat, name: str) -> tuple[np.ndarray, FloatFormat, bool]:
    """float64 values, their format and whether ``x`` was a torch tensor."""
    fmt: FloatFormat | None = None
    if isinstance(x, torch.Tensor):
        try:
            fmt = get_format(x.dtype)
        except ValueError:
            fmt = None
    elif isinstance(x, np.ndarray):
        try:
            fmt = get_format(x.dtype)
        except ValueError:
            fmt = None
    v, as_torch = to_float64(x)
    if v.ndim != 2:
        raise ValueError(f"{name} must be a matrix (2 dimensions), got shape {tuple(v.shape)}")
    if fmt is None:
        fmt = default
        ok = is_representable(v, fmt)
        if not np.all(ok):
            raise ValueError(
                f"{name} holds {int(ok.size - np.count_nonzero(ok))} value(s) that are not "
                f"{fmt.name} values (e.g. {v[~ok].ravel()[:3].tolist()}); pass a tensor or array "
                f"of their own dtype, or round them first"
            )
    return v, fmt, as_torch


def _operands(
    a: Any, b: Any, default: FloatFormat
) -> tuple[np.ndarray, np.ndarray, FloatFormat, FloatFormat, bool]:
    a64, fa, ta = _operand(a, default, "A")
    b64, fb, tb = _operand(b, default, "B")
    if a64.shape[1] != b64.shape[0]:
        raise ValueError(f"shapes {a64.shape} and {b64.shape} cannot be multiplied (K differs)")
    return a64, b64, fa, fb, ta or tb


def _products_fit(a64: np.ndarray, b64: np.ndarray, fa: FloatFormat, fb: FloatFormat,
                  f: FloatFormat) -> bool:  # fmt: skip
    """Is every finite product exactly a normal (or zero) value of ``f``?  (Sufficient test.)"""
    if fa.precision + fb.precision > f.precision:
        return False
    a = np.abs(a64[np.isfinite(a64) & (a64 != 0)])
    b = np.abs(b64[np.isfinite(b64) & (b64 != 0)])
    if a.size == 0 or b.size == 0:
        return True
    return bool(a.min() * b.min() >= f.min_normal and a.max() * b.max() <= f.max_finite)


class _ProductTerms:
    """The products ``a[k, i] * b[k, j]`` as :class:`orders.Terms`, computed chunk by chunk.

    ``how``: ``"exact"`` (float64, exact: any two values of at most 24 bits multiply exactly in
    float64), ``"fp32"`` (one IEEE fp32 multiply: exact, or the product rounded once to fp32; for a
    bf16/fp16 accumulator an exact fp32 product is then cast once to its dtype), or ``"round"``
    (exact float64 product, then rounded once to the format).  ``fits``: every product is a value
    of the format.  ``pairs``: output j is ``sum_k at[k, j] * b[k, j]`` (a selection of outputs).
    """

    def __init__(self, at: torch.Tensor, b: torch.Tensor, ar: Arith, how: str, exact: bool,
                 pairs: bool = False, fits: bool = False) -> None:  # fmt: skip
        self.ar, self.how, self.exact, self.pairs, self.fits = ar, how, exact, pairs, fits
        self.native_steps = how == "fp32" and ar.dtype == torch.float32  # step_native works
        self.fused_steps = exact  # add_into works
        dt = torch.float32 if how == "fp32" else torch.float64
        self.at, self.b = at.to(dt), b.to(dt)
        self.n = at.shape[0]
        self.size = at.shape[1] if pairs else at.shape[1] * b.shape[1]

    def chunk(self, k0: int, k1: int) -> torch.Tensor:
        a, b = self.at[k0:k1], self.b[k0:k1]
        p = a * b if self.pairs else (a.unsqueeze(2) * b.unsqueeze(1)).reshape(k1 - k0, -1)
        return self._finish(p)

    def add_into(self, acc: torch.Tensor, k: int, out: torch.Tensor) -> None:
        """``out = fl64(acc + term_k)`` for exact terms: the product is exact in float64, so
        whether addcmul fuses or not, the sum rounds once."""
        if self.pairs:
            torch.addcmul(acc, self.at[k], self.b[k], out=out)
        else:
            m, n = self.at.shape[1], self.b.shape[1]
            torch.addcmul(acc.view(m, n), self.at[k].unsqueeze(1), self.b[k].unsqueeze(0),
                          out=out.view(m, n))  # fmt: skip

    def step_native(self, acc: torch.Tensor, k: int) -> None:
        """``acc = round(acc + term_k)`` in place, for an fp32 accumulator (``native_steps``)."""
        a, b = self.at[k], self.b[k]
        if not self.pairs:
            m, n = self.at.shape[1], self.b.shape[1]
            acc, a, b = acc.view(m, n), a.unsqueeze(1), b.unsqueeze(0)
        if self.fits:  # exact products: one rounding whether or not addcmul fuses
            acc.addcmul_(a, b)
        else:  # fp32 multiply (one rounding), then add (another)
            acc.add_(a * b)

    def _finish(self, p: torch.Tensor) -> torch.Tensor:
        """Products as computed (float32 IEEE, or exact float64) -> the terms of ``chunk``."""
        if self.how == "fp32":
            return p if self.ar.dtype == torch.float32 else p.to(self.ar.dtype)
        if self.how == "round":
            return self.ar.round64(p)
        return p if self.exact else p.to(self.ar.dtype)

    def output_blocks(self, elements: int) -> Iterator[tuple[int, torch.Tensor]]:
        """``(first output, terms [outputs, n])`` for blocks of about ``elements`` terms: whole rows
        of the output, products laid out output by output (what a per-output sort wants)."""
        n = self.n
        if self.pairs:
            step = max(1, elements // max(n, 1))
            for c0 in range(0, self.size, step):
                a, b = self.at[:, c0 : c0 + step].t(), self.b[:, c0 : c0 + step].t()
                yield c0, self._finish(a * b)
            return
        cols = self.b.shape[1]
        bt = self.b.t().contiguous()  # [N, K]
        rows = max(1, elements // max(n * cols, 1))
        for i0 in range(0, self.at.shape[1], rows):
            a = self.at[:, i0 : i0 + rows].t().contiguous()  # [r, K]
            p = (a.unsqueeze(1) * bt.unsqueeze(0)).reshape(-1, n)  # [r * N, K]
            yield i0 * cols, self._finish(p)

    def select(self, index: torch.Tensor) -> _ProductTerms:
        n = self.b.shape[1]
        rows, cols = index // n, index % n
        if self.pairs:
            return _ProductTerms(self.at[:, index], self.b[:, index], self.ar, self.how,
                                 self.exact, True, self.fits)  # fmt: skip
        return _ProductTerms(self.at[:, rows], self.b[:, cols], self.ar, self.how, self.exact, True,
                             self.fits)  # fmt: skip


def _product_terms(a64: np.ndarray, b64: np.ndarray, fa: FloatFormat, fb: FloatFormat,
                   ar: Arith, fma: bool) -> _ProductTerms:  # fmt: skip
    at = torch.from_numpy(np.ascontiguousarray(a64.T))
    b = torch.from_numpy(np.ascontiguousarray(b64))
    f = ar.fmt
    in_f32 = _products_fit(a64, b64, fa, fb, _F32)
    if _products_fit(a64, b64, fa, fb, f):  # fma is irrelevant: no product rounds
        return _ProductTerms(at, b, ar, "fp32" if ar.native else "exact", exact=False, fits=True)
    if fma:
        return _ProductTerms(at, b, ar, "exact", exact=True)
    if ar.native and (f.name == "fp32" or in_f32):
        return _ProductTerms(at, b, ar, "fp32", exact=False)  # IEEE multiply (+ one cast)
    return _ProductTerms(at, b, ar, "round", exact=False)


# ---------------------------------------------------------------------------------------------
# Bounds around the exact result


def _indicator(x: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "nan": np.isnan(x), "pinf": x == np.inf, "ninf": x == -np.inf, "zero": x == 0,
        "pos": x > 0, "neg": x < 0,
    }  # fmt: skip


def _specials(a64: np.ndarray, b64: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Elementwise: is some product NaN (or inf * 0), +inf, -inf?  (Counts by 0/1 matmuls.)"""
    m, n = a64.shape[0], b64.shape[1]
    none = np.zeros((m, n), dtype=bool)
    if np.all(np.isfinite(a64)) and np.all(np.isfinite(b64)):
        return none, none, none
    ia = {k: v.astype(np.float64) for k, v in _indicator(a64).items()}
    ib = {k: v.astype(np.float64) for k, v in _indicator(b64).items()}
    ones_a, ones_b = np.ones_like(a64), np.ones_like(b64)
    inf_a, inf_b = ia["pinf"] + ia["ninf"], ib["pinf"] + ib["ninf"]
    nan = ia["nan"] @ ones_b + ones_a @ ib["nan"] + inf_a @ ib["zero"] + ia["zero"] @ inf_b
    ok_a, ok_b = 1 - ia["nan"], 1 - ib["nan"]
    pinf = (ia["pinf"] @ (ib["pos"] * ok_b) + ia["ninf"] @ (ib["neg"] * ok_b)
            + (ia["pos"] * ok_a) @ ib["pinf"] + (ia["neg"] * ok_a) @ ib["ninf"])  # fmt: skip
    ninf = (ia["pinf"] @ (ib["neg"] * ok_b) + ia["ninf"] @ (ib["pos"] * ok_b)
            + (ia["pos"] * ok_a) @ ib["ninf"] + (ia["neg"] * ok_a) @ ib["pinf"])  # fmt: skip
    return nan > 0, pinf > 0, ninf > 0


def _finite(x: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(x), x, 0.0)


def _abs_sums(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Upper bounds on sum_k |a b|, on the positive products' sum and on |negative ones'| sum.

    Two float64 matmuls: ``S = |A| @ |B|`` and ``D = A @ B``, each within ``g = (k + 2) 2**-53``
    of its exact value relative to S; then pos = (S + D) / 2 and neg = (S - D) / 2 up to g S.
    """
    k = a.shape[1]
    g = (k + 2) * 2.0**-53
    s = (torch.from_numpy(np.abs(a)) @ torch.from_numpy(np.abs(b))).numpy()
    d = (torch.from_numpy(a) @ torch.from_numpy(b)).numpy()
    s_up = s * (1 + 2 * g)
    pos = np.maximum((s + d) / 2 + 2 * g * s_up, 0.0)
    neg = np.maximum((s - d) / 2 + 2 * g * s_up, 0.0)
    return s_up, pos, neg


class _Analysis:
    """What every bound needs: the exact finite part, sums of magnitudes, special products."""

    def __init__(self, a64: np.ndarray, b64: np.ndarray) -> None:
        af, bf = _finite(a64), _finite(b64)
        self.exact: ExactSum = exact_matmul(af, bf)
        self.hi, self.lo, self.err = self.exact.approx()
        self.abs_sum, self.pos, self.neg = _abs_sums(af, bf)
        self.nan, self.pinf, self.ninf = _specials(a64, b64)
        self.k = a64.shape[1]

    def bounds(self, fmt: FloatFormat, model: ErrorModel) -> Bounds:
        return Bounds(fmt, model, self.hi, self.lo, self.err, self.abs_sum, self.pos, self.neg,
                      self.nan, self.pinf, self.ninf)  # fmt: skip

    def rounded(self, fmt: FloatFormat, rounding: str) -> np.ndarray:
        """IEEE semantics of the exact result rounded once to ``fmt`` (an exact zero is +0)."""
        out = self.exact.round(fmt, rounding)
        nan = self.nan | (self.pinf & self.ninf)
        inf = np.where(self.pinf, np.inf, np.where(self.ninf, -np.inf, 0.0))
        big = inf if fmt.has_inf else np.where(inf != 0, np.nan, 0.0)
        return np.asarray(np.where(nan, np.nan, np.where(inf != 0, big, out)), dtype=np.float64)


class _Bounded(ABC):
    """Bounds API shared by the algorithms and the operation's reference."""

    format: FloatFormat

    @abstractmethod
    def roundings(self, k: int) -> int:
        """The most roundings one product passes through, for k products."""

    @abstractmethod
    def charged(self, k: int) -> int:
        """The roundings charged the underflow unit eta, for k products."""

    def error_model(self, k: int) -> ErrorModel:
        """``gamma_n * sum over k of |A[i,k] * B[k,j]| + N * eta * (1 + gamma_n)`` for k products."""
        try:
            k = operator.index(k)  # ints and numpy integers
        except TypeError:
            raise ValueError(f"k must be an integer >= 0, got {k!r}") from None
        if isinstance(k, bool) or k < 0:
            raise ValueError(f"k must be an integer >= 0, got {k!r}")
        f = self.format
        return ErrorModel(self.roundings(k), self.charged(k), f.unit_roundoff,
                          f.min_subnormal / 2, _TERMS_TEXT)  # fmt: skip

    def bounds(self, a: Any, b: Any) -> Bounds:
        """Elementwise bounds for ``A @ B`` (:class:`errormodel.Bounds`)."""
        a64, b64, _, _, _ = _operands(a, b, self.format)
        return _Analysis(a64, b64).bounds(self.format, self.error_model(a64.shape[1]))

    def tolerance(self, a: Any, b: Any) -> np.ndarray:
        """Elementwise bound on |output - exact| (float64 ``[M, N]``), for finite results."""
        return self.bounds(a, b).tolerance()

    def finite_range(self, a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)``: a finite output is covered iff it lies in it (empty: low > high)."""
        return self.bounds(a, b).finite_range()

    def may_be(self, kind: str, a: Any, b: Any) -> np.ndarray:
        """Elementwise: can the output be ``"nan"``, ``"inf"`` (either sign) or ``"zero"``?"""
        return self.bounds(a, b).may_be(kind)

    def covers(self, output: Any, a: Any, b: Any) -> np.ndarray:
        """Elementwise: is ``output`` (any dtype) within the bounds of ``A @ B``?"""
        out, _ = to_float64(output)
        return self.bounds(a, b).covers(out)


class MatmulAlgorithm(_Bounded):
    """One way of computing ``A @ B``: an accumulation order in a format, with or without FMA."""

    name = "matmul"

    def __init__(self, fmt: FormatLike, order: AccumulationAlgorithm | None, *, fma: bool,
                 rounding: str) -> None:  # fmt: skip
        self.format = get_format(fmt)
        self.rounding = check_rounding(rounding)
        self.fma = bool(fma)
        self.order = order
        self.arith = Arith(self.format, self.rounding)

    def __repr__(self) -> str:
        return (f"{self.name}({self.format.name!r}{self._extra()}, fma={self.fma}, "
                f"rounding={self.rounding!r})")  # fmt: skip

    def _extra(self) -> str:
        return ""

    def roundings(self, k: int) -> int:
        """fma: the order's count for exact terms; no fma: 2 (the product rounded, then taken
        into the accumulator) + the order's count for terms of the format."""
        assert self.order is not None
        if k == 0:
            return 0
        if self.fma:
            return self.order.roundings(k, terms_in_format=False)
        return 2 + self.order.roundings(k, terms_in_format=True)

    def charged(self, k: int) -> int:
        """fma: the order's additions; no fma: 2 per product + the order's k - 1 additions."""
        assert self.order is not None
        if k == 0:
            return 0
        if self.fma:
            return self.order.charged(k, terms_in_format=False)
        return 2 * k + self.order.charged(k, terms_in_format=True)

    def run(self, a: Any, b: Any) -> Any:
        """``A @ B`` as this implementation computes it (exactly emulated)."""
        fast = self._run_compiled(a, b)
        if fast is not None:
            return fast
        a64, b64, fa, fb, as_torch = _operands(a, b, self.format)
        m, n = a64.shape[0], b64.shape[1]
        out = self._run(a64, b64, fa, fb)
        if isinstance(out, torch.Tensor):
            out = out.reshape(m, n)
        else:
            out = np.asarray(out).reshape(m, n)
        return to_output(out, self.format, as_torch)

    @abstractmethod
    def _run(self, a64: np.ndarray, b64: np.ndarray, fa: FloatFormat,
             fb: FloatFormat) -> torch.Tensor | np.ndarray:  # fmt: skip
        """The ``M * N`` outputs (flat) for float64 operands of formats ``fa`` and ``fb``."""

    def _run_compiled(self, a: Any, b: Any) -> Any:
        """The output through a compiled kernel (:mod:`.compiled`), or None where there is none."""
        return None


def _operands32(a: Any, b: Any, default: FloatFormat) -> tuple[np.ndarray, np.ndarray, FloatFormat,
                                                                 FloatFormat, bool]:  # fmt: skip
    """The operands as C-contiguous float32 arrays (exact), their formats and whether either was
    a torch tensor: straight from fp32-or-narrower tensors and arrays, else through _operands."""
    x, y = compiled.operands32(a), compiled.operands32(b)
    if x is not None and y is not None and x[0].shape[1] == y[0].shape[0]:
        as_torch = isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)
        return x[0], y[0], x[1], y[1], as_torch
    a64, b64, fa, fb, as_torch = _operands(a, b, default)  # validates (raises) as run() does
    return a64.astype(np.float32), b64.astype(np.float32), fa, fb, as_torch  # exact: <= fp32


class _Ordered(MatmulAlgorithm):
    """The products (exact or rounded, per fma and the data) summed by an order of :mod:`.orders`;
    compiled (:func:`.compiled.run_ordered`) where numba is available."""

    order_name = ""
    block = 0

    def _run_compiled(self, a: Any, b: Any) -> Any:
        if not compiled.available():
            return None
        a32, b32, fa, fb, as_torch = _operands32(a, b, self.format)
        out = compiled.run_ordered(self.order_name, self.block, self.format, self.rounding,
                                   self.fma, a32, b32, fa, fb)  # fmt: skip
        return None if out is None else compiled.to_output(out, self.format, as_torch)

    def _run(self, a64: np.ndarray, b64: np.ndarray, fa: FloatFormat,
             fb: FloatFormat) -> torch.Tensor:  # fmt: skip
        return self._sum(_product_terms(a64, b64, fa, fb, self.arith, self.fma))

    @abstractmethod
    def _sum(self, terms: Any) -> torch.Tensor:
        """The engine of :mod:`.orders` for this order."""


class _Sequential(_Ordered):
    name = "matmul_sequential"
    order_name = "sequential"

    def _sum(self, terms: Any) -> torch.Tensor:
        return _sequential(terms, self.arith)


class _Pairwise(_Ordered):
    name = "matmul_pairwise"
    order_name = "pairwise"

    def _sum(self, terms: Any) -> torch.Tensor:
        return _pairwise(terms, self.arith)


class _Blocked(_Ordered):
    name = "matmul_blocked"
    order_name = "blocked"

    def __init__(self, fmt: FormatLike, block_size: int, *, fma: bool, rounding: str) -> None:
        order = acc_mod.blocked(fmt, block_size, rounding=rounding)
        super().__init__(fmt, order, fma=fma, rounding=rounding)
        self.block_size = block_size
        self.block = block_size

    def _extra(self) -> str:
        return f", {self.block_size}"

    def _sum(self, terms: Any) -> torch.Tensor:
        return _blocked(terms, self.arith, self.block_size)


class _ExactAccumulation(MatmulAlgorithm):
    name = "matmul_exact_accumulation"

    def roundings(self, k: int) -> int:
        """One rounding: the exact sum's."""
        return 0 if k == 0 else 1

    def charged(self, k: int) -> int:
        return 0 if k == 0 else 1

    def __repr__(self) -> str:
        return f"{self.name}({self.format.name!r}, rounding={self.rounding!r})"

    def _run_compiled(self, a: Any, b: Any) -> Any:
        """Finite operands of fp32 or narrower formats through :func:`_exact_compiled` (the same
        method, its passes compiled); None (the torch path runs) where it does not apply."""
        if not compiled.available() or _nbexact() is None:
            return None
        a32, b32, _, _, as_torch = _operands32(a, b, self.format)
        out = _exact_compiled(a32, b32, self.format, self.rounding)
        return None if out is None else compiled.to_output(out, self.format, as_torch)

    def _run(self, a64: np.ndarray, b64: np.ndarray, fa: FloatFormat,
             fb: FloatFormat) -> np.ndarray:  # fmt: skip
        if np.all(np.isfinite(a64)) and np.all(np.isfinite(b64)):
            return _exact_rounded_finite(a64, b64, self.format, self.rounding)
        return _Analysis(a64, b64).rounded(self.format, self.rounding)


_NB_EXACT: dict[str, Any] = {}
_SCRATCH = threading.local()
_SCRATCH_MAX = 2**26  # bytes of float64 work arrays kept between calls, per thread


def _scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A float64 work array of ``shape`` (contents undefined), kept between calls of the same
    thread when small enough: fresh pages of a new array fault in one by one, and at these sizes
    that cost (about 4 us a page here) rivals the arithmetic."""
    size = 8 * math.prod(shape)
    if size > _SCRATCH_MAX:
        return np.empty(shape)
    kept: dict[str, np.ndarray] = _SCRATCH.__dict__.setdefault("arrays", {})
    arr = kept.get(name)
    if arr is None or arr.size < size // 8:
        arr = kept[name] = np.empty(size // 8)
    return arr[: size // 8].reshape(shape)


def _nbexact() -> Any:
    """The kernels of :mod:`._nbexact` (imported on first use: it loads numba), or None."""
    if "mod" not in _NB_EXACT:
        mod: Any
        try:
            from . import _nbexact as mod
        except ImportError:
            mod = None
        _NB_EXACT["mod"] = mod
    return _NB_EXACT["mod"]


def _exact_compiled(a32: np.ndarray, b32: np.ndarray, fmt: FloatFormat,
                    rounding: str) -> np.ndarray | None:  # fmt: skip
    """:func:`_exact_rounded_finite` with its passes compiled (:mod:`._nbexact`, whose docstring
    proves the bounds): a float32 ``[M, N]`` array of values of ``fmt``, or None where an operand
    holds inf or NaN.  ``a32 [M, K]``, ``b32 [K, N]``: C-contiguous float32 arrays of values of
    formats of at most 24 bits.

    1. One pass over each operand: the float64 copies (B transposed), the finiteness check, an
       upper bound on each row's (column's) 2-norm and its lattice exponent.
    2. One float64 BLAS matmul ``D = A @ B``.
    3. One pass over the outputs: the bound (0 where every partial sum of the output lies on its
       lattice below 2**53 units: ``D`` is then exact), both interval ends rounded, compared.
    4. The undecided outputs summed again with TwoSum (a certified double-double) and decided the
       same way; those still undecided (sums on or next to a midpoint) summed exactly in digits.
    """
    nbx = _nbexact()
    m, k = a32.shape
    n = b32.shape[1]
    if m == 0 or n == 0 or k == 0:
        return np.zeros((m, n), dtype=np.float32)  # empty sums: +0
    a64, b64 = _scratch("a64", (m, k)), _scratch("b64", (k, n))
    stats_a = np.empty(m), np.empty(m, np.int32), np.empty(m, np.int32), np.empty(m, np.int32)
    stats_b = np.empty(n), np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int32)
    nbx.prep_rows(a32, a32.view(np.int32), a64, *stats_a)
    nbx.prep_cols(b32, b32.view(np.int32), b64, *stats_b)
    if (stats_a[3] == 255).any() or (stats_b[3] == 255).any():
        return None  # an inf or NaN: the torch path's special-value analysis
    grow = 1.0 + (k + 8) * 2.0**-52
    (na, la), (nb, lb) = _norm_lattice(*stats_a[:3], grow), _norm_lattice(*stats_b[:3], grow)
    blocks = _k_blocks(k)
    kb = k // blocks
    a3 = torch.from_numpy(a64).view(m, blocks, kb).transpose(0, 1)  # [P, M, kb], no copy
    d = _scratch("d", (blocks, m, n))
    torch.bmm(a3, torch.from_numpy(b64).view(blocks, kb, n), out=torch.from_numpy(d))  # [P, M, N]
    spec = (fmt.name == "fp32" and rounding == NEAREST_EVEN, fmt.mantissa_bits, fmt.emin,
            fmt.max_finite, fmt.has_inf, rounding != NEAREST_EVEN)  # fmt: skip
    out = np.empty((m, n), dtype=np.float32)
    undecided = np.empty((m, n), dtype=np.bool_)
    nbx.certify(d, na, la, nb, lb, (kb + 8) * 2.0**-53 * grow, (blocks + 8) * 2.0**-53 * grow,
                out, undecided, *spec)  # fmt: skip
    rows, cols = np.nonzero(undecided)
    if rows.size:
        order = np.argsort(cols, kind="stable")
        rows, cols = rows[order], cols[order]
        ucols, starts = np.unique(cols, return_index=True)
        starts = np.append(starts, cols.size)
        vals = np.empty(rows.size, dtype=np.float32)
        ok = np.empty(rows.size, dtype=np.bool_)
        nbx.resum(a64, b32, rows, ucols, starts, (k + 16) * 2.0**-53 * grow, vals, ok, *spec)
        still = np.flatnonzero(~ok)
        if still.size:
            terms = a64[rows[still]] * b64[:, cols[still]].T  # [s, K]: exact products
            vals[still] = exact_sum(terms, axis=1).round(fmt, rounding).astype(np.float32)
        out[rows, cols] = vals
    return out


_BLOCK_K = 256  # BLAS products of about this many terms: the bound grows with it


def _k_blocks(k: int) -> int:
    """How many equal blocks of K the BLAS call sums separately: a power of two dividing K, at
    most 16 and leaving blocks of at least ``_BLOCK_K`` terms (1 for small or odd K)."""
    most = max(1, min(16, k & -k, k // _BLOCK_K))
    return 1 << (most.bit_length() - 1)


def _norm_lattice(sumsq: np.ndarray, minexp: np.ndarray, ormant: np.ndarray,
                  grow: float) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """From the statistics of :func:`._nbexact.prep_rows`: an upper bound on each 2-norm
    (``sqrt(sumsq) * grow``, :mod:`._nbexact` 1) and each lattice exponent: every element is a
    multiple of ``2**(max(minexp, 1) - 150 + tz)``, tz the trailing zeros of the OR of the
    mantissa fields (23 if 0).  (An element with exponent field ``e >= minexp`` is its 24-bit
    significand, whose lowest set bit is at or above tz, times ``2**(max(e, 1) - 150)``.)"""
    low = ormant & -ormant  # lowest set bit of the OR (0 if none)
    tz = np.where(low == 0, 23, np.frexp(low.astype(np.float64))[1] - 1)
    lat = np.maximum(minexp, 1).astype(np.int64) - 150 + tz
    return np.sqrt(sumsq) * grow, lat


def _round_once(x: torch.Tensor, fmt: FloatFormat, rounding: str) -> torch.Tensor:
    """float64 values rounded once to ``fmt`` (float64 tensor of values of fmt)."""
    if fmt.name == "fp32" and rounding == NEAREST_EVEN:
        return x.to(torch.float32).to(torch.float64)  # one IEEE rounding
    return torch.from_numpy(round_to_format(x.numpy(), fmt, rounding=rounding))


def _exact_rounded_finite(a64: np.ndarray, b64: np.ndarray, fmt: FloatFormat,
                          rounding: str) -> np.ndarray:  # fmt: skip
    """The exact ``A @ B`` of finite values rounded once to ``fmt``, certified per output.

    One float64 BLAS matmul ``D``: every product of two values of at most 24 bits is exact in
    float64 (and far from its underflow and overflow), so in any order, with or without FMA,
    ``|D - exact| <= gamma_K * sum_k |a_k b_k| <= gamma_K * ||a_i|| ||b_j||`` (Cauchy-Schwarz),
    ``gamma_K = K u / (1 - K u)``, u = 2**-53 (taken generously: :func:`_certified`).  Rounding is
    monotone, so where both ends of ``[D - E, D + E]`` round to the same value (the same bits: a
    sign of zero counts) that is the rounded exact result.  The outputs left undecided (under 1 %
    for randn data) are summed again from their exact products, far more accurately
    (:func:`_split_sum`), and certified the same way; what is still undecided (an exact sum on or
    next to a midpoint) is summed exactly in digits (:func:`exactsum.exact_sum`).
    """
    m, k = a64.shape
    n = b64.shape[1]
    a, b = torch.from_numpy(a64), torch.from_numpy(b64)
    d = torch.matmul(a, b) + 0.0  # an exact zero is +0 (a -0 product sum would stay -0)
    grow = 1.0 + (k + 8) * 2.0**-52
    norm_a = torch.sqrt((a * a).sum(dim=1)) * grow  # each square exact; the sum rounds k times
    norm_b = torch.sqrt((b * b).sum(dim=0)) * grow
    err = torch.outer(norm_a, norm_b) * ((k + 8) * 2.0**-53 * grow)  # (k + 8) u >= gamma_k
    flat, bad = _certified(d.reshape(-1), err.reshape(-1), fmt, rounding)
    if bad.numel():
        terms = a.index_select(0, bad // n) * b.index_select(1, bad % n).t()  # [bad, K]: exact
        approx, bound = _split_sum(terms)
        fixed, still = _certified(approx, bound, fmt, rounding)
        if still.numel():
            digits = exact_sum(terms[still].numpy(), axis=1)
            fixed[still] = torch.from_numpy(digits.round(fmt, rounding))
        flat[bad] = fixed
    return flat.reshape(m, n).numpy()


def _certified(x: torch.Tensor, err: torch.Tensor, fmt: FloatFormat,
               rounding: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Values known only to lie within ``err`` of ``x``: ``(rounded, undecided)`` where
    ``rounded`` holds the rounding of every value in ``[x - err, x + err]`` (each end moved one
    float64 step outwards for the rounding of the subtraction) and ``undecided`` indexes those
    whose two ends round differently."""
    inf = torch.tensor(math.inf, dtype=torch.float64)
    wide = err > 0
    low = torch.where(wide, torch.nextafter(x - err, -inf), x)
    high = torch.where(wide, torch.nextafter(x + err, inf), x)
    out = _round_once(low, fmt, rounding)
    up = _round_once(high, fmt, rounding)
    undecided = (out != up) | (torch.signbit(out) != torch.signbit(up))
    return out, undecided.nonzero().squeeze(1)


def _split_sum(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, e)``: each row's sum of the float64 values ``p [r, K]`` within ``e`` of the exact one.

    Each row is cut on its own lattice: ``hi = round(p / q) q`` with ``q = 2**(t - W)``, 2**t above
    the row's largest magnitude and ``K 2**W <= 2**52``, so every ``hi`` is an integer of at most
    2**W times q and every partial sum of them is exact in any order; ``lo = p - hi`` is exact with
    ``|lo| <= q / 2``, summed with error at most ``gamma_K sum |lo|``; the final addition rounds once
    more (``u |s|``), unless every ``lo`` is zero: then ``s`` is the exact sum and ``e = 0``."""
    r, k = p.shape
    big = p.abs().amax(dim=1, keepdim=True)
    _, t = torch.frexp(big)  # big < 2**t
    width = 52 - math.ceil(math.log2(max(k, 2)))  # k * 2**width <= 2**52
    q = torch.ldexp(torch.ones_like(big), t.to(torch.float64) - width)
    hi = torch.round(p / q) * q  # exact: scaling by powers of two, rounding to an integer
    lo = p - hi  # exact
    s_hi = hi.sum(dim=1)  # exact (see above)
    lo_abs = lo.abs().sum(dim=1)
    s = s_hi + lo.sum(dim=1) + 0.0  # +0 for an exact zero
    grow = 1.0 + (k + 8) * 2.0**-52
    e = s.abs() * 2.0**-52 + lo_abs * ((k + 8) * 2.0**-52 * grow) * grow
    # no low parts (every product on the row's lattice, as for narrow inputs): s is the exact sum
    return s, torch.where(lo_abs == 0, torch.zeros_like(e), e)


class _Slots16(MatmulAlgorithm):
    name = "matmul_slots16"

    def roundings(self, k: int) -> int:
        """2 (product, then into the accumulator) + at most k - 1 additions on any path: a term
        of slot s passes n_s - 1 additions in its slot and one per later non-empty slot."""
        return 0 if k == 0 else k + 1

    def charged(self, k: int) -> int:
        return 0 if k == 0 else 3 * k - 1

    def __repr__(self) -> str:
        return f"{self.name}({self.format.name!r}, rounding={self.rounding!r})"

    def _run(self, a64: np.ndarray, b64: np.ndarray, fa: FloatFormat,
             fb: FloatFormat) -> torch.Tensor:  # fmt: skip
        terms = _product_terms(a64, b64, fa, fb, self.arith, fma=False)
        return _slots16(terms, self.arith)


def matmul_sequential(fmt: FormatLike, *, fma: bool = True,
                      rounding: str = NEAREST_EVEN) -> MatmulAlgorithm:  # fmt: skip
    """Products added one at a time, in index order, to an accumulator in ``fmt`` starting at +0."""
    return _Sequential(fmt, acc_mod.sequential(fmt, rounding=rounding), fma=fma, rounding=rounding)


def matmul_pairwise(fmt: FormatLike, *, fma: bool = True,
                    rounding: str = NEAREST_EVEN) -> MatmulAlgorithm:  # fmt: skip
    """Products added as a balanced tree, level by level, the odd element carried (the tree of
    ``tasks.kernels``' fp8-pairwise), then to an accumulator starting at +0."""
    return _Pairwise(fmt, acc_mod.pairwise(fmt, rounding=rounding), fma=fma, rounding=rounding)


def matmul_blocked(fmt: FormatLike, block_size: int, *, fma: bool = True,
                   rounding: str = NEAREST_EVEN) -> MatmulAlgorithm:  # fmt: skip
    """Sequential within blocks of ``block_size`` products, then sequential across block sums."""
    return _Blocked(fmt, block_size, fma=fma, rounding=rounding)


def matmul_exact_accumulation(fmt: FormatLike, *, rounding: str = NEAREST_EVEN) -> MatmulAlgorithm:
    """Exact products summed exactly, then rounded once to ``fmt``."""
    return _ExactAccumulation(fmt, None, fma=True, rounding=rounding)


def matmul_slots16(fmt: FormatLike, *, rounding: str = NEAREST_EVEN) -> MatmulAlgorithm:
    """Products rounded to ``fmt``, summed in 16 slots by magnitude; each slot in increasing
    magnitude with alternating signs, then the slots from the smallest up (:func:`orders.slots16`)."""
    return _Slots16(fmt, None, fma=False, rounding=rounding)


# ---------------------------------------------------------------------------------------------
# The operation's reference


class MatmulResult(_Bounded):
    """``A @ B`` as an operation: the exact result, ``rounded`` once to the output format, and the
    operation's bounds: those of computing in the output format in any order, with or without FMA
    (sequential with rounded products is the deepest such order: k + 1 roundings, 3k - 1 charged).
    The same bounds cover an implementation that computes in a more precise format (fp32 for bf16
    outputs) and rounds once to the output format at the end.
    """

    def __init__(self, a: Any, b: Any, out_format: FormatLike | None, rounding: str) -> None:
        default = get_format(out_format) if out_format is not None else _F32
        self._a64, self._b64, fa, fb, self._as_torch = _operands(a, b, default)
        if out_format is None:
            out_format = fa if fa == fb else _F32
        self.format = get_format(out_format)
        self.rounding = check_rounding(rounding)
        self.k = self._a64.shape[1]
        self._analysis = _Analysis(self._a64, self._b64)

    def roundings(self, k: int) -> int:
        return 0 if k == 0 else k + 1

    def charged(self, k: int) -> int:
        return 0 if k == 0 else 3 * k - 1

    @property
    def exact(self) -> np.ndarray:
        """The exact finite result as float64 (within one float64 spacing; NaN/inf where a product
        is NaN or infinite, as IEEE arithmetic gives them)."""
        an = self._analysis
        nan = an.nan | (an.pinf & an.ninf)
        inf = np.where(an.pinf, np.inf, -np.inf)
        return np.where(nan, np.nan, np.where(an.pinf | an.ninf, inf, an.hi))

    @property
    def rounded(self) -> Any:
        """The exact result rounded once to the output format, in the inputs' kind."""
        values = self._analysis.rounded(self.format, self.rounding)
        return to_output(values, self.format, self._as_torch)

    def exact_fraction(self, i: int, j: int) -> Fraction:
        """The exact finite result at ``[i, j]`` as a Fraction."""
        return self._analysis.exact.fraction((i, j))

    def model(self) -> ErrorModel:
        """The operation's error model for this K."""
        return self.error_model(self.k)

    def _own(self) -> Bounds:
        return self._analysis.bounds(self.format, self.error_model(self.k))

    def tolerance(self, a: Any = None, b: Any = None) -> np.ndarray:
        return self._own().tolerance() if a is None else super().tolerance(a, b)

    def finite_range(self, a: Any = None, b: Any = None) -> tuple[np.ndarray, np.ndarray]:
        return self._own().finite_range() if a is None else super().finite_range(a, b)

    def may_be(self, kind: str, a: Any = None, b: Any = None) -> np.ndarray:
        return self._own().may_be(kind) if a is None else super().may_be(kind, a, b)

    def covers(self, output: Any, a: Any = None, b: Any = None) -> np.ndarray:
        if a is not None:
            return super().covers(output, a, b)
        out, _ = to_float64(output)
        return self._own().covers(out)


def matmul(a: Any, b: Any, out_format: FormatLike | None = None, *,
           rounding: str = NEAREST_EVEN) -> MatmulResult:  # fmt: skip
    """The reference for ``A @ B``: exact, ``.rounded`` to ``out_format`` (default: the inputs'
    format if they share one, else fp32), and the operation's tolerance (:class:`MatmulResult`)."""
    return MatmulResult(a, b, out_format, rounding)
