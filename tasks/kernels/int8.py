"""INT8 scaled-GEMM kernels on the CPU: exact int32 accumulation, then each library's epilogue.

INT8 products summed in int32 are exact and order-free while no sum overflows: with weights in
[-127, 127] and activations in [-128, 127] up to K = 132104, and up to K = 131071 when both operands
may be -128 (docs/reference/numerics.md §3).  So every INT8 kernel computes the same integer accumulator,
and INT8 kernels can differ only in their epilogue (vllm-kernels.md §2.1, §2.2, §2.4).

The accumulator is the int32 one (:func:`.accumulator.int32_accumulator`), computed on the fastest
exact path of this CPU (``torch._int_mm`` where oneDNN has VNNI or AMX, a float GEMM of the integers
elsewhere; probed once per process and named in each kernel's ``code_path``).  Past the no-overflow
bound the int32 sum wraps modulo 2**32, which is what a GPU's int32 accumulator does too, and the
wrapped value does not depend on the summation order (two's-complement addition is associative);
these kernels therefore keep running there and return what an int32-accumulating kernel returns.
The kernel ``exact`` is the reference that shows the damage.

Kernels (see :mod:`.epilogue` for the exact formulas):

* ``int8-cutlass-order``: ``rn(fl(sa * fl(sb * fl(acc))))``; bias: ``rn(fma32(sa, fl(sb*fl(acc)), bias))``.
* ``int8-triton-order`` (``bias_mode`` "fp32" | "output"): ``rn(fl(sb * fl(sa * fl(acc))))``; bias
  added in fp32 (vLLM >= 0.32) or after rounding, in the output dtype (vLLM <= 0.31).
* ``int8-torch-channelwise``: ``rn(fl(fl(fl(fl(acc) * sa) * sb) + bias))``.
"""

from __future__ import annotations

from typing import Any

import torch

from . import epilogue
from .accumulator import INT32_EXACT_K, accumulator_path, int32_accumulator
from .operands import Operands
from .registry import Kernel, check_choice, register_kernel

__all__ = [
    "int32_accumulator",
    "Int8CutlassOrder",
    "Int8TritonOrder",
    "Int8TorchChannelwise",
    "INT32_EXACT_K",
]

class _Int8Kernel(Kernel):
    operand_dtype = "int8"
    device = "cpu"

    @property
    def code_path(self) -> str:
        """Which exact path computes the int32 accumulator in this process (probed on first use)."""
        return accumulator_path().describe()

    def caveat(self) -> str | None:
        return accumulator_path().native_note()

    def bounds_algorithm(
        self, operand_dtype: str, m: int, n: int, capability: tuple[int, int] | None = None
    ) -> tuple[str, str] | None:
        """``("exact", "fp32")``: the int32 sum is exact (K <= INT32_EXACT_K), converted to fp32 once."""
        return ("exact", "fp32")

    def accumulator_fp32(self, ops: Operands) -> torch.Tensor:
        """``fl(acc)``: int32 -> fp32 conversion, round-to-nearest-even (exact below 2**24)."""
        return int32_accumulator(ops.a, ops.b).to(torch.float32)


@register_kernel("int8-cutlass-order")
class Int8CutlassOrder(_Int8Kernel):
    """vLLM ``cutlass_scaled_mm`` INT8 epilogue (vllm-kernels.md §2.1).

    ``out = rn(fl(sa * fl(sb * fl(acc))))``; with bias ``out = rn(fma32(sa, fl(sb * fl(acc)),
    float(bias)))``, the multiply-add rounded once in fp32.
    """

    description = (
        "exact int32 acc; rn(fl(sa*fl(sb*acc))), bias: rn(fma32(sa, fl(sb*acc), bias)) "
        "(vllm-kernels.md §2.1 CUTLASS)"
    )

    def compute(self, ops: Operands) -> torch.Tensor:
        return epilogue.cutlass(
            self.accumulator_fp32(ops), ops.scale_a, ops.scale_b, ops.out_dtype, ops.bias
        )


@register_kernel("int8-triton-order")
class Int8TritonOrder(_Int8Kernel):
    """vLLM ``triton_scaled_mm`` INT8 epilogue (vllm-kernels.md §2.2).

    ``c = fl(sb * fl(sa * fl(acc)))``; no bias: ``rn(c)``.  ``bias_mode="fp32"`` (vLLM >= 0.32,
    default): ``rn(fl(c + bias))``.  ``bias_mode="output"`` (vLLM <= 0.31): ``rn(rn(c) + bias)``,
    the add in the output dtype.  Triton's possible mul+add contraction (§2.2 [inferred]) is not
    modelled.
    """

    param_defaults = {"bias_mode": "fp32"}

    @property
    def description(self) -> str:  # type: ignore[override]
        mode = self.params["bias_mode"]
        bias = "rn(fl(c + bias))" if mode == "fp32" else "rn(rn(c) + bias) in the output dtype"
        return (
            f"exact int32 acc; c = fl(sb*fl(sa*acc)), rn(c), bias: {bias} "
            "(vllm-kernels.md §2.2 Triton)"
        )

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        check_choice(self.name, "bias_mode", params["bias_mode"], epilogue.BIAS_MODES)
        return params

    def compute(self, ops: Operands) -> torch.Tensor:
        return epilogue.triton(
            self.accumulator_fp32(ops),
            ops.scale_a,
            ops.scale_b,
            ops.out_dtype,
            ops.bias,
            bias_mode=self.params["bias_mode"],
        )


@register_kernel("int8-torch-channelwise")
class Int8TorchChannelwise(_Int8Kernel):
    """vLLM's torch channel-wise fallback order (vllm-kernels.md §2.4) on an exact int32 acc.

    ``out = rn(fl(fl(fl(fl(acc) * sa) * sb) + bias))``: separate fp32 eager ops, no FMA.
    """

    description = (
        "exact int32 acc; rn(fl(fl(fl(acc*sa)*sb) + bias)), separate fp32 ops "
        "(vllm-kernels.md §2.4 torch channel-wise)"
    )

    def compute(self, ops: Operands) -> torch.Tensor:
        return epilogue.channelwise(
            self.accumulator_fp32(ops), ops.scale_a, ops.scale_b, ops.out_dtype, ops.bias
        )
