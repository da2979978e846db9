"""Summation orders emulated exactly, vectorized over a batch of independent sums (torch, CPU).

Every function here sums ``n`` terms for each of ``B`` outputs in one fixed order, rounding each
addition once to a format (:class:`Arith`), and returns what an IEEE machine adding in that order
computes, bit for bit.  Terms come from a :class:`Terms` provider in chunks ``[k, B]`` (the summation
axis first, so one step of a sequential sum is one contiguous ``[B]`` slice): either values of the
format, or exact float64 values that may not be (a product added by a fused multiply-add).

Exactness, by case:

* Both operands are values of the format and the rounding is nearest-even: torch's own add in the
  format's dtype.  fp32 adds are IEEE; bf16 and fp16 adds compute in fp32 and round once more, which
  is innocuous because fp32 has at least 2p + 2 bits for p = 8 and 11 (Figueroa 1995).
* Both operands are values of the format, another rounding or format: the float64 sum (innocuous
  for the same reason, 53 >= 2 * 24 + 2) rounded by :func:`round_to_format`.
* An operand is exact but not in the format (``add_exact``): ``s = fl64(x + y)``.  For fp32, casting
  ``s`` is right unless ``s`` is exactly an fp32 midpoint, which a bit test finds (it also flags
  harmless values with the same low bits, e.g. exact sums; all flagged ones are recomputed exactly).
  A sequential sum tests every step and, every ``_CHECKPOINT`` steps, redoes the flagged outputs
  from the checkpoint (:class:`_Fp32Scan`).  Otherwise, and for the flagged ones, TwoSum gives the
  exact remainder and :func:`round_to_format` rounds ``s + e`` once (:func:`round_dyadic` in Python
  integers when only a few outputs need it).

Providers may also offer per-step methods that avoid materializing the terms (``step_native`` and
``add_into`` of :class:`tasks.numerics.products` terms); :func:`sequential` and :func:`blocked` use
them when present.

Every accumulator starts at +0.0, as a GPU accumulator register does, so a sum of zeros is +0.0.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch

from .formats import FloatFormat, get_format
from .rounding import NEAREST_EVEN, FormatLike, check_rounding, round_dyadic, round_to_format

__all__ = ["Arith", "Terms", "ArrayTerms", "sequential", "pairwise", "blocked", "slots16"]

_F64 = torch.float64
_MID_MASK = (1 << 28) - 1  # low 28 significand bits of a float64 are zero at every fp32 midpoint
_CHUNK_ELEMENTS = 1 << 18  # elements of one [k, B] chunk of terms: small enough to stay in cache
_NATIVE = ("fp32", "bf16", "fp16")
_CHECKPOINT = 16  # steps between midpoint checks of the fp32 fast path (flagged ones redone)
_FEW = 8  # at most this many flagged outputs are redone one by one in Python integers


class Arith:
    """Round-to-nearest arithmetic of one format on torch tensors, exactly.

    Values of the format are stored in ``self.dtype``: the format's own dtype where torch's
    arithmetic in it is exact (fp32, bf16, fp16 with nearest-even), float64 otherwise.
    """

    def __init__(self, fmt: FormatLike, rounding: str = NEAREST_EVEN) -> None:
        self.fmt: FloatFormat = get_format(fmt)
        self.rounding = check_rounding(rounding)
        self.native = self.rounding == NEAREST_EVEN and self.fmt.name in _NATIVE
        self.dtype = self.fmt.torch_dtype if self.native else _F64
        self.fp32 = self.fmt.name == "fp32"

    def zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype)

    def round64(self, x: torch.Tensor) -> torch.Tensor:
        """Exact float64 values rounded once to the format (stored in ``self.dtype``)."""
        if self.native and self.fp32:
            return x.to(torch.float32)  # one IEEE rounding
        r = round_to_format(x.numpy(), self.fmt, rounding=self.rounding)
        return torch.from_numpy(r).to(self.dtype)  # exact: r holds values of the format

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``round(x + y)`` for values of the format."""
        if self.native:
            return x + y
        return self.round64(x + y)  # float64 sum, then one rounding: innocuous (module doc)

    def add_exact(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``round(x + y)`` for exact float64 operands (not necessarily values of the format)."""
        x, y = torch.broadcast_tensors(x.to(_F64), y.to(_F64))
        if not self.fp32:
            return self.exact_add64(x, y).to(self.dtype)
        s = x + y
        r = s.to(torch.float32)
        flag = (s.view(torch.int64) & _MID_MASK) == 0
        if bool(flag.any()):
            r[flag] = self.exact_add64(x[flag], y[flag]).to(torch.float32)
        return r.to(self.dtype)

    def exact_add64(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """TwoSum, then one rounding of the exact sum: float64 tensor of values of the format."""
        s = x + y
        bv = s - x
        e = (x - (s - bv)) + (y - bv)
        e = torch.nan_to_num(e, nan=0.0, posinf=0.0, neginf=0.0)  # s not finite: no remainder
        r = round_to_format(s.numpy(), self.fmt, e.numpy(), self.rounding)
        return torch.from_numpy(np.asarray(r, dtype=np.float64))


class Terms(Protocol):
    """``n`` terms for each of ``size`` outputs, produced in chunks along the summation axis."""

    n: int
    size: int
    exact: bool  # True: float64 values that may lie outside the format; False: values of it

    def chunk(self, k0: int, k1: int) -> torch.Tensor:
        """Terms k0..k1-1 as ``[k1 - k0, size]``: ``arith.dtype`` if not exact, else float64."""
        ...

    def select(self, index: torch.Tensor) -> Terms:
        """The same terms for the outputs ``index`` (a 1-D long tensor) only."""
        ...


class ArrayTerms:
    """Terms given as a ``[n, size]`` tensor."""

    def __init__(self, values: torch.Tensor, exact: bool) -> None:
        self.values = values
        self.n, self.size = values.shape
        self.exact = exact

    def chunk(self, k0: int, k1: int) -> torch.Tensor:
        return self.values[k0:k1]

    def select(self, index: torch.Tensor) -> ArrayTerms:
        return ArrayTerms(self.values[:, index], self.exact)


def _chunks(terms: Terms, per: int = 1) -> Iterator[tuple[int, torch.Tensor]]:
    step = max(per, (_CHUNK_ELEMENTS // max(terms.size, 1)) // per * per)
    for k0 in range(0, terms.n, step):
        yield k0, terms.chunk(k0, min(terms.n, k0 + step))


def _add_scalar(x: float, y: float, ar: Arith) -> float:
    """``round(x + y)`` for Python floats with IEEE rules, in Python integers (for the few flagged
    outputs of the fp32 fast path)."""
    if math.isnan(x) or math.isnan(y):
        return math.nan
    if math.isinf(x) or math.isinf(y):
        if math.isinf(x) and math.isinf(y) and x != y:
            return math.nan
        v = x if math.isinf(x) else y
        return v if ar.fmt.has_inf else math.nan
    (mx, ex), (my, ey) = _dyadic(x), _dyadic(y)
    e = min(ex, ey)
    n = (mx << (ex - e)) + (my << (ey - e))  # x + y == n * 2**e exactly
    if n == 0:  # an exact zero is +0 unless both operands are -0
        return -0.0 if math.copysign(1, x) < 0 and math.copysign(1, y) < 0 else 0.0
    return round_dyadic(n, e, ar.fmt, ar.rounding)


def _dyadic(x: float) -> tuple[int, int]:
    m, e = math.frexp(x)
    return int(math.ldexp(m, 53)), e - 53


def _scan_scalar(start: float, terms: list[float], ar: Arith) -> float:
    acc = start
    for t in terms:
        acc = _add_scalar(acc, t, ar)
    return acc


def _scan_general(start: torch.Tensor, t: torch.Tensor, ar: Arith, exact: bool) -> torch.Tensor:
    """Sequential sum of ``t [k, B]`` onto ``start [B]`` (float64 values of the format)."""
    acc = start.to(_F64)
    for i in range(t.shape[0]):
        if exact:
            acc = ar.exact_add64(acc, t[i].to(_F64))
        else:
            acc = ar.add(acc.to(ar.dtype), t[i]).to(_F64)
    return acc


def _scan(acc: torch.Tensor, t: torch.Tensor, ar: Arith, exact: bool) -> torch.Tensor:
    """Sequential sum of ``t [k, *B]`` onto ``acc [*B]`` (values of the format, ``ar.dtype``)."""
    if not exact:
        if ar.native:
            acc = acc.clone()
            for i in range(t.shape[0]):
                acc.add_(t[i])
            return acc
        for i in range(t.shape[0]):
            acc = ar.add(acc, t[i])
        return acc
    if not ar.fp32:
        shape = acc.shape
        flat = _scan_general(acc.reshape(-1), t.reshape(t.shape[0], -1), ar, True)
        return flat.reshape(shape).to(ar.dtype)
    # fp32 fast path: float64 sum, one cast, a midpoint flag per element; flagged sums redone.
    shape = acc.shape
    start = acc.to(torch.float32).reshape(-1)
    fast = _Fp32Scan(start)
    for i in range(t.shape[0]):
        torch.add(fast.a64, t[i].reshape(-1), out=fast.s)
        fast.settle()
    fast.redo(start, lambda bad: t.reshape(t.shape[0], -1)[:, bad], ar)
    return fast.a32.reshape(shape).to(ar.dtype)


class _Fp32Scan:
    """State of the fp32 fast path: ``s = fl64(acc + x)`` is written by the caller, ``settle``
    rounds it to fp32 and records whether it could have been an fp32 midpoint."""

    def __init__(self, start: torch.Tensor) -> None:
        self.a32 = start.clone()
        self.a64 = start.to(_F64)
        self.s = torch.empty_like(self.a64)
        self.low = torch.empty(start.shape, dtype=torch.int64)
        self.flag = torch.full(start.shape, _MID_MASK + 1, dtype=torch.int64)

    def settle(self) -> None:
        self.a32.copy_(self.s)  # one IEEE rounding to fp32
        self.a64.copy_(self.a32)
        torch.bitwise_and(self.s.view(torch.int64), _MID_MASK, out=self.low)
        torch.minimum(self.flag, self.low, out=self.flag)

    def redo(self, start: torch.Tensor, terms_of: Any, ar: Arith) -> None:
        """Recompute the flagged outputs exactly from ``start`` (``terms_of(index)`` gives their
        float64 terms ``[k, len(index)]``) and reset the flags."""
        bad = (self.flag == 0).nonzero().squeeze(1)
        if 0 < bad.numel() <= _FEW:
            t = terms_of(bad).to(_F64)
            fixed = torch.tensor(
                [_scan_scalar(float(start[i]), t[:, j].tolist(), ar) for j, i in enumerate(bad)],
                dtype=torch.float32,
            )
            self.a32[bad] = fixed
            self.a64[bad] = fixed.to(_F64)
        elif bad.numel():
            fixed = _scan_general(start[bad], terms_of(bad), ar, True).to(torch.float32)
            self.a32[bad] = fixed
            self.a64[bad] = fixed.to(_F64)
        self.flag.fill_(_MID_MASK + 1)


def _sequential_range(terms: Terms, ar: Arith, k0: int, k1: int) -> torch.Tensor | None:
    """Terms k0..k1-1 summed from +0 one step at a time through the provider's own step methods,
    where it has them (products: ``add_into`` for exact terms, ``step_native`` for values of the
    format, both without materializing the products); None if it has not.
    """
    size = terms.size
    if not terms.exact and getattr(terms, "native_steps", False) and ar.dtype == torch.float32:
        step = terms.step_native  # type: ignore[attr-defined]
        acc = ar.zeros(size)
        for k in range(k0, k1):
            step(acc, k)
        return acc
    if terms.exact and getattr(terms, "fused_steps", False) and ar.fp32:
        add_into = terms.add_into  # type: ignore[attr-defined]
        start = torch.zeros(size, dtype=torch.float32)
        fast = _Fp32Scan(start)
        for c0 in range(k0, k1, _CHECKPOINT):
            c1 = min(k1, c0 + _CHECKPOINT)
            start = fast.a32.clone()
            for k in range(c0, c1):
                add_into(fast.a64, k, fast.s)
                fast.settle()
            fast.redo(start, lambda bad, c0=c0, c1=c1: terms.select(bad).chunk(c0, c1), ar)
        return fast.a32.to(ar.dtype)
    return None


def sequential(terms: Terms, ar: Arith) -> torch.Tensor:
    """``((0 + x_0) + x_1) + ... + x_{n-1}`` for every output: ``[size]`` in ``ar.dtype``."""
    fused = _sequential_range(terms, ar, 0, terms.n)
    if fused is not None:
        return fused
    acc = ar.zeros(terms.size)
    for _, t in _chunks(terms):
        acc = _scan(acc, t, ar, terms.exact)
    return acc


def _add_mixed(ar: Arith, x: torch.Tensor, y: torch.Tensor, y_exact: bool) -> torch.Tensor:
    return ar.add_exact(x, y) if y_exact else ar.add(x, y)


def _tree(t: torch.Tensor, ar: Arith, exact: bool) -> tuple[torch.Tensor, bool]:
    """Level-by-level pairwise sum of ``t [n, B]`` (odd element carried, unrounded).

    Returns the sum and whether it is still an unrounded exact term (only when n == 1 and exact).
    """
    n = t.shape[0]
    if n == 1:
        return t[0], exact
    h = n // 2
    pend: torch.Tensor | None = None
    if exact:
        x = ar.add_exact(t[0 : 2 * h : 2], t[1 : 2 * h : 2])
        if n % 2:
            pend = t[n - 1]
    else:
        x = ar.add(t[0 : 2 * h : 2], t[1 : 2 * h : 2])
        if n % 2:
            x = torch.cat([x, t[n - 1 :]])
    while x.shape[0] + (pend is not None) > 1:
        m = x.shape[0]
        h = m // 2
        if pend is not None and m % 2:  # pairs (x0, x1) ... (x_{m-1}, pend)
            y = ar.add(x[0 : 2 * h : 2], x[1 : 2 * h : 2])
            last = ar.add_exact(x[m - 1], pend)
            x, pend = torch.cat([y, last[None]]), None
        elif pend is not None:  # m even: the pending term is carried again
            x = ar.add(x[0::2], x[1::2])
        else:
            y = ar.add(x[0 : 2 * h : 2], x[1 : 2 * h : 2])
            x = torch.cat([y, x[m - 1 :]]) if m % 2 else y
    return x[0], False


def pairwise(terms: Terms, ar: Arith, chunk: int = 64) -> torch.Tensor:
    """Level-by-level pairwise sum (the odd element carried to the next level), then ``0 + sum``.

    The same tree as ``tasks.kernels.fp8.accumulate_pairwise``: chunks of a power-of-two size C at
    multiples of C are whole subtrees of it; chunk sums are merged like a binary counter (two
    subtrees of equal height as soon as both exist) and the leftovers folded right to left.  The
    carried odd element is the last one of its level, so only the last chunk can leave a term
    unrounded (when it holds a single term); it is added exactly where the tree adds it.
    """
    # fewer, larger chunks for 4-byte values of the format (less Python per product); float64
    # exact terms are slower out of cache (measured at M = N = 256)
    limit = _CHUNK_ELEMENTS if terms.exact or ar.dtype == _F64 else 4 * _CHUNK_ELEMENTS
    while chunk > 2 and chunk * terms.size > limit:
        chunk //= 2
    stack: list[tuple[int, torch.Tensor]] = []
    total: torch.Tensor | None = None
    pend = False
    for k0 in range(0, terms.n, chunk):
        total, pend = _tree(terms.chunk(k0, min(terms.n, k0 + chunk)), ar, terms.exact)
        height = 0
        while stack and stack[-1][0] == height:
            total = _add_mixed(ar, stack.pop()[1], total, pend)
            pend = False
            height += 1
        stack.append((height, total))
    if not stack:
        return ar.zeros(terms.size)
    total = stack.pop()[1]
    while stack:
        total = _add_mixed(ar, stack.pop()[1], total, pend)
        pend = False
    if pend:  # a single exact term: the accumulator's 0 + x rounds it (and makes -0 +0)
        return ar.round64(total.to(_F64) + 0.0)
    return total + 0.0  # 0 + sum: exact, turns -0 into +0


def blocked(terms: Terms, ar: Arith, block_size: int) -> torch.Tensor:
    """Sequential from +0 within blocks of ``block_size`` consecutive terms (the last one may be
    shorter), then sequential from +0 across the block sums, in order.

    Small blocks are summed side by side.  The last block is then padded with +0 terms: adding +0
    to a value of the format is exact, and it can only change a -0 block sum into +0, which the
    across sum (an accumulator that is never -0) does not distinguish.
    """
    b = block_size
    total = ar.zeros(terms.size)
    if b * terms.size > _CHUNK_ELEMENTS:  # one block at a time, in cache-sized pieces
        step = max(1, _CHUNK_ELEMENTS // max(terms.size, 1))
        for k0 in range(0, terms.n, b):
            k1 = min(terms.n, k0 + b)
            fused = _sequential_range(terms, ar, k0, k1)
            if fused is None:
                fused = ar.zeros(terms.size)
                for j0 in range(k0, k1, step):
                    fused = _scan(fused, terms.chunk(j0, min(k1, j0 + step)), ar, terms.exact)
            total = _accumulate(ar, total, fused[None])
        return total
    for _, t in _chunks(terms, per=b):
        k = t.shape[0]
        g = -(-k // b)
        if g * b != k:
            t = torch.cat([t, t.new_zeros(g * b - k, terms.size)])
        blocks = t.reshape(g, b, terms.size).transpose(0, 1)  # [b, g, B]
        sums = _scan(ar.zeros(g, terms.size), blocks, ar, terms.exact)
        total = _accumulate(ar, total, sums)
    return total


def _accumulate(ar: Arith, total: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """``total + sums[0] + sums[1] + ...`` in order (values of the format)."""
    if ar.native:
        for i in range(sums.shape[0]):
            total.add_(sums[i])
        return total
    for i in range(sums.shape[0]):
        total = ar.add(total, sums[i])
    return total


def slot_of(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Slot 0..15 of values of ``fmt``: 16 equal bands of binary exponents from the smallest
    subnormal's to ``emax``; zeros in slot 0, inf and NaN in slot 15."""
    lo = fmt.emin - fmt.mantissa_bits
    width = -(-(fmt.emax - lo + 1) // 16)
    _, e = torch.frexp(x.to(_F64).abs())  # |x| = m 2**e, m in [1/2, 1): exponent e - 1
    slot = torch.clamp(torch.div(e.to(torch.int64) - 1 - lo, width, rounding_mode="floor"), 0, 15)
    slot = torch.where(x == 0, torch.zeros_like(slot), slot)
    return torch.where(torch.isfinite(x), slot, torch.full_like(slot, 15))


def slots16(terms: Terms, ar: Arith) -> torch.Tensor:
    """Values of the format summed in 16 slots by magnitude (:func:`slot_of`).

    Within a slot: increasing magnitude with alternating signs (smallest positive, smallest
    negative, next positive, ...; when one sign runs out the other continues; +0 counts as
    positive and -0 as negative), sequential from +0.  Then the slot sums sequentially from +0,
    slot 0 (smallest) first.

    Needs all n terms of an output at once: outputs are processed in blocks.  Each output's terms
    are sorted once as int32 bit patterns of float32 (every value of these formats is one): the
    negatives come first in increasing magnitude, then the positives in increasing magnitude, and
    within each sign the slots are contiguous (the slot is monotone in magnitude), so a batched
    search finds where each (slot, sign) run starts.  The slot's sum is then the sequential sum of
    ``pos_0, neg_0, pos_1, neg_1, ...`` with +0 in place of the terms of a sign that has run out:
    adding +0 to an accumulator that started at +0 changes nothing (it is never -0), so the zeros
    are exactly "the other sign continues".  One native add per step over the block.
    """
    if terms.exact:
        raise ValueError("slots16 sums values of the format (rounded products)")
    out = ar.zeros(terms.size)
    n = terms.n
    if n == 0:
        return out
    work: dict[str, np.ndarray] = {}
    blocks = getattr(terms, "output_blocks", None)  # products straight in [outputs, n] layout
    if blocks is not None:
        for c0, t in blocks(_SLOTS_ELEMENTS):
            out[c0 : c0 + t.shape[0]] = _slots16_block(t, ar, work)
        return out
    cols = max(1, _SLOTS_ELEMENTS // n)
    for c0 in range(0, terms.size, cols):
        idx = torch.arange(c0, min(terms.size, c0 + cols))
        out[idx] = _slots16_block(terms.select(idx).chunk(0, n).t(), ar, work)
    return out


_SLOTS_ELEMENTS = 1 << 22  # terms per block of outputs (sorted keys, windows: ~100 MB)
_INT32_MIN = -(2**31)


def _slot_bounds(fmt: FloatFormat) -> np.ndarray:
    """int32 bit patterns of the lower magnitude bound of slots 0..15 (slot 0: +0)."""
    lo = fmt.emin - fmt.mantissa_bits
    width = -(-(fmt.emax - lo + 1) // 16)
    b = np.array([0.0] + [2.0 ** (lo + s * width) for s in range(1, 16)], dtype=np.float32)
    return b.view(np.int32).astype(np.int64)


def _slots16_block(t: torch.Tensor, ar: Arith, work: dict[str, np.ndarray]) -> torch.Tensor:
    """``t [c, n]``: the slots16 sum of each row (``[c]`` in ``ar.dtype``).  ``work`` keeps a
    buffer between blocks (sorted values, then n zeros to read past a run)."""
    c, n = t.shape
    buf = work.get("vals")
    if buf is None or buf.shape[0] < c:
        buf = work["vals"] = np.zeros((c, 2 * n), dtype=np.float32)
    vals = buf[:c]
    vals[:, :n] = t.to(torch.float32).numpy()  # exact: these formats' values are float32 values
    keys = vals[:, :n].view(np.int32)
    keys.sort(axis=1)  # per row: negatives, then positives, each by increasing magnitude
    bounds = _slot_bounds(ar.fmt)
    probe_np = np.concatenate([bounds + _INT32_MIN, [0], bounds]).astype(np.int32)
    at_np = np.empty((c, 33), dtype=np.int64)
    for r in range(c):  # one short binary search per row (keys is a strided view of vals)
        at_np[r] = np.searchsorted(keys[r], probe_np)
    neg_at = at_np[:, :17]  # run starts of the negatives of slots 0..15, then their end
    pos_at = np.concatenate([at_np[:, 17:], np.full((c, 1), n)], axis=1)
    n_neg, n_pos = np.diff(neg_at, axis=1), np.diff(pos_at, axis=1)  # [c, 16]
    longest = np.maximum(n_neg, n_pos).max(axis=0)
    rows = np.arange(c)
    across = ar.zeros(c)
    for s in range(16):
        steps = int(longest[s])
        if steps == 0:  # empty in every output of the block: its sum is +0, adding it is a no-op
            continue
        windows = np.lib.stride_tricks.sliding_window_view(vals, steps, axis=1)
        seq = np.empty((c, steps, 2), dtype=np.float32)  # pos_0, neg_0, pos_1, neg_1, ... per row
        runs = ((pos_at[:, s], n_pos[:, s]), (neg_at[:, s], n_neg[:, s]))
        for side, (start, count) in enumerate(runs):
            w = windows[rows, start]  # [c, steps]: the run, then whatever follows it
            w[np.arange(steps)[None, :] >= count[:, None]] = 0.0  # a sign that has run out: +0 adds
            seq[:, :, side] = w
        steps_major = torch.from_numpy(seq.reshape(c, 2 * steps)).t().contiguous()  # [2 steps, c]
        across = ar.add(across, _seq_rows(steps_major, ar))
    return across


def _seq_rows(t: torch.Tensor, ar: Arith) -> torch.Tensor:
    """``((0 + t[0]) + t[1]) + ...`` per column of ``t [r, c]`` (float32 values of the format)."""
    r, c = t.shape
    if ar.native and ar.fp32 and c >= 2:
        # numpy's reduction over the outer axis of a C-contiguous array adds row after row into the
        # output, each a float32 IEEE add (pairwise summation is only used along the inner axis,
        # hence c >= 2: a single column would make the summed axis the inner one)
        buf = np.empty((r + 1, c), dtype=np.float32)
        buf[0] = 0.0
        buf[1:] = t.numpy()
        with np.errstate(invalid="ignore", over="ignore"):
            return torch.from_numpy(np.add.reduce(buf, axis=0))
    v = t.to(ar.dtype)
    acc = ar.zeros(c)
    for i in range(r):
        acc = ar.add(acc, v[i])
    return acc
