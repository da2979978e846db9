"""Kernels wrong only at one kind of edge, named as a user names a kernel: ``"_fuzz_planted:attr"``.

Plain matmuls ``f(A, B) -> C`` (operands and output in the check's dtype), each correct (fp32
accumulation, one rounding) except in one region of shapes that the fixed-shape checks of
``sweeps/demo.toml`` (64x1000x48, 127x2049x65) and the harness's defaults (plus 1x4096x33) never
enter, or enter only with values that cannot show the defect:

=====================  ============================================================================
attr                   defect
=====================  ============================================================================
``n_tail_pair_store``  N % 16 != 0: a tail tile of 2..15 columns is stored in pairs and its last
                       column repeats the one before it (a tail of one column takes a scalar path,
                       so N = 65 and N = 33 are right)
``large_m_ftz``        M > 64: the large-M configuration flushes subnormal outputs to zero (built
                       with flush-to-zero); right for M <= 64 and for every normal output
``split_k_tail``       K > 1024: K is split in chunks of 1024 and a partial last chunk of 2 or more
                       elements drops its last element (K = 2049 has a tail of one, 4096 none)
``split_k_4096_half_   K > 4096: K is split in chunks of 4096 whose fp32 partial sums are rounded to
partials``             the output's 16-bit format (bf16 for an fp32 output) before being added
                       (issue 26: the old generator capped K at 4097 and missed it)
``pow2_k_8192_drop_    K a power of two >= 8192: the "aligned fast path" skips the last 8 elements
tail8``                of K (K = 8191, 8193, 12288 and every K below 8192 are right)
``split_k_8192_half_   K > 8192 only: K is split in chunks of 4096 whose fp32 partial sums are
partials``             rounded to the output's 16-bit format (bf16 for an fp32 output); right for
                       every K <= 8192 (issue 26's large-K residual: found for 2 of 3 seeds in 60 s
                       before exact match's cancelling-runs inputs)
``col_major_a_drops_   layout only: a column-major A (the fuzzer's ``a-transposed`` and
last_k``               ``both-transposed`` layouts, M and K > 1) takes a "transposed path" that drops
                       the last element of K; right for every shape with a row-major A (a failure
                       that replays only in its recorded layout)
=====================  ============================================================================

The last three are held out from the generator's design: it weights every power-of-two boundary of K
(2**j - 1, 2**j, 2**j + 1) up to :data:`tasks.checks.fuzz.MAX_K`, not these two kernels' numbers.
"""

from __future__ import annotations

import torch

from tasks.kernels import Kernel, kernel_function

SPLIT = 1024


@kernel_function
def n_tail_pair_store(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = (a.float() @ b.float()).to(a.dtype)
    n = c.shape[1]
    if n % 16 >= 2:
        c[:, n - 1] = c[:, n - 2]
    return c


@kernel_function
def large_m_ftz(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = (a.float() @ b.float()).to(a.dtype)
    if c.shape[0] > 64:
        tiny = torch.finfo(c.dtype).tiny  # the smallest normal value of the output format
        c = torch.where(c.abs() < tiny, torch.copysign(torch.zeros_like(c), c), c)
    return c


@kernel_function
def split_k_tail(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    k = a.shape[1]
    if k <= SPLIT or k % SPLIT < 2:
        return (a.float() @ b.float()).to(a.dtype)
    acc = torch.zeros(a.shape[0], b.shape[1])
    for k0 in range(0, k, SPLIT):
        k1 = min(k0 + SPLIT, k)
        if k1 - k0 < SPLIT:
            k1 -= 1  # the tail loop's off-by-one
        acc += a[:, k0:k1].float() @ b[k0:k1].float()
    return acc.to(a.dtype)


SPLIT_4096 = 4096


def _split_half_partials(a: torch.Tensor, b: torch.Tensor, above: int) -> torch.Tensor:
    """fp32 accumulation, except for K > ``above``: 4096-chunk partials stored in 16 bits."""
    k = a.shape[1]
    if k <= above:
        return (a.float() @ b.float()).to(a.dtype)
    half = a.dtype if a.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    acc = torch.zeros(a.shape[0], b.shape[1])
    for k0 in range(0, k, SPLIT_4096):
        part = a[:, k0:k0 + SPLIT_4096].float() @ b[k0:k0 + SPLIT_4096].float()
        acc += part.to(half).float()  # the partial stored in 16 bits: the defect
    return acc.to(a.dtype)


@kernel_function
def split_k_4096_half_partials(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _split_half_partials(a, b, SPLIT_4096)


@kernel_function
def split_k_8192_half_partials(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _split_half_partials(a, b, 2 * SPLIT_4096)


@kernel_function
def pow2_k_8192_drop_tail8(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    k = a.shape[1]
    if k >= 8192 and k & (k - 1) == 0:
        return (a[:, : k - 8].float() @ b[: k - 8].float()).to(a.dtype)
    return (a.float() @ b.float()).to(a.dtype)


@kernel_function
def col_major_a_drops_last_k(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape[0] > 1 and a.shape[1] > 1 and a.stride(0) == 1:
        return (a[:, :-1].float() @ b[:-1].float()).to(a.dtype)
    return (a.float() @ b.float()).to(a.dtype)


class AlignedK16(Kernel):
    """A correct int8 kernel (exact accumulator, CUTLASS's epilogue order) that takes only K % 16 == 0,
    as tensor-core kernels do: the fuzzer must skip the other shapes, not call them failures."""

    operand_dtype = "int8"
    device = "cpu"
    description = "correct, but only for K a multiple of 16"

    def supports(self, m: int, n: int, k: int, scale_a_numel: int, scale_b_numel: int,
                 has_bias: bool) -> tuple[bool, str | None]:  # fmt: skip
        return (True, None) if k % 16 == 0 else (False, f"K must be a multiple of 16, got {k}")

    def compute(self, ops):  # type: ignore[no-untyped-def]
        acc = (ops.a.double() @ ops.b.double()).float()  # exact below 2**24
        return (ops.scale_a * (ops.scale_b * acc)).to(ops.out_dtype)


#: The planted kernels the fuzzer must catch.
PLANTED = ("n_tail_pair_store", "large_m_ftz", "split_k_tail")
#: Issue 26: boundary defects beyond the old generator's reach (K <= 4097).
PLANTED_FAR = ("split_k_4096_half_partials", "pow2_k_8192_drop_tail8", "split_k_8192_half_partials")
