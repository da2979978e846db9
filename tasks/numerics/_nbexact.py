"""numba kernels behind ``matmul_exact_accumulation``'s compiled path (:func:`.products._exact_compiled`;
imported lazily by it: importing this module loads numba).

The method is that of :func:`.products._exact_rounded_finite` (one float64 BLAS matmul ``D``, a
certified bound per output, the undecided outputs summed again, the rest in exact digits); these
kernels do the passes around the BLAS call, for operands given as float32 arrays of values of
formats of at most 24 significant bits (every product is exact in float64, between 2**-298 and
2**256 in magnitude: far from float64's underflow and overflow).

* :func:`prep_rows` / :func:`prep_cols`: the float64 copies BLAS needs, the finiteness check and
  per row of A (column of B) the sum of squares and what gives its lattice (every element a
  multiple of ``2**lat``: :func:`.products._norm_lattice`), in one pass over each operand.
* The BLAS call (in :func:`.products._exact_compiled`): ``D_b = A[:, block b] @ B[block b, :]`` for
  P equal blocks of K (one batched call, no copies; P a power of two, at most 16, blocks of at
  least 256 products): the bound below grows with the block's length, not K's.
* :func:`certify`: per output, ``x = fl(sum_b D_b)``, the bound, both ends of the interval, their
  rounding and the comparison (:func:`_decide`), in one pass.
* :func:`resum`: the undecided outputs summed again from their exact products with TwoSum
  (a certified double-double), and decided the same way.

The bounds, each an upper bound whatever the order of the floating-point operations it bounds
(u = 2**-53, ``gamma_n = n u / (1 - n u)``):

1. Norms.  ``sumsq`` is computed with reassociation allowed (``fastmath={"reassoc"}``, so that the
   reduction vectorizes); each square of a value of at most 24 bits is exact in float64 and any
   summation tree of K non-negative terms gives ``computed >= exact (1 - u)**(K - 1)``, so
   ``exact <= computed (1 + gamma_K)``; ``norm = sqrt(sumsq) * grow`` with
   ``grow = 1 + (K + 8) 2**-52`` covers that factor's square root and the two roundings of sqrt and
   the multiplication (``grow (1 - u)**2 >= 1 + gamma_K``).  So ``norm >= ||row||_2``.
2. Stage one, any order and FMA use inside BLAS: with ``S_b = sum_(k in b) |a_k b_k|``,
   ``|D_b - exact_b| <= gamma_Kb S_b``, and the P - 1 additions of ``x = fl(sum_b D_b)`` add at
   most ``gamma_(P-1) sum_b |D_b|``; ``sum_b S_b = sum_k |a_k b_k| <= ||a|| ||b|| <= na nb``
   (Cauchy-Schwarz).  So ``|x - exact| <= gamma_Kb na nb + gamma_(P-1) sum_b |D_b| <= e =
   na nb c + (sum_b |D_b|) cs`` with ``c = (Kb + 8) u grow`` and ``cs = (P + 8) u grow`` (the
   slack over ``gamma`` covers the roundings of ``sum |D_b|`` and of e's own computation; with
   P = 1 this is the bound of :func:`.products._exact_rounded_finite`).  Exact case: if every
   element of row ``a`` is a multiple of ``2**la`` and every element of column ``b`` one of
   ``2**lb``, every product and every partial sum formed (inside BLAS, a sum of a subset of the
   products, whatever the order, with or without FMA; then the sums of the ``D_b``) is a multiple
   of ``2**(la + lb)`` of magnitude at most ``sum_k |a_k b_k| <= na nb``; when
   ``na nb < 2**(la + lb + 53)`` (tested as ``fl(fl(na nb) (1 + 2**-50)) < 2**(la + lb + 53)``,
   which implies it) each of them is a float64 number, no operation rounds, and ``x`` is exact
   (``e = 0``).  Small integers and narrow inputs of a narrow range are decided this way.
3. Stage two (:func:`_sum2`): TwoSum is an error-free transformation (also with underflow), so
   with ``S`` the final high part and ``q_1..q_n`` (``n <= K + 3``) the remainders of all TwoSums,
   ``exact = S + sum q`` exactly.  ``Q = fl(sum q)`` in any order: ``|Q - sum q| <= gamma_(n-1)
   sum |q|``, and ``sum |q| <= M (1 + gamma_(n-1))`` for the computed ``M``.  Then
   ``(r, t) = TwoSum(S, Q)`` gives ``S + Q = r + t`` exactly, so ``|exact - r| <= |t| +
   gamma_(n-1)(1 + gamma_(n-1)) M <= (|t| + M (K + 16) u grow) (1 + 2**-50)`` (the last factor and
   the slack in ``K + 16`` cover the roundings of this expression).  Where no TwoSum loses a bit
   (``M = 0`` and ``t = 0``), ``r`` is the exact sum and the bound is 0: exact ties are decided here.
4. Deciding (:func:`_decide`, as :func:`.products._certified`): the exact value lies in
   ``[x - e, x + e]``; the ends are computed in float64 and moved one float64 step outwards (that
   covers the rounding of the subtraction and the addition); rounding is monotone, so where both
   ends round to the same value (the same sign of zero included) that is the exact value rounded
   once.  An exact zero is +0 (``x + 0.0``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ._nbkernels import _f2i, _i2f  # float64 <-> int64 bit patterns

_MAGIC = 6755399441055744.0  # 1.5 * 2**52: (r + M) - M is r rounded to an integer, ties to even


@njit(cache=True, parallel=True, fastmath={"reassoc"})
def prep_rows(x: np.ndarray, bits: np.ndarray, out: np.ndarray, sumsq: np.ndarray,
              minexp: np.ndarray, ormant: np.ndarray, maxexp: np.ndarray) -> None:  # fmt: skip
    """Row by row of ``x [M, K]`` (float32; ``bits`` its int32 view): ``out = float64(x)``, the
    sum of squares (module doc, 1), and over the row's elements the smallest biased exponent field
    of a nonzero element (255 if none), the OR of the mantissa fields and the largest exponent
    field (255: an inf or NaN).  (Reassociation only lets the reductions vectorize.)"""
    m, k = x.shape
    for i in prange(m):
        s = 0.0
        lo = np.int32(255)
        om = np.int32(0)
        mx = np.int32(0)
        xr = x[i]
        br = bits[i]
        orow = out[i]
        for q in range(k):
            v = np.float64(xr[q])
            orow[q] = v
            s += v * v
            ua = br[q] & np.int32(0x7FFFFFFF)
            ef = ua >> np.int32(23)
            lo = min(lo, ef if ua != 0 else np.int32(255))
            mx = max(mx, ef)
            om |= ua
        sumsq[i] = s
        minexp[i] = lo
        ormant[i] = om & np.int32(0x7FFFFF)
        maxexp[i] = mx


_CHUNKS = 8  # row chunks of B in prep_cols (partial column statistics, joined at the end)


@njit(cache=True, parallel=True, fastmath={"reassoc"})
def prep_cols(x: np.ndarray, bits: np.ndarray, out: np.ndarray, sumsq: np.ndarray,
              minexp: np.ndarray, ormant: np.ndarray, maxexp: np.ndarray) -> None:  # fmt: skip
    """Column by column of ``x [K, N]`` (float32; ``bits`` its int32 view) what :func:`prep_rows`
    gives per row, with ``out = float64(x)`` in the same layout; rows are read in order (the
    statistics of a chunk of rows are kept per column, vectorized across columns)."""
    k, n = x.shape
    part = np.zeros((_CHUNKS, n))
    lo = np.full((_CHUNKS, n), 255, dtype=np.int32)
    om = np.zeros((_CHUNKS, n), dtype=np.int32)
    mx = np.zeros((_CHUNKS, n), dtype=np.int32)
    step = (k + _CHUNKS - 1) // _CHUNKS
    for ch in prange(_CHUNKS):
        p = part[ch]
        lc = lo[ch]
        oc = om[ch]
        mc = mx[ch]
        for q in range(ch * step, min(k, (ch + 1) * step)):
            xr = x[q]
            br = bits[q]
            orow = out[q]
            for c in range(n):
                v = np.float64(xr[c])
                orow[c] = v
                p[c] += v * v
                ua = br[c] & np.int32(0x7FFFFFFF)
                ef = ua >> np.int32(23)
                lc[c] = min(lc[c], ef if ua != 0 else np.int32(255))
                mc[c] = max(mc[c], ef)
                oc[c] |= ua
    for c in range(n):
        s = 0.0
        a = np.int32(255)
        o = np.int32(0)
        e = np.int32(0)
        for ch in range(_CHUNKS):
            s += part[ch, c]
            a = min(a, lo[ch, c])
            o |= om[ch, c]
            e = max(e, mx[ch, c])
        sumsq[c] = s
        minexp[c] = a
        ormant[c] = o & np.int32(0x7FFFFF)
        maxexp[c] = e


@njit(cache=True)
def _round(s: float, mb: int, emin: int, maxf: float, has_inf: bool, away: bool) -> float:
    """The float64 ``s`` rounded to the format with ``mb`` mantissa bits, smallest normal
    exponent ``emin`` and largest finite value ``maxf`` (nearest, ties to even or ``away``), as
    :func:`.rounding.round_to_format` does it: overflow to +-inf (NaN without inf), a negative value
    rounding to zero gives -0.  (The method of ``_nbkernels._round`` without a remainder.)"""
    ex = ((_f2i(s) >> 52) & 0x7FF) - 1023
    qe = max(ex, emin) - mb
    q = _i2f((qe + 1023) << 52)
    r = s * _i2f((1023 - qe) << 52)  # exact: s / q, q a power of two
    n = (r + _MAGIC) - _MAGIC  # |r| < 2**25: round half to even
    if away and abs(r - n) == 0.5:
        n = r + math.copysign(0.5, r)
    out = math.copysign(n * q, s)
    if not abs(out) <= maxf:  # overflow (finite s only here)
        out = math.copysign(math.inf, s) if has_inf else math.nan
    return out


@njit(cache=True)
def _next_down(y: float) -> float:
    """The largest float64 below the finite ``y`` (``np.nextafter(y, -inf)``, inlined)."""
    i = _f2i(y)
    if y > 0:
        return float(_i2f(i - 1))
    if y < 0:
        return float(_i2f(i + 1))
    return -5e-324


@njit(cache=True)
def _ends(x: float, e: float) -> tuple[float, float]:
    """``[x - e, x + e]`` with each end moved one float64 step outwards (module doc, 4)."""
    if e == 0:
        return x, x
    return _next_down(x - e), -_next_down(-(x + e))


@njit(cache=True)
def _same(r_lo: np.float32, r_hi: np.float32) -> bool:
    """The same value, the sign of zero included (a NaN never matches: it stays undecided)."""
    return r_lo == r_hi and math.copysign(1.0, r_lo) == math.copysign(1.0, r_hi)


@njit(cache=True)
def _decide(x: float, e: float, fast32: bool, mb: int, emin: int, maxf: float, has_inf: bool,
            away: bool) -> tuple[np.float32, bool]:  # fmt: skip
    """``(rounded, decided)`` for a value known to lie within ``e`` of ``x`` (module doc, 4):
    rounded to fp32 (to nearest even: one IEEE cast) with ``fast32``, else to the format of
    ``mb``, ``emin``, ``maxf``, ``has_inf``, ``away`` (:func:`_round`), as float32 (exact: every
    format is fp32 or narrower)."""
    lo, hi = _ends(x, e)
    if fast32:
        r_lo = np.float32(lo)
        r_hi = np.float32(hi)
    else:
        r_lo = np.float32(_round(lo, mb, emin, maxf, has_inf, away))
        r_hi = np.float32(_round(hi, mb, emin, maxf, has_inf, away))
    return r_lo, _same(r_lo, r_hi)


@njit(cache=True)
def _decide32(x: float, e: float) -> tuple[np.float32, bool]:
    """:func:`_decide` for fp32, to nearest even (kept apart: the general one, even with its
    branch not taken, keeps the loop that calls it from being optimized; 10x slower)."""
    lo, hi = _ends(x, e)
    r_lo = np.float32(lo)
    r_hi = np.float32(hi)
    return r_lo, _same(r_lo, r_hi)


@njit(cache=True, parallel=True)
def certify(d: np.ndarray, na: np.ndarray, la: np.ndarray, nb: np.ndarray, lb: np.ndarray,
            c: float, cs: float, out: np.ndarray, undecided: np.ndarray, fast32: bool, mb: int,
            emin: int, maxf: float, has_inf: bool, away: bool) -> None:  # fmt: skip
    """Stage one (module doc, 2 and 4): ``d [P, M, N]`` the BLAS results of the P blocks of K;
    ``out [M, N]`` (float32) their sum rounded (right where decided) and ``undecided [M, N]``
    (bool) where the interval's ends round differently.  ``na``, ``nb``: upper bounds on the
    2-norms of A's rows and B's columns; ``la``, ``lb``: their lattice exponents; ``c``, ``cs``:
    the factors of the bound ``na nb c + cs sum_b |d[b]|``."""
    nblk, m, n = d.shape
    for i in prange(m):
        xs = d[0, i].copy()  # the blocks' sums, block after block (vectorized across j)
        sas = np.abs(xs)
        for b in range(1, nblk):
            db = d[b, i]
            for j in range(n):
                xs[j] += db[j]
                sas[j] += abs(db[j])
        for j in range(n):
            x = xs[j] + 0.0  # an exact zero is +0
            sa = sas[j]
            p = na[i] * nb[j]
            if p == 0.0:
                e = 0.0
            elif la[i] + lb[j] + 53 < 1000 and p * (1.0 + 2.0**-50) < _i2f(
                (la[i] + lb[j] + 53 + 1023) << 52
            ):
                e = 0.0  # exact: every partial sum on the lattice 2**(la + lb), below 2**53 units
            else:
                e = p * c + sa * cs
            if fast32:
                v, ok = _decide32(x, e)
            else:
                v, ok = _decide(x, e, fast32, mb, emin, maxf, has_inf, away)
            out[i, j] = v
            undecided[i, j] = not ok


@njit(cache=True)
def _two_sum(a: float, b: float) -> tuple[float, float]:
    s = a + b
    bv = s - a
    return s, (a - (s - bv)) + (b - bv)


@njit(cache=True)
def _sum2(a: np.ndarray, b: np.ndarray, c: float) -> tuple[float, float]:
    """``(r, e)``: ``sum_k a[k] b[k]`` (exact float64 products) within ``e`` of ``r`` (module doc,
    3).  Four TwoSum chains over interleaved products (shorter dependency chains), then joined."""
    k = a.shape[0]
    s0 = s1 = s2 = s3 = 0.0
    q0 = q1 = q2 = q3 = 0.0
    m0 = m1 = m2 = m3 = 0.0
    k4 = k - k % 4
    for t in range(0, k4, 4):
        s0, r = _two_sum(s0, a[t] * b[t])
        q0 += r
        m0 += abs(r)
        s1, r = _two_sum(s1, a[t + 1] * b[t + 1])
        q1 += r
        m1 += abs(r)
        s2, r = _two_sum(s2, a[t + 2] * b[t + 2])
        q2 += r
        m2 += abs(r)
        s3, r = _two_sum(s3, a[t + 3] * b[t + 3])
        q3 += r
        m3 += abs(r)
    for t in range(k4, k):
        s0, r = _two_sum(s0, a[t] * b[t])
        q0 += r
        m0 += abs(r)
    s, r = _two_sum(s0, s1)
    q0 += r
    m0 += abs(r)
    s, r = _two_sum(s, s2)
    q1 += r
    m1 += abs(r)
    s, r = _two_sum(s, s3)
    q2 += r
    m2 += abs(r)
    qs = (q0 + q1) + (q2 + q3)
    ms = (m0 + m1) + (m2 + m3)
    res, tail = _two_sum(s, qs)
    if ms == 0.0 and tail == 0.0:
        return res + 0.0, 0.0  # no TwoSum lost a bit: res is the exact sum (+0 for zero)
    return res + 0.0, (abs(tail) + ms * c) * (1.0 + 2.0**-50)


_GROUP = 16  # columns of B gathered together in resum


@njit(cache=True, parallel=True)
def resum(a: np.ndarray, b: np.ndarray, rows: np.ndarray, ucols: np.ndarray, starts: np.ndarray,
          c: float, out: np.ndarray, decided: np.ndarray, fast32: bool, mb: int, emin: int,
          maxf: float, has_inf: bool, away: bool) -> None:  # fmt: skip
    """Stage two (module doc, 3 and 4) for outputs sorted by column: those of column
    ``ucols[u]`` are ``rows[starts[u]:starts[u + 1]]``; ``out[t]`` (float32) and ``decided[t]`` for
    each.  ``a [M, K]`` is float64, ``b [K, N]`` float32 (half the memory to read); the columns of
    b are gathered ``_GROUP`` at a time into a contiguous float64 buffer."""
    k = a.shape[1]
    nu = ucols.shape[0]
    ng = (nu + _GROUP - 1) // _GROUP
    for g in prange(ng):
        u0 = g * _GROUP
        w = min(_GROUP, nu - u0)
        buf = np.empty((_GROUP, k))
        for q in range(k):
            br = b[q]
            for cc in range(w):
                buf[cc, q] = np.float64(br[ucols[u0 + cc]])
        for cc in range(w):
            col = buf[cc]
            for t in range(starts[u0 + cc], starts[u0 + cc + 1]):
                x, e = _sum2(a[rows[t]], col, c)
                if fast32:
                    v, ok = _decide32(x, e)
                else:
                    v, ok = _decide(x, e, fast32, mb, emin, maxf, has_inf, away)
                out[t] = v
                decided[t] = ok
