"""cuBLAS kernels of the GPU lease kit (issue #38): torch-only GPU GEMMs, and the same code on the CPU.

A borrowed GPU may have torch and nothing else (no vLLM).  These kernels need only torch APIs that
exist in torch 2.11 as well as 2.13 (``torch._int_mm``, ``torch.matmul``, ``torch.addcmul``,
``torch.backends.cuda.matmul.allow_tf32`` and the reduced-precision-reduction flags).  Each takes a
``device`` parameter: ``"cuda"`` (the default) runs the cuBLAS call on the GPU; ``"cpu"`` replaces
the device call by its CPU counterpart and runs the rest of the code unchanged (the kit's ``--cpu``
mode, and these kernels' tests).

=================  ========  ====================================================================
name               operands  what it computes
=================  ========  ====================================================================
``cublas-int8``    int8      int32 accumulator from ``torch._int_mm`` (cuBLAS; on the CPU the exact
                             :func:`.accumulator.int32_accumulator`), then ``epilogue``
                             ("channelwise" | "cutlass" | "triton") as separate eager fp32 torch
                             ops on the same device, in the formulas of :mod:`.epilogue`
``cublas-matmul``  any       operands converted to ``dtype`` ("bf16" | "fp16" | "fp32"),
                             ``C = torch.matmul(a, b)`` (cuBLAS) in that dtype, then the scales and
                             bias in channel-wise order in fp32 eager ops, rounded to ``out_dtype``
=================  ========  ====================================================================

``cublas-int8`` and ``torch._int_mm``'s shape rules.  On CUDA ``torch._int_mm`` requires M > 16 and
K, N multiples of 8 (``_int_mm_out_cuda``).  :func:`padded_int_mm` pads ``a`` with zero rows up to
M = 17 and both operands with zero columns / rows up to the next multiples of 8 in K and N, calls the
int32 GEMM, and narrows the result to ``[M, N]``.  Exact: a zero K index adds ``0 * b = 0`` to every
sum, and padded rows and columns of the result are dropped; so every shape is supported.  Past the
int32 no-overflow bound (K > :data:`.accumulator.INT32_EXACT_K`) the CPU path wraps modulo 2**32;
that cuBLAS wraps the same way is a prediction, not a fact.

Its epilogues, and what is known about each on CUDA:

* ``channelwise``: ``rn(fl(fl(fl(acc) * sa) * sb) + bias)`` (:func:`.epilogue.channelwise`);
* ``triton``: ``rn(fl(sb * fl(sa * fl(acc))))``, bias added in fp32 (vLLM 0.32 mode;
  :func:`.epilogue.triton` with ``bias_mode="fp32"``);
* ``cutlass``: ``rn(fl(sa * fl(sb * fl(acc))))`` (:func:`.epilogue.cutlass`); with bias, one fused op,
  ``torch.addcmul(bias, sa, t)`` with ``t = fl(sb * fl(acc))``.

Every op but one is a separate eager elementwise torch op, one IEEE round-to-nearest-even operation per
element on any device (no contraction across ops), so those formulas hold on CUDA as on the CPU: known.
The exception is ``torch.addcmul``: whether CUDA's kernel contracts ``bias + sa * t`` into one FMA
(what CUTLASS's ``multiply_add`` does, and what the emulation ``int8-cutlass-order`` computes) is NOT
known: it is a prediction that the GPU run checks.  (On the CPU, ``torch.addcmul`` is fused or not
depending on the CPU capability torch dispatches to: fused at AVX2 and AVX512, two roundings at
DEFAULT, measured with torch 2.13.  So the CPU path does not call it: its CPU counterpart is the exact
fused multiply-add :func:`.epilogue.fma32`.)

``cublas-matmul`` (batch invariance and the ``bounds`` check).  int8 and e4m3 values are exact in
bf16, fp16 and fp32, so the conversion is exact.  For the call: TF32 off
(``torch.backends.cuda.matmul.allow_tf32 = False``), reduced-precision reductions of bf16 / fp16 GEMMs
off (``allow_bf16_reduced_precision_reduction`` / ``allow_fp16_reduced_precision_reduction`` = False:
cuBLAS then accumulates and reduces split-K partials in fp32) and fp16 accumulation off where torch has
that flag; each is restored afterwards (:func:`matmul_settings`).  On the CPU, the CPU's fp16
reduced-precision flag is turned off the same way, and a oneDNN fp32 precision other than IEEE is
set back to ``"ieee"`` for the call.

Its declared accumulation (:meth:`CublasMatmul.declaration`): fp32 accumulation in an unknown order
(the ``bounds`` check's ``any`` algorithm in fp32: products exact, any order of fp32 additions), then
for ``dtype`` bf16 / fp16 a rounding of the fp32 result to that dtype (torch.matmul's output), *then*
the scaling and the final rounding to ``out_dtype``: a double rounding.  The single-rounding model of
``swapcheck check bounds --algorithm any --accumulate fp32`` therefore holds for ``dtype="fp32"`` (any
output dtype), and for ``dtype="bf16"`` only with ``out_dtype`` bf16 (and the check's power-of-two
scales, which make the scaling exact); anywhere else use :meth:`CublasMatmul.output_bound`, the
honest bound: the fp32 ``any`` range of the accumulator pushed through the kernel's own
post-accumulation steps (each monotone in the accumulator, so the ends of the range map to the ends
of the outputs' range).  fp16 may overflow (``C`` is inf where ``|acc| >= 65520``); the bound says so.
That cuBLAS's fp32 accumulation obeys the ``any`` bound (round to nearest in every addition) is
itself a claim the GPU run checks: tensor-core adders have been measured to truncate (Fasi et al.
2021, for V100/T4/A100), which can exceed the bound by up to a factor of two.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tasks.devices import cuda_reason

from . import epilogue
from .accumulator import INT32_EXACT_K, accumulator_path, int32_accumulator
from .operands import Operands
from .registry import Kernel, KernelError, check_choice, register_kernel

__all__ = [
    "DEVICES",
    "EMULATIONS",
    "INT8_EPILOGUES",
    "INT_MM_MIN_M",
    "INT_MM_MULTIPLE",
    "MATMUL_DTYPES",
    "CublasInt8",
    "CublasMatmul",
    "int_mm_shape",
    "matmul_settings",
    "pad_for_int_mm",
    "padded_int_mm",
]

DEVICES = ("cuda", "cpu")
#: ``torch._int_mm`` on CUDA: ``self.size(0) > 16``.
INT_MM_MIN_M = 17
#: ``torch._int_mm`` on CUDA: K and N multiples of 8.
INT_MM_MULTIPLE = 8
INT8_EPILOGUES = ("channelwise", "cutlass", "triton")
#: Each ``cublas-int8`` epilogue's CPU emulation (the kernel the kit pairs it with).
EMULATIONS: dict[str, dict[str, Any]] = {
    "channelwise": {"kernel": "int8-torch-channelwise", "params": {}},
    "cutlass": {"kernel": "int8-cutlass-order", "params": {}},
    "triton": {"kernel": "int8-triton-order", "params": {"bias_mode": "fp32"}},
}
MATMUL_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_FORMULAS = {
    "channelwise": "rn(fl(fl(fl(acc)*sa)*sb) + bias), separate fp32 ops (vllm-kernels.md §2.4 order)",
    "triton": "rn(fl(sb*fl(sa*fl(acc)))), bias: rn(fl(c + bias)) in fp32 (vllm-kernels.md §2.2 order, vLLM 0.32)",
    "cutlass": "rn(fl(sa*fl(sb*fl(acc)))), bias: torch.addcmul(bias, sa, fl(sb*acc)) (vllm-kernels.md §2.1 order)",
}


def _ceil(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _check_device(kernel: str, params: dict[str, Any]) -> str:
    return str(check_choice(kernel, "device", params["device"], DEVICES))


def _cuda_available() -> tuple[bool, str | None]:
    reason = cuda_reason()
    return (False, reason) if reason else (True, None)


def _device_name() -> str:
    reason = cuda_reason()
    return f"CUDA ({reason})" if reason else str(torch.cuda.get_device_name())


# -- torch._int_mm's shape rules ---------------------------------------------------------------------


def int_mm_shape(m: int, k: int, n: int) -> tuple[int, int, int]:
    """The ``(M, K, N)`` that :func:`padded_int_mm` passes to ``torch._int_mm`` for a problem of
    ``(m, k, n)``: M at least :data:`INT_MM_MIN_M`, K and N rounded up to multiples of
    :data:`INT_MM_MULTIPLE`."""
    return max(m, INT_MM_MIN_M), _ceil(k, INT_MM_MULTIPLE), _ceil(n, INT_MM_MULTIPLE)


def pad_for_int_mm(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` ``[M, K]`` and ``b`` ``[K, N]`` int8, zero-padded to :func:`int_mm_shape` and contiguous
    (row-major), on their own device.  Zero rows of ``a`` give result rows that are dropped, zero
    K columns / rows add ``0`` to every sum, zero columns of ``b`` give result columns that are
    dropped: the ``[M, N]`` corner of the padded product is the product, exactly."""
    m, k = int(a.shape[0]), int(a.shape[1])
    n = int(b.shape[1])
    mp, kp, np_ = int_mm_shape(m, k, n)
    if (mp, kp) == (m, k):
        ap = a.contiguous()
    else:
        ap = a.new_zeros((mp, kp))
        ap[:m, :k] = a
    if (kp, np_) == (k, n):
        bp = b.contiguous()
    else:
        bp = b.new_zeros((kp, np_))
        bp[:k, :n] = b
    return ap, bp


