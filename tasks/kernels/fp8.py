"""FP8 (e4m3fn) scaled-GEMM emulations: fp32 accumulation in a fixed, documented order.

Each product of two e4m3 values has at most 8 significant bits and lies in [2**-18, 448**2], so it
is exact in fp32: the only roundings are the fp32 additions of the accumulation and the epilogue.
The emulations below fix the order of those additions and perform each of them as one IEEE fp32
add (round-to-nearest-even), vectorized over the ``[M, N]`` outputs with torch float32 tensors.
They are therefore bit-identical to any fp32 machine that adds in that order; the tests check them
bit for bit against a Fraction oracle that follows the same order.

Orders (``K`` products ``p_0 .. p_{K-1}`` per output; every accumulator starts at +0.0, as GPU
accumulator registers do, so an all-zero sum is +0.0):

* ``sequential``: ``acc = ((0 + p_0) + p_1) + ... + p_{K-1}``.
* ``pairwise``: level-by-level pairing with the odd element carried: level 0 adds
  ``(p_0 + p_1), (p_2 + p_3), ...``; an odd last element passes to the next level unchanged; repeat
  until one value is left; then ``acc = 0 + that``.  This is the balanced tree of K padded with zeros
  to a power of two (adding an exact zero changes nothing but the sign of a zero, which the final
  ``0 +`` normalises).  It is *not* the recursive-halving tree (split at ceil(n/2)), which pairs
  differently for K not a power of two.
* ``blocked(b)``: ``sequential`` inside each block of ``b`` consecutive products (the last block
  may be shorter), giving block sums ``s_0 .. s_{ceil(K/b)-1}``; then ``sequential`` across them:
  ``acc = ((0 + s_0) + s_1) + ...``.  This is a split-K / promotion-interval structure with an
  exact fp32 inner accumulator; it is not a model of Hopper's limited-precision tensor-core
  accumulator (docs/reference/numerics.md §5.2).

Epilogue (``epilogue`` parameter): "cutlass" (default, vllm-kernels.md §2.1) or "triton" (§2.2,
bias added in fp32), applied to the fp32 accumulator exactly as for INT8 (see :mod:`.epilogue`).

Speed: sequential is one in-place ``addcmul_`` of ``[M, N]`` per k (``acc + a_k * b_k`` with an
exact product is one rounding whether or not torch fuses it into an FMA); pairwise builds the
products in chunks of ``_PAIR_CHUNK`` and reduces them level by level; blocked runs the blocks of a
group side by side.  ``torch.cumsum`` is not used: its order is not specified.  Measured at
M = N = 256 on 2 CPU cores (torch 2.13): K = 4096 / 16384 takes sequential 0.04 / 0.14 s, pairwise
0.05 / 0.21 s, blocked-128 0.02 / 0.07 s, blocked-32 0.02 / 0.08 s.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from . import epilogue
from .operands import Operands
from .registry import Kernel, KernelError, check_choice, register_kernel

__all__ = [
    "fp8_operands_fp32",
    "accumulate_sequential",
    "accumulate_pairwise",
    "accumulate_blocked",
    "Fp8Sequential",
    "Fp8Pairwise",
    "Fp8Blocked",
]

_PAIR_CHUNK = 64  # products per chunk in accumulate_pairwise; a power of two (64: fastest measured)
_PAIR_LEVEL0_ELEMENTS = 1 << 23  # cap on the [C/2, M, N] level-0 array (chunk halves to fit)
_BLOCK_GROUP_ELEMENTS = (
    1 << 21
)  # [blocks, M, N] elements side by side in blocked (fastest measured)


def fp8_operands_fp32(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 ``a [M,K]`` and ``b [K,N]`` as float32 (exact): ``a.T`` as ``[K, M]`` and ``b [K, N]``."""
    return a.to(torch.float32).t().contiguous(), b.to(torch.float32).contiguous()


