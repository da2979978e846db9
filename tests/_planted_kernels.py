"""Kernels with planted defects, named the way a user names their own kernel: ``"_planted_kernels:attr"``.

Plain matmuls ``f(A, B) -> C``, marked ``@kernel_function`` (operands in the check's dtype, output in the same dtype), except
``WrongChannelScale``, a scaled INT8 kernel.  Each imitates one bug of a tiled GEMM
(docs/reference/numerics.md §6.3), with tiles of TILE x TILE outputs and K-blocks of BK:

=========================  ====================================================================
attr                       defect
=========================  ====================================================================
``correct``                none: fp32 accumulation, rounded once (the control)
``tile_scaled``            the first output tile multiplied by (1 + 2**-8) (a wrong alpha)
``dropped_k_block``        the last K-block (the partial one when K % BK != 0) never added
``transposed_tile``        the output tile at rows 0..TILE, columns TILE..2 TILE written transposed
``bf16_accumulator``       the accumulator rounded to bf16 after every K-block
``split_k_bf16_partials``  K split in 4, each partial result rounded to bf16, then added
``rtz_epilogue``           fp32 accumulation, then rounded toward zero (truncated) to the output
``WrongChannelScale``      int8: output column N // 2 multiplied by the scale of column N // 2 - 1
=========================  ====================================================================
"""

from __future__ import annotations

import torch

from tasks.kernels import Kernel, kernel_function

TILE = 16
BK = 64


@kernel_function
def correct(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 accumulation, one rounding to the operands' dtype."""
    return (a.float() @ b.float()).to(a.dtype)


@kernel_function
def tile_scaled(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = a.float() @ b.float()
    c[:TILE, :TILE] *= 1 + 2**-8
    return c.to(a.dtype)


@kernel_function
def dropped_k_block(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    k = a.shape[1]
    keep = ((k - 1) // BK) * BK
    return (a[:, :keep].float() @ b[:keep].float()).to(a.dtype)


@kernel_function
def transposed_tile(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = a.float() @ b.float()
    if c.shape[0] >= TILE and c.shape[1] >= 2 * TILE:
        c[:TILE, TILE : 2 * TILE] = c[:TILE, TILE : 2 * TILE].T.clone()
    return c.to(a.dtype)


@kernel_function
def bf16_accumulator(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.bfloat16)
    for k0 in range(0, a.shape[1], BK):
        block = a[:, k0 : k0 + BK].float() @ b[k0 : k0 + BK].float()
        acc = (acc.float() + block).to(torch.bfloat16)
    return acc.to(a.dtype)


@kernel_function
def split_k_bf16_partials(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    bounds = torch.linspace(0, a.shape[1], 5).round().long().tolist()
    total = torch.zeros(a.shape[0], b.shape[1])
    for k0, k1 in zip(bounds[:-1], bounds[1:], strict=True):
        total += (a[:, k0:k1].float() @ b[k0:k1].float()).to(torch.bfloat16).float()
    return total.to(a.dtype)


@kernel_function
def rtz_epilogue(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = a.float() @ b.float()
    r = c.to(a.dtype)
    away = r.float().abs() > c.abs()  # rounded away from zero: step one spacing back
    return torch.where(away, torch.nextafter(r, torch.zeros_like(r)), r)


class WrongChannelScale(Kernel):
    """int8: exact accumulator, fl(fl(acc * sa) * sb), but column N // 2 takes column N//2 - 1's scale."""

    operand_dtype = "int8"
    device = "cpu"
    description = "planted defect: one column uses its neighbour's per-channel scale"

    def compute(self, ops):
        acc = (ops.a.double() @ ops.b.double()).float()  # exact below 2**24
        sb = ops.scale_b.clone()
        j = ops.n // 2
        if j >= 1:
            sb[0, j] = sb[0, j - 1]
        return (acc * ops.scale_a * sb).to(ops.out_dtype)


#: attr -> the checks that must report it INCORRECT (the others must let it through).
CAUGHT_BY = {
    "tile_scaled": {"exact_match", "bounds"},
    "dropped_k_block": {"exact_match", "bounds"},
    "transposed_tile": {"exact_match", "bounds"},
    "bf16_accumulator": {"bounds"},
    "split_k_bf16_partials": {"bounds"},
    "rtz_epilogue": {"bounds"},
    "WrongChannelScale": {"exact_match", "bounds"},
}


@kernel_function
def raises(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("planted failure: this kernel always raises")


@kernel_function
def wrong_shape(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() @ b.float()).to(a.dtype)[:, :-1]


@kernel_function
def three_args(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return a @ b


@kernel_function
def blocked(a: torch.Tensor, b: torch.Tensor, *, block: int = 64) -> torch.Tensor:
    """A correct kernel with a keyword parameter: fp32 sums of K-blocks, rounded once."""
    acc = torch.zeros(a.shape[0], b.shape[1])
    for k0 in range(0, a.shape[1], block):
        acc += a[:, k0 : k0 + block].float() @ b[k0 : k0 + block].float()
    return acc.to(a.dtype)


#: torch.matmul, marked as a kernel the way a user wraps a third-party function in their own module.
torch_matmul = kernel_function(torch.matmul)
