"""Running a transformers model's attention through a registry kernel, and capturing its q, k, v.

:func:`use_attention` makes every attention layer of a transformers model call an attention kernel
of the registry (through transformers' ``AttentionInterface``: one function per kernel, registered
once per process, with transformers' eager masks -- additive, the dtype's minimum at excluded
positions).  The function repeats the key and value heads to the query's (exact copies, what
transformers' eager and fp64 attention do), passes the layer's mask and scaling, and returns the
kernel's output in transformers' ``[B, L, H, D]`` layout.  Calls are counted per kernel
(:data:`CALLS`): the evidence that a run ran the attention it claims.

The registry's ``fp64`` entry is the tiny model's default path itself
(:data:`tasks.models.invariance.FP64_ATTENTION`, with its float64 KV cache), not a re-registration.

:func:`capturing` records each layer's ``q``, ``k`` (after RoPE, before repeating), ``v``, mask and
scaling while running the default float64 attention: the operands a per-layer attention replay
feeds to two kernels (``attention_replay`` kind).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from tasks.attention.registry import get_attention, repeat_kv

__all__ = ["CALLS", "CapturedAttention", "attention_calls", "capturing", "implementation", "require_attention_calls",
           "use_attention"]

#: attention kernel name -> layer calls made through :func:`use_attention` in this process.
CALLS: Counter[str] = Counter()
_PREFIX = "swapcheck_attn_"
_CAPTURE = "swapcheck_attn_capture"  # no "flash"/"sdpa" inside (see _key)


def _key(name: str) -> str:
    # A digest, not the name: transformers reads "flash" or "sdpa" inside an implementation's name
    # as a request for its own flash-attention or SDPA paths.
    return _PREFIX + hashlib.sha256(name.encode()).hexdigest()[:16]


def _register(key: str, fn: Any) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    if key not in AttentionInterface._global_mapping:
        AttentionInterface.register(key, fn)
    if key not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(key, eager_mask)


def implementation(name: str) -> str:
    """The transformers ``attn_implementation`` that runs registry kernel ``name`` (registered once)."""
    from tasks.attention import DEFAULT_ATTENTION
    from tasks.models.invariance import FP64_ATTENTION, register

    if name == DEFAULT_ATTENTION:
        register()
        return FP64_ATTENTION
    kernel = get_attention(name)
    ok, why = kernel.available()
    if not ok:
        raise ValueError(f"attention kernel {name!r} cannot run the CPU engine here: {why}")
    if kernel.device != "cpu":
        raise ValueError(f"attention kernel {name!r} runs on {kernel.device}; the CPU engine needs a cpu kernel")

    def attend(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
        if dropout:
            raise ValueError("the W8A8 engine runs inference only (attention dropout must be 0)")
        n_rep = int(getattr(module, "num_key_value_groups", 1))
        k, v = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
        mask = None if attention_mask is None else attention_mask[:, :, :, : k.shape[-2]].to(query.dtype)
        out, _ = kernel(query, k, v, attn_mask=mask, scale=scaling)
        CALLS[name] += 1
        return out.transpose(1, 2).contiguous(), None

    key = _key(name)
    _register(key, attend)
    return key


def use_attention(hf: Any, name: str) -> None:
    """Run every attention layer of ``hf`` through registry kernel ``name`` from now on."""
    hf.set_attn_implementation(implementation(name))


@dataclass
class CapturedAttention:
    """One attention call: ``q`` ``[B, H, L, D]``, ``k``/``v`` ``[B, KV, S, D]`` as the layer had
    them (after RoPE), its additive ``mask`` ``[B, 1, L, S]`` (or None) and ``scale``."""

    layer_index: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    scale: float


@contextmanager
def capturing(hf: Any) -> Iterator[list[CapturedAttention]]:
    """Inside the block, every attention call of ``hf`` runs the default float64 attention and is
    recorded (in call order); the model's previous attention comes back afterwards."""
    from tasks.models.invariance import fp64_attention

    records: list[CapturedAttention] = []

    def attend(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
        mask = None if attention_mask is None else attention_mask[:, :, :, : key.shape[-2]].clone()
        records.append(CapturedAttention(int(getattr(module, "layer_idx", len(records))), query.clone(),
                                         key.clone(), value.clone(), mask, float(scaling)))
        return fp64_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)

    from transformers import AttentionInterface

    _register(_CAPTURE, attend)
    AttentionInterface._global_mapping[_CAPTURE] = attend  # this block's recorder
    before = hf.config._attn_implementation
    hf.set_attn_implementation(_CAPTURE)
    try:
        yield records
    finally:
        hf.set_attn_implementation(before)


def attention_calls() -> dict[str, int]:
    """Layer calls per attention kernel made through the engine in this process so far."""
    return dict(CALLS)


def require_attention_calls(name: str, arm: str, before: dict[str, int] | None = None) -> None:
    """Raise unless the attention kernel ``name`` ran since ``before`` (:func:`attention_calls`): the
    evidence that a run tested the attention it claims (the default float64 path is the engine's own)."""
    from tasks.attention import DEFAULT_ATTENTION

    if name != DEFAULT_ATTENTION and CALLS[name] <= (before or {}).get(name, 0):
        raise RuntimeError(f"attention evidence does not match the arm {arm!r}: attention kernel {name!r} "
                           "was configured but never called")
