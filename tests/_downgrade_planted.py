"""Kernels that compute in a narrower format than they claim, named as a user names a kernel:
``"_downgrade_planted:attr"``.

Plain matmuls ``f(A, B) -> C`` (operands and output in the check's dtype) that claim fp32 products
and fp32 accumulation, each silently downgraded in one way (the failures of the field's recent
reports: a batch-invariant fp32 matmul that used TF32):

===================  ==============================================================================
attr                 downgrade
===================  ==============================================================================
``tf32_inputs``      rounds both operands to tf32 (10 stored mantissa bits, ties to even), as a GPU
                     with ``allow_tf32`` does, then multiplies and accumulates exactly in fp32
``bf16_compute``     computes in bf16 internally: operands rounded to bf16, every partial sum
                     rounded to bf16 (sequential over K, fused multiply-add)
``fp16_accumulate``  exact products, accumulated in fp16 over K-chunks of 64 (each chunk's sum
                     rounded to fp16 after every addition), the chunks then summed in fp16
``bf16_result``      accumulates exactly (fp32 would too here), then rounds the result to bf16 before
                     the fp32 store: a bf16-internal epilogue, not a bf16 accumulator
``ragged_n_zeroed``  exact, but the last ``N % 16`` columns (a ragged N tail) are left zero: an edge
                     bug, not precision (issue #36: it had been called a precision downgrade)
``one_off``          exact but for output (0, 0), one too large: wrong for no reason a check can name
===================  ==============================================================================
"""

from __future__ import annotations

import torch

from tasks.kernels import kernel_function

CHUNK = 64


def _round_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> tf32 (10 stored mantissa bits), ties to even, kept in fp32 storage."""
    bits = x.float().contiguous().view(torch.int32)
    lsb = (bits >> 13) & 1
    rounded = (bits + 0xFFF + lsb) & ~0x1FFF
    return rounded.view(torch.float32)


@kernel_function
def tf32_inputs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (_round_tf32(a).double() @ _round_tf32(b).double()).to(a.dtype)


def _narrow_sequential(a: torch.Tensor, b: torch.Tensor, acc_dtype: torch.dtype, chunk: int | None) -> torch.Tensor:
    a64, b64 = a.double(), b.double()
    k = a.shape[1]
    step = chunk or k
    total = torch.zeros(a.shape[0], b.shape[1], dtype=acc_dtype)
    for k0 in range(0, k, step):
        acc = torch.zeros(a.shape[0], b.shape[1], dtype=acc_dtype)
        for kk in range(k0, min(k0 + step, k)):
            acc = (acc.double() + a64[:, kk : kk + 1] * b64[kk : kk + 1, :]).to(acc_dtype)  # fused: one rounding
        total = (total.double() + acc.double()).to(acc_dtype)
    return total


@kernel_function
def bf16_compute(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _narrow_sequential(a.bfloat16(), b.bfloat16(), torch.bfloat16, None).to(a.dtype)


@kernel_function
def fp16_accumulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _narrow_sequential(a, b, torch.float16, CHUNK).to(a.dtype)


@kernel_function
def bf16_result(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() @ b.double()).float().bfloat16().to(a.dtype)


@kernel_function
def ragged_n_zeroed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = (a.double() @ b.double()).to(a.dtype)
    tail = out.shape[1] % 16
    if tail:
        out[:, out.shape[1] - tail:] = 0
    return out


@kernel_function
def one_off(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = (a.double() @ b.double()).to(a.dtype)
    out[0, 0] += 1
    return out
