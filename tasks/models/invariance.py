"""Shape-invariant float parts: attention and ``lm_head`` in float64, rounded once to fp32.

Why.  Per-token int8 quantization is a chaotic amplifier: an input element that moves by one fp32
ulp changes its int8 value whenever it sits next to a rounding midpoint; the layer's output then
moves by a whole quantization step, which moves more elements downstream.  fp32 attention does
not compute a query row the same way in every shape: prefill (all queries at once) and KV-cache
decode (one query per sequence) use different GEMM kernels, and left padding changes the number of
(masked) keys in the reductions; an fp32 ``lm_head`` GEMV (one row) and GEMM (many rows) round
differently too.  Measured on ``tiny-qwen3`` with fp32 attention and ``lm_head``: the attention
output of one prompt differed by ~5e-7 between a batch of one and a padded batch, and
teacher-forced scoring of 64 greedy sequences (32 new tokens each) disagreed with the generating
run's own tokens in 14 of them (19 of 2048 positions), more than swapping the INT8 kernel changes
(1-2 of 64 sequences under real scales).  That noise would drown the signal the experiments look
for.  With ``reductions="fp64"``: 0 of 64, and every position's top-k logits bit-identical between
teacher forcing and decoding, and between a prompt alone and in a padded batch.

How.  ``scores = q·kᵀ·scaling + mask``, ``softmax`` and ``probs·v`` run in float64, and so does
``lm_head`` (``x·Wᵀ`` of fp32 values); each result is rounded once to fp32.  Reassociation across
shapes moves a float64 result by ~1e-16 relative, and its fp32 rounding changes only when the
float64 value lies that close to an fp32 rounding midpoint (~2^-29 per element), so in practice
the engine computes each token's row the same way whatever the batch, padding or phase.  The masks
are transformers' eager masks (the dtype's minimum at masked positions; exp gives exactly 0).
RMSNorm, rotary embeddings, SiLU and residual adds are elementwise or per-row and stay fp32.

``reductions="fp32"`` in :func:`~tasks.models.build_model` keeps transformers' own fp32 eager
attention and ``lm_head``, to see the amplification for yourself.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["REDUCTIONS", "FP64_ATTENTION", "Fp64Linear", "fp64_attention", "register", "apply"]

FP64_ATTENTION = "swapcheck_fp64"
#: ``reductions=`` choice of build_model -> transformers ``attn_implementation``.
REDUCTIONS = {"fp64": FP64_ATTENTION, "fp32": "eager"}


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def fp64_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function: eager attention in float64 (module docstring).

    ``query`` ``[B, H, Q, D]``, ``key``/``value`` ``[B, KV, S, D]``; returns ``([B, Q, H, D]`` in
    ``query.dtype``, None)``, the layout transformers' eager attention returns.
    """
    if dropout:
        raise ValueError("the W8A8 engine runs inference only (attention dropout must be 0)")
    n_rep = int(getattr(module, "num_key_value_groups", 1))
    q = query.to(torch.float64)
    k = _repeat_kv(key, n_rep).to(torch.float64)
    v = _repeat_kv(value, n_rep).to(torch.float64)
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : k.shape[-2]].to(torch.float64)
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v).transpose(1, 2).contiguous()
    return out.to(query.dtype), None


class Fp64Linear(nn.Linear):
    """``nn.Linear`` computed in float64 and rounded once to the input dtype (same parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.bias.to(torch.float64) if self.bias is not None else None
        return nn.functional.linear(x.to(torch.float64), self.weight.to(torch.float64), b).to(x.dtype)


def register() -> None:
    """Register :func:`fp64_attention` (and transformers' eager mask for it) once per process."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    if FP64_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(FP64_ATTENTION, fp64_attention)
    if FP64_ATTENTION not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(FP64_ATTENTION, eager_mask)


def apply(hf: Any, reductions: str) -> None:
    """Make ``hf.lm_head`` an :class:`Fp64Linear` sharing its parameters when ``reductions == "fp64"``
    (attention is chosen when the model is built, through ``attn_implementation``)."""
    if reductions != "fp64":
        return
    old = hf.lm_head
    if isinstance(old, Fp64Linear) or not isinstance(old, nn.Linear):
        return
    new = Fp64Linear(old.in_features, old.out_features, bias=old.bias is not None, device="meta")
    new.weight = old.weight  # the same Parameter: ties and state_dict names are kept
    new.bias = old.bias
    hf.lm_head = new
