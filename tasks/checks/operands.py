"""Operands of the checks: binary draws, general (randn and adversarial) draws, power-of-two scales.

Every draw is deterministic in its parameters (a SHA-256 of them seeds a ``torch.Generator``), so
a reported trial can be rerun on its own: same check, kernel-independent parameters, same operands.

General input kinds (the ``bounds`` check):

====================  ==========================================================================
kind                  what it stresses
====================  ==========================================================================
``randn``             standard normal entries: the everyday case, many outputs near zero
``uniform-positive``  entries uniform in [0, 1): every partial sum grows, so an accumulator that
                      loses precision (a bf16 accumulator, bf16 split-K partials, a truncating
                      epilogue) errs in one direction and the error adds up
``mixed-scale``       normal entries, each column of A multiplied by 2**e, e uniform in [-4, 4]:
                      products of very different sizes, which an order-dependent sum rounds away
====================  ==========================================================================

Scaled kernels get int8 or fp8 e4m3 operands of the same kinds (int8: randn * 32 rounded and
clamped to [-127, 127], uniform integers in [0, 127], or integers times 2**e clamped; fp8: the
float draw times 16 cast to e4m3) and power-of-two scales, so that every multiplication by a scale
is exact and the checks stay exact.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tasks.seeds import stable_seed

__all__ = [
    "INPUT_KINDS",
    "SCALES_BLIND_SPOT",
    "SCALE_MODES",
    "generator",
    "binary",
    "cancelling_runs",
    "RUNS_FREE",
    "RUNS_MAX_VALUE",
    "RUNS_MIN_RUN",
    "general",
    "scales",
]

INPUT_KINDS = ("randn", "uniform-positive", "mixed-scale")
SCALE_MODES = ("pow2", "unit")
#: What a check with these scales cannot see (issue #36: ``check all`` read IDENTICAL three times for a
#: kernel whose epilogue differs from CUTLASS's), said beside its verdict.
SCALES_BLIND_SPOT = (
    "cannot see: with {scales} scales every multiplication by a scale is exact, so epilogue orders "
    "(CUTLASS's sa*(sb*acc), Triton's sb*(sa*acc)) and epilogue roundings all give the same bits here; "
    "an epilogue difference shows only with real scales: run a K-depth sweep (kind = \"kdepth\", "
    "scale_modes = [\"real\"]) of this kernel beside the reference"
)
#: Power-of-two scales are 2**e with e uniform in [-POW2_RANGE, POW2_RANGE] (per token / channel).
POW2_RANGE = 2


def generator(*parts: Any) -> torch.Generator:
    """A CPU generator seeded by a hash of ``parts`` (stable across processes and versions)."""
    return torch.Generator().manual_seed(stable_seed(*parts))


def binary(m: int, k: int, n: int, p: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``A [M, K]`` and ``B [K, N]`` of zeros and ones (float32), each entry 0 with probability p."""
    a = (torch.rand(m, k, generator=gen) >= p).to(torch.float32)
    b = (torch.rand(k, n, generator=gen) >= p).to(torch.float32)
    return a, b


#: cancelling-runs: free (unpaired) positions of K, whose 0/1 products alone make up the exact total ...
RUNS_FREE = 32
#: ... the paired entries' magnitudes 1..RUNS_MAX_VALUE ...
RUNS_MAX_VALUE = 3
#: ... and the shortest run of one sign (shorter only when K itself is shorter).
RUNS_MIN_RUN = 256
#: fp32's exact-integer range: every partial sum of a cancelling-runs draw stays within it.
_FP32_EXACT = 2**24


