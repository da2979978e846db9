"""GPU scaled-GEMM kernels: vLLM's CUTLASS and Triton entries, and ``torch._scaled_mm`` on CUDA.

=========================  ==========  ==========================================================
name                       operands    what it calls (docs/reference/vllm-kernels.md)
=========================  ==========  ==========================================================
vllm-cutlass               int8, fp8   ``vllm._custom_ops.cutlass_scaled_mm`` (§3), the entry vLLM's
                                       CUTLASS kernel classes call, *including* its silent Triton
                                       fallback when K or N is not a multiple of 16 (§1.2 Pitfall 1)
vllm-cutlass-raw           int8, fp8   ``torch.ops._C.cutlass_scaled_mm(out, a, b, sa, sb, bias)``
                                       (§3): no fallback; unaligned K or N is refused
vllm-triton                int8, fp8   ``triton_scaled_mm`` (§2.2, §3) with ``scale_b`` as ``[N, 1]``
torch-scaled-mm-cuda       fp8         ``torch._scaled_mm`` (cuBLASLt, §2.4), ``use_fast_accum``;
                                       ``device="cpu"``: the same call on the CPU (kit ``--cpu``)
=========================  ==========  ==========================================================

They take the shared call (docs/reference/design.md) on CUDA tensors and convert the layouts at the boundary
(:func:`vllm_operands`): ``a`` row-major, ``b`` ``[K, N]`` column-major (§2.1 "b.stride(0)==1"),
scales fp32 and contiguous (``scale_a`` ``[M, 1]`` or ``[1, 1]``; ``scale_b`` ``[1, N]`` for
CUTLASS, ``[N, 1]`` for Triton, which rejects ``(1, N)``, §3), bias ``[N]`` contiguous in the output
dtype.  The vLLM ops write bf16 or fp16 only (§2.1 entry constraints); ``torch.float32`` is refused.

Availability needs CUDA and, for the three vLLM kernels, vLLM 0.29-0.32 (the releases that pin
torch 2.13; reference "Version pins").  Nothing here imports vLLM at module import time:
:meth:`available` reads the installed version from the package metadata first and imports
``vllm._custom_ops`` only when everything else is in place, so ``swapcheck kernels list`` on a
CPU machine shows each kernel as unavailable with the reason.

The fallback is detected from the shapes, with the rule of ``_custom_ops.cutlass_scaled_mm``
(0.32.0 lines 771-818): ``b.shape[0] % 16 != 0 or b.shape[1] % 16 != 0`` (or ROCm) runs
``triton_scaled_mm`` instead.  :class:`VllmCutlass` records it per call (``last_fallback``,
``fallback_calls``) and :func:`cutlass_falls_back` gives the rule to anyone who only has shapes.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from tasks.devices import SUPPORTED_VLLM, cuda_reason, parse_version, vllm_reason, vllm_version

from .operands import Operands
from .registry import Kernel, KernelError, check_choice, register_kernel

__all__ = [
    "ALIGNMENT",
    "SUPPORTED_VLLM",
    "TorchScaledMMCuda",
    "VllmCutlass",
    "VllmCutlassRaw",
    "VllmTriton",
    "cuda_reason",
    "cutlass_falls_back",
    "fallback_reason",
    "parse_version",
    "triton_bias_mode",
    "vllm_operands",
    "vllm_reason",
    "vllm_version",
]

#: K and N must be multiples of this for CUTLASS (§1.2 Pitfall 1, §2.1 entry constraints).
ALIGNMENT = 16
#: The module that defines ``triton_scaled_mm`` in every release 0.11-0.33 (§2.2, §3).
TRITON_SCALED_MM_MODULE = "vllm.model_executor.layers.quantization.compressed_tensors.triton_scaled_mm"
_VLLM_OUT_DTYPES = (torch.bfloat16, torch.float16)
_IMPORTED: dict[str, Any] = {}


# -- versions and availability (what the machine offers: tasks.devices) ---------------------------


def _capability() -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability()
    return int(major), int(minor)


def _import(name: str) -> Any:
    if name not in _IMPORTED:
        _IMPORTED[name] = importlib.import_module(name)
    return _IMPORTED[name]


def triton_bias_mode(version: str | None) -> str:
    """How ``triton_scaled_mm`` adds the bias in ``version`` (§2.2): ``"fp32"`` from 0.32.0,
    ``"output"`` (after rounding, in the output dtype) in 0.11-0.31."""
    v = parse_version(version)
    return "fp32" if v is not None and v[:2] >= (0, 32) else "output"


# -- the fallback rule and the boundary layouts -----------------------------------------------------


def cutlass_falls_back(k: int, n: int, rocm: bool = False) -> bool:
    """True when ``vllm._custom_ops.cutlass_scaled_mm`` runs ``triton_scaled_mm`` instead of
    CUTLASS: K or N (``b.shape[0]``, ``b.shape[1]``) not a multiple of 16, or ROCm (§1.2 Pitfall 1,
    ``_custom_ops.py`` 0.32.0 lines 771-818; the same in 0.29-0.31)."""
    return rocm or k % ALIGNMENT != 0 or n % ALIGNMENT != 0


def fallback_reason(k: int, n: int) -> str | None:
    """A sentence naming the unaligned dimension(s), or None when CUTLASS runs."""
    bad = [f"{d}={v}" for d, v in (("K", k), ("N", n)) if v % ALIGNMENT]
    if not bad:
        return None
    return (
        f"{' and '.join(bad)} not a multiple of {ALIGNMENT}: vllm._custom_ops.cutlass_scaled_mm "
        "silently runs triton_scaled_mm (vllm-kernels.md §1.2 Pitfall 1)"
    )


def vllm_operands(ops: Operands, scale_b_layout: str = "row") -> dict[str, Any]:
    """The operands in the layouts vLLM's ops require (§2.1 entry constraints, §3).

    ``a`` row-major; ``b`` ``[K, N]`` column-major (``stride(0) == 1``, the ``w.t()`` view of a
    contiguous ``[N, K]`` weight); ``scale_a`` fp32 contiguous ``[M, 1]`` or ``[1, 1]``;
    ``scale_b`` fp32 contiguous ``[1, N]`` (``scale_b_layout="row"``, CUTLASS and torch) or
    ``[N, 1]`` (``"col"``, Triton: a ``(1, N)`` scale_b is rejected there), ``[1, 1]`` when
    per-tensor; ``bias`` contiguous ``[N]`` in the output dtype (already checked) or None.
    """
    if scale_b_layout not in ("row", "col"):
        raise ValueError(f"scale_b_layout must be 'row' or 'col', got {scale_b_layout!r}")
    a = ops.a if ops.a.is_contiguous() else ops.a.contiguous()
    b = ops.b if ops.b.stride(0) == 1 else ops.b.t().contiguous().t()
    sa = (ops.scale_a[:1, :1] if ops.scale_a_numel == 1 else ops.scale_a).contiguous()
    sb = (ops.scale_b[:, :1] if ops.scale_b_numel == 1 else ops.scale_b).contiguous()
    if scale_b_layout == "col":
        sb = sb.reshape(-1, 1).contiguous()
    bias = None if ops.bias is None else ops.bias.contiguous()
    return {"a": a, "b": b, "scale_a": sa, "scale_b": sb, "bias": bias}


def _vllm_out_dtype(name: str, ops: Operands) -> None:
    if ops.out_dtype not in _VLLM_OUT_DTYPES:
        raise KernelError(
            f"kernel {name!r}: vLLM's scaled-mm ops write torch.bfloat16 or torch.float16 only "
            f"(vllm-kernels.md §2.1 entry constraints), got {ops.out_dtype}"
        )


# -- kernels -----------------------------------------------------------------------------------------


class _CudaKernel(Kernel):
    """Common availability: CUDA, and for vLLM ops vLLM 0.29-0.32 importable."""

    device = "cuda"
    needs_vllm = True

    def _reasons(self) -> list[str]:
        reasons = []
        cuda = cuda_reason()
        if cuda:
            reasons.append(cuda)
        if self.needs_vllm:
            version = vllm_version()  # this module's name: tests stand in another version
            vr = vllm_reason(version, installed=version is not None)
            if vr:
                reasons.append(vr)
        return reasons

    def _probe(self) -> str | None:
        """Import what the kernel calls; a reason when that fails (runs only with CUDA + vLLM)."""
        return None

    def available(self) -> tuple[bool, str | None]:
        reasons = self._reasons()
        if reasons:
            return False, "; ".join(reasons)
        problem = self._probe()
        return (False, problem) if problem else (True, None)

    def provenance(self) -> dict[str, Any]:
        """Versions and device this kernel runs with (for a unit's manifest)."""
        info: dict[str, Any] = {
            "kernel": self.name,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "vllm": vllm_version(),
        }
        if cuda_reason() is None:
            info["device_name"] = torch.cuda.get_device_name()
            info["capability"] = list(_capability())
        return info

    def _check_capability(self, ops: Operands) -> None:
        cc = _capability()
        if ops.is_fp8 and cc < (8, 9):
            raise KernelError(
                f"kernel {self.name!r}: FP8 needs compute capability >= 8.9, this GPU is {cc[0]}.{cc[1]}"
            )


class _VllmCutlassBase(_CudaKernel):
    operand_dtype = "any"

    def _probe(self) -> str | None:
        try:
            _import("vllm._custom_ops")
            torch.ops._C.cutlass_scaled_mm  # noqa: B018  (registered by vllm._C on import)
        except Exception as exc:
            return f"vllm._custom_ops / torch.ops._C.cutlass_scaled_mm not importable: {type(exc).__name__}: {exc}"
        return None

    def _check_capability(self, ops: Operands) -> None:
        super()._check_capability(ops)
        cc = _capability()
        if not ops.is_fp8 and cc >= (10, 0):
            # CUTLASS INT8 is not compiled for SM100+ although the kernel class claims support
            # (§1.2 Pitfall 2, vLLM PR #54316).
            raise KernelError(
                f"kernel {self.name!r}: CUTLASS INT8 is not built for compute capability "
                f"{cc[0]}.{cc[1]} (SM100+; vllm-kernels.md §1.2 Pitfall 2)"
            )


@register_kernel("vllm-cutlass")
class VllmCutlass(_VllmCutlassBase):
    """``vllm._custom_ops.cutlass_scaled_mm``, the entry vLLM's CUTLASS kernel classes call.

    With K and N multiples of 16 it runs CUTLASS: ``rn(fl(sa * fl(sb * acc)))``, with bias
    ``rn(fma(sa, fl(sb * acc), bias))`` (§2.1).  Otherwise it silently runs ``triton_scaled_mm``
    (§1.2 Pitfall 1): every call sets :attr:`last_fallback`, and :attr:`fallback_calls` counts the
    calls that fell back, so a caller can record what really ran.
    """

    description = (
        "vllm._custom_ops.cutlass_scaled_mm (CUDA): CUTLASS rn(fl(sa*fl(sb*acc))), bias as fma "
        "(vllm-kernels.md §2.1); K or N not a multiple of 16 silently runs triton_scaled_mm "
        "(§1.2 Pitfall 1), recorded in last_fallback"
    )

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.last_fallback: bool | None = None
        self.calls = 0
        self.fallback_calls = 0

    def runs(self, k: int, n: int) -> str:
        """``"cutlass"`` or ``"triton"``: what this entry runs for a ``[K, N]`` weight."""
        return "triton" if cutlass_falls_back(k, n, rocm=torch.version.hip is not None) else "cutlass"

    def cpu_counterpart(self, k: int, n: int) -> dict[str, Any]:
        """The CPU emulation of what runs for these shapes (INT8; §2.1 or, on fallback, §2.2)."""
        if self.runs(k, n) == "cutlass":
            return {"kernel": "int8-cutlass-order", "params": {}}
        return {"kernel": "int8-triton-order", "params": {"bias_mode": triton_bias_mode(vllm_version())}}

    def compute(self, ops: Operands) -> torch.Tensor:
        _vllm_out_dtype(self.name, ops)
        self._check_capability(ops)
        fell_back = self.runs(ops.k, ops.n) == "triton"
        self.last_fallback = fell_back
        self.calls += 1
        self.fallback_calls += int(fell_back)
        o = vllm_operands(ops, "row")
        out: torch.Tensor = _import("vllm._custom_ops").cutlass_scaled_mm(
            o["a"], o["b"], o["scale_a"], o["scale_b"], ops.out_dtype, o["bias"]
        )
        return out


@register_kernel("vllm-cutlass-raw")
class VllmCutlassRaw(_VllmCutlassBase):
    """``torch.ops._C.cutlass_scaled_mm(out, a, b, sa, sb, bias)``: CUTLASS itself, no fallback.

    The C++ entry requires K and N multiples of 16 (``b.stride(1) % 16 == 0``,
    ``c.stride(0) % 16 == 0``; §2.1), so :meth:`supports` refuses other shapes with the reason.
    """

    description = (
        "torch.ops._C.cutlass_scaled_mm (CUDA): CUTLASS only, rn(fl(sa*fl(sb*acc))), bias as fma "
        "(vllm-kernels.md §2.1, §3); K and N must be multiples of 16, no Triton fallback"
    )

    def supports(
        self, m: int, n: int, k: int, scale_a_numel: int, scale_b_numel: int, has_bias: bool
    ) -> tuple[bool, str | None]:
        if k % ALIGNMENT or n % ALIGNMENT:
            bad = ", ".join(f"{d}={v}" for d, v in (("K", k), ("N", n)) if v % ALIGNMENT)
            return False, (
                f"{bad}: torch.ops._C.cutlass_scaled_mm needs K and N multiples of {ALIGNMENT} "
                "(vllm-kernels.md §2.1 entry constraints); 'vllm-cutlass' accepts them and runs "
                "triton_scaled_mm instead (§1.2 Pitfall 1)"
            )
        return True, None

    def compute(self, ops: Operands) -> torch.Tensor:
        _vllm_out_dtype(self.name, ops)
        self._check_capability(ops)
        _import("vllm._custom_ops")  # loads vllm._C, which registers torch.ops._C.*
        o = vllm_operands(ops, "row")
        out = torch.empty((ops.m, ops.n), dtype=ops.out_dtype, device=ops.a.device)
        torch.ops._C.cutlass_scaled_mm(out, o["a"], o["b"], o["scale_a"], o["scale_b"], o["bias"])
        return out


@register_kernel("vllm-triton")
class VllmTriton(_CudaKernel):
    """``triton_scaled_mm`` (§2.2): ``rn(fl(sb * fl(sa * acc)))``; bias added after rounding in
    the output dtype up to vLLM 0.31, in fp32 from 0.32 (:func:`triton_bias_mode`).

    ``scale_b`` is passed as ``[N, 1]`` (vLLM's ``ChannelQuantScaleParameter`` layout; ``(1, N)``
    is rejected by the op, §3).  No alignment requirement (masked loads).
    """

    operand_dtype = "any"

    @property
    def description(self) -> str:  # type: ignore[override]
        version = vllm_version()
        mode = triton_bias_mode(version)
        bias = "rn(fl(c + bias))" if mode == "fp32" else "rn(rn(c) + bias) in the output dtype"
        where = f"vllm {version}" if version else "vllm >= 0.32; <= 0.31 adds after rounding"
        return (
            f"triton_scaled_mm (CUDA): c = fl(sb*fl(sa*acc)), rn(c), bias: {bias} ({where}; "
            "vllm-kernels.md §2.2, §3); scale_b passed as [N, 1]"
        )

    @property
    def bias_mode(self) -> str:
        """``"fp32"`` or ``"output"``: the installed vLLM's bias handling (§2.2)."""
        return triton_bias_mode(vllm_version())

    def cpu_counterpart(self, k: int = 0, n: int = 0) -> dict[str, Any]:
        """The CPU emulation of this kernel's INT8 epilogue (§2.2)."""
        return {"kernel": "int8-triton-order", "params": {"bias_mode": self.bias_mode}}

    def _probe(self) -> str | None:
        try:
            getattr(_import(TRITON_SCALED_MM_MODULE), "triton_scaled_mm")  # noqa: B009
        except Exception as exc:
            return f"{TRITON_SCALED_MM_MODULE}.triton_scaled_mm not importable: {type(exc).__name__}: {exc}"
        return None

    def compute(self, ops: Operands) -> torch.Tensor:
        _vllm_out_dtype(self.name, ops)
        self._check_capability(ops)
        o = vllm_operands(ops, "col")
        fn = _import(TRITON_SCALED_MM_MODULE).triton_scaled_mm
        out: torch.Tensor = fn(o["a"], o["b"], o["scale_a"], o["scale_b"], ops.out_dtype, o["bias"])
        return out


@register_kernel("torch-scaled-mm-cuda")
class TorchScaledMMCuda(_CudaKernel):
    """``torch._scaled_mm`` on CUDA FP8 (cuBLASLt; §2.4), ``use_fast_accum`` False (precise, the
    schema default and what vLLM passes) or True (fast accumulation, no periodic promotion).

    Scales: both per-tensor are passed as 0-d tensors; otherwise row-wise, ``scale_a`` ``[M, 1]``
    and ``scale_b`` ``[1, N]`` (a per-tensor side expanded, which gives the same values), which
    cuBLASLt supports with a bf16 output.  K and N must be multiples of 16.

    ``device`` "cuda" (default) | "cpu": with "cpu" the same code calls ``torch._scaled_mm`` on CPU
    tensors (torch 2.13's CPU implementation, the path of ``fp8-torch-scaled-mm``): the GPU lease kit's
    ``--cpu`` mode.  cuBLASLt's rules (K and N multiples of 16, row-wise scales with a bf16 output
    only) are kept there, so that the CPU mode runs exactly the problems the GPU runs; the CPU's
    numerics are its own (:mod:`.scaled_mm`), not cuBLASLt's.  The parameter enters unit ids only
    where a spec sets it.
    """

    operand_dtype = "fp8_e4m3"
    needs_vllm = False
    param_defaults = {"use_fast_accum": False, "device": "cuda"}

    @property
    def description(self) -> str:  # type: ignore[override]
        if self.device == "cpu":
            from .scaled_mm import cpu_scaled_mm_path

            return (
                f"torch._scaled_mm on the CPU (the --cpu stand-in for cuBLASLt FP8), use_fast_accum="
                f"{self.params['use_fast_accum']}; path here: {cpu_scaled_mm_path()} (vllm-kernels.md §2.4)"
            )
        mode = "fast accumulation" if self.params["use_fast_accum"] else "precise (promoted) accumulation"
        return (
            f"torch._scaled_mm on CUDA (cuBLASLt FP8), use_fast_accum={self.params['use_fast_accum']}: "
            f"{mode}; scaling and bias order internal to cuBLASLt (vllm-kernels.md §2.4)"
        )

    @property
    def code_path(self) -> str | None:
        """On the CPU, the path ``torch._scaled_mm`` takes here (as ``fp8-torch-scaled-mm`` names it)."""
        if self.device != "cpu":
            return None
        from .scaled_mm import Fp8TorchScaledMM

        return str(Fp8TorchScaledMM().code_path)

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(params["use_fast_accum"], bool):
            raise KernelError(
                f"kernel 'torch-scaled-mm-cuda': use_fast_accum must be True or False, "
                f"got {params['use_fast_accum']!r}"
            )
        self.device = check_choice("torch-scaled-mm-cuda", "device", params["device"], ("cuda", "cpu"))
        return params

    def available(self) -> tuple[bool, str | None]:
        if self.device == "cpu":
            from .scaled_mm import _probe as cpu_probe

            return cpu_probe()
        return super().available()

    def provenance(self) -> dict[str, Any]:
        info = super().provenance()
        info["device"] = self.device
        if self.device == "cpu":
            info.pop("device_name", None)
            info.pop("capability", None)
        return info

    def _probe(self) -> str | None:
        cc = _capability()
        if cc < (8, 9):
            return f"FP8 torch._scaled_mm needs compute capability >= 8.9; this GPU is {cc[0]}.{cc[1]}"
        return None

    def supports(
        self, m: int, n: int, k: int, scale_a_numel: int, scale_b_numel: int, has_bias: bool
    ) -> tuple[bool, str | None]:
        if k % ALIGNMENT or n % ALIGNMENT:
            return False, (
                f"K={k}, N={n}: torch._scaled_mm (cuBLASLt FP8) needs K and N multiples of "
                f"{ALIGNMENT}"
            )
        return True, None

    def compute(self, ops: Operands) -> torch.Tensor:
        o = vllm_operands(ops, "row")
        if ops.scale_a_numel == 1 and ops.scale_b_numel == 1:
            sa, sb = o["scale_a"].reshape(()), o["scale_b"].reshape(())
        else:
            if ops.out_dtype != torch.bfloat16:
                raise KernelError(
                    f"kernel {self.name!r}: row-wise scales (per-token or per-channel) need "
                    f"out_dtype torch.bfloat16 in torch._scaled_mm, got {ops.out_dtype}"
                )
            sa = o["scale_a"].expand(ops.m, 1).contiguous()
            sb = o["scale_b"].expand(1, ops.n).contiguous()
        try:
            out: torch.Tensor = torch._scaled_mm(
                o["a"], o["b"], sa, sb, bias=o["bias"], out_dtype=ops.out_dtype,
                use_fast_accum=self.params["use_fast_accum"],
            )
        except RuntimeError as exc:
            raise KernelError(f"kernel {self.name!r}: torch._scaled_mm refused the call: {exc}") from exc
        return out
