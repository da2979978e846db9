"""Attention algorithms: forward and backward bounds of fused attention kernels.

Fused attention kernels round in places the definition of ``scaled_dot_product_attention`` does not.
:class:`AttentionAlgorithm` describes those places by method, following the numerics seed
(``seeds/001_f76128d442045203.txt``, "Attention algorithms"):

=====================  ==========================================================================
method                 what the kernel does
=====================  ==========================================================================
online_softmax=True    processes the keys in blocks with a running maximum and sum, rescaling
                       earlier partial sums
block_size=n           with online_softmax: at most ceil(S / n) blocks of at most n keys, in any
                       order (without it, any blocking)
exp2=True              computes the weights as exp2 of logits in base-2 units
weights="bfloat16"     rounds the weights to this format before the product with V (in the
                       backward, also P and dS)
accumulate="bfloat16"  does every accumulation in this format instead of the compute format
bias="bfloat16"        rounds float-mask values to this format before adding them (ALiBi biases
                       computed in lower precision)
reciprocal=True        normalizes by a rounded reciprocal of the row sum instead of dividing
=====================  ==========================================================================

The methods combine; with none, the bounds are the definition's: every operation of the definition
(``Q K^T``, the scale, the mask, max, exp, the row sum, the division, ``P V``) computed in the compute
format fp32 in any order of its sums, the output rounded once to the inputs' format (fp32, bf16 or
fp16).  Any format can stand in for "bfloat16".

An algorithm has ``tolerance()``, ``finite_range()``, ``may_be()`` and ``covers()``, taking the
arguments of ``scaled_dot_product_attention`` and returning an :class:`AttentionResult` with ``.out``
(``[..., L, Ev]``) and ``.logsumexp`` (``[..., L]``, natural log, fp32), and the ``backward_`` forms
for the gradients (a :class:`GradResult` with ``.dq``, ``.dk``, ``.dv``): given the forward's ``out``
and ``logsumexp``, a fused backward that recomputes P from logsumexp and takes D = rowsum(dO * O)
from out; without them, a backward that recomputes the softmax (PyTorch's math path).  No ``run()``:
kernels differ in details these methods leave open (:mod:`.attention_emulate` emulates concrete
ones exactly).  No error model: attention's error grows with the size of the logits, which no
formula in shapes and formats alone bounds.  docs/numerics.md ("Attention") derives every bound.

Conventions: a fully masked row (every key masked, by a boolean mask, ``-inf`` in a float mask or
the causal mask) has no softmax; its output may be NaN (the definition) or 0 (PyTorch's math path,
which uses a safe softmax), its logsumexp NaN or -inf, its gradients NaN or 0.  A row that touches a
NaN or infinite input may be NaN or +-inf and is never finite-covered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .attention_bounds import (
    _FLOAT64_UNITS,
    EXP_ULPS,
    SCALE_ROUNDINGS,
    _float64,
    _forward,
    _grads,
    _group_any,
    _Problem,
    _problem,
    _ulp,
    _Units,
    _values,
)
from .formats import FORMATS, FloatFormat, get_format
from .rounding import FormatLike, is_representable

__all__ = [
    "AttentionAlgorithm",
    "AttentionResult",
    "GradResult",
    "EXP_ULPS",
    "SCALE_ROUNDINGS",
    "STANDARDS",
    "COMPUTE_DTYPES",
]

_F32 = FORMATS["fp32"]
#: The compute format ``dtype="fp64"`` (not a storage format of the project, so not in FORMATS).
_F64 = FloatFormat("fp64", 64, 11, 52, -1022, 1023, True, "exponent all ones, mantissa != 0")
#: The compute formats the ``dtype`` option takes (fp16 is refused: its range lets logits, row sums
#: and unnormalised sums overflow, which these bounds do not charge).
COMPUTE_DTYPES = ("fp32", "bf16", "fp64")
#: The ``standard`` option: which reading of the definition's order of summation the bounds hold for
#: (docs/numerics.md, "Attention: the options").
STANDARDS = ("any-order", "sequential")
_SLACK = 1.0 + 2.0**-20  # the bound's own float64 evaluation, rounded up generously
_KINDS = ("nan", "inf", "zero")


@dataclass(frozen=True)
class _Options:
    """The options every bound method takes (module docstring)."""

    compute: FloatFormat
    standard: str
    flush: bool


def _options(dtype: Any, standard: str, flush_to_zero: bool) -> _Options:
    """Check and resolve ``dtype``, ``standard`` and ``flush_to_zero``; ValueError names what is allowed."""
    name = str(dtype).removeprefix("torch.").strip().lower() if isinstance(dtype, str) or \
        type(dtype).__module__ == "torch" else None
    if name in ("fp64", "float64", "double"):
        compute = _F64
    else:
        try:
            compute = get_format(dtype)
        except ValueError as exc:
            raise ValueError(f"dtype {dtype!r}: allowed compute formats {', '.join(COMPUTE_DTYPES)}") from exc
        if compute.name not in COMPUTE_DTYPES:
            raise ValueError(f"dtype {compute.name}: allowed compute formats {', '.join(COMPUTE_DTYPES)} (fp16 "
                             "compute is not bounded: its range lets intermediate sums overflow)")
    if standard not in STANDARDS:
        raise ValueError(f"standard must be one of {', '.join(STANDARDS)}, got {standard!r}")
    if not isinstance(flush_to_zero, bool):
        raise ValueError(f"flush_to_zero must be True or False, got {flush_to_zero!r}")
    return _Options(compute, standard, flush_to_zero)


def _eta(f: FloatFormat, flush: bool) -> float:
    """The absolute error of one rounding to ``f`` in its subnormal range: half the smallest
    subnormal with gradual underflow, the smallest normal when subnormal results are flushed."""
    return f.min_normal if flush else f.min_subnormal / 2


def _input_rounding(p: _Problem, c: FloatFormat, flush: bool) -> tuple[float, float]:
    """``(u_in, eta_in)``: the relative and absolute error of converting an input (q, k, v, the
    float mask) to the compute format ``c``: ``(0, 0)`` when every value is one of ``c``'s (with
    ``flush``, none a subnormal of ``c``), else ``c``'s unit roundoff and :func:`_eta`."""
    if c.mantissa_bits >= p.fmt.mantissa_bits and c.emin <= p.fmt.emin - p.fmt.mantissa_bits:
        return 0.0, 0.0  # every value of the inputs' format is a normal value of c
    xs = [x[np.isfinite(x)] for x in (p.q, p.k, p.v, p.bias)]
    exact = all(bool(np.all(is_representable(x, c))) for x in xs)
    sub = flush and any(bool(np.any((x != 0) & (np.abs(x) < c.min_normal))) for x in xs)
    if exact and not sub:
        return 0.0, 0.0
    return (0.0 if exact else c.unit_roundoff), _eta(c, flush)


