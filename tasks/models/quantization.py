"""W8A8 INT8 quantization: per-token activations exactly as vLLM, per-channel symmetric weights.

Activations, dynamic symmetric per token, as vLLM's ``scaled_int8_quant`` kernel computes them
(docs/reference/vllm-kernels.md §2.6; ``csrc/quantization/w8a8/int8/scaled_quant.cu``), ``scales="real"``:

* ``absmax = max_j |x[i, j]|`` (a maximum is exact and order-free), in fp32;
* ``scale = fl(absmax / 127)``, the fp32 scale stored and handed to the GEMM (``[M, 1]``);
* ``inv = fl(127 / absmax)``: the kernel multiplies by this, it does **not** divide by ``scale``;
* ``q = sat8(rn(fl(x * inv)))``: one fp32 multiply, round half to even (``cvt.rni``), saturate to
  [-128, 127] (``.sat``).  ``x * inv`` can exceed 127 by rounding only at the absmax element,
  where it rounds to 127 anyway; saturation is there for the formula's sake.
* A row of zeros: vLLM computes ``scale = 0/127 = 0`` and ``inv = 127/0 = inf``, so ``x * inv`` is
  ``0 * inf = NaN`` and ``cvt.rni.sat.s8.f32`` turns NaN into 0 (PTX converts NaN to 0 for
  float-to-integer ``cvt``).  We return the same: scale 0, q all 0 (so the GEMM row is 0 whatever
  the epilogue order).  Non-finite activations are refused (:class:`ValueError`): the kernels
  require finite scales.

``scales="pow2"`` (the paper's probe: both scales rounded UP to a power of two before quantizing):

* ``scale = pow2_up(fl(absmax / 127))``, the smallest power of two >= the fp32 real scale;
* ``q = sat8(rn(x / scale))``: division by a power of two is exact (barring underflow), so this is
  the exact ``x / scale`` rounded half to even; ``|x / scale| <= 127`` up to the rounding of the
  real scale, and saturation covers that edge.  A zero row keeps scale 0 and q 0.

Weights, per output channel, symmetric (what llm-compressor writes into a compressed-tensors W8A8
checkpoint; our choice where a detail is not pinned down):

* ``w`` ``[N, K]`` in fp32; ``scale[n] = fl(absmax(w[n, :]) / 127)`` (``"pow2"``: ``pow2_up`` of
  that); ``q = clamp(rn(fl(w / scale)), -127, 127)``: true fp32 division, round half to even,
  symmetric range [-127, 127] (never -128).
* An all-zero channel gets scale 1.0 and q 0 (any scale gives output 0; 1.0 keeps scales finite,
  positive and, under ``"pow2"``, a power of two).
* :func:`requantize_weight_pow2` moves an already-int8 channel (a compressed-tensors checkpoint)
  onto the power-of-two grid: ``q2 = clamp(rn(q * s / pow2_up(s)), -127, 127)``, computed in float64
  (``q * s / 2^e`` is exact there).

FP8 e4m3 weights, per output channel, symmetric (:func:`quantize_weight_fp8`; the downstream GEMM of
an FP8 quantizer pair in the ``quantize`` kind): ``scale[n] = fl32(absmax(w[n, :]) / 448)``;
``q = e4m3(clamp(fl32(w / scale[n]), -448, 448))`` rounded to nearest, ties to even (torch's fp32 ->
``float8_e4m3fn`` conversion); an all-zero channel gets scale 1.0 and q 0.  This is the per-channel
("channel" strategy) layout vLLM's FP8 W8A8 kernels take as ``weight_scale`` ``[N, 1]``
(docs/reference/vllm-kernels.md §2.4: the channel-wise path is taken unless both scales are per tensor),
computed the way a symmetric absmax quantizer computes it.
"""

from __future__ import annotations

import torch

__all__ = [
    "SCALE_MODES",
    "pow2_up",
    "is_pow2",
    "quantize_activations",
    "quantize_weight",
    "quantize_weight_fp8",
    "requantize_weight_pow2",
]

SCALE_MODES = ("real", "pow2")
_INT8_MIN, _INT8_MAX = -128, 127
# 127 as an fp32 tensor: ``tensor / absmax`` divides (a Python ``127.0 / absmax`` would multiply by a
# reciprocal, which rounds differently); made once, not at every call.
_127 = torch.tensor(127.0, dtype=torch.float32)
_WEIGHT_MAX = 127


def check_scale_mode(scales: str) -> str:
    if scales not in SCALE_MODES:
        raise ValueError(f"scales must be one of {', '.join(SCALE_MODES)}; got {scales!r}")
    return scales


