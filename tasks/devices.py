"""Where a kernel runs: what this machine offers (CUDA, vLLM), and running a callable on its device.

The bottom layer of ``tasks/`` (docs/architecture.md): GEMM kernels, attention kernels, the checks
and the kinds all ask the same two questions, so both are answered once, here.

* :func:`cuda_reason`, :func:`vllm_reason`: why CUDA or vLLM cannot be used here (None when they can).
  vLLM is never imported for that: its version comes from the package metadata (:func:`vllm_version`).
* :func:`cpu_model`, :func:`cpu_flags`, :func:`isa_level`: which CPU this is, and the instruction
  set level its GEMM libraries can use (issue #35: the same kernel name computes different bits on
  an AVX2 and an AVX512 machine, and runs 50x slower on one without VNNI).
* :func:`on_device`: call ``fn`` with its tensor arguments moved to the kernel's device, wait for it
  (a CUDA kernel runs asynchronously), and bring every tensor of the result back to the CPU; with the
  seconds the call itself took (operands already on the device, so the copies are not timed).
"""

from __future__ import annotations

import os
import platform
import re
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["GEMM_FLAGS", "ISA_LEVELS", "SUPPORTED_VLLM", "cpu_flags", "cpu_model", "cpu_vendor", "cuda_reason",
           "isa_level", "mkl_isa",
           "on_device", "parse_version", "vllm_reason", "vllm_version"]

#: /proc/cpuinfo flags that select GEMM code paths (oneDNN, MKL and torch's own dispatch read them).
GEMM_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
              "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "sve", "sve2")
#: The x86 levels that change which INT8/FP32 GEMM code runs, lowest first.
ISA_LEVELS = ("baseline", "AVX2", "AVX-VNNI", "AVX512", "AVX512-VNNI", "AMX")
#: oneDNN's ``ONEDNN_MAX_CPU_ISA`` values (``DNNL_MAX_CPU_ISA`` before v3) as levels.
_ONEDNN_CAPS = {"SSE41": "baseline", "AVX": "baseline", "AVX2": "AVX2", "AVX2_VNNI": "AVX-VNNI",
                "AVX2_VNNI_2": "AVX-VNNI", "AVX512_CORE": "AVX512", "AVX512_CORE_VNNI": "AVX512-VNNI",
                "AVX512_CORE_BF16": "AVX512-VNNI", "AVX512_CORE_FP16": "AVX512-VNNI",
                "AVX10_1_512": "AVX512-VNNI", "AVX512_CORE_AMX": "AMX", "AVX512_CORE_AMX_FP16": "AMX",
                "AVX10_1_512_AMX": "AMX", "AVX10_1_512_AMX_FP16": "AMX", "ALL": "AMX"}

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


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_model(text: str | None = None) -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what :mod:`platform` says."""
    for line in (_cpuinfo() if text is None else text).splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags(text: str | None = None) -> list[str]:
    """The GEMM-relevant ISA flags (:data:`GEMM_FLAGS`) of the first CPU in ``/proc/cpuinfo`` text
    (``flags`` on x86, ``Features`` on ARM), sorted; empty where the file is absent."""
    for line in (_cpuinfo() if text is None else text).splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            have = set(value.split())
            return sorted(f for f in GEMM_FLAGS if f in have)
    return []


def cpu_vendor(text: str | None = None) -> str:
    """``vendor_id`` of ``/proc/cpuinfo`` (``GenuineIntel``, ``AuthenticAMD``), or "unknown"."""
    for line in (_cpuinfo() if text is None else text).splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def mkl_isa(vendor: str | None = None, level: str | None = None, env: dict[str, str] | None = None) -> str:
    """The instruction set MKL's GEMMs run at here: "AVX-512" or "AVX2" (or "baseline").

    MKL is taken to dispatch its AVX-512 kernels on Intel CPUs only and its AVX2 ones on AMD CPUs
    whatever they have.  That is inferred, not read from MKL: ``torch._scaled_mm``'s emulated CPU path
    (an MKL fp32 GEMM) gave the same bits on an AVX512-VNNI AMD EPYC as under
    ``MKL_ENABLE_INSTRUCTIONS=AVX2``, on an AVX2-only EPYC (as reported), and other bits on CI's Intel
    AMX machine (tests/test_spacing_facts.py).  ``MKL_ENABLE_INSTRUCTIONS`` caps it.  ``level`` defaults
    to :func:`isa_level`."""
    vendor = cpu_vendor() if vendor is None else vendor
    level = isa_level() if level is None else level
    env = dict(os.environ) if env is None else env
    rank = ISA_LEVELS.index(level)
    isa = "AVX-512" if rank >= ISA_LEVELS.index("AVX512") and vendor == "GenuineIntel" else (
        "AVX2" if rank >= ISA_LEVELS.index("AVX2") else "baseline")
    cap = (env.get("MKL_ENABLE_INSTRUCTIONS") or "").strip().upper()
    if isa == "AVX-512" and cap in ("AVX2", "AVX", "SSE4_2"):
        isa = "AVX2" if cap == "AVX2" else "baseline"
    return isa


def isa_level(flags: list[str] | None = None, env: dict[str, str] | None = None,
              torch_capability: str | None = None) -> str:
    """The highest level of :data:`ISA_LEVELS` that this CPU has *and* that its GEMM libraries may use.

    The hardware's level (``amx_int8`` AMX; ``avx512_vnni`` AVX512-VNNI; ``avx512f`` and ``avx512bw``
    AVX512; ``avx_vnni`` AVX-VNNI; ``avx2`` AVX2), capped by ``ONEDNN_MAX_CPU_ISA`` (oneDNN runs
    no higher) and by torch's CPU capability (``ATEN_CPU_CAPABILITY``: AVX2 caps at AVX2): on an
    AVX512 machine ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` computes what an AVX2 machine
    computes.  ``torch_capability`` defaults to torch's own answer when torch is imported already."""
    have = set(cpu_flags() if flags is None else flags)
    env = dict(os.environ) if env is None else env
    level = ("AMX" if "amx_int8" in have else "AVX512-VNNI" if "avx512_vnni" in have
             else "AVX512" if {"avx512f", "avx512bw"} <= have else "AVX-VNNI" if "avx_vnni" in have
             else "AVX2" if "avx2" in have else "baseline")
    caps = [level]
    cap = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if cap in _ONEDNN_CAPS:
        caps.append(_ONEDNN_CAPS[cap])
    if torch_capability is None:
        import sys

        torch = sys.modules.get("torch")
        torch_capability = torch.backends.cpu.get_cpu_capability() if torch is not None else None
    if torch_capability and torch_capability.upper() in ("DEFAULT", "AVX2"):
        caps.append("baseline" if torch_capability.upper() == "DEFAULT" else "AVX2")
    return min(caps, key=ISA_LEVELS.index)


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
