"""Activation quantizers behind one call and one registry: ``quantizer(x) -> (q, scale)``.

Get one with :func:`get_quantizer` (parameters override an entry's presets)::

    from tasks.quantizers import get_quantizer
    q, scale = get_quantizer("vllm-int8")(x)                      # x [tokens, hidden] fp32/bf16/fp16
    q, scale = get_quantizer("vllm-int8", rounding="away")(x)     # == "int8-half-away"

Built-in entries (each differs from its vLLM reference in ONE step; formulas in :mod:`.per_token`
and docs/quantizers.md):

=================  ======  ==============================================================================
name               q       what it computes
=================  ======  ==============================================================================
vllm-int8          int8    vLLM ``scaled_int8_quant`` dynamic per token: s = fl32(amax/127),
                           q = rn_even_sat(fl32(x * fl32(127/amax))); the W8A8 engine's quantizer
int8-half-away     int8    vllm-int8 with ties rounded half away from zero (Triton/libdevice ``round``)
int8-divide        int8    vllm-int8 with q from a true division by the stored scale, fl32(x / s)
int8-recip127      int8    vllm-int8 with s = fl32(amax * fl32(1/127)) (multiply by a rounded 1/127)
int8-fp16-scale    int8    vllm-int8 with the scale stored in fp16, fl16(fl32(amax/127))
int8-eps           int8    vllm-int8 with amax clamped below at fl32(1e-10) (zero rows get a scale)
int8-static        int8    vLLM static per tensor: s = fl32(static_scale), q = rn_even_sat(fl32(x / s))
vllm-fp8           fp8     vLLM dynamic per-token FP8 (CUDA kernel): s = max(fl32(amax/448),
                           fl32(1/(448*512))), q = e4m3(clamp(fl32(x / s), -448, 448))
fp8-mul-inv        fp8     vllm-fp8 multiplying by fl32(1/s) (vLLM's ``QuantFP8.forward_native``)
fp8-static         fp8     static FP8: s = fl32(static_scale), q = e4m3(clamp(fl32(x * fl32(1/s))))
=================  ======  ==============================================================================
"""

from __future__ import annotations

from .registry import (
    Quantizer,
    QuantizerError,
    get_quantizer,
    list_quantizers,
    quantizer_names,
    register_quantizer,
)

__all__ = [
    "DEFAULT_QUANTIZER",
    "Quantizer",
    "QuantizerError",
    "get_quantizer",
    "list_quantizers",
    "quantizer_names",
    "register_quantizer",
]

#: The W8A8 engine's activation quantizer (tasks/models/quantization.py, ``scales="real"``).
DEFAULT_QUANTIZER = "vllm-int8"

_INT8 = "tasks.quantizers.per_token:Int8PerToken"
_FP8 = "tasks.quantizers.per_token:Fp8PerToken"

register_quantizer("vllm-int8", _INT8, "vLLM scaled_int8_quant, dynamic per token (the engine's default)")
register_quantizer("int8-half-away", _INT8, "vllm-int8, ties half away from zero", rounding="away")
register_quantizer("int8-divide", _INT8, "vllm-int8, q = fl32(x / s)", apply="divide")
register_quantizer("int8-recip127", _INT8, "vllm-int8, s = fl32(amax * fl32(1/127))", scale="mul-recip")
register_quantizer("int8-fp16-scale", _INT8, "vllm-int8, scale stored in fp16", scale_dtype="fp16")
register_quantizer("int8-eps", _INT8, "vllm-int8, amax clamped at 1e-10", eps=1e-10)
register_quantizer("int8-static", _INT8, "vLLM static per-tensor INT8 (needs static_scale)", mode="static",
                   apply="divide")
register_quantizer("vllm-fp8", _FP8, "vLLM dynamic per-token FP8 e4m3 (CUDA kernel)")
register_quantizer("fp8-mul-inv", _FP8, "vllm-fp8 multiplying by fl32(1/s) (forward_native)", apply="mul-inv")
register_quantizer("fp8-static", _FP8, "static per-tensor FP8 e4m3 (needs static_scale)", mode="static",
                   apply="mul-inv", min_scale=0.0)
