"""Slow exact oracles for the kernel tests: the same order of operations, in Fractions.

Every fp32 operation is ``fl(exact) = round_fraction(exact, "fp32")``; every final rounding is
``round_fraction(exact, out)``.  Nothing here uses floating-point arithmetic except the exact
conversions of operands to Fractions, so a disagreement with a kernel is the kernel's bug (or the
oracle not following the documented order).  Shared Hypothesis strategies live here too.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch
from hypothesis import strategies as st

from tasks.numerics import round_fraction

F = Fraction
OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
BITS_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def fl(x: Fraction) -> Fraction:
    """One fp32 rounding (values stay far from fp32 overflow in these tests)."""
    v = round_fraction(x, "fp32")
    assert np.isfinite(v), "oracle left fp32 range"
    return F(v)


def rn(x: Fraction, out: torch.dtype) -> float:
    """Final rounding into the output dtype (may be +-inf for fp16)."""
    return round_fraction(x, OUT_NAMES[out])


def wrap_int32(x: int) -> int:
    return ((x + 2**31) % 2**32) - 2**31


# -- INT8 epilogues --------------------------------------------------------------------------


def int8_acc(a: torch.Tensor, b: torch.Tensor) -> list[list[int]]:
    al, bl = a.tolist(), b.tolist()
    k = len(bl)
    return [
        [wrap_int32(sum(al[i][t] * bl[t][j] for t in range(k))) for j in range(len(bl[0]))]
        for i in range(len(al))
    ]


def epilogue_oracle(
    accf: Fraction,
    sa: Fraction,
    sb: Fraction,
    bias_value: float | None,
    out: torch.dtype,
    kind: str,
) -> float:
    """One output element for epilogue ``kind`` from the (already fp32) accumulator ``accf``.

    ``bias_value`` is a float so that the sign of a zero bias survives (it matters only when an
    add has an exactly zero result: IEEE gives -0 for -0 + -0).
    """
    bias = None if bias_value is None else F(bias_value)
    if kind == "cutlass":
        t = fl(sb * accf)
        return rn(fl(sa * t), out) if bias is None else rn(fl(sa * t + bias), out)
    if kind in ("triton", "triton-fp32", "triton-output"):
        u = fl(sb * fl(sa * accf))
        if bias is None:
            return rn(u, out)
        if kind == "triton-output":
            c = rn(u, out)
            if not np.isfinite(c):
                return c
            if F(c) + bias == 0:  # IEEE: x + (-x) = +0, but -0 + -0 = -0 (c may be -0 here)
                return c + bias_value if c == 0 else 0.0
            return rn(F(c) + bias, out)
        return rn(fl(u + bias), out)
    if kind == "channelwise":
        u = fl(fl(accf * sa) * sb)
        return rn(u, out) if bias is None else rn(fl(u + bias), out)
    raise ValueError(kind)


def _scales(sa: torch.Tensor, sb: torch.Tensor, m: int, n: int) -> tuple[list[F], list[F]]:
    sal = [F(v) for v in sa.reshape(-1).tolist()]
    sbl = [F(v) for v in sb.reshape(-1).tolist()]
    return (sal * m if len(sal) == 1 else sal), (sbl * n if len(sbl) == 1 else sbl)


def apply_epilogue(
    acc: list[list[Fraction]],
    sa: torch.Tensor,
    sb: torch.Tensor,
    out: torch.dtype,
    bias: torch.Tensor | None,
    kind: str,
) -> torch.Tensor:
    """Oracle output tensor from an accumulator (Fractions, already fp32 values)."""
    m, n = len(acc), len(acc[0])
    sal, sbl = _scales(sa, sb, m, n)
    bl = None if bias is None else bias.to(torch.float64).tolist()
    vals = [
        [
            epilogue_oracle(acc[i][j], sal[i], sbl[j], None if bl is None else bl[j], out, kind)
            for j in range(n)
        ]
        for i in range(m)
    ]
    return torch.tensor(vals, dtype=torch.float64).to(out)


def int8_oracle(a, b, sa, sb, out, bias, kind) -> torch.Tensor:
    acc = [[fl(F(v)) for v in row] for row in int8_acc(a, b)]
    return apply_epilogue(acc, sa, sb, out, bias, kind)


# -- FP8 accumulation orders -----------------------------------------------------------------


def products(a: torch.Tensor, b: torch.Tensor, i: int, j: int) -> list[Fraction]:
    af = a.to(torch.float64)[i].tolist()
    bf = b.to(torch.float64)[:, j].tolist()
    return [F(x) * F(y) for x, y in zip(af, bf, strict=True)]


def seq_sum(ps: list[Fraction]) -> Fraction:
    acc = F(0)
    for p in ps:
        acc = fl(acc + p)
    return acc


def pairwise_sum(ps: list[Fraction]) -> Fraction:
    """Level-by-level pairing, odd element carried; then 0 + that."""
    xs = list(ps)
    while len(xs) > 1:
        nxt = [fl(xs[i] + xs[i + 1]) for i in range(0, len(xs) - 1, 2)]
        if len(xs) % 2:
            nxt.append(xs[-1])
        xs = nxt
    return fl(F(0) + xs[0])


def blocked_sum(ps: list[Fraction], block: int) -> Fraction:
    sums = [seq_sum(ps[i : i + block]) for i in range(0, len(ps), block)]
    return seq_sum(sums)


def fp8_acc_oracle(a: torch.Tensor, b: torch.Tensor, order: str, block: int = 0):
    m, n = a.shape[0], b.shape[1]
    fn = {
        "sequential": seq_sum,
        "pairwise": pairwise_sum,
        "blocked": lambda ps: blocked_sum(ps, block),
    }[order]
    return [[fn(products(a, b, i, j)) for j in range(n)] for i in range(m)]


# -- exact -----------------------------------------------------------------------------------


def exact_oracle(a, b, sa, sb, out, bias) -> torch.Tensor:
    m, n = a.shape[0], b.shape[1]
    sal, sbl = _scales(sa, sb, m, n)
    bl = None if bias is None else [F(v) for v in bias.to(torch.float64).tolist()]
    vals = []
    for i in range(m):
        row = []
        for j in range(n):
            x = sum(products(a, b, i, j), F(0)) * sal[i] * sbl[j]
            if bl is not None:
                x += bl[j]
            row.append(rn(x, out))
        vals.append(row)
    return torch.tensor(vals, dtype=torch.float64).to(out)


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.dtype == y.dtype and torch.equal(
        x.view(BITS_VIEW[x.dtype]), y.view(BITS_VIEW[y.dtype])
    )


# -- Hypothesis strategies -------------------------------------------------------------------

# All finite e4m3fn bit patterns (0x7F / 0xFF are NaN).
FP8_FINITE_BITS = [v for v in range(256) if v & 0x7F != 0x7F]

out_dtypes = st.sampled_from([torch.bfloat16, torch.float16, torch.float32])


@st.composite
def fp32_scale(draw) -> float:
    """Positive fp32 scale: a power of two or a random fp32 value in a realistic range."""
    if draw(st.booleans()):
        return float(2.0 ** draw(st.integers(-24, 4)))
    v = draw(st.floats(min_value=2.0**-20, max_value=4.0, width=32, allow_subnormal=False))
    return float(v)


@st.composite
def scale_tensors(draw, m: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale_a, scale_b) in a random allowed layout."""
    per_tensor_a = draw(st.booleans())
    per_tensor_b = draw(st.booleans())
    if per_tensor_a:
        sa = torch.tensor(draw(fp32_scale()), dtype=torch.float32).reshape(
            draw(st.sampled_from([(), (1,), (1, 1)]))
        )
    else:
        vals = [draw(fp32_scale()) for _ in range(m)]
        sa = torch.tensor(vals, dtype=torch.float32).reshape(draw(st.sampled_from([(m, 1), (m,)])))
    if per_tensor_b:
        sb = torch.tensor(draw(fp32_scale()), dtype=torch.float32).reshape(
            draw(st.sampled_from([(), (1,), (1, 1)]))
        )
    else:
        vals = [draw(fp32_scale()) for _ in range(n)]
        sb = torch.tensor(vals, dtype=torch.float32).reshape(
            draw(st.sampled_from([(n,), (1, n), (n, 1)]))
        )
    return sa, sb


@st.composite
def bias_tensor(draw, n: int, out: torch.dtype, scale: float = 8.0) -> torch.Tensor | None:
    if draw(st.booleans()):
        return None
    vals = [draw(st.floats(-scale, scale, allow_nan=False, width=32)) for _ in range(n)]
    return torch.tensor(vals, dtype=torch.float32).to(out)


@st.composite
def int8_matrix(draw, rows: int, cols: int) -> torch.Tensor:
    vals = draw(st.lists(st.integers(-128, 127), min_size=rows * cols, max_size=rows * cols))
    return torch.tensor(vals, dtype=torch.int8).reshape(rows, cols)


@st.composite
def fp8_matrix(draw, rows: int, cols: int) -> torch.Tensor:
    vals = draw(
        st.lists(st.sampled_from(FP8_FINITE_BITS), min_size=rows * cols, max_size=rows * cols)
    )
    return torch.tensor(vals, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(rows, cols)
