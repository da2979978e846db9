"""The CPU attention kernels of the registry (:mod:`.registry`).

====================  ===============================================================  ==================
name                  what it computes                                                 logsumexp
====================  ===============================================================  ==================
``sdpa-math``         ``scaled_dot_product_attention`` under ``sdpa_kernel(SDPBackend   computed alongside
                      .MATH)``: PyTorch's reference path (matmul, softmax, matmul)
``sdpa-flash-cpu``    ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``:   the kernel's own
                      PyTorch's CPU flash kernel (blocked online softmax; what SDPA
                      runs on the CPU for ``SDPBackend.FLASH_ATTENTION``)
``eager``             transformers' eager attention: ``q kᵀ * scale + mask`` and         computed alongside
                      ``p v`` in the input dtype, ``softmax`` in float32 then cast to
                      the input dtype
``fp64``              :func:`attend_fp64`, the one float64 attention (the tiny         computed with the
                      model's default, ``models.invariance.fp64_attention``, calls     output in float64
                      it too): every step in float64, rounded once
====================  ===============================================================  ==================

"Computed alongside": those backends do not return a logsumexp, so it is computed from the same
operands in float64 and rounded once to float32 (:func:`logsumexp_alongside`); it is the same for
each of them bit for bit, and says nothing about the kernel's own numerics.

Boolean masks and ``is_causal`` become additive masks holding the dtype's most negative value at
excluded positions for ``eager`` and ``fp64`` (what transformers' eager masks hold), so a fully
excluded row averages its values instead of dividing by zero; the logsumexp of such a row is that
value plus ``log(S)``.  ``is_causal`` aligns the diagonal top-left, as SDPA does (query ``i`` sees
keys ``j <= i``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.attention.registry import AttentionKernel, register_attention

if TYPE_CHECKING:
    import torch

__all__ = ["EAGER", "FP64", "SDPA_FLASH_CPU", "SDPA_MATH", "additive_mask", "attend_fp64", "logsumexp_alongside"]

ALONGSIDE = "computed alongside in float64, rounded once to float32 (the backend returns none)"


def _causal(length: int, keys: int) -> torch.Tensor:
    import torch

    return torch.ones(length, keys, dtype=torch.bool).tril()


def additive_mask(q: torch.Tensor, keys: int, attn_mask: torch.Tensor | None, is_causal: bool,
                  dtype: torch.dtype) -> torch.Tensor | None:
    """The mask as an additive tensor of ``dtype``: float masks as given (converted), boolean and
    causal exclusions as ``finfo(q.dtype).min`` (transformers' eager convention)."""
    import torch

    if is_causal:
        attn_mask = _causal(q.shape[-2], keys)
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        low = torch.finfo(q.dtype).min
        return torch.zeros(attn_mask.shape, dtype=dtype).masked_fill(~attn_mask, low)
    return attn_mask.to(dtype)


def logsumexp_alongside(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
                        scale: float) -> torch.Tensor:
    """``log(sum_j exp(q·k_j * scale + mask_j))`` per query, in float64, rounded once to float32."""
    import torch

    scores = torch.matmul(q.to(torch.float64), k.to(torch.float64).transpose(-2, -1)) * scale
    mask = additive_mask(q, k.shape[-2], attn_mask, is_causal, torch.float64)
    if mask is not None:
        scores = scores + mask
    return torch.logsumexp(scores, dim=-1).to(torch.float32)


def _math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
          scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                               scale=scale)
    return out, logsumexp_alongside(q, k, attn_mask, is_causal, scale)


def _flash_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
               scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # The kernel takes additive masks; SDPA's own conversion of a boolean mask is this one.
        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill(~attn_mask, float("-inf"))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)
    return out, lse


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    w = torch.matmul(q, k.transpose(2, 3)) * scale
    mask = additive_mask(q, k.shape[-2], attn_mask, is_causal, q.dtype)
    if mask is not None:
        w = w + mask
    w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v), logsumexp_alongside(q, k, attn_mask, is_causal, scale)


def attend_fp64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The one float64 attention: ``scores = q·kᵀ * scale + mask``, ``softmax``, ``probs·v``, every
    step in float64 (operands and mask converted exactly; a float64 tensor is used as it is).

    ``q`` ``[..., L, D]``, ``k``/``v`` ``[..., S, D]`` with as many heads as ``q`` (repeat key/value
    heads first), ``mask`` additive and broadcastable to ``[..., L, S]`` or None.  Returns
    ``(out, scores)`` in float64, unrounded: the ``fp64`` entry rounds ``out`` once to the inputs'
    dtype and takes the logsumexp of ``scores``; the tiny model's default attention
    (:func:`tasks.models.invariance.fp64_attention`) rounds ``out`` in transformers' layout.
    """
    import torch

    scores = torch.matmul(q.to(torch.float64), k.to(torch.float64).transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores + mask.to(torch.float64)
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v.to(torch.float64)), scores


def _fp64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
          scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    out, scores = attend_fp64(q, k, v, additive_mask(q, k.shape[-2], attn_mask, is_causal, torch.float64), scale)
    return out.to(q.dtype), torch.logsumexp(scores, dim=-1).to(torch.float32)


SDPA_MATH = AttentionKernel(
    name="sdpa-math", device="cpu", compute=_math, gqa=False, logsumexp=ALONGSIDE, algorithm="plain",
    description="torch scaled_dot_product_attention under sdpa_kernel(SDPBackend.MATH): matmul, softmax, matmul")
SDPA_FLASH_CPU = AttentionKernel(
    name="sdpa-flash-cpu", device="cpu", compute=_flash_cpu, gqa=False, logsumexp="returned by the backend",
    algorithm="flash-cpu",
    description="torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: PyTorch's CPU flash kernel "
                "(blocked online softmax, normalised by a reciprocal)")
EAGER = AttentionKernel(
    name="eager", device="cpu", compute=_eager, gqa=False, logsumexp=ALONGSIDE, algorithm="plain",
    description="transformers' eager attention: q kT * scale + mask and p v in the input dtype, softmax in float32")
FP64 = AttentionKernel(
    name="fp64", device="cpu", compute=_fp64, gqa=False, algorithm="plain",
    logsumexp="computed in float64 with the output, rounded once to float32",
    description="the tiny model's default (tasks.attention.cpu.attend_fp64): float64 throughout, rounded once")

for _k in (SDPA_MATH, SDPA_FLASH_CPU, EAGER, FP64):
    register_attention(_k)