def cancelling_runs(m: int, k: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense small-integer ``A [M, K]``, ``B [K, N]`` (float32) whose partial sums along K are large
    but whose exact total is a small nonnegative integer: exact match's second input kind (issue 26).

    Construction.  ``f`` positions of K (``f = K`` when ``K <= 33``, else ``RUNS_FREE`` or one more,
    so that ``K - f`` is even) are *free*: there ``A`` and ``B`` are 0 or 1 (each with probability
    1/2).  The other ``K - f`` positions are cut into runs of one sign, alternating, lengths
    log-uniform in [``RUNS_MIN_RUN``, ``K - f``]; the majority sign's last positions are flipped so
    that both signs hold ``P = (K - f) / 2`` positions.  The t-th "+" position is paired with a random
    "-" position (a random permutation); a pair gets ``A[:, +] = u_t``, ``A[:, -] = -u_t`` and
    ``B[+, :] = B[-, :] = v_t`` with ``u_t [M]``, ``v_t [N]`` integers uniform in
    1..``RUNS_MAX_VALUE``.  So every product at a "+" position is positive, every one at a "-"
    position negative (for every output), and each pair's two products cancel exactly.

    Claim: **every kernel that multiplies these operands exactly and accumulates in fp32 (or wider,
    or in an exact integer accumulator), in any order, association or split of K, with or without
    fma, returns exactly** ``T = sum over free k of A[i, k] B[k, j]``, an integer in [0, f] with
    ``f <= 33``, times the scales when they are powers of two.  Proof:

    1. every entry is an integer of magnitude at most 3: exact in bf16, fp16, fp32, int8 and e4m3,
       and every product an integer of magnitude at most 9, exact in fp32;
    2. every partial sum (over any subset of K, combined in any order) is an integer of magnitude at
       most ``sum_k |A[i, k] B[k, j]| <= 9 K``, which is below ``2**24`` (asserted: ``K < 1,864,135``);
       the exact sum of two such integers is again one, and fp32 holds every integer below ``2**24``,
       so no addition rounds and the accumulator ends at the exact total;
    3. the pairs cancel exactly, so that total is ``T``, in [0, f]; an integer at most 33 (times a
       power of two in the normal range) is a value of bf16, fp16 and fp32, so rounding it once to the
       output format returns it unchanged;
    4. no entry is -0 and no paired entry is 0, so no product is -0 and a zero total is +0 in any
       order (``x + (-x)`` is +0 under round-to-nearest): the sign of zero is that of the exact total.

    What it exposes: a partial sum over a run of L same-sign positions is about ``4 L`` in magnitude
    (far beyond bf16's exact 256 and fp16's 2048 at L >= 512), so a kernel that stores a split-K
    partial, or its accumulator, in a 16-bit format rounds it (by several units at 4096 products) and
    the total it returns is off by that: exact match sees it at any K, where the bounds check's
    ``gamma_K * sum |a b|`` may be wider than the rounding.  The pairs are matched at random (not
    mirrored), so two halves of K do not round to exact negatives of each other.
    """
    if 9 * k >= _FP32_EXACT:
        raise ValueError(f"cancelling-runs needs 9 K < 2**24 (every partial sum exact in fp32), got K = {k}")
    f = k if k <= RUNS_FREE + 1 else RUNS_FREE + (k - RUNS_FREE) % 2
    paired = k - f
    free = torch.randperm(k, generator=gen)[:f]
    a = torch.zeros(m, k)
    b = torch.zeros(k, n)
    a[:, free] = torch.randint(0, 2, (m, f), generator=gen).float()
    b[free, :] = torch.randint(0, 2, (f, n), generator=gen).float()
    if paired == 0:
        return a, b
    signs = torch.empty(paired)
    sign, at = (1.0 if float(torch.rand(1, generator=gen)) < 0.5 else -1.0), 0
    lo = math.log(min(RUNS_MIN_RUN, paired))
    while at < paired:
        length = int(math.exp(lo + float(torch.rand(1, generator=gen)) * (math.log(paired) - lo)))
        signs[at:at + max(1, length)] = sign
        at, sign = at + max(1, length), -sign
    plus = int((signs > 0).sum())
    excess = (plus - (paired - plus)) // 2  # > 0: too many "+"; flip the last ones of the majority
    if excess:
        major = 1.0 if excess > 0 else -1.0
        signs[torch.nonzero(signs == major).reshape(-1)[-abs(excess):]] = -major
    slots = torch.ones(k, dtype=torch.bool)
    slots[free] = False
    where = torch.nonzero(slots).reshape(-1)  # the paired positions, in K order, take the sign sequence
    pos, neg = where[signs > 0], where[signs < 0]
    neg = neg[torch.randperm(len(neg), generator=gen)]
    u = torch.randint(1, RUNS_MAX_VALUE + 1, (m, len(pos)), generator=gen).float()
    v = torch.randint(1, RUNS_MAX_VALUE + 1, (len(pos), n), generator=gen).float()
    a[:, pos], a[:, neg] = u, -u
    b[pos, :], b[neg, :] = v, v
    return a, b


def _float_draw(kind: str, m: int, k: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "randn":
        return torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    if kind == "uniform-positive":
        return torch.rand(m, k, generator=gen), torch.rand(k, n, generator=gen)
    if kind == "mixed-scale":
        a = torch.randn(m, k, generator=gen)
        e = torch.randint(-4, 5, (1, k), generator=gen).to(torch.float32)
        return a * torch.exp2(e), torch.randn(k, n, generator=gen)
    raise ValueError(f"unknown input kind {kind!r}; valid: {', '.join(INPUT_KINDS)}")


def general(
    kind: str, m: int, k: int, n: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``A``, ``B`` of input ``kind`` in ``dtype`` (a float dtype, int8 or float8_e4m3fn)."""
    a, b = _float_draw(kind, m, k, n, gen)
    if dtype == torch.int8:
        if kind == "uniform-positive":
            return (a * 128).floor().clamp(0, 127).to(torch.int8), (b * 128).floor().clamp(0, 127).to(torch.int8)
        return (a * 32).round().clamp(-127, 127).to(torch.int8), (b * 32).round().clamp(-127, 127).to(torch.int8)
    if dtype == torch.float8_e4m3fn:
        return (a * 16).clamp(-448, 448).to(dtype), (b * 16).clamp(-448, 448).to(dtype)
    return a.to(dtype), b.to(dtype)


def scales(
    mode: str, m: int, n: int, numel: tuple[int, int], gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``scale_a`` (``[M, 1]`` or ``[1]``) and ``scale_b`` (``[N]`` or ``[1]``), float32.

    ``mode`` "unit": all ones; "pow2": independent powers of two 2**e, e in [-2, 2], per token
    and per channel (``numel`` says how many of each the kernel takes: (M or 1, N or 1)).
    """
    if mode not in SCALE_MODES:
        raise ValueError(f"unknown scale mode {mode!r}; valid: {', '.join(SCALE_MODES)}")
    na, nb = numel
    if mode == "unit":
        sa, sb = torch.ones(na), torch.ones(nb)
    else:
        sa = torch.exp2(torch.randint(-POW2_RANGE, POW2_RANGE + 1, (na,), generator=gen).float())
        sb = torch.exp2(torch.randint(-POW2_RANGE, POW2_RANGE + 1, (nb,), generator=gen).float())
    return sa.reshape(na, 1).float().contiguous(), sb.reshape(nb).float().contiguous()
