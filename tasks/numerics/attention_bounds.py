"""The derivation behind :class:`.attention.AttentionAlgorithm`: the inputs, the exact centre and
the forward and backward error bounds, step by step (docs/numerics.md, "Attention", writes each step
out).  Everything here is float64 numpy on whole tensors; the public API is in :mod:`.attention`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .formats import FORMATS, FloatFormat, get_format
from .rounding import is_representable

__all__ = ["EXP_ULPS", "SCALE_ROUNDINGS"]

#: The bounds allow exp, exp2, log and log2 an error of this many ulps of the compute format
#: (correctly rounded: 0.5; glibc and SLEEF's u10 variants: 1; CUDA's ex2.approx: 2).
EXP_ULPS = 2
#: Roundings allowed in applying the scale to a logit: the scale rounded, then multiplied (2), or
#: PyTorch's math path, which multiplies q and k each by a rounded sqrt(scale) (4).
SCALE_ROUNDINGS = 4

_F32 = FORMATS["fp32"]
_U64 = 2.0**-53
_ETA64 = 2.0**-1075


# ---------------------------------------------------------------------------------------------
# Inputs


def _values(x: Any, name: str) -> tuple[np.ndarray, FloatFormat]:
    """float64 values and the format of a torch tensor or numpy array of fp32, bf16 or fp16."""
    fmt: FloatFormat | None = None
    dtype = getattr(x, "dtype", None)
    if dtype is not None:
        try:
            fmt = get_format(dtype)
        except ValueError:
            fmt = None
    if type(x).__module__.startswith("torch"):
        v = x.detach().to("cpu").double().numpy()
    else:
        arr = np.asarray(x)
        v = (arr.astype(np.float32) if arr.dtype.kind not in "fiub" else arr).astype(np.float64)
    if fmt is None:
        if not np.all(is_representable(v, _F32)):
            raise ValueError(
                f"{name}: values of dtype {dtype} are not fp32, bf16 or fp16 values; pass a torch "
                "tensor or numpy array of float32, bfloat16 or float16"
            )
        fmt = _F32
    if fmt.name not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"{name}: dtype {fmt.name} is not supported; allowed: float32, bfloat16, float16")
    return np.asarray(v, dtype=np.float64), fmt


@dataclass
class _Problem:
    """The inputs as float64 arrays with k and v expanded to the query heads, and the exact centre."""

    q: np.ndarray  # [..., H, L, E]
    k: np.ndarray  # [..., H, S, E]
    v: np.ndarray  # [..., H, S, Ev]
    allowed: np.ndarray  # [..., H, L, S] bool: the key takes part
    bias: np.ndarray  # [..., H, L, S] float mask values (0 where none or masked)
    scale: float
    fmt: FloatFormat  # the inputs' (and outputs') format
    group: int  # query heads per key head (enable_gqa)
    k_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    nonfinite_row: np.ndarray  # [..., H, L]
    has_bias: bool  # a float mask is added
    # the centre (float64, within the float64 bound of itself)
    s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    m: np.ndarray = field(default_factory=lambda: np.zeros(0))
    p: np.ndarray = field(default_factory=lambda: np.zeros(0))
    z: np.ndarray = field(default_factory=lambda: np.zeros(0))
    o: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lse: np.ndarray = field(default_factory=lambda: np.zeros(0))
    a: np.ndarray = field(default_factory=lambda: np.zeros(0))  # scale * |q| @ |k|^T, rounded up
    empty: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # [..., H, L] fully masked rows
    count: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [..., H, L] keys taking part


def _problem(q: Any, k: Any, v: Any, attn_mask: Any, is_causal: bool, scale: float | None,
             enable_gqa: bool) -> _Problem:  # fmt: skip
    q64, fq = _values(q, "q")
    k64, fk = _values(k, "k")
    v64, fv = _values(v, "v")
    if not (fq == fk == fv):
        raise ValueError(f"q, k and v must share a dtype, got {fq.name}, {fk.name}, {fv.name}")
    for name, x in (("q", q64), ("k", k64), ("v", v64)):
        if x.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (positions, features)")
    if q64.shape[-1] != k64.shape[-1]:
        raise ValueError(f"q and k must share the feature size, got {q64.shape[-1]} and {k64.shape[-1]}")
    if k64.shape[:-1] != v64.shape[:-1]:
        raise ValueError(f"k and v must agree on all but the last dimension, got {k64.shape}, {v64.shape}")
    k_shape, v_shape = k64.shape, v64.shape
    group = 1
    if q64.shape[:-2] != k64.shape[:-2]:
        hq, hk = (q64.shape[-3], k64.shape[-3]) if q64.ndim >= 3 and k64.ndim >= 3 else (0, 0)
        if (not enable_gqa or q64.shape[:-3] != k64.shape[:-3] or hk == 0 or hq % hk != 0):
            raise ValueError(
                f"q {q64.shape} and k {k64.shape} must share their leading dimensions, or with "
                "enable_gqa=True the query heads must be a multiple of the key heads"
            )
        group = hq // hk
        k64 = np.repeat(k64, group, axis=-3)
        v64 = np.repeat(v64, group, axis=-3)
    lq, sk = q64.shape[-2], k64.shape[-2]
    batch = q64.shape[:-2]
    allowed = np.ones(batch + (lq, sk), dtype=bool)
    bias = np.zeros(batch + (lq, sk))
    if is_causal:
        if attn_mask is not None:
            raise ValueError("pass either attn_mask or is_causal=True, not both (as torch requires)")
        allowed &= np.tril(np.ones((lq, sk), dtype=bool))
    if attn_mask is not None:
        if getattr(attn_mask, "dtype", None) is not None and str(attn_mask.dtype).endswith("bool"):
            mb = np.asarray(attn_mask.detach().cpu().numpy() if hasattr(attn_mask, "detach") else attn_mask)
            allowed = allowed & np.broadcast_to(mb.astype(bool), allowed.shape)
        else:
            mf, _ = _values(attn_mask, "attn_mask")
            mf = np.broadcast_to(mf, allowed.shape)
            if np.isnan(mf).any() or (mf == np.inf).any():
                raise ValueError("attn_mask: a float mask may hold -inf (masked) but not NaN or +inf")
            allowed = allowed & (mf != -np.inf)
            bias = np.where(allowed, mf, 0.0)
    if scale is None:
        scale = 1.0 / math.sqrt(q64.shape[-1])  # the real 1/sqrt(E) within a float64 rounding
    nonfin = ~np.isfinite(q64).all(axis=-1)
    kv_bad = ~(np.isfinite(k64).all(axis=-1) & np.isfinite(v64).all(axis=-1))  # [..., S]
    nonfin = nonfin | (allowed & kv_bad[..., None, :]).any(axis=-1)
    prob = _Problem(q64, k64, v64, allowed, bias, float(scale), fq, group, k_shape, v_shape, nonfin,
                    bool(np.any(bias != 0)))
    _centre(prob)
    return prob


def _centre(p: _Problem) -> None:
    """The exact result, computed in float64 (its error is bounded by the float64 bound)."""
    q = np.where(np.isfinite(p.q), p.q, 0.0)
    k = np.where(np.isfinite(p.k), p.k, 0.0)
    v = np.where(np.isfinite(p.v), p.v, 0.0)
    e_dim = q.shape[-1]
    s = p.scale * np.einsum("...le,...se->...ls", q, k) + p.bias
    a = abs(p.scale) * np.einsum("...le,...se->...ls", np.abs(q), np.abs(k))
    p.a = a * (1 + (e_dim + 4) * 2.0**-52)
    s = np.where(p.allowed, s, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = s.max(axis=-1)
        p.empty = np.asarray(~p.allowed.any(axis=-1))
        m = np.where(p.empty, 0.0, m)
        e = np.where(p.allowed, np.exp(s - m[..., None]), 0.0)
        z = e.sum(axis=-1)
        p.z = np.where(p.empty, 1.0, z)
        p.p = e / p.z[..., None]
        p.o = np.einsum("...ls,...sj->...lj", p.p, v)
        p.lse = np.where(p.empty, -np.inf, m + np.log(p.z))
    p.s, p.m = np.where(p.allowed, s, 0.0), m
    p.count = p.allowed.sum(axis=-1)


# ---------------------------------------------------------------------------------------------
# The units of one computation: which formats round where


@dataclass(frozen=True)
class _Units:
    uc: float  # compute format
    ua: float  # accumulations
    uw: float  # weights (0: not rounded beyond the compute format)
    ub: float  # float-mask values (0: exact)
    eta_c: float
    eta_a: float
    eta_w: float
    eps_c: float
    online: bool
    block: int | None
    exp2: bool
    ndiv: int  # roundings of the normalisation: 1 (divide) or 2 (reciprocal, then multiply)
    # The options of the methods (docs/numerics.md, "Attention: the options"):
    u_in: float = 0.0  # relative error of converting an input (q, k, v, mask) to the compute format
    eta_in: float = 0.0  # its absolute error (underflow; min_normal when subnormals are flushed)
    sequential: bool = False  # the definition's written order: every sum left to right


_FLOAT64_UNITS = _Units(_U64, _U64, 0.0, 0.0, _ETA64, _ETA64, 0.0, 2 * _U64, False, None, False, 2)


def _g(n: Any, u: float) -> Any:
    """gamma_n elementwise (n may be an array)."""
    n = np.asarray(n, dtype=np.float64)
    nu = n * u
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(nu >= 1, np.inf, nu / (1 - nu) * (1 + 2.0**-50))


@dataclass
class _Forward:
    """The forward's intermediate bounds (per key [..., L, S], per row [..., L])."""

    delta: np.ndarray  # |logit error|
    rho: np.ndarray  # relative error of a weight in the product with V (common factor removed)
    eta_w: np.ndarray | float  # absolute error of a weight
    zeta: np.ndarray  # relative error of the row sum
    out_c: np.ndarray  # |out - exact| before the final rounding
    lse: np.ndarray  # |logsumexp - exact|


