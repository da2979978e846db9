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

from typing import Any

import torch

from tasks.seeds import stable_seed

__all__ = [
    "INPUT_KINDS",
    "SCALE_MODES",
    "generator",
    "binary",
    "general",
    "scales",
]

INPUT_KINDS = ("randn", "uniform-positive", "mixed-scale")
SCALE_MODES = ("pow2", "unit")
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
