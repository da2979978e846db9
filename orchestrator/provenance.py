"""Provenance carried by every launch: versions, hardware and the environment that selects kernels."""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

PACKAGES = ("swapcheck", "torch", "ray", "pyarrow", "duckdb", "numpy", "ml_dtypes", "vllm", "triton", "transformers")

#: Environment variables that change which kernel runs or how it rounds (reference/vllm-kernels.md).
KERNEL_ENV = re.compile(r"^(VLLM_|TRITON_|CUBLAS|CUBLASLT_|NVIDIA_TF32|TORCH_|OMP_NUM_THREADS|MKL_|OPENBLAS_|CUDA_VISIBLE_DEVICES|SWAPCHECK_)")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def collect(torch_facts: bool = True) -> dict[str, Any]:
    """Facts about the driver's machine; workers add their own host and torch version per unit.

    ``torch_facts`` False leaves out what needs torch imported (CUDA, the GPUs: a second or more on
    a CPU-only driver): a launch records that part once its units are running (orchestrator/runner.py)."""
    info: dict[str, Any] = {
        "versions": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "env": {k: v for k, v in sorted(os.environ.items()) if KERNEL_ENV.match(k) and "TOKEN" not in k},
    }
    if not torch_facts:
        return info
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            info["cuda_capability"] = list(torch.cuda.get_device_capability(0))
            info["cuda_driver"] = getattr(torch._C, "_cuda_getDriverVersion", lambda: None)()
    except Exception as exc:  # noqa: BLE001 - provenance must never break a launch
        info["torch_error"] = repr(exc)
    return info
