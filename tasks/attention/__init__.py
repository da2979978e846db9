"""Attention kernels behind one call and one registry (docs/attention.md).

``get_attention(name)(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False)``
returns ``(out, logsumexp)``; :func:`list_attention` shows every entry with its availability.
CPU entries: ``sdpa-math``, ``sdpa-flash-cpu``, ``eager``, ``fp64`` (:mod:`.cpu`); PyTorch's SDPA
backends each forced to one backend, ``sdpa-{flash,efficient,cudnn,math}-cuda`` (:mod:`.sdpa`, with
``sdpa_attention(backend, device)`` naming each one's CPU counterpart); GPU engine entries: vLLM's
backends by name (:mod:`.vllm`).  :mod:`tasks.models.hf_attention` runs the tiny model with
any CPU entry (the engine's side: it sits in the models layer, above this package).
"""

from tasks.attention.registry import (
    AttentionError,
    AttentionKernel,
    attention_names,
    get_attention,
    list_attention,
    register_attention,
)

__all__ = [
    "DEFAULT_ATTENTION",
    "AttentionError",
    "AttentionKernel",
    "attention_names",
    "get_attention",
    "list_attention",
    "register_attention",
]

#: The attention the tiny model runs when an arm names none (tasks.models.invariance).
DEFAULT_ATTENTION = "fp64"
