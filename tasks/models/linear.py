"""``W8A8Linear``: one decoder linear layer computed as vLLM's W8A8 INT8 path computes it.

Per call (docs/reference/vllm-kernels.md §4, the chain ``apply_weights`` -> ``scaled_int8_quant`` ->
``cutlass_scaled_mm`` / ``triton_scaled_mm``):

1. the input ``[..., K]`` is viewed as ``x`` ``[M, K]`` and quantized per token
   (:func:`.quantization.quantize_activations`, with the model's scale mode): ``x_q`` int8
   ``[M, K]``, ``x_scale`` fp32 ``[M, 1]``;
2. the GEMM runs through the registry kernel: ``kernel(x_q, w_q.t(), x_scale, w_scale, out_dtype,
   bias)`` with ``w_q`` int8 ``[N, K]`` (so ``b = w_q.t()`` is the column-major ``[K, N]`` view
   vLLM passes), ``w_scale`` fp32 ``[N]``, ``bias`` ``[N]`` in ``out_dtype`` or None;
3. the ``[M, N]`` output (``out_dtype``, bf16 by default, as a bf16 vLLM model writes it) is handed
   back converted to the input's dtype (the engine runs fp32 between linears; bf16 -> fp32 is
   exact, so the kernel's rounding is the only rounding of the layer).

Every call is counted per kernel name (:attr:`W8A8Linear.calls`), and, while a recorder is set
(:meth:`tasks.models.W8A8Model.capture`), handed to it with the exact operands and output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .quantization import check_scale_mode, quantize_activations

if TYPE_CHECKING:
    from tasks.kernels import Kernel

__all__ = ["W8A8Linear", "LAYER_TYPES", "PROJECTIONS", "resolve_kernel", "OUT_DTYPES"]

#: Projection attribute (within a decoder layer) -> short layer type, in forward order.
PROJECTIONS: dict[str, str] = {
    "self_attn.q_proj": "q",
    "self_attn.k_proj": "k",
    "self_attn.v_proj": "v",
    "self_attn.o_proj": "o",
    "mlp.gate_proj": "gate",
    "mlp.up_proj": "up",
    "mlp.down_proj": "down",
}
LAYER_TYPES = tuple(PROJECTIONS.values())
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

#: Called once per layer call: ``recorder(layer, x_q, x_scale, output)``.
Recorder = Callable[["W8A8Linear", torch.Tensor, torch.Tensor, torch.Tensor], None]


def resolve_kernel(kernel: Any) -> Kernel:
    """A registry kernel from a name (``"int8-cutlass-order"``, ``"pkg.mod:attr"``), a dict
    ``{"kernel": name, "params": {...}}`` (an optional ``"name"`` label is ignored), or a
    :class:`tasks.kernels.Kernel` instance.  It must take int8 operands on the CPU."""
    from tasks.kernels import Kernel, get_kernel

    if isinstance(kernel, Kernel):
        k = kernel
    elif isinstance(kernel, str):
        k = get_kernel(kernel)
    elif isinstance(kernel, dict):
        unknown = sorted(set(kernel) - {"kernel", "params", "name"})
        if unknown or "kernel" not in kernel:
            raise ValueError(
                "a kernel dict is {'kernel': <registry name>, 'params': {...}}; "
                f"got keys {sorted(kernel)}"
            )
        k = get_kernel(kernel["kernel"], **dict(kernel.get("params") or {}))
    else:
        raise ValueError(
            f"kernel must be a registry name, a {{'kernel': ..., 'params': ...}} dict or a Kernel; "
            f"got {type(kernel).__name__}"
        )
    if k.operand_dtype not in ("int8", "any"):
        raise ValueError(
            f"kernel {k.name!r} takes {k.operand_dtype} operands; the W8A8 engine needs an int8 kernel"
        )
    if k.device != "cpu":
        raise ValueError(f"kernel {k.name!r} runs on {k.device!r}; the W8A8 engine runs on the CPU")
    return k


class W8A8Linear(nn.Module):
    """An int8-weight, int8-activation linear layer (module docstring).

    Buffers: ``weight`` int8 ``[N, K]``, ``weight_scale`` fp32 ``[N]``, ``bias`` ``[N]`` in
    ``out_dtype`` or None.  Attributes: ``name`` (``"layers.3.self_attn.q_proj"``), ``index``
    (decoder layer number), ``layer_type`` (q, k, v, o, gate, up, down), ``kernel``, ``scales``
    (``"real"`` or ``"pow2"``, the activation scale mode), ``out_dtype``, ``calls``
    (kernel name -> count) and ``recorder``.
    """

    weight: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        kernel: Kernel,
        scales: str = "real",
        out_dtype: torch.dtype = torch.bfloat16,
        name: str = "",
        index: int = -1,
        layer_type: str = "",
    ) -> None:
        super().__init__()
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise ValueError(f"{name}: weight must be int8 [N, K], got {weight.dtype} {tuple(weight.shape)}")
        n = int(weight.shape[0])
        if weight_scale.dtype != torch.float32 or weight_scale.numel() != n:
            raise ValueError(
                f"{name}: weight_scale must be float32 with N={n} elements, got "
                f"{weight_scale.dtype} {tuple(weight_scale.shape)}"
            )
        if not bool(torch.isfinite(weight_scale).all()) or bool((weight_scale <= 0).any()):
            raise ValueError(f"{name}: weight scales must be finite and positive")
        if out_dtype not in OUT_DTYPES.values():
            raise ValueError(f"{name}: out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("weight_scale", weight_scale.reshape(n).contiguous())
        if bias is not None:
            if tuple(bias.shape) != (n,):
                raise ValueError(f"{name}: bias must be [N] = [{n}], got {tuple(bias.shape)}")
            bias = bias.to(out_dtype).contiguous()
        self.register_buffer("bias", bias)
        self.kernel = kernel
        self.scales = check_scale_mode(scales)
        self.out_dtype = out_dtype
        self.name = name
        self.index = index
        self.layer_type = layer_type
        self.calls: dict[str, int] = {}
        self.recorder: Recorder | None = None
        #: A registry activation quantizer (:mod:`tasks.quantizers`) replacing step 1's
        #: :func:`quantize_activations` when set; None (the default) keeps the engine's own, which is
        #: the registry's ``vllm-int8`` bit for bit (tests/test_quantizers.py).
        self.quantizer: Any = None

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def gemm(self, x_q: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
        """The scaled GEMM alone, through this layer's kernel: ``[M, N]`` in ``out_dtype``."""
        out = self.kernel(x_q, self.weight.t(), x_scale, self.weight_scale, self.out_dtype, self.bias)
        self.calls[self.kernel.name] = self.calls.get(self.kernel.name, 0) + 1
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{self.name}: input has {x.shape[-1]} features, the layer takes {self.in_features}")
        x2 = x.reshape(-1, self.in_features)
        if self.quantizer is None:
            x_q, x_scale = quantize_activations(x2, self.scales)
        else:
            x_q, x_scale = self.quantizer(x2)
            x_scale = x_scale.to(torch.float32)  # an fp16 scale is read back exactly; kernels take fp32
        out = self.gemm(x_q, x_scale)
        if self.recorder is not None:
            self.recorder(self, x_q, x_scale, out)
        return out.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"{self.name or 'unnamed'}: in={self.in_features}, out={self.out_features}, "
            f"bias={self.bias is not None}, kernel={self.kernel.name}, scales={self.scales}, "
            f"out_dtype={self.out_dtype}"
        )
