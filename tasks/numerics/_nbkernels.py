"""numba kernels behind :mod:`.compiled` (imported lazily by it: importing this module loads numba).

Every kernel computes ``out = A @ B`` for one accumulation order, one output tile (``_R`` rows x
``_JB`` columns) per parallel iteration; inside a tile the loops run over ``k`` in the order's
sequence, then the tile's rows, then its columns, so each output's additions happen in exactly the
order of :mod:`.orders` while LLVM vectorizes the innermost loop over columns (independent
outputs).  Tiles are independent, so the result does not depend on the thread count.  No
``fastmath``: LLVM neither reassociates nor contracts a multiply and an add into an FMA (tests check
it on data where an FMA changes the result); a fused multiply-add is asked for explicitly
(:func:`_fma32`, ``llvm.fma``, always one rounding).

float32 kernels (``kind``: 0 fp32, 1 bf16, 2 fp16; round to nearest even only), for operands whose
products are exact in fp32 (always for fp32 accumulators: see below):

* fp32, fma=False: IEEE fp32 multiply, then add; fma=True: ``fma(a, b, acc)``, the exact product
  added with one rounding.  The first level of a pairwise tree with fma adds two exact products
  (up to 48 bits each) with one rounding: their float64 sum, rounded to odd with its TwoSum
  remainder, then one cast to fp32 (correct because 53 >= 24 + 2).
* bf16 / fp16 (products exact in fp32, checked by the caller), one loop per format and fma (no
  branch inside it): a sum of two values of the format is added in fp32 and rounded once more to
  the format (innocuous: 24 >= 2p + 2, as torch does).  bf16 rounding is the integer
  round-to-nearest-even of the fp32 bit pattern (:func:`_bf16`); fp16 rounding is one hardware
  conversion to half and back (:func:`_fp16`: F16C ``vcvtps2ph``, or the bit method
  :func:`_rnd_fp16_soft` where the target has none).  A sum with an exact product (fma) is taken
  as fl32(x + y) and its TwoSum remainder: fp16 rounds it to odd (24 >= 11 + 2) before the
  conversion (:func:`_sum_fp16`); bf16 lets the remainder break the one tie that can misround, a
  sum on a bf16 midpoint (:func:`_sum_bf16`).

float64 kernels (``*_gen``): any format, either round-to-nearest mode, any inputs: float64 values,
TwoSum remainders and :func:`_round` (the method of :func:`.rounding.round_to_format`).  Every value
is a value of fp32 or narrower or the product of two of them (at most 48 bits, exponent within
float64's normal range), so float64 products and TwoSum remainders are exact.
"""

from __future__ import annotations

import math
import platform
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

_R = 16  # output rows per tile
_JB = 64  # output columns per tile: a K x 64 panel of B (1 MiB fp32 at K = 4096) stays in L2
_MAGIC = 6755399441055744.0  # 1.5 * 2**52: (r + M) - M is r rounded to an integer, ties to even
_F16_MIN_NORMAL_BITS = 0x38800000  # fp32 bit pattern of 2**-14
_F16_SUB = np.float32(0.75)  # (x + 0.75) - 0.75 rounds |x| < 2**-14 to a multiple of 2**-24
_F16_MAX = np.float32(65504.0)
_INF32 = np.float32(np.inf)
_ZERO32 = np.float32(0.0)


