"""vLLM's attention backends as registry entries (GPU nodes only).

==========================  ==================  =====================================================
name                        vLLM backend        what it is
==========================  ==================  =====================================================
``vllm-flash-attn``         ``FLASH_ATTN``      vLLM's FlashAttention build (``vllm_flash_attn``)
``vllm-flashinfer``         ``FLASHINFER``      FlashInfer's prefill/decode kernels
``vllm-triton-attn``        ``TRITON_ATTN``     vLLM's Triton unified attention kernel
``vllm-flex-attention``     ``FLEX_ATTENTION``  PyTorch FlexAttention, compiled
==========================  ==================  =====================================================

These are selected per arm on the vLLM engine (``engine = "vllm"`` arms with ``attention =
"vllm-flash-attn"``): the engine is built with ``LLM(attention_backend="FLASH_ATTN")``, vLLM 0.32's
selector (``EngineArgs.attention_backend``, engine/arg_utils.py, validated into
``AttentionConfig.backend``). vLLM 0.32 reads no ``VLLM_ATTENTION_BACKEND`` variable (it only warns
"Unknown vLLM environment variable detected"): the variable this module used to set selected nothing,
and every attention arm silently ran the default backend (issue #37). The backend that ran is
observed, as a GEMM arm's kernel is: vLLM logs ``Using FLASH_ATTN backend.`` (a selected backend) or
``Using FLASH_ATTN attention backend out of potential backends: [...]`` (its own choice)
(platforms/cuda.py), the engine collects the line
(:func:`tasks.models.vllm_selection.parse_attention_log`) and a configured backend that is not the
observed one fails the run (:func:`tasks.models.vllm_selection.check_evidence`).

Every layer of the served model then runs the backend with vLLM's paged KV cache. The entries are
not called on their own: each backend's kernels take vLLM's paged-cache metadata, which only a
running engine builds, so the entries have no standalone ``compute`` and ``check attention`` refuses
them with that reason. On this CPU machine they are listed as unavailable with the reason (no CUDA,
vLLM not installed), the way :mod:`tasks.kernels.cuda` lists the GPU GEMM kernels.

The backend names are the members of vLLM 0.32's ``AttentionBackendEnum``
(v1/attention/backends/registry.py), which ``make vllm-contract`` checks against the wheel.
"""

from __future__ import annotations

from tasks.attention.registry import AttentionKernel, register_attention

__all__ = ["BACKENDS", "ENGINE_ARGUMENT", "engine_arguments"]

#: registry name -> vLLM backend name (an ``AttentionBackendEnum`` member).
BACKENDS = {
    "vllm-flash-attn": "FLASH_ATTN",
    "vllm-flashinfer": "FLASHINFER",
    "vllm-triton-attn": "TRITON_ATTN",
    "vllm-flex-attention": "FLEX_ATTENTION",
}
#: The ``LLM``/``EngineArgs`` keyword argument that selects vLLM's attention backend.
ENGINE_ARGUMENT = "attention_backend"


def _reason() -> str | None:
    from tasks.devices import cuda_reason, vllm_reason

    reasons = [r for r in (cuda_reason(), vllm_reason()) if r]
    return "; ".join(reasons) or None


def engine_arguments(name: str) -> dict[str, str]:
    """The ``LLM`` keyword arguments that make a vLLM engine run the attention backend ``name`` (a
    registry name)."""
    return {ENGINE_ARGUMENT: BACKENDS[name]}


for _name, _backend in BACKENDS.items():
    register_attention(AttentionKernel(
        name=_name, device="cuda", compute=None, engine_backend=_backend, reason=_reason,
        logsumexp="inside the engine (not exposed)",
        description=f"vLLM attention backend {_backend}, selected per arm on the vLLM engine "
                    f"(LLM({ENGINE_ARGUMENT}={_backend!r}), the backend that ran checked in vLLM's log)"))