def accumulate_sequential(at: torch.Tensor, bf: torch.Tensor) -> torch.Tensor:
    """``((0 + p_0) + p_1) + ...`` in fp32 for every output; ``at`` ``[K, M]``, ``bf`` ``[K, N]``."""
    k, m = at.shape
    n = bf.shape[1]
    acc = torch.zeros(m, n, dtype=torch.float32)
    a3 = at.unsqueeze(2)  # [K, M, 1]
    b3 = bf.unsqueeze(1)  # [K, 1, N]
    for i in range(k):
        acc.addcmul_(a3[i], b3[i])  # acc + a*b: the product is exact, so one rounding either way
    return acc


def _tree(x: torch.Tensor) -> torch.Tensor:
    """Level-by-level pairwise sum over dim 0 of ``x`` ``[n, M, N]`` (odd element carried)."""
    while x.shape[0] > 1:
        n = x.shape[0]
        h = n // 2
        y = x[0 : 2 * h : 2] + x[1 : 2 * h : 2]
        x = torch.cat([y, x[n - 1 :]]) if n % 2 else y
    return x[0]


def _pair_level0(at: torch.Tensor, bf: torch.Tensor) -> torch.Tensor:
    """Level 0 of the tree for a chunk: ``p_{2i} + p_{2i+1}`` (odd last product carried)."""
    k = at.shape[0]
    h = k // 2
    ae, ao = at[0 : 2 * h : 2].unsqueeze(2), at[1 : 2 * h : 2].unsqueeze(2)
    be, bo = bf[0 : 2 * h : 2].unsqueeze(1), bf[1 : 2 * h : 2].unsqueeze(1)
    level = ae * be  # exact products
    level.addcmul_(ao, bo)  # p_even + p_odd: one rounding
    if k % 2:
        last = at[k - 1 :].unsqueeze(2) * bf[k - 1 :].unsqueeze(1)
        level = torch.cat([level, last])
    return level


