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
"vllm-flash-attn"``: the arm's environment gets ``VLLM_ATTENTION_BACKEND=<backend>``), so every
layer of the served model runs the backend with vLLM's paged KV cache.  They are not called on their
own: each backend's kernels take vLLM's paged-cache metadata, which only a running engine builds, so
the entries have no standalone ``compute`` and ``check attention`` refuses them with that reason.
On this CPU machine they are listed as unavailable with the reason (no CUDA, vLLM not installed),
the way :mod:`tasks.kernels.cuda` lists the GPU GEMM kernels.

The backend names are vLLM's ``AttentionBackendEnum`` members as its ``VLLM_ATTENTION_BACKEND``
variable takes them; reference/vllm-kernels.md does not cover attention, so which names an installed
version accepts is for the GPU run to confirm (docs/attention.md).
"""

from __future__ import annotations

from tasks.attention.registry import AttentionKernel, register_attention

__all__ = ["BACKENDS", "ENV_VAR", "backend_env"]

#: registry name -> vLLM backend name.
BACKENDS = {
    "vllm-flash-attn": "FLASH_ATTN",
    "vllm-flashinfer": "FLASHINFER",
    "vllm-triton-attn": "TRITON_ATTN",
    "vllm-flex-attention": "FLEX_ATTENTION",
}
#: The environment variable that selects vLLM's attention backend.
ENV_VAR = "VLLM_ATTENTION_BACKEND"


def _reason() -> str | None:
    from tasks.devices import cuda_reason, vllm_reason

    reasons = [r for r in (cuda_reason(), vllm_reason()) if r]
    return "; ".join(reasons) or None


def backend_env(name: str) -> dict[str, str]:
    """The environment that makes a vLLM engine run the attention backend ``name`` (a registry name)."""
    return {ENV_VAR: BACKENDS[name]}


for _name, _backend in BACKENDS.items():
    register_attention(AttentionKernel(
        name=_name, device="cuda", compute=None, engine_backend=_backend, reason=_reason,
        logsumexp="inside the engine (not exposed)",
        description=f"vLLM attention backend {_backend}, selected per arm on the vLLM engine ({ENV_VAR})"))
