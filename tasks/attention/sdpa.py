"""PyTorch's SDPA backends as registry entries, each forced to exactly one backend (issue #38).

``torch.nn.functional.scaled_dot_product_attention`` picks a backend per call (flash,
memory-efficient, cuDNN, math) and, when the preferred one cannot take the inputs, silently runs
another.  Each entry here runs SDPA under ``torch.nn.attention.sdpa_kernel([SDPBackend.X])`` with
that one backend allowed, so a backend that cannot take the inputs (fp32 for flash or cuDNN, a
float mask for flash, ``is_causal`` with L != S for flash, a head size it lacks, no GPU support)
raises -- an :class:`~tasks.attention.registry.AttentionError` naming the backend -- instead of
answering with another backend's bits.

====================== ====== ========================= ===================================================
name                   device SDPBackend                declared algorithm (``check attention`` preset)
====================== ====== ========================= ===================================================
``sdpa-flash-cuda``    cuda   ``FLASH_ATTENTION``       ``fused-general`` (FlashAttention-2's tiling is per
                                                        head size and GPU: no block size is claimed)
``sdpa-efficient-cuda`` cuda  ``EFFICIENT_ATTENTION``   ``fused-general`` (the CUTLASS memory-efficient
                                                        kernel; its key block depends on head size and GPU)
``sdpa-cudnn-cuda``    cuda   ``CUDNN_ATTENTION``       ``fused-general`` (cuDNN's fused attention: closed
                                                        source, its tiling unknown)
``sdpa-math-cuda``     cuda   ``MATH``                  ``plain`` (matmul, softmax, matmul; fp16/bf16
                                                        inputs upcast to fp32 and rounded once)
``sdpa-efficient-cpu`` cpu    ``EFFICIENT_ATTENTION``   never available: PyTorch has no CPU implementation
``sdpa-cudnn-cpu``     cpu    ``CUDNN_ATTENTION``       never available: cuDNN is a CUDA library
====================== ====== ========================= ===================================================

The registry takes no parameters per entry, so the device is part of the name (as
``torch-scaled-mm-cuda`` is in the GEMM registry) and :func:`sdpa_attention` maps ``(backend,
device)`` to the name.  On the CPU the flash and math backends are the entries that already exist:
``sdpa-flash-cpu`` (:mod:`.cpu`: the op SDPA's ``FLASH_ATTENTION`` backend runs on the CPU,
called directly, so no other backend can run, and its own logsumexp returned; its output is SDPA's
forced flash output bit for bit, tests/test_sdpa_kernels.py) and ``sdpa-math`` (SDPA under
``sdpa_kernel(SDPBackend.MATH)``).  The efficient and cuDNN backends have no CPU counterpart: their
``-cpu`` entries exist so that a sweep that swaps every device call for its CPU counterpart (the GPU
lease kit's ``--cpu`` mode) finds a row saying why, and drops them with that reason.

``fused-general`` (:data:`tasks.checks.attention.PRESETS`) is the most general fused algorithm
the bounds describe: online softmax with a rescale allowed after every key (any blocking), weights
as ``exp2`` of base-2 logits, normalised by a rounded reciprocal, the weights rounded to the
inputs' format before ``P V``; fp32 accumulation.  Each of those widens the bound (any block size
is covered by none; exp2 covers exp; a reciprocal covers a division), so a kernel whose exact tiling
is unknown is held to a bound that covers every tiling.  What it does not cover: tensor-core
accumulation that is not round-to-nearest fp32 (Hopper's MMA units), and the memory-efficient
kernel's fp32 path, which multiplies through 3xTF32 tensor-core products on sm80+; the first GPU
run shows whether the bound holds (``ulps`` widens it).  ``sdpa-math-cuda`` is ``plain`` only with
TF32 matmuls off (torch's default; ``torch.get_float32_matmul_precision() == "highest"``).

Logsumexp: SDPA's public call returns none, so every entry here computes it alongside, in float64
from the same operands (:func:`tasks.attention.cpu.logsumexp_alongside`): identical for every entry
that does, saying nothing about the backend.  Key and value heads are repeated to the query's
before the call (``gqa=False``: the memory-efficient backend takes no ``enable_gqa``), and the
operands are made contiguous (a copy of the same values): what is left for a backend to refuse is a
limit of the backend itself.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from tasks.attention.registry import AttentionError, AttentionKernel, Compute, register_attention

if TYPE_CHECKING:
    import torch

__all__ = ["BACKENDS", "FUSED_ALGORITHM", "SDPA_NAMES", "forced_sdpa", "sdpa_attention"]

#: Backend (as the kit names it) -> the ``torch.nn.attention.SDPBackend`` member it forces.
BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
            "math": "MATH"}
#: ``(backend, device)`` -> the registry entry that runs it there.
SDPA_NAMES = {
    ("flash", "cuda"): "sdpa-flash-cuda", ("flash", "cpu"): "sdpa-flash-cpu",
    ("efficient", "cuda"): "sdpa-efficient-cuda", ("efficient", "cpu"): "sdpa-efficient-cpu",
    ("cudnn", "cuda"): "sdpa-cudnn-cuda", ("cudnn", "cpu"): "sdpa-cudnn-cpu",
    ("math", "cuda"): "sdpa-math-cuda", ("math", "cpu"): "sdpa-math",
}
#: The preset the fused CUDA backends declare (module docstring).
FUSED_ALGORITHM = "fused-general"

_ALONGSIDE = "computed alongside in float64, rounded once to float32 (SDPA's public call returns none)"
_NO_CPU = {
    "efficient": "PyTorch has no CPU implementation of the memory-efficient SDPA backend "
                 "(SDPBackend.EFFICIENT_ATTENTION runs on CUDA only); not substituted by another backend",
    "cudnn": "cuDNN attention is a CUDA library (SDPBackend.CUDNN_ATTENTION runs on CUDA only); "
             "not substituted by another backend",
}


def sdpa_attention(backend: str, device: str = "cuda") -> str:
    """The registry name of SDPA backend ``backend`` (``flash``, ``efficient``, ``cudnn``, ``math``)
    on ``device`` (``cuda`` or ``cpu``); whether it can run here is ``get_attention(name).available()``."""
    try:
        return SDPA_NAMES[(backend, device)]
    except KeyError:
        raise AttentionError(f"no SDPA entry for backend {backend!r} on device {device!r}; backends: "
                             f"{', '.join(BACKENDS)}; devices: cuda, cpu") from None


def forced_sdpa(backend: str) -> Compute:
    """A ``compute`` that runs SDPA with only ``backend`` (a key of :data:`BACKENDS`) allowed; a
    backend that cannot take the inputs raises :class:`AttentionError` (no other backend runs)."""
    member = BACKENDS[backend]

    def compute(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from tasks.attention.cpu import logsumexp_alongside

        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        # SDPA says why a backend refuses the inputs only in warnings: they go into the error.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([getattr(SDPBackend, member)]):
                    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                                           is_causal=is_causal, scale=scale)
            except RuntimeError as exc:
                why = [str(w.message).strip() for w in caught] + [str(exc).strip() or type(exc).__name__]
                mask = "none" if attn_mask is None else f"{attn_mask.dtype}"
                raise AttentionError(
                    f"SDPA backend {member} cannot take these inputs ({q.device.type}, {q.dtype}, q "
                    f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, mask {mask}, is_causal={is_causal}); "
                    f"only this backend was allowed, so no other one ran. torch: {' | '.join(why)}") from exc
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        mask_cpu = attn_mask.cpu() if attn_mask is not None else None
        lse = logsumexp_alongside(q.cpu(), k.cpu(), mask_cpu, is_causal, scale)
        return out, lse.to(q.device)

    compute.__name__ = compute.__qualname__ = f"sdpa_{backend}"
    return compute


def _cuda_reason(backend: str) -> Callable[[], str | None]:
    def reason() -> str | None:
        from tasks.devices import cuda_reason

        why = cuda_reason()
        if why is None and backend == "cudnn":
            import torch

            if not torch.backends.cudnn.is_available():
                why = "cuDNN is not available to this torch build"
        return why

    return reason


def _no_cpu(backend: str) -> Callable[[], str | None]:
    def reason() -> str | None:
        return _NO_CPU[backend]

    return reason


_DESCRIBE = {
    "flash": "FlashAttention-2 (fp16/bf16; no float mask; is_causal only with L == S)",
    "efficient": "the CUTLASS memory-efficient kernel (fp32/fp16/bf16, float or boolean masks)",
    "cudnn": "cuDNN's fused attention (fp16/bf16)",
    "math": "PyTorch's math path: matmul, softmax, matmul (fp16/bf16 upcast to fp32, rounded once)",
}

KERNELS = [
    AttentionKernel(
        name=SDPA_NAMES[(backend, "cuda")], device="cuda", compute=forced_sdpa(backend), gqa=False,
        logsumexp=_ALONGSIDE, reason=_cuda_reason(backend),
        algorithm="plain" if backend == "math" else FUSED_ALGORITHM,
        description=f"torch scaled_dot_product_attention under sdpa_kernel([SDPBackend.{member}]) on CUDA: "
                    f"{_DESCRIBE[backend]}; raises when the backend cannot take the inputs")
    for backend, member in BACKENDS.items()
] + [
    AttentionKernel(
        name=SDPA_NAMES[(backend, "cpu")], device="cpu", compute=forced_sdpa(backend), gqa=False,
        logsumexp=_ALONGSIDE, reason=_no_cpu(backend), algorithm=FUSED_ALGORITHM,
        description=f"SDPBackend.{BACKENDS[backend]} on the CPU: does not exist in PyTorch (listed so that a "
                    "CPU counterpart of the CUDA entry says why it is dropped)")
    for backend in ("efficient", "cudnn")
]

for _k in KERNELS:
    register_attention(_k)
