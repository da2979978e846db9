"""Exact emulations of concrete attention kernels, and the exact reference attention.

:class:`AttentionKernel` is one way of computing ``scaled_dot_product_attention`` and its backward,
every operation rounded once to a stated format, emulated exactly: a kernel is a choice of methods
(online softmax with blocks of n keys in a given order, exp2 of base-2 logits, weights rounded to a
format, accumulation in a format, float-mask values rounded, a reciprocal normalisation, the scale
applied to the logits or as sqrt(scale) to q and k) and ``forward()`` / ``backward()`` return what
that kernel computes.  The kernels of :data:`KERNELS` are the ones the tests hold against
:class:`.attention.AttentionAlgorithm`, including planted ones that round where their algorithm does
not allow.

Exactness: every operation takes values of formats of at most 24 significant bits.  ``+ - * /`` are
computed in float64 and rounded once with :func:`.rounding.round_to_format` (innocuous double
rounding, 53 >= 2 * 24 + 2: Figueroa 1995); a fused multiply-add ``acc + a * b`` takes the exact
float64 product and TwoSum's exact remainder; ``exp``, ``exp2``, ``log`` and ``log2`` are
correctly rounded: numpy's float64 value, certified where both ends of a +-2^-50 relative interval
round to the same value, recomputed with ``decimal`` at 60 digits where they do not.  The same kernel
code runs on Python fractions (``arith="exact"``, every operation exact then :func:`round_fraction`,
the transcendental ones at 60 digits): the tests check the two bit for bit.

:func:`exact_attention` and :func:`exact_attention_backward` (from :mod:`.attention_reference`,
re-exported here) are the reference: logits in fractions, exp and log at 60 significant digits,
everything else exact, rounded once to the output format (the inputs' format for out and the
gradients, fp32 for the logsumexp).  Slow: for small shapes.

Fully masked rows follow PyTorch's math path (a safe softmax): output 0, logsumexp -inf, gradients 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np

from .attention import AttentionResult, GradResult
from .attention_bounds import _float64, _values
from .attention_reference import (
    _dexp,
    _dlog,
    _dsqrt,
    _Inputs,
    _inputs,
    exact_attention,
    exact_attention_backward,
)
from .formats import FORMATS, FloatFormat, get_format
from .rounding import round_fraction, round_to_format, two_sum

__all__ = [
    "AttentionKernel",
    "KERNELS",
    "DESCRIBED_BY",
    "PLANTED",
    "exact_attention",
    "exact_attention_backward",
]

_F32 = FORMATS["fp32"]
_CERT = 2.0**-50


# ---------------------------------------------------------------------------------------------
# Two arithmetics with the same operations


class _Fast:
    """float64 arrays; each operation rounded once (see the module docstring for why it is exact)."""

    exact = False

    def val(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)

    def const(self, x: Fraction, f: FloatFormat) -> np.ndarray:
        return np.asarray(round_fraction(x, f))

    def out(self, x: Any) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)

    def rnd(self, x: Any, f: FloatFormat) -> np.ndarray:
        return round_to_format(x, f)

    def add(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        return round_to_format(np.asarray(x) + y, f)

    def sub(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        return round_to_format(np.asarray(x) - y, f)

    def mul(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        return round_to_format(np.asarray(x) * y, f)

    def div(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return round_to_format(np.asarray(x) / y, f)

    def fma(self, acc: Any, a: Any, b: Any, f: FloatFormat) -> np.ndarray:
        s, e = two_sum(acc, np.asarray(a) * b)  # the product is exact in float64
        return round_to_format(s, f, e)

    def _certified(self, x: Any, f: FloatFormat, fast: Callable[[np.ndarray], np.ndarray],
                   slow: Callable[[Fraction], Fraction]) -> np.ndarray:  # fmt: skip
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            y = fast(x)
            lo = round_to_format(y * (1 - _CERT), f)
            hi = round_to_format(y * (1 + _CERT), f)
        out = np.where(lo == hi, lo, np.nan)
        todo = ~(lo == hi)
        if np.any(todo):
            flat_x, flat = x[todo], out[todo]
            for i, xv in enumerate(flat_x):
                flat[i] = round_fraction(slow(Fraction(float(xv))), f)
            out[todo] = flat
        return np.asarray(out)

    def exp(self, x: Any, f: FloatFormat, base2: bool = False) -> np.ndarray:
        return self._certified(x, f, np.exp2 if base2 else np.exp, lambda z: _dexp(z, base2))

    def log(self, x: Any, f: FloatFormat, base2: bool = False) -> np.ndarray:
        return self._certified(x, f, np.log2 if base2 else np.log, lambda z: _dlog(z, base2))

    def gt(self, x: Any, y: Any) -> np.ndarray:
        return np.asarray(np.asarray(x) > y, dtype=bool)

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape)


def _obj(shape: tuple[int, ...], value: Fraction = Fraction(0)) -> np.ndarray:
    a = np.empty(shape, dtype=object)
    a.fill(value)
    return a


class _Exact(_Fast):
    """Object arrays of Fractions: every operation exact, then :func:`round_fraction`."""

    exact = True

    def val(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        out = np.empty(x.shape, dtype=object)
        for idx, xv in np.ndenumerate(x):
            out[idx] = Fraction(float(xv))
        return out

    def const(self, x: Fraction, f: FloatFormat) -> Any:
        return Fraction(round_fraction(x, f))

    def out(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=object)
        return np.vectorize(float, otypes=[np.float64])(x) if x.size else np.zeros(x.shape)

    def _map(self, fn: Callable[..., Fraction], *xs: Any) -> np.ndarray:
        arrs = np.broadcast_arrays(*[np.asarray(x, dtype=object) for x in xs])
        out = np.empty(arrs[0].shape, dtype=object)
        for idx in np.ndindex(out.shape):
            out[idx] = fn(*[a[idx] for a in arrs])
        return out

    def rnd(self, x: Any, f: FloatFormat) -> np.ndarray:
        return self._map(lambda a: Fraction(round_fraction(Fraction(a), f)), x)

    def add(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        return self._map(lambda a, b: Fraction(round_fraction(a + b, f)), x, y)

    def sub(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        return self._map(lambda a, b: Fraction(round_fraction(a - b, f)), x, y)

    def mul(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        return self._map(lambda a, b: Fraction(round_fraction(a * b, f)), x, y)

    def div(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        return self._map(lambda a, b: Fraction(round_fraction(Fraction(a) / b, f)) if b != 0
                         else Fraction(0), x, y)  # fmt: skip

    def fma(self, acc: Any, a: Any, b: Any, f: FloatFormat) -> np.ndarray:
        return self._map(lambda s, x, y: Fraction(round_fraction(s + x * y, f)), acc, a, b)

    def exp(self, x: Any, f: FloatFormat, base2: bool = False) -> np.ndarray:
        return self._map(lambda a: Fraction(round_fraction(_dexp(Fraction(a), base2), f)), x)

    def log(self, x: Any, f: FloatFormat, base2: bool = False) -> np.ndarray:
        return self._map(lambda a: Fraction(round_fraction(_dlog(Fraction(a), base2), f)), x)

    def gt(self, x: Any, y: Any) -> np.ndarray:
        return np.asarray(self._map(lambda a, b: a > b, x, y), dtype=bool)

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return _obj(shape)


_ARITH = {"fast": _Fast(), "exact": _Exact()}


def _where(c: np.ndarray, a: Any, b: Any) -> np.ndarray:
    return np.asarray(np.where(c, a, b))


def _group_sum(ar: _Fast, x: np.ndarray, group: int, f: FloatFormat) -> np.ndarray:
    """Add the query heads of each key head in order, in ``f`` (GQA's dk and dv)."""
    if group == 1:
        return x
    sh = x.shape
    xs = x.reshape(sh[:-3] + (sh[-3] // group, group) + sh[-2:])
    acc = xs[..., 0, :, :]
    for g in range(1, group):
        acc = ar.add(acc, xs[..., g, :, :], f)
    return np.asarray(acc)


# ---------------------------------------------------------------------------------------------
# Kernels


@dataclass(frozen=True)
class AttentionKernel:
    """One concrete attention kernel (its forward and its backward), emulated exactly.

    Attributes:
        name: a label.
        online_softmax: running maximum and sum over blocks of ``block_size`` keys (None: one block).
        block_size: keys per block of the online softmax.
        key_order: ``"forward"`` or ``"reverse"``: the order of the keys in every sum over keys
            (and of the blocks).
        exp2: weights as exp2 of logits multiplied by a rounded log2(e); logsumexp converted back
            with a rounded ln(2).
        weights: format the weights are rounded to before the product with V (backward: also P and
            dS); None: the compute format.
        accumulate: format of every accumulation (dot products, row sums, P V); None: fp32.
        bias: format the float-mask values are rounded to before they are added; None: exact.
        reciprocal: normalise by a rounded 1 / rowsum, then multiply.
        normalize: ``"first"`` (P = e / rowsum, then P V: the math path) or ``"last"`` (acc / rowsum:
            flash); None: last with online_softmax, else first.
        scale_mode: ``"direct"`` (logit * rounded scale) or ``"sqrt"`` (q and k each multiplied by a
            rounded sqrt(scale), as PyTorch's math path does).
    """

    name: str
    online_softmax: bool = False
    block_size: int | None = None
    key_order: str = "forward"
    exp2: bool = False
    weights: str | None = None
    accumulate: str | None = None
    bias: str | None = None
    reciprocal: bool = False
    normalize: str | None = None
    scale_mode: str = "direct"

    def __post_init__(self) -> None:
        if self.key_order not in ("forward", "reverse"):
            raise ValueError(f"key_order must be 'forward' or 'reverse', got {self.key_order!r}")
        if self.normalize not in (None, "first", "last"):
            raise ValueError(f"normalize must be 'first', 'last' or None, got {self.normalize!r}")
        if self.scale_mode not in ("direct", "sqrt"):
            raise ValueError(f"scale_mode must be 'direct' or 'sqrt', got {self.scale_mode!r}")

    def with_(self, **changes: Any) -> AttentionKernel:
        """A copy with some fields changed."""
        return replace(self, **changes)

    # -- pieces -----------------------------------------------------------------------------
    def _fmts(self) -> tuple[FloatFormat, FloatFormat, FloatFormat | None, FloatFormat | None]:
        c = _F32
        a = get_format(self.accumulate) if self.accumulate else c
        w = get_format(self.weights) if self.weights else None
        b = get_format(self.bias) if self.bias else None
        return c, a, w, b

    def _keys(self, n: int) -> list[int]:
        return list(range(n)) if self.key_order == "forward" else list(range(n - 1, -1, -1))

    def _scaled(self, ar: _Fast, x: _Inputs) -> tuple[Any, Any, Any, Any]:
        """(q', k', the scale applied to dot products or None, the scale for the gradients)."""
        c, *_ = self._fmts()
        q, k = ar.val(x.q), ar.val(x.k)
        if self.scale_mode == "sqrt":
            cs = ar.const(_dsqrt(x.scale), c)
            return ar.mul(q, cs, c), ar.mul(k, cs, c), None, cs
        sc = ar.const(x.scale, c)
        return q, k, sc, sc

    def _logits(self, ar: _Fast, x: _Inputs) -> tuple[list[Any], Any, Any, Any]:
        """Per key, the logit row ``[..., H, L]`` as the kernel computes it (base 2 with exp2), and
        (q', k', scale) for the backward."""
        c, a, _, b = self._fmts()
        q, k, sc, _ = self._scaled(ar, x)
        e_dim = x.q.shape[-1]
        mask = None if x.mask is None else ar.val(x.mask)
        if mask is not None and b is not None:
            mask = ar.rnd(mask, b)
        l2e = ar.const(Fraction(1) / _dlog(Fraction(2)), c) if self.exp2 else None
        out = []
        for j in range(x.k.shape[-2]):
            acc = ar.zeros(x.q.shape[:-1])
            for e in range(e_dim):
                acc = ar.fma(acc, q[..., :, e], k[..., j : j + 1, e], a)
            s = acc if sc is None else ar.mul(acc, sc, c)
            if mask is not None:
                s = ar.add(s, mask[..., j], c)
            if l2e is not None:
                s = ar.mul(s, l2e, c)
            out.append(_where(x.allowed[..., j], s, ar.zeros(s.shape)))
        return out, q, k, sc

    def _softmax_first(self, ar: _Fast, x: _Inputs, s: list[Any]) -> tuple[list[Any], Any, Any]:
        """Non-online softmax: (per key P (normalised, compute format), row max, row sum)."""
        c, a, _, _ = self._fmts()
        allowed = x.allowed
        m, has = ar.zeros(s[0].shape), np.zeros(s[0].shape, dtype=bool)
        for j in range(len(s)):
            take = allowed[..., j] & (~has | ar.gt(s[j], m))
            m, has = _where(take, s[j], m), has | allowed[..., j]
        e = []
        for j in range(len(s)):
            d = _where(allowed[..., j], ar.sub(s[j], m, c), ar.zeros(m.shape))
            e.append(_where(allowed[..., j], ar.exp(d, c, self.exp2), ar.zeros(m.shape)))
        z = ar.zeros(m.shape)
        for j in self._keys(len(s)):
            z = _where(allowed[..., j], ar.add(z, e[j], a), z)
        return e, m, _where(has, z, ar.zeros(m.shape) + 1)  # a fully masked row: 1, not 0 / 0

    def _normalise(self, ar: _Fast, num: Any, z: Any) -> Any:
        c = _F32
        if self.reciprocal:
            return ar.mul(num, ar.div(ar.zeros(np.shape(z)) + 1, z, c), c)
        return ar.div(num, z, c)

    def _lse(self, ar: _Fast, m: Any, z: Any) -> Any:
        c = _F32
        if self.exp2:
            ln2 = ar.const(_dlog(Fraction(2)), c)
            return ar.mul(ar.add(m, ar.log(z, c, True), c), ln2, c)
        return ar.add(m, ar.log(z, c), c)

    # -- forward ----------------------------------------------------------------------------
    def forward(self, q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
                scale: float | None = None, enable_gqa: bool = False, *,
                arith: str = "fast") -> AttentionResult:  # fmt: skip
        """``(out, logsumexp)`` as this kernel computes them: float64 arrays of values of the
        inputs' format (out) and of fp32 (logsumexp, natural log)."""
        ar = _ARITH[arith]
        x = _inputs(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        o, lse = self._forward(ar, x)
        return AttentionResult(o, lse)

    def _forward(self, ar: _Fast, x: _Inputs) -> tuple[np.ndarray, np.ndarray]:
        c, a, w, _ = self._fmts()
        s, _, _, _ = self._logits(ar, x)
        vv = ar.val(x.v)
        allowed = x.allowed
        rows = s[0].shape
        empty = np.asarray(~allowed.any(axis=-1))
        online = self.online_softmax
        if not online:
            e, m, z = self._softmax_first(ar, x, s)
            acc = ar.zeros(rows + (x.v.shape[-1],))
            first = (self.normalize or "first") == "first"
            for j in self._keys(len(s)):
                wj = self._normalise(ar, e[j], z) if first else e[j]
                if w is not None:
                    wj = ar.rnd(wj, w)
                new = ar.fma(acc, wj[..., None], vv[..., j : j + 1, :], a)
                acc = _where(allowed[..., j, None], new, acc)
            o = acc if first else self._normalise(ar, acc, z[..., None])
        else:
            m, has = ar.zeros(rows), np.zeros(rows, dtype=bool)
            z = ar.zeros(rows)
            acc = ar.zeros(rows + (x.v.shape[-1],))
            keys = self._keys(len(s))
            bs = self.block_size or len(keys)
            for b0 in range(0, len(keys), bs):
                blk = keys[b0 : b0 + bs]
                bm, bhas = ar.zeros(rows), np.zeros(rows, dtype=bool)
                for j in blk:
                    take = allowed[..., j] & (~bhas | ar.gt(s[j], bm))
                    bm, bhas = _where(take, s[j], bm), bhas | allowed[..., j]
                grow = bhas & has & ar.gt(bm, m)
                m_new = _where(grow | (bhas & ~has), bm, m)
                d = _where(has & bhas, ar.sub(m, m_new, c), ar.zeros(rows))
                alpha = _where(has & bhas, ar.exp(d, c, self.exp2), ar.zeros(rows) + 1)
                z = ar.mul(z, alpha, c)
                acc = ar.mul(acc, alpha[..., None], c)
                for j in blk:
                    dj = _where(allowed[..., j], ar.sub(s[j], m_new, c), ar.zeros(rows))
                    ej = _where(allowed[..., j], ar.exp(dj, c, self.exp2), ar.zeros(rows))
                    z = _where(allowed[..., j], ar.add(z, ej, a), z)
                    wj = ar.rnd(ej, w) if w is not None else ej
                    new = ar.fma(acc, wj[..., None], vv[..., j : j + 1, :], a)
                    acc = _where(allowed[..., j, None], new, acc)
                m, has = m_new, has | bhas
            if (self.normalize or "last") == "first":
                raise ValueError("an online softmax normalises last (normalize='last' or None)")
            o = self._normalise(ar, acc, _where(empty, ar.zeros(rows) + 1, z)[..., None])
        zz = _where(empty, ar.zeros(rows) + 1, z)
        lse = self._lse(ar, m, zz)
        o = ar.rnd(o, x.fmt)
        o_out = np.where(empty[..., None], 0.0, ar.out(o))
        lse_out = np.where(empty, -np.inf, ar.out(lse))
        return o_out, lse_out

    # -- backward ---------------------------------------------------------------------------
    def backward(self, q: Any, k: Any, v: Any, grad: Any, out: Any = None, logsumexp: Any = None,
                 attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
                 enable_gqa: bool = False, *, arith: str = "fast") -> GradResult:  # fmt: skip
        """``(dq, dk, dv)`` as this kernel's backward computes them.

        With ``out`` and ``logsumexp``: fused (P = exp(logit - logsumexp), D = rowsum(grad * out));
        without: the softmax recomputed (non-online, normalised first) and D = rowsum(P * dP).
        """
        ar = _ARITH[arith]
        x = _inputs(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        c, a, w, _ = self._fmts()
        g64, _ = _values(grad, "grad")
        s, qq, kk, _ = self._logits(ar, x)
        _, _, _, gscale = self._scaled(ar, x)
        allowed = x.allowed
        rows = s[0].shape
        dO, vv = ar.val(g64), ar.val(x.v)
        if out is not None:
            lse = np.where(allowed.any(axis=-1), _float64(logsumexp).reshape(rows), 0.0)
            lse_v = ar.val(lse)
            if self.exp2:
                lse_v = ar.mul(lse_v, ar.const(Fraction(1) / _dlog(Fraction(2)), c), c)
            probs = []
            for j in range(len(s)):
                d = _where(allowed[..., j], ar.sub(s[j], lse_v, c), ar.zeros(rows))
                probs.append(_where(allowed[..., j], ar.exp(d, c, self.exp2), ar.zeros(rows)))
            oo = ar.val(_float64(out).reshape(x.q.shape[:-1] + (x.v.shape[-1],)))
            dd = ar.zeros(rows)
            for jj in range(x.v.shape[-1]):
                dd = ar.fma(dd, dO[..., jj], oo[..., jj], a)
        else:
            e, _, z = self._softmax_first(ar, x, s)
            probs = [_where(allowed[..., j], self._normalise(ar, e[j], z), ar.zeros(rows))
                     for j in range(len(s))]  # fmt: skip
            dd = None
        pw = [ar.rnd(pj, w) if w is not None else pj for pj in probs]
        # dP[..., L, S] = dO V^T, one key at a time
        dp = []
        for j in range(len(s)):
            accp = ar.zeros(rows)
            for jj in range(x.v.shape[-1]):
                accp = ar.fma(accp, dO[..., jj], vv[..., j : j + 1, jj], a)
            dp.append(accp)
        if dd is None:
            dd = ar.zeros(rows)
            for j in self._keys(len(s)):
                dd = _where(allowed[..., j], ar.fma(dd, probs[j], dp[j], a), dd)
        ds = []
        for j in range(len(s)):
            dsj = ar.mul(probs[j], ar.sub(dp[j], dd, c), c)
            if w is not None:
                dsj = ar.rnd(dsj, w)
            ds.append(_where(allowed[..., j], dsj, ar.zeros(rows)))
        # dQ = scale * dS K
        accq = ar.zeros(x.q.shape)
        for j in self._keys(len(s)):
            accq = ar.fma(accq, ds[j][..., None], kk[..., j : j + 1, :], a)
        dq = ar.mul(accq, gscale, c)
        # dK = scale * dS^T Q and dV = P^T dO, one query at a time
        lq = x.q.shape[-2]
        ds_mat = np.stack(ds, axis=-1)  # [..., L, S]
        pw_mat = np.stack(pw, axis=-1)
        acck = ar.zeros(x.k.shape)
        accv = ar.zeros(x.v.shape)
        for i in range(lq):
            acck = ar.fma(acck, ds_mat[..., i, :, None], qq[..., i : i + 1, :], a)
            accv = ar.fma(accv, pw_mat[..., i, :, None], dO[..., i : i + 1, :], a)
        dk = ar.mul(acck, gscale, c)
        dv = accv
        dk = _group_sum(ar, dk, x.group, c)
        dv = _group_sum(ar, dv, x.group, c)
        f = x.fmt
        return GradResult(ar.out(ar.rnd(dq, f)), ar.out(ar.rnd(dk, f)), ar.out(ar.rnd(dv, f)))


# ---------------------------------------------------------------------------------------------
# Named kernels and planted defects

KERNELS: dict[str, AttentionKernel] = {
    k.name: k
    for k in (
        AttentionKernel("math", normalize="first"),
        AttentionKernel("math-reciprocal", reciprocal=True, scale_mode="sqrt"),
        AttentionKernel("math-reverse", key_order="reverse", normalize="last"),
        AttentionKernel("flash16", online_softmax=True, block_size=16),
        AttentionKernel("flash4-reverse", online_softmax=True, block_size=4, key_order="reverse"),
        AttentionKernel("flash1", online_softmax=True, block_size=1),
        AttentionKernel("flash4-exp2", online_softmax=True, block_size=4, exp2=True),
        AttentionKernel("flash4-bf16w", online_softmax=True, block_size=4, weights="bfloat16"),
        AttentionKernel("flash4-fp16w-exp2-recip", online_softmax=True, block_size=4,
                        weights="float16", exp2=True, reciprocal=True),  # fmt: skip
        AttentionKernel("math-bf16acc", accumulate="bfloat16"),
        AttentionKernel("math-bf16w", weights="bfloat16"),
        AttentionKernel("math-bf16bias", bias="bfloat16"),
    )
}


#: The AttentionAlgorithm (its keyword arguments) that describes each kernel of KERNELS.
DESCRIBED_BY: dict[str, dict[str, Any]] = {
    "math": {},
    "math-reciprocal": {"reciprocal": True},
    "math-reverse": {},
    "flash16": {"online_softmax": True, "block_size": 16},
    "flash4-reverse": {"online_softmax": True, "block_size": 4},
    "flash1": {"online_softmax": True},
    "flash4-exp2": {"online_softmax": True, "block_size": 4, "exp2": True},
    "flash4-bf16w": {"online_softmax": True, "block_size": 4, "weights": "bfloat16"},
    "flash4-fp16w-exp2-recip": {"online_softmax": True, "block_size": 4, "weights": "float16",
                                "exp2": True, "reciprocal": True},  # fmt: skip
    "math-bf16acc": {"accumulate": "bfloat16"},
    "math-bf16w": {"weights": "bfloat16"},
    "math-bf16bias": {"bias": "bfloat16"},
}

#: Planted defects: (kernel, the algorithm kwargs it claims but breaks): each rounds somewhere that
#: algorithm does not allow, so on suitable inputs its outputs fall outside the bounds.
PLANTED: list[tuple[str, dict[str, Any]]] = [
    ("math-bf16acc", {}),
    ("math-bf16acc", {"online_softmax": True, "block_size": 16}),
    ("math-bf16w", {}),
    ("flash4-bf16w", {"online_softmax": True, "block_size": 4}),
]