def _prepare(p: _Problem, dtype: Any, standard: str, flush_to_zero: bool) -> _Options:
    """The options, checked; a row that touches an input beyond the compute format's range (it
    becomes infinite there) is marked as touching an infinite input."""
    opt = _options(dtype, standard, flush_to_zero)
    big = opt.compute.max_finite
    if big < p.fmt.max_finite:
        q_big = (np.abs(np.where(np.isfinite(p.q), p.q, 0.0)) > big).any(axis=-1)
        kv_big = np.asarray((np.abs(np.where(np.isfinite(p.k), p.k, 0.0)) > big).any(axis=-1) | (
            np.abs(np.where(np.isfinite(p.v), p.v, 0.0)) > big).any(axis=-1))
        p.nonfinite_row = p.nonfinite_row | q_big | (p.allowed & kv_big[..., None, :]).any(axis=-1)
    return opt


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class AttentionResult:
    """Per-element results for the forward: ``.out`` ``[..., L, Ev]`` and ``.logsumexp`` ``[..., L]``.

    Each is a float64 array (tolerances), a ``(low, high)`` pair (finite ranges) or a bool array
    (``may_be``, ``covers``; ``covers`` leaves ``.logsumexp`` None when no logsumexp was given).
    """

    out: Any
    logsumexp: Any

    @property
    def output(self) -> Any:
        """The seed's name for ``.out``."""
        return self.out

    def __getitem__(self, key: str) -> Any:
        if key in ("out", "output"):
            return self.out
        if key == "logsumexp":
            return self.logsumexp
        raise KeyError(f"{key!r}: an attention result has 'out' (or 'output') and 'logsumexp'")

    def all(self) -> bool:
        """For bool results: every element of both parts is True (a missing part counts as True)."""
        return all(bool(np.all(x)) for x in (self.out, self.logsumexp) if x is not None)


