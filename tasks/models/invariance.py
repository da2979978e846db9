"""Shape-invariant float parts: attention and ``lm_head`` in float64, rounded once to fp32.

Why.  Per-token int8 quantization is a chaotic amplifier: an input element that moves by one fp32
ulp changes its int8 value whenever it sits next to a rounding midpoint; the layer's output then
moves by a whole quantization step, which moves more elements downstream.  fp32 attention does
not compute a query row the same way in every shape: prefill (all queries at once) and KV-cache
decode (one query per sequence) use different GEMM kernels, and left padding changes the number of
(masked) keys in the reductions; an fp32 ``lm_head`` GEMV (one row) and GEMM (many rows) round
differently too.  Measured on ``tiny-qwen3`` (``int8-cutlass-order``, real scales, torch 2.13.0+cpu,
transformers 5.19.0) with fp32 attention and ``lm_head``, in the setting of ``sweeps/demo.toml``'s
generate experiment (64 prompts of 16 tokens greedily decoded in one batch of 64, each sequence
then scored alone by prefill as the teacher-forced replay scores it): teacher-forced scoring
disagreed with the generating run's own tokens in 8 of 64 sequences (12 of 4096 positions) with 64
new tokens, and in 3 of 64 (5 of 2048 positions) with 32; with 1, 2 or 4 torch threads alike, and
1 of 64 (32 tokens) / 3 of 64 (64 tokens) under power-of-two scales.  ``swapcheck sweep launch
sweeps/noise-floor-fp32.toml`` then ``swapcheck report noise-floor`` shows the 64-token figures
(docs/noise-floor.md).  An earlier version of this note read 14 of 64 (19 of 2048 positions, 32
new tokens); neither the current engine nor a copy of the tree from 2026-11-30 reproduces it with
this torch, so that figure came from an older state of the engine or its libraries and is withdrawn.
That is as much as swapping the INT8 kernel changes (2 of 64 sequences under real scales,
32 tokens), so the noise would drown the signal the experiments look for.  With
``reductions="fp64"``: 0 of 64 with 32 or 64 new tokens, and every position's logits bit-identical
between teacher forcing and decoding, and between a prompt alone and in a padded batch.

How.  ``scores = q·kᵀ·scaling + mask``, ``softmax`` and ``probs·v`` run in float64, and so does
``lm_head`` (``x·Wᵀ`` of fp32 values); each result is rounded once to fp32.  Reassociation across
shapes moves a float64 result by ~1e-16 relative, and its fp32 rounding changes only when the
float64 value lies that close to an fp32 rounding midpoint (~2^-29 per element), so in practice
the engine computes each token's row the same way whatever the batch, padding or phase.  The masks
are transformers' eager masks (the dtype's minimum at masked positions; exp gives exactly 0).
RMSNorm, rotary embeddings, SiLU and residual adds are elementwise or per-row and stay fp32.

The KV cache of generation (``Fp64KVCache``, made by :func:`kv_cache`).  Decoding step ``t`` attends over every cached
key and value.  transformers' ``DynamicCache`` keeps them in fp32 with ``num_key_value_heads``
heads, so each step would repeat the whole cache to ``num_attention_heads`` heads and convert it to
float64 again, in every layer (O(S) copies per step).  ``Fp64KVCache``
stores each layer's keys and values already repeated and in float64, appending only the new
positions: fp32 -> float64 is exact and repeating copies values, so the tensor
:func:`fp64_attention` reads is the same one it would build from the fp32 cache -- the same values,
shape ``[B, H, S, D]``, contiguous layout and dtype -- and every result is the same bit for bit
(tests/test_models_kvcache.py checks this over prefill, decode steps, padded batches and a new
sequence after a finished one).  The cache belongs to one ``generate`` call: a new sequence starts
a new cache, so nothing from another sequence or layer can be reused.

``reductions="fp32"`` in :func:`~tasks.models.build_model` keeps transformers' own fp32 eager
attention and ``lm_head``, to see the amplification for yourself.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from tasks.attention.cpu import attend_fp64
from tasks.attention.registry import repeat_kv

__all__ = ["REDUCTIONS", "FP64_ATTENTION", "Fp64Linear", "fp64_attention", "kv_cache", "register", "apply"]

FP64_ATTENTION = "swapcheck_fp64"
#: ``reductions=`` choice of build_model -> transformers ``attn_implementation``.
REDUCTIONS = {"fp64": FP64_ATTENTION, "fp32": "eager"}


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
    if key.dtype == torch.float64 and key.shape[1] == query.shape[1]:
        k, v = key, value  # from Fp64KVCache: already repeated to every query head and in float64
    else:
        n_rep = int(getattr(module, "num_key_value_groups", 1))
        k, v = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    mask = None if attention_mask is None else attention_mask[:, :, :, : k.shape[-2]]
    out, _ = attend_fp64(query, k, v, mask, scaling)
    return out.transpose(1, 2).contiguous().to(query.dtype), None


def kv_cache(config: Any, capacity: int = 0) -> Any:
    """A fresh ``Fp64KVCache`` (a transformers ``DynamicCache``) for one generation with a model of ``config`` (attention
    :data:`FP64_ATTENTION`), or None (transformers' default cache) when the model has a layer that is
    not full attention (a sliding window crops its cache) or attention of another implementation.
    ``capacity``: the positions the generation will hold (prompt width + new tokens), allocated at
    the first update; more grow the buffers by doubling."""
    if getattr(config, "_attn_implementation", None) != FP64_ATTENTION:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        return None
    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads or config.num_attention_heads)
    if heads % kv_heads:
        return None
    return _cache_class()(int(config.num_hidden_layers), heads // kv_heads, capacity)


@functools.cache
def _cache_class() -> type:
    """The float64 cache class, defined on first use (``transformers`` is imported lazily)."""
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    class Fp64KVLayer(DynamicLayer):
        """One layer's keys and values, repeated to every query head and kept in float64.

        They live in buffers ``[B, H, capacity, D]``, allocated at the first update (the capacity
        ``generate`` asks for; more positions than that grow them by doubling); ``keys``/``values``
        are the views ``[:, :, :S]`` of the positions written so far, and each update writes only
        the new positions.  A view's batch and head strides are the buffer's, its position rows
        are contiguous as in a fresh tensor.  If anything replaced ``keys``/``values`` (transformers'
        crop, reorder or batch selection), the buffers are rebuilt from them first."""

        def __init__(self, n_rep: int, capacity: int = 0) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.n_rep = n_rep
            self.capacity = capacity
            self._kbuf: torch.Tensor | None = None
            self._vbuf: torch.Tensor | None = None

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.dtype, self.device = torch.float64, key_states.device
            self.keys = torch.tensor([], dtype=torch.float64, device=self.device)
            self.values = torch.tensor([], dtype=torch.float64, device=self.device)
            self._kbuf = self._vbuf = None
            self.is_initialized = True

        def _ours(self) -> bool:
            # keys/values are still views [:, :, :S] of the buffers (inference tensors have no _base)
            for view, buf in ((self.keys, self._kbuf), (self.values, self._vbuf)):
                if (view is None or buf is None or view.dim() != 4 or view.data_ptr() != buf.data_ptr()
                        or view.stride() != buf.stride() or view.shape[:2] != buf.shape[:2]
                        or view.shape[-1] != buf.shape[-1] or view.shape[-2] > buf.shape[-2]):
                    return False
            return True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            b, kv, q, d = key_states.shape
            heads = kv * self.n_rep
            old = self.get_seq_length()
            total = old + q
            kbuf, vbuf = self._kbuf, self._vbuf
            if (kbuf is None or vbuf is None or not self._ours() or kbuf.shape[-2] < total
                    or tuple(kbuf.shape[:2]) != (b, heads) or kbuf.shape[-1] != d):
                cap = self.capacity if old == 0 and self.capacity >= total else max(2 * total, 64)
                # zeros, not empty: the pages are touched once here instead of a few at every step
                kbuf = torch.zeros((b, heads, cap, d), dtype=torch.float64, device=key_states.device)
                vbuf = torch.zeros((b, heads, cap, d), dtype=torch.float64, device=key_states.device)
                if old:
                    assert self.keys is not None and self.values is not None
                    kbuf[:, :, :old] = self.keys
                    vbuf[:, :, :old] = self.values
                self._kbuf, self._vbuf = kbuf, vbuf
            # Exact: float32 -> float64 and repeating (head h reads key head h // n_rep, as
            # repeat_kv does) only copy values; one copy_ converts and broadcasts the new positions.
            kbuf[:, :, old:total].unflatten(1, (kv, self.n_rep)).copy_(key_states.unsqueeze(2))
            vbuf[:, :, old:total].unflatten(1, (kv, self.n_rep)).copy_(value_states.unsqueeze(2))
            self.keys, self.values = kbuf[:, :, :total], vbuf[:, :, :total]
            return self.keys, self.values

    class Fp64KVCache(DynamicCache):
        """A ``DynamicCache`` of ``Fp64KVLayer`` s, one per decoder layer (module docstring)."""

        def __init__(self, num_layers: int, n_rep: int, capacity: int = 0) -> None:
            Cache.__init__(self, layers=[Fp64KVLayer(n_rep, capacity) for _ in range(num_layers)])

    return Fp64KVCache


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
