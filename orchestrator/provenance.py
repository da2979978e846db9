"""Provenance carried by every launch: versions, hardware and the environment that selects kernels.

Beside the versions and the host, :func:`collect` records the kernel's full identity (issue #26): what
besides a kernel's name decides which instructions compute its result. ``identity`` holds

* ``cpu``: the CPU model and the ISA flags that select GEMM code paths (``/proc/cpuinfo``: avx2,
  avx512f, avx512_bf16, amx_bf16, amx_int8, fma, ...), and torch's CPU capability (the dispatch level
  torch picked: ``torch.backends.cpu.get_cpu_capability()``);
* ``libraries``: torch, oneDNN, MKL, the BLAS torch was built with (``torch.__config__.show()``), the
  BLAS numpy was built with, and on GPU CUDA, cuBLAS,
  cuDNN, Triton and CUTLASS where importable;
* ``threads``: torch's intra- and inter-op thread counts in the driver (a worker sets its own from
  the spec: its ledger row has it);
* ``matmul``: ``torch.get_float32_matmul_precision()``, ``allow_tf32``,
  ``allow_bf16_reduced_precision_reduction`` and ``allow_fp16_reduced_precision_reduction``: a
  setting that lets an fp32 GEMM compute in TF32 or bf16 changes the kernel without changing its name;
* ``layout_path``: per registered kernel that exposes it (a ``code_path`` attribute), the code path
  its operand layout selects; the kernels that do not are listed beside the identity, in
  ``layout_path_not_exposed`` (not hashed: registering a kernel changes no identity);
* ``gpu``: on CUDA, the device, its capability and the autotuned tactics' cache hash
  (:func:`autotune_cache_hash` over Triton's and TorchInductor's cache directories) where the engine
  keeps one, else ``"not exposed"``.

``identity_sha256`` is the first 16 hex digits of the SHA-256 of ``identity`` as sorted JSON: two
launches with the same hash ran the same kernel identity. It is only set with ``torch_facts`` (the
final launch row); a row written before (or by an older swapcheck) has none, and readers treat a
missing hash as unknown, never as a change. ``threadpools`` (beside the identity, not hashed) lists
the BLAS and OpenMP libraries loaded in the driver with their versions and threads (threadpoolctl):
which are loaded depends on what the process imported so far.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import socket
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from tasks.devices import GEMM_FLAGS, cpu_flags, cpu_model, isa_level

__all__ = ["GEMM_FLAGS", "KERNEL_ENV", "NOT_EXPOSED", "PACKAGES", "autotune_cache_dirs", "autotune_cache_hash",
           "collect", "cpu_flags", "cpu_model", "identity_hash", "isa_level", "layout_paths", "package_versions",
           "parse_torch_config", "torch_identity"]

PACKAGES = ("swapcheck", "torch", "ray", "pyarrow", "duckdb", "numpy", "ml_dtypes", "vllm", "triton", "transformers")

#: Environment variables that change which kernel runs or how it rounds (docs/reference/vllm-kernels.md).
KERNEL_ENV = re.compile(r"^(VLLM_|TRITON_|CUBLAS|CUBLASLT_|NVIDIA_TF32|TORCH_|OMP_NUM_THREADS|MKL_|OPENBLAS_|CUDA_VISIBLE_DEVICES|SWAPCHECK_|ONEDNN_|DNNL_)")


#: What the identity says where a kernel or engine does not report the path or tactic it took.
NOT_EXPOSED = "not exposed"
#: Hex digits of the identity hash.
HASH_DIGITS = 16


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def parse_torch_config(show: str) -> dict[str, str | None]:
    """The backend libraries in ``torch.__config__.show()``: oneDNN, MKL, BLAS, LAPACK, OpenMP, the CPU
    capability torch was built to use, CUDA and cuDNN. A library the text does not name is None."""
    def find(pattern: str) -> str | None:
        m = re.search(pattern, show)
        return m.group(1).strip() if m else None

    return {"onednn": find(r"(?:MKL-DNN|oneDNN)\s+v?([0-9][^\s(]*)"),
            "mkl": find(r"Math Kernel Library Version\s+([0-9][^\s-]*)"),
            "blas": find(r"BLAS_INFO=([^,\s]+)"),
            "lapack": find(r"LAPACK_INFO=([^,\s]+)"),
            "openmp": find(r"OpenMP\s+([0-9]+)"),
            "cpu_capability_build": find(r"CPU capability usage:\s*([A-Za-z0-9_]+)"),
            "cuda_build": find(r"CUDA Runtime\s+([0-9.]+)"),
            "cudnn_build": find(r"CuDNN\s+([0-9.]+)")}


def identity_hash(identity: dict[str, Any]) -> str:
    """The compact identity: the first :data:`HASH_DIGITS` hex digits of SHA-256 of sorted JSON."""
    blob = json.dumps(identity, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:HASH_DIGITS]


def autotune_cache_hash(dirs: list[Path]) -> str | None:
    """SHA-256 (first :data:`HASH_DIGITS` hex digits) of the autotuning caches in ``dirs``: every
    file's path relative to its directory and its bytes, in sorted order. None when no file exists
    (nothing tuned yet, or no engine keeps a cache here)."""
    h = hashlib.sha256()
    n = 0
    for d in dirs:
        if not d.is_dir():
            continue
        for f in sorted(p for p in d.rglob("*") if p.is_file()):
            try:
                data = f.read_bytes()
            except OSError:
                continue
            h.update(str(f.relative_to(d)).encode() + b"\0" + hashlib.sha256(data).digest())
            n += 1
    return h.hexdigest()[:HASH_DIGITS] if n else None


def autotune_cache_dirs(env: dict[str, str] | None = None) -> list[Path]:
    """Where Triton and TorchInductor keep their autotuned tactics (their own defaults unless set)."""
    env = dict(os.environ) if env is None else env
    home = Path(env.get("HOME", str(Path.home())))
    triton = Path(env.get("TRITON_CACHE_DIR") or home / ".triton" / "cache")
    user = env.get("USER", "user")
    inductor = Path(env.get("TORCHINDUCTOR_CACHE_DIR") or Path("/tmp") / f"torchinductor_{user}")
    return [triton, inductor]


def layout_paths() -> dict[str, str]:
    """Per registered kernel, the code path its operand layout selects where the kernel exposes one
    (a ``code_path`` attribute or property), else :data:`NOT_EXPOSED`; a kernel that cannot be built
    here is left out."""
    from tasks.kernels.registry import code_path_of, get_kernel, kernel_names

    out: dict[str, str] = {}
    try:
        names = kernel_names()
    except Exception as exc:  # noqa: BLE001 - a broken entry point must not cost the rest of the identity
        return {"(registry)": f"{NOT_EXPOSED}: {type(exc).__name__}: {exc}"}
    for name in names:
        try:
            k = get_kernel(name)
        except Exception:  # noqa: BLE001 - a kernel that cannot be built has no path to report
            continue
        out[name] = code_path_of(k) or NOT_EXPOSED
    return out


def _numpy_blas() -> dict[str, Any] | None:
    try:
        import numpy as np

        cfg = np.show_config(mode="dicts")
        blas = (cfg or {}).get("Build Dependencies", {}).get("blas", {})
        return {"name": blas.get("name"), "version": blas.get("version")}
    except Exception:  # noqa: BLE001 - an older numpy has no dict config
        return None


def _loaded_threadpools() -> list[dict[str, Any]]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return sorted(({"api": i.get("internal_api"), "version": i.get("version"), "threads": i.get("num_threads"),
                    "library": Path(str(i.get("filepath", ""))).name} for i in threadpool_info()),
                  key=lambda r: (str(r["api"]), str(r["library"])))


def _optional_version(*names: str) -> str | None:
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def gpu_driver() -> str | None:
    """The NVIDIA driver's version (``nvidia-smi``; 580.159.03), or None where it cannot be read."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def _cublaslt_runtime() -> int | None:
    """``cublasLtGetVersion()`` of the cuBLASLt library this process loaded (torch loads it with CUDA;
    e.g. 130100 for 13.1.0), or None where it cannot be found: the version that ran, whatever the
    package metadata says."""
    import ctypes
    import ctypes.util

    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", ctypes.util.find_library("cublasLt")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        except OSError:
            continue
        fn = lib.cublasLtGetVersion
        fn.restype = ctypes.c_size_t
        return int(fn())
    return None