@dataclass(frozen=True)
class GradResult:
    """Per-element results for the backward: ``.dq``, ``.dk`` and ``.dv``, shaped like q, k, v."""

    dq: Any
    dk: Any
    dv: Any

    def __getitem__(self, key: str) -> Any:
        if key not in ("dq", "dk", "dv"):
            raise KeyError(f"{key!r}: a gradient result has 'dq', 'dk' and 'dv'")
        return getattr(self, key)

    def all(self) -> bool:
        """For bool results: every element of the three gradients is True."""
        return all(bool(np.all(x)) for x in (self.dq, self.dk, self.dv))


# ---------------------------------------------------------------------------------------------
# The algorithm


class AttentionAlgorithm:
    """The places a fused attention kernel rounds (see the module docstring for the methods)."""

    def __init__(self, *, online_softmax: bool = False, block_size: int | None = None,
                 exp2: bool = False, weights: FormatLike | None = None,
                 accumulate: FormatLike | None = None, bias: FormatLike | None = None,
                 reciprocal: bool = False) -> None:  # fmt: skip
        if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int)
                                       or block_size < 1):  # fmt: skip
            raise ValueError(f"block_size must be an integer >= 1 or None, got {block_size!r}")
        self.online_softmax = bool(online_softmax)
        self.block_size = block_size
        self.exp2 = bool(exp2)
        self.weights = None if weights is None else get_format(weights)
        self.accumulate = None if accumulate is None else get_format(accumulate)
        self.bias = None if bias is None else get_format(bias)
        self.reciprocal = bool(reciprocal)
        self.compute = _F32  # the default compute format; the methods' ``dtype`` option changes it

    def __repr__(self) -> str:
        parts = []
        if self.online_softmax:
            parts.append("online_softmax=True")
        if self.block_size is not None:
            parts.append(f"block_size={self.block_size}")
        if self.exp2:
            parts.append("exp2=True")
        for name in ("weights", "accumulate", "bias"):
            f = getattr(self, name)
            if f is not None:
                parts.append(f"{name}={f.name!r}")
        if self.reciprocal:
            parts.append("reciprocal=True")
        return f"AttentionAlgorithm({', '.join(parts)})"

    def _units(self, p: _Problem, opt: _Options | None = None) -> _Units:
        opt = opt or _Options(_F32, "any-order", False)
        c = opt.compute
        a = self.accumulate or c
        w, b = self.weights, self.bias
        uw = w.unit_roundoff if w is not None and w.unit_roundoff > c.unit_roundoff else 0.0
        # rounding mask values that are already values of the bias format changes nothing
        ub = b.unit_roundoff if b is not None and not np.all(is_representable(p.bias, b)) else 0.0
        u_in, eta_in = _input_rounding(p, c, opt.flush)
        fl = opt.flush
        return _Units(
            c.unit_roundoff, a.unit_roundoff, uw, ub, _eta(c, fl), _eta(a, fl),
            (_eta(w, fl) if w is not None else 0.0), c.eps, self.online_softmax,
            self.block_size, self.exp2, 2 if self.reciprocal else 1,
            u_in, eta_in, opt.standard == "sequential" and not self.online_softmax,
        )  # fmt: skip

    # -- forward ----------------------------------------------------------------------------
    def _forward_bounds(self, p: _Problem, ulps: float, opt: _Options) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # 0 * inf: no bound
            c64 = _forward(p, _FLOAT64_UNITS)  # the centre's own float64 error
            fw = _forward(p, self._units(p, opt), o_err=c64.out_c)  # step 7b needs |p.o - o|
        f = p.fmt
        tol_c = (fw.out_c + c64.out_c) * _SLACK
        with np.errstate(invalid="ignore", over="ignore"):
            out = (tol_c + f.unit_roundoff * (np.abs(p.o) + tol_c) + _eta(f, opt.flush)) * _SLACK
            lse = (fw.lse + c64.lse) * _SLACK
            if opt.compute is not _F32:  # computed in another format, returned in fp32: one more rounding
                lse = (lse + _F32.unit_roundoff * (np.abs(p.lse) + lse) + _eta(_F32, opt.flush)) * _SLACK
            if ulps:
                out = out + ulps * _ulp(np.abs(p.o) + out, f)
                lse = lse + ulps * _ulp(np.abs(p.lse) + lse, f)
        bad = p.nonfinite_row
        out = np.where(bad[..., None], np.inf, np.where(p.empty[..., None], 0.0, out))
        lse = np.where(bad | p.empty, np.inf, lse)
        return np.asarray(out), np.asarray(lse)

    def tolerance(self, q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
                  scale: float | None = None, enable_gqa: bool = False, *,
                  ulps: float = 0, dtype: Any = "fp32", standard: str = "any-order",
                  flush_to_zero: bool = False) -> AttentionResult:  # fmt: skip
        """Elementwise bound on ``|computed - exact|`` for the output and the logsumexp.

        ``ulps`` widens both by that many spacings of the inputs' format (for the logsumexp too,
        although it is returned in fp32: PyTorch's CPU flash kernel needs ``ulps=8`` there for
        bfloat16 and float16 inputs).  Infinite where a row touches a NaN or inf input; 0 for
        the output of a fully masked row (NaN is covered there too, see ``covers``).
        """
        p = _problem(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        opt = _prepare(p, dtype, standard, flush_to_zero)
        out, lse = self._forward_bounds(p, ulps, opt)
        return AttentionResult(out, lse)

    def finite_range(self, q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
                     scale: float | None = None, enable_gqa: bool = False, *,
                     ulps: float = 0, dtype: Any = "fp32", standard: str = "any-order",
                  flush_to_zero: bool = False) -> AttentionResult:  # fmt: skip
        """``(low, high)`` for the output and the logsumexp; empty (low > high) where no finite
        value is possible (a row touching NaN or inf inputs; a fully masked row's logsumexp)."""
        p = _problem(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        opt = _prepare(p, dtype, standard, flush_to_zero)
        return AttentionResult(*self._ranges(p, ulps, opt))

    def _ranges(self, p: _Problem, ulps: float, opt: _Options) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        out, lse = self._forward_bounds(p, ulps, opt)
        f = p.fmt
        bad = p.nonfinite_row
        with np.errstate(invalid="ignore"):
            o_lo = np.maximum(p.o - out, -f.max_finite)
            o_hi = np.minimum(p.o + out, f.max_finite)
            l_lo = p.lse - lse
            l_hi = p.lse + lse
        o_ok = ~bad[..., None] & (o_lo <= o_hi)
        l_ok = ~(bad | p.empty)
        return (
            (np.where(o_ok, o_lo, np.inf), np.where(o_ok, o_hi, -np.inf)),
            (np.where(l_ok, l_lo, np.inf), np.where(l_ok, l_hi, -np.inf)),
        )

    def may_be(self, kind: str, q: Any, k: Any, v: Any, attn_mask: Any = None,
               is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False, *,
               ulps: float = 0, dtype: Any = "fp32", standard: str = "any-order",
                  flush_to_zero: bool = False) -> AttentionResult:  # fmt: skip
        """Elementwise: can the output / logsumexp be ``"nan"``, ``"inf"`` (either sign) or ``"zero"``?"""
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(_KINDS)}, got {kind!r}")
        p = _problem(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        opt = _prepare(p, dtype, standard, flush_to_zero)
        (o_lo, o_hi), (l_lo, l_hi) = self._ranges(p, ulps, opt)
        bad, empty = p.nonfinite_row, p.empty
        if kind == "zero":
            return AttentionResult((o_lo <= 0) & (o_hi >= 0), (l_lo <= 0) & (l_hi >= 0))
        if kind == "nan":
            row = bad | empty
            return AttentionResult(np.broadcast_to(row[..., None], o_lo.shape).copy(), row)
        return AttentionResult(np.broadcast_to(bad[..., None], o_lo.shape).copy(), bad | empty)

    def covers(self, out: Any, q: Any, k: Any, v: Any, attn_mask: Any = None,
               is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False, *,
               logsumexp: Any = None, ulps: float = 0, dtype: Any = "fp32", standard: str = "any-order",
                  flush_to_zero: bool = False) -> AttentionResult:  # fmt: skip
        """Elementwise: is ``out`` (and ``logsumexp``, if given) within the bounds?

        A fully masked row's output is covered as NaN or 0, its logsumexp as NaN or -inf.
        """
        p = _problem(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        opt = _prepare(p, dtype, standard, flush_to_zero)
        (o_lo, o_hi), (l_lo, l_hi) = self._ranges(p, ulps, opt)
        o = _float64(out)
        bad, empty = p.nonfinite_row[..., None], p.empty[..., None]
        with np.errstate(invalid="ignore"):
            ok = (np.isfinite(o) & (o >= o_lo) & (o <= o_hi)) | (bad & ~np.isfinite(o))
            ok |= empty & (np.isnan(o) | (o == 0))
        lse_ok = None
        if logsumexp is not None:
            ls = _float64(logsumexp).reshape(p.lse.shape)
            with np.errstate(invalid="ignore"):
                lse_ok = (np.isfinite(ls) & (ls >= l_lo) & (ls <= l_hi)) | (
                    p.nonfinite_row & ~np.isfinite(ls)) | (p.empty & (np.isnan(ls) | (ls == -np.inf)))
        return AttentionResult(np.asarray(ok), lse_ok)

    # -- backward ---------------------------------------------------------------------------
    def _backward(self, p: _Problem, grad: Any, out: Any, logsumexp: Any, ulps: float,
                  opt: _Options) -> tuple[GradResult, GradResult, GradResult]:  # fmt: skip
        """``(centres, tolerances, no finite value)`` of dq, dk, dv.  An infinite tolerance
        alone means no useful bound (any finite value); the third part marks the elements that
        touch a NaN or infinite input and cannot be finite."""
        g64, fg = _values(grad, "grad")
        if g64.shape != p.o.shape:
            raise ValueError(f"grad must have the output's shape {p.o.shape}, got {g64.shape}")
        fused = out is not None or logsumexp is not None
        if fused and (out is None or logsumexp is None):
            raise ValueError("a fused backward needs both out and logsumexp (or neither)")
        un = self._units(p, opt)
        if un.u_in or un.eta_in or not np.all(is_representable(g64[np.isfinite(g64)], opt.compute)):
            raise ValueError(
                f"backward bounds for inputs (or grad) that change on conversion to the compute format "
                f"{opt.compute.name}{' (subnormals flushed)' if opt.flush else ''} are not derived: pass inputs "
                "of that format (without subnormals when flush_to_zero=True), or a wider dtype")
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # 0 * inf: no bound
            cen, err = _grads(p, g64, un, out, logsumexp)
            _, err64 = _grads(p, g64, _FLOAT64_UNITS, None, None)
        f = p.fmt
        tols = []
        for c, e, e64 in zip(cen, err, err64, strict=True):
            t = (e + e64) * _SLACK
            with np.errstate(invalid="ignore", over="ignore"):
                t = (t + f.unit_roundoff * (np.abs(c) + t) + _eta(f, opt.flush)) * _SLACK
                if ulps:
                    t = t + ulps * _ulp(np.abs(c) + t, f)
            tols.append(np.asarray(t))
        dq, dk, dv = cen
        tq, tk, tv = tols
        bad = p.nonfinite_row[..., None] | ~np.isfinite(g64).all(axis=-1, keepdims=True)
        bq = np.broadcast_to(bad, tq.shape)
        keyrow = _group_any((p.allowed & bad).any(axis=-2)[..., None], p)  # keys a bad row attends
        bk, bv = np.broadcast_to(keyrow, tk.shape), np.broadcast_to(keyrow, tv.shape)
        tq, tk, tv = np.where(bq, np.inf, tq), np.where(bk, np.inf, tk), np.where(bv, np.inf, tv)
        return GradResult(dq, dk, dv), GradResult(tq, tk, tv), GradResult(bq, bk, bv)

    def backward_tolerance(self, q: Any, k: Any, v: Any, grad: Any, out: Any = None,
                           logsumexp: Any = None, attn_mask: Any = None, is_causal: bool = False,
                           scale: float | None = None, enable_gqa: bool = False, *,
                           ulps: float = 0, dtype: Any = "fp32", standard: str = "any-order",
                  flush_to_zero: bool = False) -> GradResult:  # fmt: skip
        """Elementwise bounds on ``|dq|``, ``|dk|``, ``|dv|`` errors for the output gradient ``grad``.

        With ``out`` and ``logsumexp`` (the forward's, as computed): a fused backward that recomputes
        P from logsumexp and takes D = rowsum(grad * out); the bound charges their actual distance
        from the exact values.  Without them: a backward that recomputes the softmax.
        """
        p = _problem(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        opt = _prepare(p, dtype, standard, flush_to_zero)
        return self._backward(p, grad, out, logsumexp, ulps, opt)[1]

    def backward_finite_range(self, q: Any, k: Any, v: Any, grad: Any, out: Any = None,
                              logsumexp: Any = None, attn_mask: Any = None,
                              is_causal: bool = False, scale: float | None = None,
                              enable_gqa: bool = False, *, ulps: float = 0, dtype: Any = "fp32", standard: str = "any-order",
                  flush_to_zero: bool = False) -> GradResult:  # fmt: skip
        """``(low, high)`` for each gradient; empty where no finite value is possible."""
        p = _problem(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        opt = _prepare(p, dtype, standard, flush_to_zero)
        return self._grad_ranges(p, grad, out, logsumexp, ulps, opt)

    def _grad_ranges(self, p: _Problem, grad: Any, out: Any, logsumexp: Any, ulps: float,
                     opt: _Options) -> GradResult:  # fmt: skip
        cen, tol, bad = self._backward(p, grad, out, logsumexp, ulps, opt)
        m = p.fmt.max_finite
        parts = []
        for c, t, b in zip((cen.dq, cen.dk, cen.dv), (tol.dq, tol.dk, tol.dv), (bad.dq, bad.dk, bad.dv),
                           strict=True):  # fmt: skip
            with np.errstate(invalid="ignore"):
                lo, hi = np.maximum(c - t, -m), np.minimum(c + t, m)
            ok = ~b & (lo <= hi)
            parts.append((np.where(ok, lo, np.inf), np.where(ok, hi, -np.inf)))
        return GradResult(*parts)

    def backward_may_be(self, kind: str, q: Any, k: Any, v: Any, grad: Any, out: Any = None,
                        logsumexp: Any = None, attn_mask: Any = None, is_causal: bool = False,
                        scale: float | None = None, enable_gqa: bool = False, *,
                        ulps: float = 0, dtype: Any = "fp32", standard: str = "any-order",
                  flush_to_zero: bool = False) -> GradResult:  # fmt: skip
        """Elementwise: can each gradient be ``"nan"``, ``"inf"`` or ``"zero"``?"""
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(_KINDS)}, got {kind!r}")
        p = _problem(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        opt = _prepare(p, dtype, standard, flush_to_zero)
        ranges = self._grad_ranges(p, grad, out, logsumexp, ulps, opt)
        parts = []
        for lo, hi in (ranges.dq, ranges.dk, ranges.dv):
            if kind == "zero":
                parts.append((lo <= 0) & (hi >= 0))
            else:
                parts.append(lo > hi)
        if kind == "nan":  # fully masked rows: NaN by the definition
            parts[0] = parts[0] | p.empty[..., None]
        return GradResult(*parts)

    def backward_covers(self, grads: Any, q: Any, k: Any, v: Any, grad: Any, out: Any = None,
                        logsumexp: Any = None, attn_mask: Any = None, is_causal: bool = False,
                        scale: float | None = None, enable_gqa: bool = False, *,
                        ulps: float = 0, dtype: Any = "fp32", standard: str = "any-order",
                  flush_to_zero: bool = False) -> GradResult:  # fmt: skip
        """Elementwise: are ``grads = (dq, dk, dv)`` within the bounds?  A fully masked row's dq
        may be NaN or 0 (its keys' dk and dv get nothing from it)."""
        p = _problem(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        opt = _prepare(p, dtype, standard, flush_to_zero)
        ranges = self._grad_ranges(p, grad, out, logsumexp, ulps, opt)
        dq, dk, dv = (grads["dq"], grads["dk"], grads["dv"]) if isinstance(grads, dict | GradResult) else grads
        res = []
        for x, (lo, hi) in zip((dq, dk, dv), (ranges.dq, ranges.dk, ranges.dv), strict=True):
            g = _float64(x)
            with np.errstate(invalid="ignore"):
                res.append((np.isfinite(g) & (g >= lo) & (g <= hi)) | (~np.isfinite(g) & (lo > hi)))
        res[0] = res[0] | (p.empty[..., None] & (np.isnan(_float64(dq)) | (_float64(dq) == 0)))
        return GradResult(*res)
