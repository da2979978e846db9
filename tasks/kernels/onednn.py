"""``int8-onednn``: PyTorch's oneDNN quantized linear (x86 CPU), called on our int8 operands.

The op is ``torch.ops.onednn.qlinear_pointwise`` (torch 2.13 schema)::

    qlinear_pointwise(Tensor qx, float x_scale, int x_zero_point, Tensor qw, Tensor w_scale,
                      Tensor w_zero_point, Tensor? bias, float output_scale,
                      int output_zero_point, ScalarType? output_dtype, str post_op_name,
                      Scalar?[] post_op_args, str post_op_algorithm) -> Tensor

with ``qw = torch.ops.onednn.qlinear_prepack(w [N, K] int8, x_shape=None)``.  What it accepts
(measured, torch 2.13.0+cpu, oneDNN v3.12.0):

* **Activation scale: per-tensor only** (``x_scale`` a float; the ``.tensor`` overload refuses more
  than one element: "act scale/zp size should be 1").  Weight scales: per-channel ``[N]`` or a
  single element.  So ``supports()`` requires ``scale_a`` with one element, unless the kernel is
  built with ``act_scale="split-rows"``: then rows are grouped by their activation scale and the op
  is called once per distinct scale (each output element is still exactly what oneDNN computes for
  its row; on the measured machine a row's result does not depend on which rows share the call).
* **Activations are passed as uint8 with zero point 128** (``x + 128``, exact).  Signed int8 with
  zero point 0 is accepted too and gives identical bits, but oneDNN then runs its reference
  implementation (``ref_int8``, ~150x slower); uint8 is what PyTorch's x86 quantization feeds it and
  runs the JIT kernel (``brg_matmul:avx512_core_vnni`` on the measured AVX512-VNNI CPU), which
  subtracts the zero-point compensation in int32.
* Output dtypes fp32, bf16 and fp16; a bias of any of those dtypes.

What it computes (measured on that CPU, AVX512-VNNI, no AMX; bit-identical over random shapes,
all output dtypes, with and without bias, and at int32 extremes): an int32 accumulator that is
exact (wrapping modulo 2**32 past the overflow bound, like ``torch._int_mm``), then
``rn(fl(fl(fl(acc) * sa) * sb) + bias)`` -- the same formula as ``int8-torch-channelwise``.  That
is a measurement of one oneDNN build on one ISA, not a specification: oneDNN chooses its
implementation at run time (AMX, AVX2 and the reference path may order the scaling differently),
so this kernel is whatever oneDNN computes here and the tests only require it to be within one
output spacing of ``exact``.
"""

from __future__ import annotations

from typing import Any

import torch

from .operands import Operands
from .registry import Kernel, check_choice, register_kernel

__all__ = ["Int8OneDNN", "onednn_qlinear"]

ACT_SCALE_MODES = ("per-tensor", "split-rows")
_PROBE: tuple[bool, str | None] | None = None


def onednn_qlinear(
    a: torch.Tensor,
    w_packed: torch.Tensor,
    act_scale: float,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """One ``qlinear_pointwise`` call: int8 ``a [M, K]`` (shifted to uint8, zero point 128)."""
    qx = (a.to(torch.int16) + 128).to(torch.uint8)
    w_zp = torch.zeros(w_scale.numel(), dtype=torch.int64)
    out: torch.Tensor = torch.ops.onednn.qlinear_pointwise(
        qx, float(act_scale), 128, w_packed, w_scale, w_zp, bias, 1.0, 0, out_dtype, "none", [], ""
    )
    return out


def _probe() -> tuple[bool, str | None]:
    """Can the op run here, and does a tiny call give the right integer products?"""
    global _PROBE
    if _PROBE is not None:
        return _PROBE
    try:
        if not torch.backends.mkldnn.is_available():
            _PROBE = (False, "torch was built without oneDNN (torch.backends.mkldnn unavailable)")
            return _PROBE
        ops = torch.ops.onednn
        if not (hasattr(ops, "qlinear_pointwise") and hasattr(ops, "qlinear_prepack")):
            _PROBE = (False, "torch.ops.onednn.qlinear_pointwise/qlinear_prepack not registered")
            return _PROBE
        a = torch.tensor([[1, -2, 3, -128], [127, 5, -6, 7]], dtype=torch.int8)
        w = torch.tensor([[1, 2, 3, 4], [-1, -2, -3, -4], [127, -127, 0, 1]], dtype=torch.int8)
        packed = ops.qlinear_prepack(w, None)
        out = onednn_qlinear(a, packed, 1.0, torch.ones(3), torch.float32, None)
        want = (a.to(torch.int64) @ w.to(torch.int64).t()).to(torch.float32)
        if not torch.equal(out, want):
            _PROBE = (False, f"probe call returned {out.tolist()}, expected {want.tolist()}")
        else:
            _PROBE = (True, None)
    except Exception as exc:  # any failure means "not available", with the reason
        _PROBE = (False, f"probe call failed: {type(exc).__name__}: {exc}")
    return _PROBE


@register_kernel("int8-onednn")
class Int8OneDNN(Kernel):
    """PyTorch oneDNN quantized linear (``torch.ops.onednn.qlinear_pointwise``); see module docs."""

    operand_dtype = "int8"
    device = "cpu"
    param_defaults = {"act_scale": "per-tensor"}

    @property
    def description(self) -> str:  # type: ignore[override]
        split = (
            "; per-token scales by one call per distinct row scale"
            if self.params["act_scale"] == "split-rows"
            else "; per-tensor activation scale only"
        )
        return (
            "oneDNN qlinear_pointwise (uint8 acts, zero point 128): measured here as "
            f"rn(fl(fl(acc*sa)*sb) + bias) like vllm-kernels.md §2.4{split}"
        )

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        check_choice(self.name, "act_scale", params["act_scale"], ACT_SCALE_MODES)
        return params

    def available(self) -> tuple[bool, str | None]:
        return _probe()

    def supports(
        self,
        m: int,
        n: int,
        k: int,
        scale_a_numel: int,
        scale_b_numel: int,
        has_bias: bool,
    ) -> tuple[bool, str | None]:
        if scale_a_numel != 1 and self.params["act_scale"] == "per-tensor":
            return False, (
                "oneDNN qlinear takes a per-tensor activation scale only (scale_a must have 1 "
                "element); build the kernel with act_scale='split-rows' to call it once per row scale"
            )
        return True, None

    def compute(self, ops: Operands) -> torch.Tensor:
        w_packed = torch.ops.onednn.qlinear_prepack(ops.b.t().contiguous(), None)
        w_scale = ops.scale_b.reshape(-1)[: ops.scale_b_numel].contiguous()
        a = ops.a.contiguous()
        if ops.scale_a_numel == 1:
            return onednn_qlinear(
                a, w_packed, ops.scale_a[0, 0].item(), w_scale, ops.out_dtype, ops.bias
            )
        scales = ops.scale_a.reshape(-1)
        values, inverse = torch.unique(scales, return_inverse=True)
        out = torch.empty(ops.m, ops.n, dtype=ops.out_dtype)
        for i, v in enumerate(values.tolist()):
            rows = torch.nonzero(inverse == i).reshape(-1)
            out[rows] = onednn_qlinear(a[rows], w_packed, v, w_scale, ops.out_dtype, ops.bias)
        return out
