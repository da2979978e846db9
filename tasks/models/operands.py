"""Synthetic GEMM operands, drawn and quantized as a real W8A8 layer produces them.

How (docs/reference/vllm-kernels.md §2.6):

* int8 activations: per-token scale ``sa = absmax(row) / 127`` (fp32) and
  ``q = round_half_even(x * (127 / absmax))`` saturated to [-128, 127], as ``scaled_int8_quant``;
  int8 weights: per-channel ``sb = absmax(column) / 127`` and ``round(w / sb)`` in [-127, 127] —
  both are the model's own quantizer (:mod:`tasks.models.quantization`);
* fp8 e4m3: the analogue with 448, ``x / s`` cast to e4m3 (round to nearest even), clamped to ±448.

Scale mode ``pow2`` rounds every scale UP to a power of two before quantizing (so nothing saturates);
multiplying by a power of two is exact, so under ``pow2`` all epilogue orders must agree bit for bit.
The same seed draws the same real-valued ``x`` and ``w`` in both scale modes, so the modes are paired.

The draws are seeded by :func:`tasks.seeds.stable_seed` under the label ``"kdepth"`` (the kind that
drew them first): the same parameters give the same operands in every process and every kind that
uses them (``kdepth``, ``batch_invariance`` at the kernel level, the GPU smoke tests).
"""

from __future__ import annotations

from typing import Any

__all__ = ["QMAX", "draw_operands"]

QMAX = {"int8": 127.0, "fp8_e4m3": 448.0}


def draw_operands(
    dtype: str, m: int, n: int, k: int, seed: int, scale_mode: str, out_dtype: str = "bf16", bias: bool = False
) -> dict[str, Any]:
    """Quantized operands, scales and bias of one unit (deterministic in the parameters)."""
    import torch

    from tasks.models.quantization import pow2_up, quantize_activations, quantize_weight
    from tasks.numerics import get_format
    from tasks.seeds import stable_seed

    g = torch.Generator().manual_seed(stable_seed("kdepth", dtype, m, n, k, seed))
    x = torch.randn(m, k, generator=g, dtype=torch.float32)
    w = torch.randn(k, n, generator=g, dtype=torch.float32)
    bias_t = torch.randn(n, generator=g, dtype=torch.float32).to(get_format(out_dtype).torch_dtype) if bias else None
    if dtype == "int8":
        a, sa = quantize_activations(x, scale_mode)  # [M, K], [M, 1]
        bq, sb = quantize_weight(w.t(), scale_mode)  # [N, K], [N]
        b = bq.t().contiguous()
    elif dtype == "fp8_e4m3":
        qmax = QMAX[dtype]
        tiny = torch.finfo(torch.float32).tiny
        sa = x.abs().amax(dim=1, keepdim=True).clamp_min(tiny) / qmax
        sb = w.abs().amax(dim=0).clamp_min(tiny) / qmax
        if scale_mode == "pow2":
            sa, sb = pow2_up(sa), pow2_up(sb)
        a = (x / sa).clamp(-qmax, qmax).to(torch.float8_e4m3fn)
        b = (w / sb[None, :]).clamp(-qmax, qmax).to(torch.float8_e4m3fn)
    else:
        raise ValueError(f"unknown operand dtype {dtype!r}; allowed: int8, fp8_e4m3")
    return {"a": a, "b": b, "scale_a": sa.contiguous(), "scale_b": sb.reshape(n).contiguous(), "bias": bias_t}