def _fma32_typer(typingctx: object, x: object, y: object, z: object) -> tuple[object, object]:
    """``x * y + z`` with one rounding (``llvm.fma.f32``), for float32 operands."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context: object, builder: object, signature: object, args: object) -> object:
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic(  # type: ignore[attr-defined]
            "llvm.fma", [f], ir.FunctionType(f, [f, f, f])
        )
        return builder.call(fn, args)  # type: ignore[attr-defined]

    return sig, codegen


_fma32: Any = intrinsic(_fma32_typer)


@njit(cache=True)
def _f2i(x: Any) -> Any:
    return np.float64(x).view(np.int64)


@njit(cache=True)
def _i2f(n: Any) -> Any:
    return np.int64(n).view(np.float64)


def _hw_f16() -> bool:
    """Does the compilation target convert float32 to half in hardware (x86 F16C, any AArch64)?
    A fixed numba target (``NUMBA_CPU_NAME``, portable caches) is judged by its feature list."""
    from numba.core import config

    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return True
    if machine not in ("x86_64", "amd64"):
        return False
    if getattr(config, "CPU_NAME", None):
        feats = str(getattr(config, "CPU_FEATURES", None) or "")
    else:
        import llvmlite.binding as llvm

        feats = llvm.get_host_cpu_features().flatten()
    return "+f16c" in feats.split(",")


HW_F16 = _hw_f16()


@njit(cache=True)
def _rnd_fp16_soft(x: np.float32) -> np.float32:
    """An fp32 value rounded to nearest even in fp16 by bit manipulation: 13 bits dropped in fp16's
    normal range, a fixed quantum 2**-24 below it; overflow gives +-inf, NaN stays NaN, -0 kept."""
    u = np.float32(x).view(np.uint32)
    r = (u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    y = np.uint32(r).view(np.float32)
    if (u & np.uint32(0x7FFFFFFF)) < np.uint32(_F16_MIN_NORMAL_BITS):
        y = np.float32(math.copysign((x + _F16_SUB) - _F16_SUB, x))
    if abs(y) > _F16_MAX:
        y = np.float32(math.copysign(_INF32, x))
    if x != x:
        y = x
    return y


def _fp16_typer(typingctx: object, x: object) -> tuple[object, object]:
    """An fp32 value rounded to nearest even in fp16, as fp32: ``fptrunc`` to half then ``fpext``
    (one hardware conversion, ``vcvtps2ph``/``vcvtph2ps`` with F16C: IEEE rounding, subnormals,
    overflow to inf, NaN kept) where :data:`HW_F16`, else :func:`_rnd_fp16_soft`."""
    sig = types.float32(types.float32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if not HW_F16:
            return context.compile_internal(builder, _rnd_fp16_soft.py_func, signature, args)
        h = builder.fptrunc(args[0], ir.HalfType())
        return builder.fpext(h, ir.FloatType())

    return sig, codegen


_fp16: Any = intrinsic(_fp16_typer)


def _h2f_typer(typingctx: object, x: object) -> tuple[object, object]:
    """The fp16 value of a uint16 bit pattern as float32 (``bitcast`` to half, ``fpext``: exact;
    ``vcvtph2ps`` with F16C).  Used only where :data:`HW_F16`."""
    sig = types.float32(types.uint16)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


_h2f: Any = intrinsic(_h2f_typer)


@njit(cache=True)
def widen_fp16(src: np.ndarray, out: np.ndarray) -> None:
    """``out[i]`` = the fp16 value with bit pattern ``src[i]`` (uint16) as float32 (exact; NaN
    payloads kept); 1-D arrays.  Only where :data:`HW_F16`."""
    for i in range(src.shape[0]):
        out[i] = _h2f(src[i])


@njit(cache=True)
def _bf16(x: np.float32) -> np.float32:
    """An fp32 value rounded to nearest even in bf16 (fp32's exponent range, so one integer
    rounding of the bit pattern covers subnormals and overflow to inf).  A NaN whose low 16 bits
    are zero is kept as it is (no carry reaches its exponent); the bf16 kernels see no other NaN:
    every NaN they make is an input's, quieted, or the default NaN, and the caller replaces NaN
    operands of wider formats (fp16) by the default NaN (:func:`.compiled.run_ordered`)."""
    u = np.float32(x).view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.uint32(r).view(np.float32)


@njit(cache=True)
def _sum_bf16(x: np.float32, y: np.float32) -> np.float32:
    """``x + y`` (any float32 operands) rounded once to bf16.  fl32(x + y) = s and its TwoSum
    remainder e: s misrounds only when it is a bf16 midpoint (low 16 bits 0x8000) and e != 0; then
    the tie goes the way of e (up in magnitude when e has s's sign), else to even.  A non-finite s
    (e NaN) is rounded as it is (NaN: as in :func:`_bf16`)."""
    s = x + y
    bv = s - x
    e = (x - (s - bv)) + (y - bv)
    u = np.float32(s).view(np.uint32)
    same = ((np.float32(e).view(np.uint32) ^ u) >> np.uint32(31)) ^ np.uint32(1)
    t = same if (e > 0) | (e < 0) else (u >> np.uint32(16)) & np.uint32(1)
    r = (u + np.uint32(0x7FFF) + t) & np.uint32(0xFFFF0000)
    return np.uint32(r).view(np.float32)


@njit(cache=True)
def _sum_fp16(x: np.float32, y: np.float32) -> np.float32:
    """``x + y`` (any float32 operands) rounded once to fp16: fl32(x + y) rounded to odd with its
    TwoSum remainder (24 >= 11 + 2 bits, and fp16's subnormal quantum 2**-24 is far above fp32's),
    then one conversion (:func:`_fp16`).  Round to odd without a parity test: with e != 0 the
    pattern moves one step toward zero when e's sign is not s's, then its last bit is set."""
    s = x + y
    bv = s - x
    e = (x - (s - bv)) + (y - bv)
    u = np.float32(s).view(np.uint32)
    opp = (np.float32(e).view(np.uint32) ^ u) >> np.uint32(31)
    ro = ((u - opp) | np.uint32(1)) if (e > 0) | (e < 0) else u
    out: np.float32 = _fp16(np.uint32(ro).view(np.float32))
    return out


@njit(cache=True)
def _odd64_to32(x: float, y: float) -> np.float32:
    """``x + y`` for exact float64 operands, rounded once to fp32 (round to odd, then cast)."""
    s = x + y
    bv = s - x
    e = (x - (s - bv)) + (y - bv)
    bits = _f2i(s)
    fix = np.int64(((e > 0) | (e < 0)) & ((bits & 1) == 0))
    step = 1 if (e > 0) == (s > 0) else -1
    return np.float32(_i2f(bits + fix * step))


@njit(cache=True, inline="always")
def _step_row(acc: np.ndarray, brow: np.ndarray, aik: np.float32, fma: bool, kind: int) -> None:
    """``acc[j] = round(acc[j] + a * brow[j])`` for one row (the branches outside the loops)."""
    w = acc.shape[0]
    if kind == 0 and fma:
        for j in range(w):
            acc[j] = _fma32(aik, brow[j], acc[j])
    elif kind == 0:
        for j in range(w):
            acc[j] = acc[j] + aik * brow[j]
    elif kind == 1 and fma:
        for j in range(w):
            acc[j] = _sum_bf16(acc[j], aik * brow[j])
    elif kind == 1:
        for j in range(w):
            acc[j] = _bf16(acc[j] + _bf16(aik * brow[j]))
    elif fma:
        for j in range(w):
            acc[j] = _sum_fp16(acc[j], aik * brow[j])
    else:
        for j in range(w):
            acc[j] = _fp16(acc[j] + _fp16(aik * brow[j]))


@njit(cache=True, inline="always")
def _add_rows(acc: np.ndarray, x: np.ndarray, kind: int) -> None:
    """``acc = round(acc + x)`` elementwise for values of the format (float32, 2-D)."""
    if kind == 0:
        for r in range(acc.shape[0]):
            for j in range(acc.shape[1]):
                acc[r, j] = acc[r, j] + x[r, j]
    elif kind == 1:
        for r in range(acc.shape[0]):
            for j in range(acc.shape[1]):
                acc[r, j] = _bf16(acc[r, j] + x[r, j])
    else:
        for r in range(acc.shape[0]):
            for j in range(acc.shape[1]):
                acc[r, j] = _fp16(acc[r, j] + x[r, j])


@njit(parallel=True, cache=True)
def blocked_f32(a: np.ndarray, b: np.ndarray, out: np.ndarray, bs: int, across: bool, fma: bool,
                kind: int) -> None:  # fmt: skip
    """Sequential within blocks of ``bs`` products from +0, then across the block sums from +0
    (``across``; else a single block, ``bs >= K``: plain sequential).  float32 arrays."""
    m, k = a.shape
    n = b.shape[1]
    ni = (m + _R - 1) // _R
    nj = (n + _JB - 1) // _JB
    for t in prange(ni * nj):
        i0 = (t % ni) * _R
        j0 = (t // ni) * _JB
        rows = min(m, i0 + _R) - i0
        w = min(n, j0 + _JB) - j0
        tot = np.zeros((rows, w), dtype=np.float32)
        blk = np.zeros((rows, w), dtype=np.float32)
        for k0 in range(0, k, bs):
            blk[:] = 0.0
            for q in range(k0, min(k, k0 + bs)):
                brow = b[q, j0 : j0 + w]
                for r in range(rows):
                    _step_row(blk[r], brow, a[i0 + r, q], fma, kind)
            if across:
                _add_rows(tot, blk, kind)
            else:
                tot[:, :] = blk
        out[i0 : i0 + rows, j0 : j0 + w] = tot


@njit(cache=True, inline="always")
def _leaf_pairs(dst: np.ndarray, b0: np.ndarray, b1: np.ndarray, a0: np.float32, a1: np.float32,
                fma: bool, kind: int) -> None:  # fmt: skip
    """First tree level: ``dst[j] = round(t0 + t1)`` for the terms of products q and q + 1."""
    w = dst.shape[0]
    if kind == 0 and fma:
        x0, x1 = np.float64(a0), np.float64(a1)
        for j in range(w):
            dst[j] = _odd64_to32(x0 * np.float64(b0[j]), x1 * np.float64(b1[j]))
    elif kind == 0:
        for j in range(w):
            dst[j] = a0 * b0[j] + a1 * b1[j]
    elif kind == 1 and fma:
        for j in range(w):
            dst[j] = _sum_bf16(a0 * b0[j], a1 * b1[j])
    elif kind == 1:
        for j in range(w):
            dst[j] = _bf16(_bf16(a0 * b0[j]) + _bf16(a1 * b1[j]))
    elif fma:
        for j in range(w):
            dst[j] = _sum_fp16(a0 * b0[j], a1 * b1[j])
    else:
        for j in range(w):
            dst[j] = _fp16(_fp16(a0 * b0[j]) + _fp16(a1 * b1[j]))


@njit(parallel=True, cache=True)
def pairwise_f32(a: np.ndarray, b: np.ndarray, out: np.ndarray, levels: int, fma: bool,
                 kind: int) -> None:  # fmt: skip
    """Pairwise tree (level by level, the odd element carried), then ``0 + sum``.  float32 arrays.

    The tree as a binary counter over the leaves: leaf pairs (2i, 2i + 1) form its first level, and
    a new subtree is merged with the one before it while their heights are equal; at the end the
    subtrees (aligned blocks of decreasing power-of-two sizes) are folded right to left.  That is
    the level-by-level tree of :func:`.orders.pairwise`.  With an odd K the last product is a lone
    leaf, added (exactly, with fma) by the first step of the fold."""
    m, k = a.shape
    n = b.shape[1]
    ni = (m + _R - 1) // _R
    nj = (n + _JB - 1) // _JB
    for t in prange(ni * nj):
        i0 = (t % ni) * _R
        j0 = (t // ni) * _JB
        rows = min(m, i0 + _R) - i0
        w = min(n, j0 + _JB) - j0
        st = np.zeros((levels, rows, w), dtype=np.float32)
        hs = np.zeros(levels, dtype=np.int64)
        sp = 0
        q = 0
        while q + 1 < k:
            b0 = b[q, j0 : j0 + w]
            b1 = b[q + 1, j0 : j0 + w]
            for r in range(rows):
                _leaf_pairs(st[sp, r], b0, b1, a[i0 + r, q], a[i0 + r, q + 1], fma, kind)
            h = 1
            while sp > 0 and hs[sp - 1] == h:
                _add_rows(st[sp - 1], st[sp], kind)
                sp -= 1
                h += 1
            hs[sp] = h
            sp += 1
            q += 2
        tot = np.zeros((rows, w), dtype=np.float32)
        alone = q < k and sp == 0  # K = 1: the product's addition below is the final 0 + x
        if q < k:  # the lone last leaf: 0 or the last subtree, plus the product (one rounding)
            if sp > 0:
                sp -= 1
                tot[:, :] = st[sp]
            brow = b[q, j0 : j0 + w]
            for r in range(rows):
                _step_row(tot[r], brow, a[i0 + r, q], fma, kind)
        elif sp > 0:
            sp -= 1
            tot[:, :] = st[sp]
        for s in range(sp - 1, -1, -1):
            _add_rows(tot, st[s], kind)
        if alone:
            out[i0 : i0 + rows, j0 : j0 + w] = tot
        else:
            for r in range(rows):
                for j in range(w):
                    out[i0 + r, j0 + j] = _ZERO32 + tot[r, j]  # 0 + sum: -0 becomes +0


# ---------------------------------------------------------------------------------------------
# float64 kernels: any format, either rounding


@njit(cache=True)
def _round(s: float, e: float, mb: int, emin: int, maxf: float, has_inf: bool, away: bool) -> float:
    """The exact value ``s + e`` (``|e| <= ulp64(s) / 2``; 0 or NaN for a non-finite ``s``) rounded
    to the format with ``mb`` mantissa bits, smallest normal exponent ``emin`` and largest finite
    value ``maxf``, as :func:`.rounding.round_to_format` does it (the quantum of s's binade; ``e``
    decides exact ties): overflow to +-inf (NaN without inf), a negative value rounding to zero
    gives -0."""
    ex = ((_f2i(s) >> 52) & 0x7FF) - 1023
    qe = max(ex, emin) - mb
    q = _i2f((qe + 1023) << 52)
    r = s * _i2f((1023 - qe) << 52)  # exact: s / q, q a power of two
    n = (r + _MAGIC) - _MAGIC  # |r| < 2**25: round half to even
    if abs(r - n) == 0.5:  # exactly halfway at float64 precision: the remainder decides
        if e > 0:
            n = r + 0.5
        elif e < 0:
            n = r - 0.5
        elif away:
            n = r + math.copysign(0.5, r)
    out = math.copysign(n * q, s)
    if not abs(out) <= maxf:  # overflow, or s is +-inf or NaN
        if s != s:
            out = s
        elif has_inf:
            out = math.copysign(math.inf, s)
        else:
            out = math.nan
    return out


@njit(cache=True)
def _add(x: float, y: float, mb: int, emin: int, maxf: float, has_inf: bool, away: bool) -> float:
    """``round(x + y)`` for exact float64 operands: one rounding to the format, IEEE specials."""
    s = x + y
    bv = s - x
    e = (x - (s - bv)) + (y - bv)  # TwoSum; NaN when s is not finite
    if not (e > 0 or e < 0):
        e = 0.0
    return _round(s, e, mb, emin, maxf, has_inf, away)


@njit(cache=True)
def _term(p: float, fma: bool, mb: int, emin: int, maxf: float, has_inf: bool,
          away: bool) -> float:  # fmt: skip
    """A product as the order adds it: exact (fma) or rounded once to the format."""
    if fma:
        return p
    return _round(p, 0.0, mb, emin, maxf, has_inf, away)


@njit(parallel=True, cache=True)
def blocked_gen(a: np.ndarray, b: np.ndarray, out: np.ndarray, bs: int, across: bool, fma: bool,
                mb: int, emin: int, maxf: float, has_inf: bool, away: bool) -> None:  # fmt: skip
    """:func:`blocked_f32` for any format, rounding and fma (float64 values)."""
    m, k = a.shape
    n = b.shape[1]
    ni = (m + _R - 1) // _R
    nj = (n + _JB - 1) // _JB
    for t in prange(ni * nj):
        i0 = (t % ni) * _R
        j0 = (t // ni) * _JB
        rows = min(m, i0 + _R) - i0
        w = min(n, j0 + _JB) - j0
        tot = np.zeros((rows, w), dtype=np.float64)
        blk = np.zeros((rows, w), dtype=np.float64)
        for k0 in range(0, k, bs):
            blk[:] = 0.0
            for q in range(k0, min(k, k0 + bs)):
                brow = b[q, j0 : j0 + w]
                for r in range(rows):
                    aik = np.float64(a[i0 + r, q])
                    acc = blk[r]
                    for j in range(w):
                        p = _term(aik * np.float64(brow[j]), fma, mb, emin, maxf, has_inf, away)
                        acc[j] = _add(acc[j], p, mb, emin, maxf, has_inf, away)
            if across:
                for r in range(rows):
                    for j in range(w):
                        tot[r, j] = _add(tot[r, j], blk[r, j], mb, emin, maxf, has_inf, away)
            else:
                tot[:, :] = blk
        out[i0 : i0 + rows, j0 : j0 + w] = tot


@njit(parallel=True, cache=True)
def pairwise_gen(a: np.ndarray, b: np.ndarray, out: np.ndarray, levels: int, fma: bool, mb: int,
                 emin: int, maxf: float, has_inf: bool, away: bool) -> None:  # fmt: skip
    """:func:`pairwise_f32` for any format, rounding and fma (float64 values; a lone exact leaf
    stays unrounded until the addition that uses it, as in :func:`.orders.pairwise`)."""
    m, k = a.shape
    n = b.shape[1]
    ni = (m + _R - 1) // _R
    nj = (n + _JB - 1) // _JB
    for t in prange(ni * nj):
        i0 = (t % ni) * _R
        j0 = (t // ni) * _JB
        rows = min(m, i0 + _R) - i0
        w = min(n, j0 + _JB) - j0
        st = np.zeros((levels, rows, w), dtype=np.float64)
        hs = np.zeros(levels, dtype=np.int64)
        sp = 0
        q = 0
        while q + 1 < k:
            b0 = b[q, j0 : j0 + w]
            b1 = b[q + 1, j0 : j0 + w]
            for r in range(rows):
                a0 = np.float64(a[i0 + r, q])
                a1 = np.float64(a[i0 + r, q + 1])
                dst = st[sp, r]
                for j in range(w):
                    x = _term(a0 * np.float64(b0[j]), fma, mb, emin, maxf, has_inf, away)
                    y = _term(a1 * np.float64(b1[j]), fma, mb, emin, maxf, has_inf, away)
                    dst[j] = _add(x, y, mb, emin, maxf, has_inf, away)
            h = 1
            while sp > 0 and hs[sp - 1] == h:
                for r in range(rows):
                    for j in range(w):
                        st[sp - 1, r, j] = _add(st[sp - 1, r, j], st[sp, r, j], mb, emin, maxf,
                                                has_inf, away)  # fmt: skip
                sp -= 1
                h += 1
            hs[sp] = h
            sp += 1
            q += 2
        if q < k:
            brow = b[q, j0 : j0 + w]
            for r in range(rows):
                aik = np.float64(a[i0 + r, q])
                for j in range(w):
                    st[sp, r, j] = _term(aik * np.float64(brow[j]), fma, mb, emin, maxf, has_inf,
                                         away)  # fmt: skip
            sp += 1
        tot = np.zeros((rows, w), dtype=np.float64)
        if sp > 0:
            tot[:, :] = st[sp - 1]
            for s in range(sp - 2, -1, -1):
                for r in range(rows):
                    for j in range(w):
                        tot[r, j] = _add(st[s, r, j], tot[r, j], mb, emin, maxf, has_inf, away)
        for r in range(rows):
            for j in range(w):
                out[i0 + r, j0 + j] = _add(0.0, tot[r, j], mb, emin, maxf, has_inf, away)


@njit(cache=True)
def abs_range(x: np.ndarray) -> tuple[float, float]:
    """Smallest and largest magnitude among the finite nonzero values of a float32 array (inf and
    0 if none): an unsigned min and max over the magnitudes' bit patterns (monotonic in the value,
    vectorized)."""
    u = x.view(np.uint32)
    lo = np.uint32(0xFFFFFFFF)
    hi = np.uint32(0)
    for i in range(u.shape[0]):
        m = u[i] & np.uint32(0x7FFFFFFF)
        ok = (m - np.uint32(1)) < np.uint32(0x7F7FFFFF)  # 0 < m < inf's pattern (unsigned wrap)
        lo = min(lo, m if ok else np.uint32(0xFFFFFFFF))
        hi = max(hi, m if ok else np.uint32(0))
    if hi == 0:
        return math.inf, 0.0
    return float(np.uint32(lo).view(np.float32)), float(np.uint32(hi).view(np.float32))