def _forward(p: _Problem, un: _Units, o_err: np.ndarray | None = None) -> _Forward:
    """The forward's bounds in units ``un``.  ``o_err`` bounds |p.o - o| (the float64 centre's own
    error); given, the output bound is the smaller of steps 7a and 7b (docs/numerics.md), else 7a."""
    e_dim = p.q.shape[-1]
    uac = max(un.ua, un.uc)
    eta_ac = max(un.eta_a, un.eta_c)
    absm = np.abs(p.bias)
    # E products and sums (the matmul operation's k + 1), the scale, the mask's addition
    n_logit = e_dim + 1 + _scale_roundings(p.scale) + (1 if p.has_bias else 0)
    if un.u_in or un.eta_in or un.sequential:
        delta = _logit_options(p, un, uac, n_logit - e_dim - 1) + (
            (1 + un.ub) * (1 + un.u_in) * (1 + un.uc) - 1) * absm + (un.eta_in if p.has_bias else 0.0)
    else:
        delta = _g(n_logit, uac) * p.a + ((1 + un.ub) * (1 + un.uc) - 1) * absm
    delta = delta + (3 * e_dim + 8) * eta_ac
    delta = np.where(p.allowed, delta, 0.0)
    dmax = delta.max(axis=-1, initial=0.0)[..., None]
    mrow = p.m[..., None]
    d = np.where(p.allowed, mrow - p.s, 0.0)
    smin = np.where(p.allowed, p.s, np.inf).min(axis=-1, initial=np.inf)[..., None]
    srange = np.where(np.isfinite(smin), mrow - smin, 0.0) + 2 * dmax
    if un.exp2:
        arg = _g(3, un.uc) * (np.abs(p.s) + np.abs(mrow) + d + 2 * delta + 2 * dmax)
    else:
        arg = un.uc * (d + delta + dmax)
    s_keys = p.k.shape[-2]
    if un.online:
        blocks = s_keys if un.block is None else -(-s_keys // un.block)
        r = max(blocks - 1, 0)
    else:
        r = 0
    if r:
        if un.exp2:
            smax = np.where(p.allowed, np.abs(p.s), 0.0).max(axis=-1, initial=0.0)[..., None] + dmax
            resc = r * _g(3, un.uc) * (2 * smax + srange)
        else:
            resc = un.uc * srange
    else:
        resc = 0.0
    beta = EXP_ULPS * un.eps_c
    x = delta + arg + resc
    with np.errstate(over="ignore"):
        # common to the row sum and P V: the logit, the subtraction, the exps (the rescale factor
        # is one value applied to both running sums); each sum's rescale multiplications are its own
        up_c = np.exp(x) * (1 + beta) ** (1 + r)
        low_c = np.exp(-x) * (1 - beta) ** (1 + r)
        up = up_c * (1 + un.uc) ** r
        low = low_c * (1 - un.uc) ** r
    # the row sum adds the weights as computed; only the product with V sees them rounded to the
    # weights format (the seed: "before the product with V")
    rho = np.where(p.allowed, np.maximum(up - 1, 1 - low), 0.0)
    rho_c = np.where(p.allowed, np.maximum(up_c - 1, 1 - low_c), 0.0)
    rho_w = np.where(p.allowed, np.maximum(up * (1 + un.uw) - 1, 1 - low * (1 - un.uw)), 0.0)
    eta_z = (2 * (1 + r) + 1) * un.eta_c
    eta_w = eta_z + un.eta_w
    n = np.maximum(p.count, 1)[..., None]
    gz_row = _g(n, un.ua)
    if un.sequential and not r:
        # the written order: key j passes through its own rounding and one addition per later key
        later = np.flip(np.cumsum(np.flip(p.allowed, -1), axis=-1), -1) - p.allowed
        gz, gpv = _g(later + 1, un.ua), _g(later + 2, un.ua)
    else:
        gz, gpv = gz_row, _g(n + 1, un.ua)
    rz = (1 + rho) * (1 + gz) - 1
    zeta_eta = n[..., 0] * (eta_z * (1 + gz_row[..., 0]) + un.eta_a)
    zeta = (p.p * rz).sum(axis=-1) + zeta_eta
    zeta = np.where(zeta < 1, zeta, np.inf)
    xk = np.maximum((1 + rho_w) * (1 + gpv) * (1 + un.uc) ** un.ndiv - 1,
                    1 - (1 - rho_w) * (1 - gpv) * (1 - un.uc) ** un.ndiv)  # fmt: skip
    absv = np.abs(np.where(np.isfinite(p.v), p.v, 0.0))
    # the kernel's v: converted to the compute format (|v'| <= (1 + u_in)|v| + eta_in); P (v' - v)
    # moves the exact output by at most pev
    pev = un.u_in * np.einsum("...ls,...sj->...lj", p.p, absv) + un.eta_in if (un.u_in or un.eta_in) else 0.0
    absv = absv * (1 + un.u_in) + un.eta_in
    first = np.einsum("...ls,...sj->...lj", p.p * xk, absv)
    if gpv.shape[-1] == 1:
        eta_n = eta_w * (1 + gpv) * np.einsum("...ls,...sj->...lj", p.allowed * 1.0, absv)
    else:
        eta_n = eta_w * np.einsum("...ls,...sj->...lj", p.allowed * (1 + gpv), absv)
    eta_n = eta_n + 3 * n * un.eta_a
    zc = zeta[..., None]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        # 7a: every factor of a weight charged against |v_k|, the row sum's against |o|
        out_c = (first + zc * (np.abs(p.o) + pev) + eta_n) / (1 - zc) + 2 * un.eta_c + pev
        if o_err is not None and not (un.u_in or un.eta_in):
            out_c = np.minimum(out_c, _output_cancelled(p, un, o_err, rho_c, r, gz, gpv, zeta, zeta_eta, eta_n))
        lerr = -np.log1p(-zeta)
        logz = np.log(p.z)
        lse = lerr + EXP_ULPS * un.eps_c * (logz + lerr)
        lse = lse + un.uc * (np.abs(p.lse) + lse) + un.eta_c
        if un.exp2:
            lse = lse + _g(3, un.uc) * (np.abs(p.m) + dmax[..., 0] + logz + lerr)
    # no useful bound where the row sum's relative error can reach 1 (zeta = inf): infinite
    out_c = np.where(np.isnan(out_c) | ~np.isfinite(zc), np.inf, out_c)
    lse = np.where(np.isnan(lse) | ~np.isfinite(zeta), np.inf, lse)
    return _Forward(delta, rho_w, eta_w, zeta, np.asarray(out_c), np.asarray(lse))


def _output_cancelled(p: _Problem, un: _Units, o_err: np.ndarray, rho_c: np.ndarray, r: int,
                      gz: np.ndarray, gpv: np.ndarray, zeta: np.ndarray, zeta_eta: np.ndarray,
                      eta_n: np.ndarray) -> np.ndarray:  # fmt: skip
    """Step 7b: the weights' common relative error charged against |v_k - o| (it cancels in the
    normalised output), each sum's own factors against |v_k| (P V) and |o| (the row sum)."""
    r_up, r_low = (1 + un.uc) ** r, (1 - un.uc) ** r
    # |alpha_k|: P V's own factors (its rescales, the weights format, the sum, the normalisation)
    a_pv = np.maximum(r_up * (1 + un.uw) * (1 + gpv) * (1 + un.uc) ** un.ndiv - 1,
                      1 - r_low * (1 - un.uw) * (1 - gpv) * (1 - un.uc) ** un.ndiv)  # fmt: skip
    # |beta_k|: the row sum's own factors (its rescales, the sum)
    b_z = np.maximum(r_up * (1 + gz) - 1, 1 - r_low * (1 - gz))
    v = np.where(np.isfinite(p.v), p.v, 0.0)
    o_up = np.abs(p.o) + o_err  # >= |o|
    w_c = p.p * rho_c
    # sum_k p_k rho_k |v_kj - o_j| with |v_k - o| <= |v_k - p.o| + |p.o - o|, a block of rows at a time
    spread = np.empty_like(p.o)
    lq = p.o.shape[-2]
    rows = max(1, 2**22 // max(1, v.size))
    for l0 in range(0, lq, rows):
        sl = slice(l0, l0 + rows)
        dev = np.abs(v[..., None, :, :] - p.o[..., sl, None, :])  # [..., rows, S, Ev]
        spread[..., sl, :] = np.matmul(w_c[..., sl, None, :], dev)[..., 0, :]
    cancel = spread + w_c.sum(axis=-1)[..., None] * o_err
    w_1 = p.p * (1 + rho_c)
    if a_pv.shape[-1] == 1:
        own = a_pv * np.matmul(w_1, np.abs(v)) + b_z * w_1.sum(axis=-1)[..., None] * o_up
    else:  # the written order: each key's own factors
        own = np.matmul(w_1 * a_pv, np.abs(v)) + (w_1 * b_z).sum(axis=-1)[..., None] * o_up
    zc = zeta[..., None]
    num = cancel + own + eta_n * (1 + zc) + zeta_eta[..., None] * o_up
    return np.asarray(num / (1 - zc) + 2 * un.eta_c)


def _logit_options(p: _Problem, un: _Units, uac: float, extra: int) -> np.ndarray:
    """|logit error| from the products and sums (and the scale's and the mask's roundings, ``extra``)
    with the options: inputs converted to the compute format (``|x'| <= (1 + u_in)|x| + eta_in``,
    charged as ``scale * sum_e (|q'_e||k'_e| - |q_e||k_e|)``, which bounds ``|q'k' - qk|``), and
    under the written order product e passing through ``E - e + 1 + extra`` roundings instead of
    every one through ``E + 1 + extra``."""
    e_dim = p.q.shape[-1]
    q = np.abs(np.where(np.isfinite(p.q), p.q, 0.0))
    k = np.abs(np.where(np.isfinite(p.k), p.k, 0.0))
    up = 1 + (e_dim + 4) * 2.0**-52  # the float64 evaluation of the sums, rounded up
    n_e = np.arange(e_dim, 0, -1) + 1 + extra if un.sequential else np.full(e_dim, e_dim + 1 + extra)
    g_e = _g(n_e, uac)
    qh, kh = q * (1 + un.u_in) + un.eta_in, k * (1 + un.u_in) + un.eta_in
    sc = abs(p.scale)
    rounding = sc * np.einsum("...le,...se,e->...ls", qh, kh, g_e) * up
    if not (un.u_in or un.eta_in):
        return np.asarray(rounding)
    conv = (2 * un.u_in + un.u_in**2) * p.a + sc * up * (
        un.eta_in * (1 + un.u_in) * (q.sum(axis=-1)[..., :, None] + k.sum(axis=-1)[..., None, :])
        + e_dim * un.eta_in**2)  # fmt: skip
    return np.asarray(rounding + conv)


def _scale_roundings(scale: float) -> int:
    """0 for a power of 4 (the scale and its square root are powers of 2: every way of applying it
    is exact barring underflow, which the eta terms charge), else SCALE_ROUNDINGS."""
    m, e = math.frexp(abs(scale))
    return 0 if m == 0.5 and (e - 1) % 2 == 0 else SCALE_ROUNDINGS


def _ulp(x: np.ndarray, f: FloatFormat) -> np.ndarray:
    """The spacing of ``f`` above |x| (an upper bound for any x in the binade), elementwise."""
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log2(np.maximum(np.abs(x), f.min_normal)))
    return np.asarray(np.ldexp(1.0, (e - f.mantissa_bits).astype(np.int64)) * 2)


def _group_any(x: np.ndarray, p: _Problem) -> np.ndarray:
    """Reduce a per-query-head array [..., H, S, 1] to the key heads (enable_gqa)."""
    if p.group == 1:
        return x
    sh = x.shape
    return np.asarray(x.reshape(sh[:-3] + (sh[-3] // p.group, p.group) + sh[-2:]).any(axis=-3))


def _group_sum(x: np.ndarray, p: _Problem) -> np.ndarray:
    if p.group == 1:
        return x
    sh = x.shape
    return np.asarray(x.reshape(sh[:-3] + (sh[-3] // p.group, p.group) + sh[-2:]).sum(axis=-3))


def _float64(x: Any) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        return np.asarray(x.detach().to("cpu").double().numpy())
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiub":
        arr = arr.astype(np.float32)
    return np.asarray(arr, dtype=np.float64)


def _mm(sub: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(np.einsum(sub, a, b))


def _grads(p: _Problem, g: np.ndarray, un: _Units, out: Any,
           lse_in: Any) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:  # fmt: skip
    """Centres and error bounds (before the final rounding) of dq, dk, dv; see docs/numerics.md."""
    fw = _forward(p, un)
    g = np.where(np.isfinite(g), g, 0.0)
    q = np.where(np.isfinite(p.q), p.q, 0.0)
    k = np.where(np.isfinite(p.k), p.k, 0.0)
    v = np.where(np.isfinite(p.v), p.v, 0.0)
    pr = p.p
    lq, sk, ev = q.shape[-2], k.shape[-2], v.shape[-1]
    uac = max(un.ua, un.uc)
    eta = max(un.eta_a, un.eta_c)
    beta = EXP_ULPS * un.eps_c
    c64 = _forward(p, _FLOAT64_UNITS)
    # relative error of the P the backward uses
    if out is not None:
        lse_p = _float64(lse_in).reshape(p.lse.shape)
        with np.errstate(invalid="ignore"):
            lam = np.where(p.empty, 0.0, np.abs(lse_p - np.where(p.empty, 0.0, p.lse)) + c64.lse)
        lam = np.where(np.isfinite(lam), lam, np.inf)[..., None]
        lrow = np.where(p.empty, 0.0, p.lse)[..., None]
        d = np.abs(lrow - p.s)
        if un.exp2:
            arg = _g(3, un.uc) * (np.abs(p.s) + np.abs(lrow) + d + fw.delta + lam)
        else:
            arg = un.uc * (d + fw.delta + lam)
        x = fw.delta + lam + arg
        with np.errstate(over="ignore", invalid="ignore"):
            pi = np.maximum(np.exp(x) * (1 + beta) * (1 + un.uw) - 1,
                            1 - np.exp(-x) * (1 - beta) * (1 - un.uw))  # fmt: skip
        eta_p: Any = 2 * un.eta_c + un.eta_w
        o_p = _float64(out).reshape(p.o.shape)
        with np.errstate(invalid="ignore"):
            d_o = np.where(p.empty[..., None], 0.0, np.abs(o_p - p.o) + c64.out_c)
        d_o = np.where(np.isnan(d_o), np.inf, d_o)
    else:
        z = fw.zeta[..., None]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            pi = np.maximum((1 + fw.rho) * (1 + un.uc) ** un.ndiv / (1 - z) - 1,
                            1 - (1 - fw.rho) * (1 - un.uc) ** un.ndiv / (1 + z))  # fmt: skip
        pi = np.where(np.isfinite(z), pi, np.inf)  # the row sum has no bound: neither has P
        eta_p = fw.eta_w * 2 + 2 * un.eta_c
        d_o = None
    pi = np.where(p.allowed, pi, 0.0)
    ap = np.abs(pr)
    # dP = dO V^T and D
    dp = _mm("...lj,...sj->...ls", g, v)
    b = _mm("...lj,...sj->...ls", np.abs(g), np.abs(v))
    e_dp = _g(ev + 1, un.ua) * b + 3 * ev * un.eta_a
    if d_o is not None:
        dd = (g * p.o).sum(axis=-1)
        e_d = (np.abs(g) * d_o).sum(axis=-1) + _g(ev + 1, un.ua) * (np.abs(g) * (np.abs(p.o) + d_o)).sum(axis=-1)
        e_d = e_d + 3 * ev * un.eta_a
    else:
        dd = (pr * dp).sum(axis=-1)
        n = np.maximum(p.count, 1)
        e_d = (ap * (e_dp + pi * (np.abs(dp) + e_dp))).sum(axis=-1) * (1 + _g(n + 1, un.ua))
        e_d = e_d + _g(n + 1, un.ua) * (ap * np.abs(dp)).sum(axis=-1)
        e_d = e_d + eta_p * (np.abs(dp) + e_dp).sum(axis=-1) + 3 * n * un.eta_a
    gap = np.abs(dp - dd[..., None])
    ds = pr * (dp - dd[..., None])
    # dS = P (dP - D), rounded twice in the compute format and once to the weights format
    e_ds = ap * ((1 + pi) * (1 + un.uc) ** 2 * (1 + un.uw) * (gap + e_dp + e_d[..., None]) - gap)
    e_ds = np.where(p.allowed, e_ds + eta_p * (gap + e_dp + e_d[..., None]), 0.0)
    e_ds = e_ds + 2 * un.eta_c + un.eta_w
    ads = np.abs(ds) + e_ds
    sc = abs(p.scale)
    dq = p.scale * _mm("...ls,...se->...le", ds, k)
    dk = p.scale * _mm("...ls,...le->...se", ds, q)
    dv = _mm("...ls,...lj->...sj", pr, g)
    n_s = sk + 1 + _scale_roundings(p.scale)
    e_dq = sc * (_mm("...ls,...se->...le", e_ds, np.abs(k)) + _g(n_s, uac) * _mm("...ls,...se->...le", ads, np.abs(k)))
    e_dq = e_dq + 3 * (sk + 2) * eta
    n_l = lq + 1 + _scale_roundings(p.scale)
    e_dk = sc * (_mm("...ls,...le->...se", e_ds, np.abs(q)) + _g(n_l, uac) * _mm("...ls,...le->...se", ads, np.abs(q)))
    e_dk = e_dk + 3 * (lq + 2) * eta
    e_dv = _mm("...ls,...lj->...sj", ap * pi + eta_p * p.allowed, np.abs(g)) * (1 + _g(lq + 1, un.ua))
    e_dv = e_dv + _g(lq + 1, un.ua) * _mm("...ls,...lj->...sj", ap, np.abs(g)) + 3 * (lq + 1) * un.eta_a
    e_dq, e_dk, e_dv = (np.where(np.isnan(e), np.inf, e) for e in (e_dq, e_dk, e_dv))
    if p.group > 1:  # the query heads of a group add into one key head
        gg = _g(p.group, un.uc)
        e_dk = _group_sum(e_dk, p) + gg * _group_sum(np.abs(dk) + e_dk, p)
        e_dv = _group_sum(e_dv, p) + gg * _group_sum(np.abs(dv) + e_dv, p)
        dk, dv = _group_sum(dk, p), _group_sum(dv, p)
    return (dq, dk, dv), (np.asarray(e_dq), np.asarray(e_dk), np.asarray(e_dv))
