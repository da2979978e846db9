"""Scaled-GEMM implementations ("kernels") behind one call and one registry.

``kernel(a, b, scale_a, scale_b, out_dtype, bias=None) -> Tensor [M, N]`` (docs/reference/design.md contract;
operand rules in :mod:`.operands`).  Get one with :func:`get_kernel`::

    from tasks.kernels import get_kernel
    k = get_kernel("fp8-blocked-128")          # == get_kernel("fp8-blocked", block_size=128)
    out = k(a, b, scale_a, scale_b, torch.bfloat16)

Built-in CPU kernels (importing this package registers them):

=========================  ==========  =======================================================
name                       operands    what it computes
=========================  ==========  =======================================================
int8-cutlass-order         int8        exact int32 acc, CUTLASS epilogue (:mod:`.int8`)
int8-triton-order          int8        exact int32 acc, Triton epilogue, ``bias_mode``
int8-torch-channelwise     int8        exact int32 acc, torch channel-wise epilogue
int8-onednn                int8        oneDNN qlinear_pointwise (:mod:`.onednn`), ``act_scale``
fp8-torch-scaled-mm        fp8_e4m3    torch._scaled_mm on the CPU (:mod:`.scaled_mm`)
fp8-sequential             fp8_e4m3    exact emulation, fp32 sequential sum (:mod:`.fp8`)
fp8-pairwise               fp8_e4m3    exact emulation, fp32 pairwise tree
fp8-blocked[-<b>]          fp8_e4m3    exact emulation, fp32 blocked sum, ``block_size``
exact                      any         correctly rounded reference (:mod:`.exact`)
=========================  ==========  =======================================================

GPU kernels (:mod:`.cuda`; available with CUDA and, for the vLLM ones, vLLM 0.29-0.32):
``vllm-cutlass``, ``vllm-cutlass-raw``, ``vllm-triton``, ``torch-scaled-mm-cuda`` (``device`` "cuda" |
"cpu": the same torch._scaled_mm call on the CPU, the GPU lease kit's ``--cpu`` mode).

cuBLAS kernels of the GPU lease kit (:mod:`.cublas`; torch only, ``device`` "cuda" (default) | "cpu"):

=========================  ==========  =======================================================
cublas-int8                int8        torch._int_mm int32 acc (padded), ``epilogue``
                                       channelwise | cutlass | triton as eager fp32 ops
cublas-matmul              any         torch.matmul in ``dtype`` bf16 | fp16 | fp32, then
                                       channel-wise scaling in fp32 (batch invariance, bounds)
=========================  ==========  =======================================================

Triton kernel (:mod:`.triton_mm`; the ``triton`` extra, imported only when it runs): ``triton-scaled-mm``
(int8 / fp8, after vLLM 0.32's ``triton_scaled_mm``), ``device`` "cuda" (compiled) | "cpu" (Triton's
interpreter).

Users add kernels with ``register_kernel``, the entry-point group ``swapcheck.kernels``, or by
naming ``"package.module:attr"`` directly.  The target must declare itself a kernel: a
:class:`Kernel` subclass or instance, a plain matmul ``f(A, B) -> C`` marked ``@kernel_function``
(wrapped as an unscaled :class:`MatmulKernel`), or a factory marked ``@kernel_factory``; anything
else is refused before it is called.  ``set_user_kernels(False)`` (``SWAPCHECK_USER_KERNELS=0``)
turns ``module:attr`` and entry-point kernels off (rules in :mod:`.registry`).
"""

# Importing the modules registers the built-ins; cuda registers the GPU kernels and imports no vLLM,
# triton_mm registers triton-scaled-mm and imports no triton.
from . import cublas, cuda, exact, fp8, int8, onednn, scaled_mm, triton_mm  # noqa: F401
from .operands import Operands, check_operands
from .registry import (
    ENTRY_POINT_GROUP,
    USER_KERNELS_ENV,
    Kernel,
    KernelError,
    KernelFactory,
    KernelFunction,
    MatmulKernel,
    get_kernel,
    kernel_factory,
    kernel_function,
    kernel_names,
    list_kernels,
    register_kernel,
    set_user_kernels,
    user_kernels,
    user_kernels_enabled,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "USER_KERNELS_ENV",
    "Kernel",
    "KernelError",
    "KernelFactory",
    "KernelFunction",
    "MatmulKernel",
    "Operands",
    "check_operands",
    "get_kernel",
    "kernel_factory",
    "kernel_function",
    "kernel_names",
    "list_kernels",
    "register_kernel",
    "set_user_kernels",
    "user_kernels",
    "user_kernels_enabled",
]
