"""The exact reference attention, forward and backward, and the decimal helpers the exact emulations
share.

:func:`exact_attention` and :func:`exact_attention_backward`: logits in Python fractions, exp and log
at 60 significant digits (``decimal``), everything else exact, rounded once to the output format (the
inputs' format for out and the gradients, fp32 for the logsumexp).  60 digits decide the rounding
unless the exact value lies within 10^-60 (relative) of a midpoint of the format, which for values
built from exponentials of nonzero rationals is not expected to happen.  Slow: for small shapes.
A fully masked row gives out 0, logsumexp -inf and zero gradients (PyTorch's safe softmax).
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .attention import AttentionResult, GradResult
from .attention_bounds import _float64, _values
from .formats import FORMATS, FloatFormat
from .rounding import round_fraction

__all__ = ["exact_attention", "exact_attention_backward"]

_F32 = FORMATS["fp32"]
_DIGITS = 60


def _dec(x: Fraction) -> decimal.Decimal:
    return decimal.Decimal(x.numerator) / decimal.Decimal(x.denominator)


def _ctx() -> decimal.Context:
    return decimal.Context(prec=_DIGITS, Emin=-999999, Emax=999999)


def _dexp(x: Fraction, base2: bool = False) -> Fraction:
    with decimal.localcontext(_ctx()):
        d = _dec(x)
        if base2:
            d = d * decimal.Decimal(2).ln()
        return Fraction(d.exp())


def _dlog(x: Fraction, base2: bool = False) -> Fraction:
    with decimal.localcontext(_ctx()):
        d = _dec(x).ln()
        if base2:
            d = d / decimal.Decimal(2).ln()
        return Fraction(d)


def _dsqrt(x: Fraction) -> Fraction:
    with decimal.localcontext(_ctx()):
        return Fraction(_dec(x).sqrt())


@dataclass
class _Inputs:
    q: np.ndarray  # [..., H, L, E] float64
    k: np.ndarray  # [..., H, S, E], expanded to the query heads
    v: np.ndarray
    allowed: np.ndarray  # [..., H, L, S]
    mask: np.ndarray | None  # float mask values (0 where masked), or None
    scale: Fraction  # the real scale (1/sqrt(E) to 60 digits when not given)
    fmt: FloatFormat
    group: int


def _inputs(q: Any, k: Any, v: Any, attn_mask: Any, is_causal: bool, scale: float | None,
            enable_gqa: bool) -> _Inputs:  # fmt: skip
    q64, fq = _values(q, "q")
    k64, _ = _values(k, "k")
    v64, _ = _values(v, "v")
    group = 1
    if q64.shape[:-2] != k64.shape[:-2]:
        if not enable_gqa:
            raise ValueError(f"q {q64.shape} and k {k64.shape} differ in leading dimensions")
        group = q64.shape[-3] // k64.shape[-3]
        k64, v64 = np.repeat(k64, group, axis=-3), np.repeat(v64, group, axis=-3)
    lq, sk = q64.shape[-2], k64.shape[-2]
    allowed = np.ones(q64.shape[:-2] + (lq, sk), dtype=bool)
    mask = None
    if is_causal:
        allowed &= np.tril(np.ones((lq, sk), dtype=bool))
    if attn_mask is not None:
        if str(getattr(attn_mask, "dtype", "")).endswith("bool"):
            mb = attn_mask.detach().cpu().numpy() if hasattr(attn_mask, "detach") else np.asarray(attn_mask)
            allowed &= np.broadcast_to(mb, allowed.shape)
        else:
            mf = np.broadcast_to(_float64(attn_mask), allowed.shape)
            allowed &= mf != -np.inf
            mask = np.where(allowed, mf, 0.0)
    s = Fraction(1) / _dsqrt(Fraction(q64.shape[-1])) if scale is None else Fraction(float(scale))
    return _Inputs(q64, k64, v64, allowed, mask, s, fq, group)


def _rows(x: _Inputs) -> list[tuple[int, ...]]:
    return list(np.ndindex(x.q.shape[:-2]))


def _exact_row(x: _Inputs, h: tuple[int, ...], i: int) -> tuple[list[Fraction] | None, Fraction]:
    """(softmax weights of row i of head h as Fractions (60-digit exps), logsumexp) or (None, 0)."""
    keys = [j for j in range(x.k.shape[-2]) if x.allowed[h + (i, j)]]
    if not keys:
        return None, Fraction(0)
    qrow = [Fraction(float(t)) for t in x.q[h + (i,)]]
    logits = {}
    for j in keys:
        dot = sum((a * Fraction(float(b)) for a, b in zip(qrow, x.k[h + (j,)], strict=True)), Fraction(0))
        s = dot * x.scale
        if x.mask is not None:
            s += Fraction(float(x.mask[h + (i, j)]))
        logits[j] = s
    m = max(logits.values())
    e = {j: _dexp(logits[j] - m) for j in keys}
    z = sum(e.values(), Fraction(0))
    p = [e[j] / z if j in e else Fraction(0) for j in range(x.k.shape[-2])]
    return p, m + _dlog(z)


def exact_attention(q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
                    scale: float | None = None, enable_gqa: bool = False) -> AttentionResult:  # fmt: skip
    """The exact attention (60 significant digits), rounded once: out to the inputs' format,
    logsumexp to fp32.  A fully masked row gives out 0 and logsumexp -inf (the safe softmax)."""
    x = _inputs(q, k, v, attn_mask, is_causal, scale, enable_gqa)
    out = np.zeros(x.q.shape[:-1] + (x.v.shape[-1],))
    lse = np.full(x.q.shape[:-1], -np.inf)
    for h in _rows(x):
        for i in range(x.q.shape[-2]):
            p, ls = _exact_row(x, h, i)
            if p is None:
                continue
            for jj in range(x.v.shape[-1]):
                val = sum((pk * Fraction(float(x.v[h + (kk, jj)])) for kk, pk in enumerate(p) if pk),
                          Fraction(0))  # fmt: skip
                out[h + (i, jj)] = round_fraction(val, x.fmt)
            lse[h + (i,)] = round_fraction(ls, _F32)
    return AttentionResult(out, lse)


def exact_attention_backward(q: Any, k: Any, v: Any, grad: Any, attn_mask: Any = None,
                             is_causal: bool = False, scale: float | None = None,
                             enable_gqa: bool = False) -> GradResult:  # fmt: skip
    """The exact gradients (60 significant digits) rounded once to the inputs' format."""
    x = _inputs(q, k, v, attn_mask, is_causal, scale, enable_gqa)
    g64, _ = _values(grad, "grad")
    lq, sk = x.q.shape[-2], x.k.shape[-2]
    fr = np.vectorize(lambda t: Fraction(float(t)), otypes=[object])
    dq = np.empty(x.q.shape, dtype=object)
    dk = np.empty(x.k.shape, dtype=object)
    dv = np.empty(x.v.shape, dtype=object)
    for h in _rows(x):
        qh, kh, vh, gh = fr(x.q[h]), fr(x.k[h]), fr(x.v[h]), fr(g64[h])
        pm = np.empty((lq, sk), dtype=object)
        for i in range(lq):
            p, _ = _exact_row(x, h, i)
            pm[i] = p if p is not None else [Fraction(0)] * sk
        dp = gh.dot(vh.T)
        dsm = np.empty((lq, sk), dtype=object)
        for i in range(lq):
            d = sum((pm[i, j] * dp[i, j] for j in range(sk)), Fraction(0))
            for j in range(sk):
                dsm[i, j] = pm[i, j] * (dp[i, j] - d)
        dq[h] = dsm.dot(kh) * x.scale
        dk[h] = dsm.T.dot(qh) * x.scale
        dv[h] = pm.T.dot(gh)
    if x.group > 1:
        sk_: tuple[int, ...] = tuple(dk.shape)
        sv_: tuple[int, ...] = tuple(dv.shape)
        dk = dk.reshape(sk_[:-3] + (sk_[-3] // x.group, x.group) + sk_[-2:]).sum(axis=-3)
        dv = dv.reshape(sv_[:-3] + (sv_[-3] // x.group, x.group) + sv_[-2:]).sum(axis=-3)
    rf = np.vectorize(lambda t: round_fraction(Fraction(t), x.fmt), otypes=[np.float64])
    return GradResult(rf(dq), rf(dk), rf(dv))
