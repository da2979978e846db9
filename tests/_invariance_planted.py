"""Kernels planted for the batch-invariance bound (issue #26): one correct kernel whose accumulation
order depends on M, one defect that appears only for M > 8, and torch's own fp32 matmul.

All take e4m3 operands and scale them first, as an fp32 layer computes: ``A = fl(a * scale_a)``,
``B = fl(b * scale_b)`` (fp32), every product ``fl(A[i,k] * B[k,j])`` rounded to fp32, summed in fp32,
the sum rounded once to the output dtype.  (Unscaled e4m3 products are exact in fp32 and their sums
over K = 64 mostly are too, so an order change would rarely show; with real scales the terms carry
24 significant bits and the order matters.)  Scaling first is one of the computations the
batch-invariance bound covers (:mod:`tasks.kinds.batch_invariance.bound`).  Used by tests/test_batch_invariance_bound.py
(as ``module:attr`` kernels: ``_invariance_planted:MBlockedFp32``).
"""

from __future__ import annotations

from typing import Any

import torch

from tasks.kernels import Kernel

__all__ = ["Bf16PartialsAboveM8", "MBlockedFp32", "TorchFp32Matmul", "block_size"]


def block_size(m: int) -> int:
    """The accumulation block of :class:`MBlockedFp32` for a batch of ``m`` rows: 4, 8, 16 or 32."""
    return 4 << (m.bit_length() % 4)


def _blocked(products: torch.Tensor, block: int, partial_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``products`` ``[M, K, N]`` (fp32) summed sequentially within blocks of ``block`` along K, each
    block sum (rounded to ``partial_dtype`` when given) then added sequentially in fp32: one fp32
    rounding per torch operation."""
    m, k, n = products.shape
    acc = torch.zeros(m, n)
    for k0 in range(0, k, block):
        part = torch.zeros(m, n)
        for j in range(k0, min(k0 + block, k)):
            part = part + products[:, j]
        if partial_dtype is not None:
            part = part.to(partial_dtype).to(torch.float32)
        acc = acc + part
    return acc


def _scaled(ops: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The operands scaled in fp32: ``[M, K]`` and ``[K, N]``."""
    return ops.a.to(torch.float32) * ops.scale_a, ops.b.to(torch.float32) * ops.scale_b


def _products(ops: Any) -> torch.Tensor:
    """``[M, K, N]`` fp32 products of the scaled operands (each rounded once)."""
    a, b = _scaled(ops)
    return a[:, :, None] * b[None]


class MBlockedFp32(Kernel):
    """Correct, order depends on M: fp32 accumulation sequential in blocks of :func:`block_size` (M) along
    K, the block sums added in order (a tile configuration chosen by the batch size, as an autotuner
    picks one per M)."""

    operand_dtype = "fp8_e4m3"
    description = "planted: fp32 blocked accumulation, block size chosen by M (correct)"

    def compute(self, ops: Any) -> torch.Tensor:
        out: torch.Tensor = _blocked(_products(ops), block_size(ops.m)).to(ops.out_dtype)
        return out


class Bf16PartialsAboveM8(Kernel):
    """A defect for M > 8 only: blocks of 16 in fp32, but above M = 8 each block sum is rounded to bf16
    before it is added (a split-K configuration with 16-bit partials chosen by M)."""

    operand_dtype = "fp8_e4m3"
    description = "planted: bf16 block partials when M > 8 (defect)"

    def compute(self, ops: Any) -> torch.Tensor:
        out: torch.Tensor = _blocked(_products(ops), 16, torch.bfloat16 if ops.m > 8 else None).to(ops.out_dtype)
        return out


class TorchFp32Matmul(Kernel):
    """torch's own fp32 matmul: ``torch.matmul`` of the scaled fp32 operands (the CPU BLAS this torch
    build dispatches to), rounded once to the output dtype."""

    operand_dtype = "fp8_e4m3"
    description = "torch.matmul in fp32 on e4m3 values, fp32 epilogue"

    def compute(self, ops: Any) -> torch.Tensor:
        a, b = _scaled(ops)
        out: torch.Tensor = (a @ b).to(ops.out_dtype)
        return out
