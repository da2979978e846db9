"""``fp8-torch-scaled-mm``: ``torch._scaled_mm`` on the CPU (vllm-kernels.md §2.4, numerics.md §5.4).

Schema (torch 2.13)::

    _scaled_mm(Tensor self, Tensor mat2, Tensor scale_a, Tensor scale_b, Tensor? bias=None,
               Tensor? scale_result=None, ScalarType? out_dtype=None, bool use_fast_accum=False)

Accepted scale layouts on the CPU (measured): both per-tensor (one element each, any of 0-d, ``[1]``,
``[1, 1]``), or both row-wise (``scale_a`` ``[M, 1]`` and ``scale_b`` ``[1, N]``, contiguous).  A mix
of per-tensor and row-wise, ``[M]``/``[N]`` vectors and ``[N, 1]`` are refused ("Invalid scaling
configuration").  This kernel accepts every layout of the call contract and reshapes at the
boundary: per-tensor + per-tensor is passed as is; anything else is passed row-wise, a per-tensor
side expanded to ``[M, 1]`` or ``[1, N]`` (the CPU path multiplies the operands elementwise by their
scales, so an expanded per-tensor scale gives the same bits; tested).

What it computes: on a CPU without AMX (ATen ``_scaled_mm_out_cpu_emulated``)
``rn(fl(matmul_fp32(fl(a * sa), fl(b * sb)) + bias))``: the scales are applied to the operands
*before* an fp32 MKL matmul (whose summation order is MKL's), the bias is added in fp32, then one
cast.  ``use_fast_accum`` is ignored on that path.  On CPUs with AMX-INT8 torch dispatches to
oneDNN (``mkldnn_scaled_mm``) instead, with different numerics.  Pre-scaling makes products inexact
(numerics.md §5.4), so this kernel is close to, not equal to, ``exact``; it does not model GPU
tensor-core accumulation.
"""

from __future__ import annotations

from typing import Any

import torch

from .operands import Operands
from .registry import Kernel, KernelError, register_kernel

__all__ = ["Fp8TorchScaledMM", "cpu_scaled_mm_path"]

_PROBE: tuple[bool, str | None] | None = None


def cpu_scaled_mm_path() -> str:
    """Which CPU implementation ``torch._scaled_mm`` takes in this process (ATen dispatch rule)."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None) or getattr(torch._C._cpu, "_is_amx_tile_supported", None)
    try:
        amx = bool(probe()) if probe is not None else False
    except RuntimeError:
        amx = False
    if amx and torch.backends.mkldnn.is_available():
        return "onednn-amx (mkldnn_scaled_mm)"
    return "emulated (fp32 pre-scaled operands, MKL sgemm)"


def _probe() -> tuple[bool, str | None]:
    global _PROBE
    if _PROBE is None:
        try:
            a = torch.tensor([[1.0, 2.0], [0.5, -1.0]]).to(torch.float8_e4m3fn)
            one = torch.tensor(1.0)
            out = torch._scaled_mm(a, a, one, one, out_dtype=torch.float32)
            want = a.to(torch.float32) @ a.to(torch.float32)
            _PROBE = (
                (True, None)
                if torch.equal(out, want)
                else (
                    False,
                    f"probe call returned {out.tolist()}, expected {want.tolist()}",
                )
            )
        except Exception as exc:
            _PROBE = (False, f"torch._scaled_mm probe failed: {type(exc).__name__}: {exc}")
    return _PROBE


@register_kernel("fp8-torch-scaled-mm")
class Fp8TorchScaledMM(Kernel):
    """``torch._scaled_mm`` on CPU fp8 operands; layouts reshaped at the boundary (module docs)."""

    operand_dtype = "fp8_e4m3"
    device = "cpu"
    param_defaults = {"use_fast_accum": False}

    @property
    def description(self) -> str:  # type: ignore[override]
        return (
            "torch._scaled_mm CPU: rn(fl(fl(a*sa) @ fl(b*sb)) + bias), scales applied to operands "
            f"before an fp32 matmul; path here: {cpu_scaled_mm_path()} "
            "(vllm-kernels.md §2.4, numerics.md §5.4)"
        )

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(params["use_fast_accum"], bool):
            raise KernelError(
                f"kernel 'fp8-torch-scaled-mm': use_fast_accum must be True or False, "
                f"got {params['use_fast_accum']!r}"
            )
        return params

    def available(self) -> tuple[bool, str | None]:
        return _probe()

    def bounds_algorithm(
        self, operand_dtype: str, m: int, n: int, capability: tuple[int, int] | None = None
    ) -> tuple[str, str] | None:
        """``("any", "fp32")``: the scaled operands summed in fp32 in the BLAS's own order."""
        return ("any", "fp32")

    @property
    def code_path(self) -> str:
        """The dispatch rule's path and the instruction sets it runs at: the emulated path's fp32 matmul
        sums in the order of MKL's kernels for that set (AVX2 on AMD CPUs and AVX2 machines, AVX-512 on
        Intel ones), so its bits differ between such machines."""
        from tasks.devices import mkl_isa

        path = cpu_scaled_mm_path()
        if path.startswith("emulated"):
            path += f" at MKL's {mkl_isa()} kernels"
        return f"{path}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}"

    def compute(self, ops: Operands) -> torch.Tensor:
        if ops.scale_a_numel == 1 and ops.scale_b_numel == 1:
            sa = ops.scale_a[0, 0]
            sb = ops.scale_b[0, 0]
        else:
            sa = ops.scale_a.contiguous()  # [M, 1]
            sb = ops.scale_b.contiguous()  # [1, N]
        return torch._scaled_mm(
            ops.a,
            ops.b,
            sa,
            sb,
            bias=ops.bias,
            out_dtype=ops.out_dtype,
            use_fast_accum=self.params["use_fast_accum"],
        )