def pow2_up(s: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= ``s`` elementwise (float32 in, float32 out; 0 stays 0).

    Exact: ``frexp`` splits ``s = m * 2**e`` with ``m`` in [0.5, 1); ``s`` is a power of two iff
    ``m == 0.5`` (then ``s`` itself), otherwise the answer is ``2**e``.  Subnormal ``s`` works too
    (``ldexp`` of 1 by a negative exponent is exact down to 2**-149).
    """
    if s.dtype != torch.float32:
        raise ValueError(f"pow2_up takes float32 scales, got {s.dtype}")
    if bool((s < 0).any()) or not bool(torch.isfinite(s).all()):
        raise ValueError("pow2_up takes finite, non-negative scales")
    m, e = torch.frexp(s)
    e = torch.where(m == 0.5, e - 1, e)
    up = torch.ldexp(torch.ones_like(s), e)
    return torch.where(s == 0, torch.zeros_like(s), up)


def is_pow2(s: torch.Tensor) -> torch.Tensor:
    """Elementwise: is ``s`` (float32) a positive power of two?  (Bit test: fraction bits zero.)"""
    bits = s.contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    fraction = bits & 0x7FFFFF
    normal = (exponent > 0) & (exponent < 255) & (fraction == 0)
    subnormal = (exponent == 0) & (fraction != 0) & ((fraction & (fraction - 1)) == 0)
    return (s > 0) & (normal | subnormal)


def _round_sat(v: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    # torch.round rounds half to even (like cvt.rni); clamp saturates; values are then integers.
    return torch.round(v).clamp_(lo, hi).to(torch.int8)


def quantize_activations(x: torch.Tensor, scales: str = "real") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token int8 quantization of ``x`` ``[M, K]`` (module docstring): ``(q int8 [M, K],
    scale float32 [M, 1])``.  ``x`` of any float dtype is first converted to fp32 (exact for bf16,
    fp16 and fp32), as the vLLM kernel does with ``static_cast<float>``."""
    check_scale_mode(scales)
    if x.dim() != 2:
        raise ValueError(f"quantize_activations takes a 2-D [M, K] tensor, got shape {tuple(x.shape)}")
    xf = x.to(torch.float32).contiguous()
    absmax = xf.abs().amax(dim=1, keepdim=True)  # [M, 1]
    # amax propagates NaN and inf, so the row maxima are finite exactly when every element is
    if not bool(torch.isfinite(absmax).all()):
        raise ValueError("activations contain inf or NaN; per-token int8 quantization needs finite x")
    zero = absmax == 0
    scale = absmax / 127.0  # fp32 division, one rounding
    if scales == "real":
        inv = _127 / absmax  # inf for a zero row
        v = xf * inv  # one fp32 rounding per element
    else:
        scale = pow2_up(scale)
        v = xf / torch.where(zero, torch.ones_like(scale), scale)
    v = v.masked_fill_(zero, 0.0)  # 0 * inf = NaN -> 0, as cvt.rni.sat does
    return _round_sat(v, _INT8_MIN, _INT8_MAX), scale


def quantize_weight(w: torch.Tensor, scales: str = "real") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 quantization of ``w`` ``[N, K]`` (module docstring):
    ``(q int8 [N, K] in [-127, 127], scale float32 [N])``."""
    check_scale_mode(scales)
    if w.dim() != 2:
        raise ValueError(f"quantize_weight takes a 2-D [N, K] weight, got shape {tuple(w.shape)}")
    wf = w.to(torch.float32)
    if not bool(torch.isfinite(wf).all()):
        raise ValueError("weight contains inf or NaN")
    absmax = wf.abs().amax(dim=1)  # [N]
    scale = absmax / 127.0
    if scales == "pow2":
        scale = pow2_up(scale)
    scale = torch.where(absmax == 0, torch.ones_like(scale), scale)
    q = _round_sat(wf / scale[:, None], -_WEIGHT_MAX, _WEIGHT_MAX)
    return q, scale.contiguous()


def requantize_weight_pow2(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move int8 weights ``q`` ``[N, K]`` with per-channel ``scale`` ``[N]`` onto power-of-two scales.

    ``s2 = pow2_up(scale)``; ``q2 = clamp(rn(q * scale / s2), -127, 127)`` in float64, where
    ``q * scale`` (8 x 24 bits) and the division by a power of two are exact.
    """
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"requantize_weight_pow2 takes int8 [N, K] weights, got {q.dtype} {tuple(q.shape)}")
    s2 = pow2_up(scale.to(torch.float32).reshape(-1))
    s2 = torch.where(s2 == 0, torch.ones_like(s2), s2)
    v = q.to(torch.float64) * scale.to(torch.float64).reshape(-1, 1) / s2.to(torch.float64)[:, None]
    return _round_sat(v, -_WEIGHT_MAX, _WEIGHT_MAX), s2.contiguous()


_FP8_MAX = 448.0


def quantize_weight_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric FP8 e4m3 quantization of ``w`` ``[N, K]`` (module docstring):
    ``(q float8_e4m3fn [N, K] in [-448, 448], scale float32 [N])``."""
    if w.dim() != 2:
        raise ValueError(f"quantize_weight_fp8 takes a 2-D [N, K] weight, got shape {tuple(w.shape)}")
    wf = w.to(torch.float32)
    if not bool(torch.isfinite(wf).all()):
        raise ValueError("weight contains inf or NaN")
    absmax = wf.abs().amax(dim=1)  # [N]
    scale = absmax / _FP8_MAX  # fp32 division, one rounding
    scale = torch.where(absmax == 0, torch.ones_like(scale), scale)
    v = (wf / scale[:, None]).clamp_(-_FP8_MAX, _FP8_MAX)  # fp32 division, one rounding per element
    return v.to(torch.float8_e4m3fn), scale.contiguous()