def torch_identity() -> dict[str, Any]:
    """The identity parts that need torch imported (module docs): libraries, threads, matmul settings,
    torch's CPU capability and, on CUDA, the GPU part."""
    import torch

    matmul: dict[str, Any] = {"float32_matmul_precision": torch.get_float32_matmul_precision()}
    cm = torch.backends.cuda.matmul
    for flag in ("allow_tf32", "allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction"):
        matmul[flag] = getattr(cm, flag, None)
    matmul["cudnn_allow_tf32"] = getattr(torch.backends.cudnn, "allow_tf32", None)
    libraries: dict[str, Any] = {"torch": torch.__version__, **parse_torch_config(torch.__config__.show()),
                                 "mkldnn_available": torch.backends.mkldnn.is_available(),
                                 "mkl_available": torch.backends.mkl.is_available(),
                                 "numpy_blas": _numpy_blas()}
    gpu: dict[str, Any] | str = "no CUDA device"
    if torch.cuda.is_available():
        libraries.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                         cublas=_optional_version("nvidia-cublas-cu12", "nvidia-cublas-cu11", "nvidia-cublas"),
                         triton=_optional_version("triton", "pytorch-triton"),
                         cutlass=_optional_version("nvidia-cutlass", "cutlass"))
        libraries.update(cublaslt_runtime=_cublaslt_runtime(), driver=gpu_driver())
        tactic = autotune_cache_hash(autotune_cache_dirs())
        props = torch.cuda.get_device_properties(0)
        gpu = {"devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
               "capability": list(torch.cuda.get_device_capability(0)),
               "multiprocessors": getattr(props, "multi_processor_count", None),
               "memory_gib": round(props.total_memory / 2**30, 1),
               "autotune_cache_sha256": tactic or NOT_EXPOSED}
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "libraries": libraries,
            "threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()},
            "matmul": matmul, "gpu": gpu}