def accumulate_pairwise(at: torch.Tensor, bf: torch.Tensor) -> torch.Tensor:
    """Level-by-level pairwise (balanced tree) fp32 sum of the products; see module docstring.

    The tree equals the balanced tree over K padded with zeros to a power of two.  Chunks of a
    power-of-two size C start at multiples of C, so each chunk is a whole subtree (the last, short
    one is the zero-padded subtree) and is reduced on its own; chunk sums are then merged like a
    binary counter (two subtrees of equal height are added as soon as both exist), and the leftover
    subtrees of decreasing height are folded right to left, which is where the zero padding would
    have put them.  Memory: C/2 + log2(K/C) + 1 arrays of ``[M, N]``.
    """
    k, m = at.shape
    n = bf.shape[1]
    if k == 1:
        return torch.zeros(m, n) + at[0].unsqueeze(1) * bf[0].unsqueeze(0)
    chunk = _PAIR_CHUNK
    while chunk > 2 and (chunk // 2) * m * n > _PAIR_LEVEL0_ELEMENTS:
        chunk //= 2
    stack: list[tuple[int, torch.Tensor]] = []  # (height above chunk level, subtree sum)
    for i in range(0, k, chunk):
        height, total = 0, _tree(_pair_level0(at[i : i + chunk], bf[i : i + chunk]))
        while stack and stack[-1][0] == height:
            total = stack.pop()[1] + total
            height += 1
        stack.append((height, total))
    total = stack.pop()[1]
    while stack:
        total = stack.pop()[1] + total
    return torch.zeros(m, n) + total  # accumulator starts at +0.0: -0.0 -> +0.0


def accumulate_blocked(at: torch.Tensor, bf: torch.Tensor, block_size: int) -> torch.Tensor:
    """Sequential within blocks of ``block_size`` products, then sequential across block sums.

    The last block is padded with zero products: adding an exact +-0 to an accumulator that started
    at +0.0 never changes it (such an accumulator is never -0.0), so padding is exact.
    """
    k, m = at.shape
    n = bf.shape[1]
    nb = -(-k // block_size)
    pad = nb * block_size - k
    if pad:
        at = torch.cat([at, at.new_zeros(pad, m)])
        bf = torch.cat([bf, bf.new_zeros(pad, n)])
    a4 = at.reshape(nb, block_size, m, 1)
    b4 = bf.reshape(nb, block_size, 1, n)
    group = max(1, _BLOCK_GROUP_ELEMENTS // (m * n))
    total = torch.zeros(m, n, dtype=torch.float32)
    for g0 in range(0, nb, group):
        g1 = min(nb, g0 + group)
        s = torch.zeros(g1 - g0, m, n, dtype=torch.float32)
        for j in range(block_size):
            s.addcmul_(a4[g0:g1, j], b4[g0:g1, j])
        for i in range(g1 - g0):
            total.add_(s[i])
    return total


class _Fp8Emulation(Kernel):
    operand_dtype = "fp8_e4m3"
    device = "cpu"
    param_defaults = {"epilogue": "cutlass"}
    order = ""

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        check_choice(self.name, "epilogue", params["epilogue"], epilogue.EPILOGUES)
        return params

    @property
    def description(self) -> str:  # type: ignore[override]
        ep = self.params["epilogue"]
        sec = "§2.1 CUTLASS" if ep == "cutlass" else "§2.2 Triton"
        return (
            f"exact emulation: e4m3 products (exact) summed in fp32, {self.order}; "
            f"{ep} epilogue (vllm-kernels.md {sec})"
        )

    #: The ``bounds`` algorithm this order is (``tasks.checks.bounds.algorithm``), in fp32.
    algorithm = ""

    def bounds_algorithm(
        self, operand_dtype: str, m: int, n: int, capability: tuple[int, int] | None = None
    ) -> tuple[str, str] | None:
        """This emulation's own order in fp32: it computes exactly that, so its bound is that order's."""
        return (self.algorithm, "fp32")

    @abc.abstractmethod
    def accumulate(self, at: torch.Tensor, bf: torch.Tensor) -> torch.Tensor:
        """The fp32 accumulator ``[M, N]`` of the exact products, in this order."""

    def compute(self, ops: Operands) -> torch.Tensor:
        at, bf = fp8_operands_fp32(ops.a, ops.b)
        acc = self.accumulate(at, bf)
        if self.params["epilogue"] == "cutlass":
            return epilogue.cutlass(acc, ops.scale_a, ops.scale_b, ops.out_dtype, ops.bias)
        return epilogue.triton(acc, ops.scale_a, ops.scale_b, ops.out_dtype, ops.bias, "fp32")


@register_kernel("fp8-sequential")
class Fp8Sequential(_Fp8Emulation):
    """FP8 e4m3 GEMM, fp32 accumulation k = 0..K-1 in order, then the chosen epilogue (§2.1/§2.2)."""

    order = "sequential k = 0..K-1"
    algorithm = "sequential"

    def accumulate(self, at: torch.Tensor, bf: torch.Tensor) -> torch.Tensor:
        return accumulate_sequential(at, bf)


@register_kernel("fp8-pairwise")
class Fp8Pairwise(_Fp8Emulation):
    """FP8 e4m3 GEMM, fp32 level-by-level pairwise accumulation (odd element carried)."""

    order = "pairwise level by level, odd element carried"
    algorithm = "pairwise"

    def accumulate(self, at: torch.Tensor, bf: torch.Tensor) -> torch.Tensor:
        return accumulate_pairwise(at, bf)


@register_kernel("fp8-blocked", suffix_param="block_size")
class Fp8Blocked(_Fp8Emulation):
    """FP8 e4m3 GEMM, fp32 accumulation sequential within blocks of ``block_size``, then across."""

    param_defaults = {"block_size": 128, "epilogue": "cutlass"}

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"fp8-blocked-{self.params['block_size']}"

    @property
    def order(self) -> str:  # type: ignore[override]
        return f"sequential within blocks of {self.params['block_size']}, then across block sums"

    @property
    def algorithm(self) -> str:  # type: ignore[override]
        return f"blocked-{self.params['block_size']}"

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        bs = params["block_size"]
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise KernelError(
                f"kernel 'fp8-blocked': block_size must be an integer >= 1, got {bs!r}"
            )
        check_choice("fp8-blocked", "epilogue", params["epilogue"], epilogue.EPILOGUES)
        return params

    def accumulate(self, at: torch.Tensor, bf: torch.Tensor) -> torch.Tensor:
        return accumulate_blocked(at, bf, self.params["block_size"])