def padded_int_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    mm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The int32 ``a @ b`` through an int32 GEMM ``mm`` (default ``torch._int_mm``) that accepts only
    M > 16 and K, N multiples of 8: pad (:func:`pad_for_int_mm`), call, narrow to ``[M, N]``.
    Runs wherever ``mm`` does (the tests pass an exact CPU int32 GEMM)."""
    m, n = int(a.shape[0]), int(b.shape[1])
    ap, bp = pad_for_int_mm(a, b)
    out = (torch._int_mm if mm is None else mm)(ap, bp)
    return out[:m, :n]


# -- the settings of a cuBLAS matmul ---------------------------------------------------------------


#: CUDA matmul flags turned off for the call (those this torch has).
_CUDA_FLAGS = ("allow_tf32", "allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction",
               "allow_fp16_accumulation")


def _get(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)
    except (AttributeError, RuntimeError):  # missing in this torch, or a legacy/new API mix
        return None


@contextlib.contextmanager
def matmul_settings(device: str, dtype: torch.dtype) -> Iterator[dict[str, Any]]:
    """Inside the block, ``torch.matmul`` in ``dtype`` on ``device`` accumulates in fp32, IEEE:

    * CUDA: ``torch.backends.cuda.matmul.allow_tf32 = False`` (fp32 inputs not rounded to TF32);
      ``allow_bf16_reduced_precision_reduction`` and ``allow_fp16_reduced_precision_reduction`` False
      (no reduced-precision split-K reductions); ``allow_fp16_accumulation`` False where torch has it.
      ``torch.backends.cudnn.allow_tf32`` is irrelevant to a matmul and left alone.
    * CPU: the CPU's fp16 reduced-precision-reduction flag False (where torch has it); oneDNN's fp32
      matmul precision ``"ieee"`` if it was set to anything else.

    Yields what was set (name -> value); every setting is restored on exit, also on an error.
    """
    restore: list[tuple[Any, str, Any]] = []  # (object, attribute, value before); "": call object(value)
    applied: dict[str, Any] = {}
    try:
        if device == "cuda":
            cm = torch.backends.cuda.matmul
            for name in _CUDA_FLAGS:
                before = _get(cm, name)
                if before is None and name == "allow_tf32":
                    # unreadable after a mix of the legacy and the new TF32 API: set the new one
                    precision_before = _get(cm, "fp32_precision")
                    if not isinstance(precision_before, str):
                        raise KernelError("cannot turn TF32 off for torch.matmul: neither "
                                          "torch.backends.cuda.matmul.allow_tf32 nor .fp32_precision is readable")
                    cm.fp32_precision = "ieee"
                    restore.append((cm, "fp32_precision", precision_before))
                    applied["torch.backends.cuda.matmul.fp32_precision"] = "ieee"
                    continue
                if before is None:
                    continue  # not in this torch
                split_k = _get(cm, f"{name}_split_k") if name.endswith("reduction") else None
                setattr(cm, name, False)
                restore.append((cm, name, (before, split_k) if isinstance(split_k, bool) else before))
                applied[f"torch.backends.cuda.matmul.{name}"] = False
        else:
            getter = getattr(torch._C, "_get_cpu_allow_fp16_reduced_precision_reduction", None)
            setter = getattr(torch._C, "_set_cpu_allow_fp16_reduced_precision_reduction", None)
            if dtype == torch.float16 and getter is not None and setter is not None:
                before_cpu = bool(getter())
                setter(False)
                restore.append((setter, "", before_cpu))
                applied["torch._C cpu allow_fp16_reduced_precision_reduction"] = False
            mk = _get(torch.backends.mkldnn, "matmul")
            precision = _get(mk, "fp32_precision") if mk is not None else None
            if dtype == torch.float32 and isinstance(precision, str) and precision not in ("ieee", "none"):
                mk.fp32_precision = "ieee"
                restore.append((mk, "fp32_precision", precision))
                applied["torch.backends.mkldnn.matmul.fp32_precision"] = "ieee"
        yield applied
    finally:
        for obj, name, before in reversed(restore):
            if name == "":
                obj(before)
            else:
                setattr(obj, name, before)


# -- kernels ---------------------------------------------------------------------------------------


class _CublasKernel(Kernel):
    """Shared: the ``device`` parameter, availability and provenance."""

    param_defaults = {"device": "cuda"}

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        self.device = _check_device(self.name or type(self).__name__, params)
        return params

    def available(self) -> tuple[bool, str | None]:
        if self.device == "cuda":
            return _cuda_available()
        return True, None

    def provenance(self) -> dict[str, Any]:
        """What this kernel runs with (for a unit's manifest): torch, CUDA and the device."""
        info: dict[str, Any] = {"kernel": self.name, "params": dict(self.params), "torch": torch.__version__,
                                "cuda": torch.version.cuda, "device": self.device}
        if self.device == "cuda" and cuda_reason() is None:
            info["device_name"] = torch.cuda.get_device_name()
            info["capability"] = list(torch.cuda.get_device_capability())
        return info


@register_kernel("cublas-int8")
class CublasInt8(_CublasKernel):
    """cuBLAS INT8 GEMM (``torch._int_mm``) with one of the three epilogue orders (module docs).

    ``device="cuda"``: the int32 accumulator from ``torch._int_mm`` on the GPU (padded to its shape
    rules: :func:`padded_int_mm`), the epilogue as eager fp32 ops on the GPU; for ``cutlass`` with bias
    ``torch.addcmul(bias, sa, t)``, whose FMA contraction on CUDA is NOT known: a prediction (that it is
    one FMA, as :func:`.epilogue.fma32` and the emulation compute) the GPU run checks.
    ``device="cpu"``: the exact int32 accumulator of this CPU (:func:`.accumulator.int32_accumulator`)
    and the same epilogue code, with :func:`.epilogue.fma32` for ``torch.addcmul``.

    The CPU emulation it is paired with (:meth:`emulation`): ``int8-torch-channelwise``,
    ``int8-triton-order`` (``bias_mode="fp32"``) or ``int8-cutlass-order``.
    """

    operand_dtype = "int8"
    param_defaults = {"device": "cuda", "epilogue": "channelwise"}
    #: The accumulation the ``bounds`` check may assume: the exact int32 sum converted once to fp32
    #: (``--algorithm exact --accumulate fp32``), while K <= INT32_EXACT_K.
    algorithm = "exact"
    accumulate = "fp32"

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        super().check_params(params)
        check_choice("cublas-int8", "epilogue", params["epilogue"], INT8_EPILOGUES)
        return params

    @property
    def description(self) -> str:  # type: ignore[override]
        ep = self.params["epilogue"]
        if self.device == "cuda":
            acc = ("cuBLAS int32 acc, torch._int_mm on CUDA (zero-padded to M >= 17 and K, N multiples of 8: "
                   "exact)")
            bias = ("; torch.addcmul on CUDA predicted to be one FMA (not known: the GPU run checks it)"
                    if ep == "cutlass" else "")
        else:
            acc = "CPU exact int32 acc (int32_accumulator, the CPU counterpart of torch._int_mm)"
            bias = "; torch.addcmul's CPU counterpart: the exact fma32" if ep == "cutlass" else ""
        emu = EMULATIONS[ep]
        return f"{acc}; {_FORMULAS[ep]}, eager fp32 ops on {self.device}{bias}; emulation {emu['kernel']}"

    @property
    def code_path(self) -> str:
        """Which path computes the int32 accumulator: cuBLAS on the named GPU, or this CPU's exact path."""
        if self.device == "cuda":
            return f"cuBLAS torch._int_mm on {_device_name()}"
        return f"CPU exact int32: {accumulator_path().describe()}"

    def caveat(self) -> str | None:
        return accumulator_path().native_note() if self.device == "cpu" else None

    def emulation(self, operand_dtype: str = "int8") -> dict[str, Any]:
        """The CPU emulation this kernel is paired with: ``{"kernel": name, "params": {...}}`` (INT8 operands
        only; ``operand_dtype`` is the call every kit kernel's ``emulation`` shares)."""
        emu = EMULATIONS[self.params["epilogue"]]
        return {"kernel": emu["kernel"], "params": dict(emu["params"])}

    def bounds_algorithm(
        self, operand_dtype: str, m: int, n: int, capability: tuple[int, int] | None = None
    ) -> tuple[str, str] | None:
        """:meth:`declaration`'s algorithm: the exact int32 sum converted once to fp32."""
        return (self.algorithm, self.accumulate)

    def declaration(self) -> dict[str, Any]:
        """The accumulation this kernel claims, for the ``bounds`` check and the batch-invariance kind."""
        return {"algorithm": self.algorithm, "accumulate": self.accumulate, "rounded_to": None,
                "holds_for": f"K <= {INT32_EXACT_K} (past it the int32 sum wraps)"}

    def accumulator(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The int32 accumulator ``a @ b`` on this kernel's device (operands already there)."""
        if self.device == "cuda":
            return padded_int_mm(a, b)
        return int32_accumulator(a, b)

    def compute(self, ops: Operands) -> torch.Tensor:
        accf = self.accumulator(ops.a, ops.b).to(torch.float32)
        sa, sb, out, bias = ops.scale_a, ops.scale_b, ops.out_dtype, ops.bias
        ep = self.params["epilogue"]
        if ep == "channelwise":
            return epilogue.channelwise(accf, sa, sb, out, bias)
        if ep == "triton":
            return epilogue.triton(accf, sa, sb, out, bias, bias_mode="fp32")
        if bias is None:
            return epilogue.cutlass(accf, sa, sb, out)
        t = sb * accf
        bias32 = bias.to(torch.float32)
        if self.device == "cuda":
            fused = torch.addcmul(bias32, sa, t)  # bias + sa * t: one FMA predicted, not known
        else:
            fused = epilogue.fma32(sa, t, bias32)
        return fused.to(out)


@register_kernel("cublas-matmul")
class CublasMatmul(_CublasKernel):
    """``torch.matmul`` (cuBLAS) in ``dtype``, then channel-wise scaling in fp32 (module docs).

    ``out = rn_out(fl(fl(fl(C) * sa) * sb) + bias)`` with ``C = torch.matmul(a.to(dtype), b.to(dtype))``:
    for bf16 / fp16, ``C`` is the fp32 accumulator rounded to ``dtype`` (a double rounding with the
    final one).  Declared accumulation: :meth:`declaration`; the honest bound: :meth:`output_bound`.
    """

    operand_dtype = "any"
    param_defaults = {"device": "cuda", "dtype": "bf16"}
    #: fp32 accumulation in an unknown order: the ``bounds`` check's ``any`` algorithm in fp32.
    algorithm = "any"
    accumulate = "fp32"

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        super().check_params(params)
        check_choice("cublas-matmul", "dtype", params["dtype"], tuple(MATMUL_DTYPES))
        return params

    @property
    def matmul_dtype(self) -> torch.dtype:
        return MATMUL_DTYPES[self.params["dtype"]]

    @property
    def rounded_to(self) -> str | None:
        """The dtype torch.matmul rounds the fp32 accumulator to before the scaling (None: fp32)."""
        dt = self.params["dtype"]
        return None if dt == "fp32" else str(dt)

    @property
    def description(self) -> str:  # type: ignore[override]
        dt = self.params["dtype"]
        where = "cuBLAS torch.matmul on CUDA" if self.device == "cuda" else "torch.matmul on the CPU"
        if self.device == "cuda":
            flags = "TF32 off (allow_tf32=False), reduced-precision reductions off, restored after"
        else:
            flags = {"bf16": "oneDNN/ATen bf16 GEMM", "fp16": "CPU fp16 reduced-precision reduction off",
                     "fp32": "oneDNN fp32 precision IEEE"}[dt]
        double = f", C rounded to {dt} before scaling (double rounding)" if dt != "fp32" else ""
        return (f"{where} in {dt} ({flags}): fp32 accumulation in an unknown order{double}; "
                "rn(fl(fl(fl(C)*sa)*sb) + bias), separate fp32 ops (channel-wise order)")

    @property
    def code_path(self) -> str:
        if self.device == "cuda":
            return f"cuBLAS torch.matmul ({self.params['dtype']}) on {_device_name()}"
        return f"torch.matmul ({self.params['dtype']}) on the CPU, capability {torch.backends.cpu.get_cpu_capability()}"

    def declaration(self) -> dict[str, Any]:
        """The accumulation this kernel claims (module docs): ``any`` order in fp32, then the fp32
        result rounded to ``rounded_to`` (None for fp32), then the scaling and the final rounding.
        ``single_rounding_out_dtypes``: the output dtypes for which the ``bounds`` check's single
        rounding model (with its power-of-two scales) holds; otherwise use :meth:`output_bound`."""
        single = {"fp32": ["bf16", "fp16", "fp32"], "bf16": ["bf16"], "fp16": []}[self.params["dtype"]]
        return {"algorithm": self.algorithm, "accumulate": self.accumulate, "rounded_to": self.rounded_to,
                "single_rounding_out_dtypes": single,
                "note": "fp32 adds assumed round-to-nearest (the any bound); tensor-core truncation would "
                        "break it: the GPU run checks it"}

    def output_bound(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        scale_a: torch.Tensor,
        scale_b: torch.Tensor,
        out_dtype: torch.dtype,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(low, high)``, ``[M, N]`` tensors of ``out_dtype`` on the CPU: every output this kernel
        can produce under its declaration lies in ``[low, high]`` (inclusive; inf where fp16 overflows).

        The fp32 ``any`` range ``[lo, hi]`` of the accumulator (``tasks.numerics.products``'s
        sequential order with rounded products, the deepest order: the bound of any order), rounded
        to fp32 (an fp32 accumulator inside the range lies between the roundings of its ends), then
        pushed through the kernel's own steps: the rounding to ``dtype``, ``* sa``, ``* sb``,
        ``+ bias``, the rounding to ``out_dtype``.  Each step is monotone in the accumulator
        (increasing, or decreasing for a negative scale), so the outputs lie between the images of
        the two ends.  Operands and scales may be on any device; they are read on the CPU.
        """
        from tasks.numerics.products import matmul_sequential

        a, b = a.cpu(), b.cpu()
        m, n = int(a.shape[0]), int(b.shape[1])
        sa = scale_a.cpu().to(torch.float32).reshape(-1, 1).expand(m, 1)
        sb = scale_b.cpu().to(torch.float32).reshape(1, -1).expand(1, n)
        alg = matmul_sequential("fp32", fma=False)
        low, high = alg.finite_range(a.to(torch.float32), b.to(torch.float32))
        ends = [torch.from_numpy(x).to(torch.float32) for x in (low, high)]
        cpu_bias = None if bias is None else bias.cpu()
        outs = [epilogue.channelwise(e.to(self.matmul_dtype).to(torch.float32), sa, sb, out_dtype, cpu_bias)
                for e in ends]
        return torch.minimum(outs[0], outs[1]), torch.maximum(outs[0], outs[1])

    def covers(
        self,
        out: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        scale_a: torch.Tensor,
        scale_b: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Elementwise: is ``out`` (this kernel's output) inside :meth:`output_bound`?"""
        low, high = self.output_bound(a, b, scale_a, scale_b, out.dtype, bias)
        o = out.cpu()
        return (o >= low) & (o <= high)

    def compute(self, ops: Operands) -> torch.Tensor:
        dt = self.matmul_dtype
        a, b = ops.a.to(dt), ops.b.to(dt)  # int8 and e4m3 values are exact in bf16, fp16, fp32
        with matmul_settings(self.device, dt):
            c = torch.matmul(a, b)
        if c.dtype != dt:
            raise KernelError(f"kernel {self.name!r}: torch.matmul returned {c.dtype}, expected {dt}")
        return epilogue.channelwise(c.to(torch.float32), ops.scale_a, ops.scale_b, ops.out_dtype, ops.bias)
