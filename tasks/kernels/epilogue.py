"""Scaled-GEMM epilogues, emulated bit for bit (docs/reference/vllm-kernels.md §2).

Each function takes the fp32 accumulator ``accf`` ``[M, N]`` (for INT8: the int32 accumulator
converted to fp32 with round-to-nearest-even), the scales as float32 ``[M, 1]`` and ``[1, N]``, the
optional bias ``[N]`` in the output dtype, and the output dtype.  Notation: ``fl()`` is one fp32
rounding, ``rn()`` the final round-to-nearest-even into the output dtype.

* :func:`cutlass` (§2.1, ``ScaledEpilogue`` / ``ScaledEpilogueBias``):
  ``rn(fl(sa * fl(sb * accf)))``; with bias ``rn(fma32(sa, fl(sb * accf), bias))``, the fused
  multiply-add rounded once to fp32 (nvcc contracts CUTLASS's ``multiply_add``; §2.1 [inferred]).
* :func:`triton` (§2.2): ``rn(fl(sb * fl(sa * accf)))``; with bias, ``bias_mode="fp32"`` (vLLM
  >= 0.32) ``rn(fl(fl(sb * fl(sa * accf)) + bias))``, ``bias_mode="output"`` (vLLM <= 0.31)
  ``rn(rn(fl(sb * fl(sa * accf))) + bias)``, the add done in the output dtype (one rounding of the
  exact sum of two output-dtype values).
* :func:`channelwise` (§2.4, vLLM's torch channel-wise fallback): ``rn(fl(fl(fl(accf * sa) * sb) +
  bias))``, separate fp32 eager ops, no FMA.

Why plain torch float32 ops are exact emulations: a torch CPU fp32 multiply or add of two tensors
is one IEEE round-to-nearest-even operation per element (no contraction across separate torch
ops), and float32 -> bfloat16/float16 casts round to nearest even.  The fused multiply-add is the
one operation torch has no exact CPU equivalent for; :func:`fma32` builds it from the exact float64
product, :func:`tasks.numerics.two_sum` and :func:`tasks.numerics.round_to_format`.
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.numerics import round_to_format, two_sum

__all__ = ["fma32", "cutlass", "triton", "channelwise", "EPILOGUES", "BIAS_MODES"]

EPILOGUES = ("cutlass", "triton")
BIAS_MODES = ("fp32", "output")


def fma32(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """fp32 fused multiply-add ``fl(x * y + z)`` (one rounding), elementwise with broadcasting.

    ``x * y`` of two fp32 values has at most 48 significant bits and lies between 2**-298 and 2**256
    in magnitude, so it is exact in float64.  ``two_sum`` then gives the float64 sum and its exact
    error, and ``round_to_format(sum, fp32, error)`` rounds the exact ``x * y + z`` once.
    """
    xd, yd, zd = (t.to(torch.float64) for t in (x, y, z))
    p = (xd * yd).numpy()
    zb = np.broadcast_to(zd.numpy(), p.shape)
    s, e = two_sum(p, zb)
    out = round_to_format(s, "fp32", e)
    return torch.from_numpy(np.ascontiguousarray(out)).to(torch.float32)


def _add_in_output_dtype(
    c: torch.Tensor, bias: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """``rn(c + bias)`` for two values of ``out_dtype``: one rounding of the exact sum.

    The float64 sum of two values of <= 24 significant bits is exact unless their exponents differ
    by more than ~29, and then rounding float64 -> out_dtype is still correct (double rounding is
    innocuous from 53 >= 2p + 2 bits; docs/reference/design.md numerics notes).
    """
    return (c.to(torch.float64) + bias.to(torch.float64)).to(out_dtype)


def cutlass(
    accf: torch.Tensor,
    sa: torch.Tensor,
    sb: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """CUTLASS ``ScaledEpilogue[Bias]`` (§2.1): ``rn(fl(sa * fl(sb * accf)))`` / ``rn(fma32(...))``."""
    t = sb * accf
    if bias is None:
        return (sa * t).to(out_dtype)
    return fma32(sa, t, bias.to(torch.float32)).to(out_dtype)


def triton(
    accf: torch.Tensor,
    sa: torch.Tensor,
    sb: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    bias_mode: str = "fp32",
) -> torch.Tensor:
    """vLLM ``triton_scaled_mm`` epilogue (§2.2): ``sb * (sa * acc)``, bias per ``bias_mode``."""
    u = sb * (sa * accf)
    if bias is None:
        return u.to(out_dtype)
    if bias_mode == "fp32":
        return (u + bias.to(torch.float32)).to(out_dtype)
    if bias_mode == "output":
        return _add_in_output_dtype(u.to(out_dtype), bias, out_dtype)
    raise ValueError(f"bias_mode must be one of {BIAS_MODES}, got {bias_mode!r}")


def channelwise(
    accf: torch.Tensor,
    sa: torch.Tensor,
    sb: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """vLLM's torch channel-wise fallback (§2.4): ``rn(fl(fl(fl(accf * sa) * sb) + bias))``."""
    u = (accf * sa) * sb
    if bias is not None:
        u = u + bias.to(torch.float32)
    return u.to(out_dtype)
