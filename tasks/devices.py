"""Where a kernel runs: what this machine offers (CUDA, vLLM), and running a callable on its device.

The bottom layer of ``tasks/`` (docs/architecture.md): GEMM kernels, attention kernels, the checks
and the kinds all ask the same two questions, so both are answered once, here.

* :func:`cuda_reason`, :func:`vllm_reason`: why CUDA or vLLM cannot be used here (None when they can).
  vLLM is never imported for that: its version comes from the package metadata (:func:`vllm_version`).
* :func:`on_device`: call ``fn`` with its tensor arguments moved to the kernel's device, wait for it
  (a CUDA kernel runs asynchronously), and bring every tensor of the result back to the CPU; with the
  seconds the call itself took (operands already on the device, so the copies are not timed).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

__all__ = ["SUPPORTED_VLLM", "cuda_reason", "on_device", "parse_version", "vllm_reason", "vllm_version"]

#: vLLM releases supported: [0.29, 0.33), those pinning torch 2.13 (reference "Version pins").
SUPPORTED_VLLM = ((0, 29), (0, 33))
_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``"0.32.1+cu130"`` -> ``(0, 32, 1)``; None for None or text that is not a version."""
    if not text:
        return None
    m = _VERSION_RE.match(str(text))
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def vllm_version() -> str | None:
    """The installed vLLM version from the package metadata (vLLM is not imported), or None."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def vllm_reason(version: str | None = None, *, installed: bool | None = None) -> str | None:
    """Why vLLM cannot be used here (None when it can): not installed, or outside 0.29-0.32."""
    if installed is None:
        version = vllm_version()
        installed = version is not None
    if not installed:
        return "vllm not installed (needs vllm>=0.29,<0.33: the 'vllm' extra of swapcheck)"
    v = parse_version(version)
    lo, hi = SUPPORTED_VLLM
    if v is None or not (lo <= v[:2] < hi):
        return (
            f"vllm {version} is installed; swapcheck supports vllm 0.29-0.32, the releases that "
            "pin torch 2.13 (vllm-kernels.md, version pins)"
        )
    return None


def cuda_reason() -> str | None:
    """Why CUDA cannot be used here (None when a CUDA device is visible)."""
    import torch

    if torch.version.cuda is None and torch.version.hip is None:
        return f"CUDA not available (torch {torch.__version__} is a CPU-only build)"
    if not torch.cuda.is_available():
        return f"CUDA not available (torch {torch.__version__} sees no CUDA device)"
    if torch.version.hip is not None:
        return "CUDA not available (this is a ROCm build; the GPU kernels here are for NVIDIA CUDA)"
    return None


def _move(x: Any, device: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, tuple | list):
        return type(x)(_move(t, device) for t in x)
    return x


def on_device(device: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` with every tensor argument on ``device`` (``"cpu"``, ``"cuda"``, ...),
    and ``(the result with every tensor back on the CPU, seconds)``.

    Tensors inside tuples and lists (arguments and results) move too; anything else passes as it is.
    On CUDA the call is bracketed by synchronisations, so the seconds are the kernel's own and the
    result is complete when it is read.  On the CPU nothing is copied (``.to`` of a CPU tensor to
    the CPU is the tensor itself).
    """
    import torch

    dev = torch.device(device)
    args, kwargs = _move(args, dev), {k: _move(v, dev) for k, v in kwargs.items()}
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    if cuda:
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0
    return _move(out, torch.device("cpu")), seconds