def collect(torch_facts: bool = True) -> dict[str, Any]:
    """Facts about the driver's machine; workers add their own host and torch version per unit.

    ``torch_facts`` False leaves out what needs torch imported (CUDA, the GPUs, the libraries and
    matmul settings of the identity: a second or more on a CPU-only driver): a launch records that part
    once its units are running (orchestrator/runner.py). Only the full facts carry ``identity_sha256``."""
    info: dict[str, Any] = {
        "versions": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "env": {k: v for k, v in sorted(os.environ.items()) if KERNEL_ENV.match(k) and "TOKEN" not in k},
    }
    identity: dict[str, Any] = {"cpu": {"model": info["cpu"], "isa_flags": cpu_flags(), "machine": platform.machine()}}
    info["identity"] = identity
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
        facts = torch_identity()
        identity["cpu"]["torch_capability"] = facts.pop("cpu_capability")
        identity["cpu"]["isa_level"] = isa_level(torch_capability=identity["cpu"]["torch_capability"])
        identity.update(facts)
        # Only the paths kernels expose enter the hash: a kernel added to the registry that reports none
        # changes no identity (the names that report none are listed beside it).
        paths = layout_paths()
        identity["layout_path"] = {k: v for k, v in paths.items() if v != NOT_EXPOSED}
        info["layout_path_not_exposed"] = sorted(k for k, v in paths.items() if v == NOT_EXPOSED)
        # Which BLAS/OpenMP libraries are loaded depends on what the driver imported so far: beside the
        # identity, not in its hash.
        info["threadpools"] = _loaded_threadpools()
        info["identity_sha256"] = identity_hash(identity)
    except Exception as exc:  # noqa: BLE001 - provenance must never break a launch
        info["torch_error"] = repr(exc)
    return info
