"""``triton-scaled-mm``: swapcheck's own Triton INT8/FP8 scaled-mm kernel, after vLLM 0.32's ``triton_scaled_mm``.

Written here from docs/reference/vllm-kernels.md §2.2 and §3 (the Triton code is :mod:`._triton_jit`), so a
GPU with only torch and Triton (issue #38: no vLLM) runs the Triton side of the CUTLASS-vs-Triton
question:

* tile heuristic (:func:`tile_shape`): ``p = next_power_of_2(max(M, 32))``; ``p <= 32``: (64, 64, 256),
  or (64, 128, 256) when N >= 8192; ``p <= 64``: (64, 64, 256); ``p <= 128``: (64, 128, 128); else
  (128, 128, 128) as (BLOCK_M, BLOCK_N, BLOCK_K);
* a plain 2-D grid of output tiles, no split-K; ``tl.dot(a, b, acc, out_dtype=int32)`` (int8) or
  ``float32`` (fp8) over the K slabs, masked loads (any M, N, K);
* epilogue ``acc = scale_a * acc.to(fp32)``, ``acc = scale_b.T * acc``, bias added in fp32 (vLLM >=
  0.32), then ``.to(out dtype)`` in the kernel;
* operands at the boundary (:func:`triton_operands`): ``a`` row-major, ``b`` ``[K, N]`` column-major,
  ``scale_a`` ``[M, 1]`` / ``[1, 1]``, ``scale_b`` ``[N, 1]`` / ``[1, 1]`` (swapcheck's ``[1, N]``
  transposed, the layout vLLM's op takes), bias ``[N]``.

Parameters: ``device`` ``"cuda"`` (default: compiled by Triton for the GPU) or ``"cpu"`` (Triton's
interpreter on numpy); ``fp_fusion`` (default ``True``, Triton's and vLLM's default
``enable_fp_fusion``): read from the PTX Triton 3.6.0 writes for SM90 (compiled on a CPU, no GPU
needed): with a bias the epilogue's ``scale_b * v + bias`` becomes one ``fma.rn.f32``, with
``fp_fusion=False`` a ``mul.rn.f32`` and an ``add.rn.f32``; without bias there is nothing to fuse.

The two modes, and why they are built the way they are:

* ``device="cuda"`` needs CUDA and an importable ``triton`` (:meth:`available` says which is missing).
  The kernel is wrapped explicitly as a ``JITFunction``; a process whose ``TRITON_INTERPRET`` is set is
  refused (Triton would interpret, and its language helpers were built for the interpreter).
* ``device="cpu"`` wraps the same function explicitly as Triton's ``InterpretedFunction``, whatever
  ``TRITON_INTERPRET`` says, so a process may run both modes one after the other (every launch holds
  one lock: the interpreter patches ``triton.language`` for the length of a call).  The kernel body
  uses Triton builtins only, so this holds whether ``triton`` was imported with or without
  ``TRITON_INTERPRET=1``.  The interpreter truncates fp32 -> bf16 and adds bf16 as raw uint16
  (reference §6), so in this mode the kernel stores the fp32 epilogue result (before the output
  conversion) and the host rounds it to the output dtype with torch (round to nearest even).

What the interpreter computes (measured, Triton 3.6.0, numpy 2.4, torch 2.13, tests/test_triton_kernel.py):
int8 ``tl.dot`` is ``np.matmul(..., dtype=int32)``: exact, and past K = 131071 wrapped modulo 2**32
like a GPU's int32 accumulator, so the outputs equal ``int8-triton-order`` bit for bit (the GPU's
too, without bias or with ``fp_fusion=False``).  FP8 ``tl.dot`` converts e4m3 to fp16 (exact: every
finite value and every pairwise product checked) and calls ``np.matmul(..., dtype=float32)``, numpy's
BLAS sgemm per BLOCK_K slab, each slab sum added to the fp32 accumulator: that is the interpreter's
summation, **not** a prediction of a GPU's accumulation.  Its declared bound is ``blocked-<BLOCK_K>``
in fp32 (any order inside a slab of BLOCK_K products is within it).  On SM90 Triton's FP8 ``tl.dot``
uses the imprecise accumulator (``max_num_imprecise_acc`` 2**30, reference §2.2; PTX: one
``wgmma ... f32.e4m3.e4m3`` chain, no promoting fp32 adds), roughly 14 bits kept (reference
numerics.md §5.2, a model): its emulation pair is judged against a bound, never bit for bit.
"""

from __future__ import annotations

import importlib.util
import os
from importlib import metadata
from typing import Any

import torch

from tasks.devices import cuda_reason

from .cuda import vllm_operands
from .operands import Operands
from .registry import Kernel, KernelError, check_choice, register_kernel

__all__ = [
    "MODES",
    "TRITON_VERSION",
    "TritonScaledMM",
    "interpret_env",
    "next_power_of_2",
    "tile_shape",
    "triton_operands",
    "triton_reason",
    "triton_version",
]

#: The Triton release the kernel is written and measured for (the `triton` extra pins it).
TRITON_VERSION = "3.6.0"
MODES = ("cuda", "cpu")
#: Values of TRITON_INTERPRET that Triton reads as true (its C++ getenv_bool).
_TRUE = ("1", "true", "on")
#: The K depth of one SM90 FP8 wgmma instruction (m64nNk32), the group the tensor core adds at once.
WGMMA_FP8_K = 32


def next_power_of_2(x: int) -> int:
    """The smallest power of two >= ``x`` (1 for ``x <= 1``)."""
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def tile_shape(m: int, n: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for an ``[M, K] x [K, N]`` problem: vLLM 0.32's heuristic (§2.2)."""
    p = next_power_of_2(max(m, 32))
    if p <= 32:
        return (64, 128, 256) if n >= 8192 else (64, 64, 256)
    if p <= 64:
        return (64, 64, 256)
    if p <= 128:
        return (64, 128, 128)
    return (128, 128, 128)


def triton_operands(ops: Operands) -> dict[str, Any]:
    """The operands as the kernel takes them: ``a`` row-major, ``b`` ``[K, N]`` column-major, ``scale_a``
    ``[M, 1]`` or ``[1, 1]``, ``scale_b`` ``[N, 1]`` or ``[1, 1]`` (swapcheck's ``[1, N]`` transposed),
    ``bias`` ``[N]`` or None; all contiguous.  The layout of vLLM's ``triton_scaled_mm`` (§3)."""
    return vllm_operands(ops, "col")


def triton_version() -> str | None:
    """The installed Triton version from the package metadata (Triton is not imported), or None."""
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


def triton_reason() -> str | None:
    """Why ``import triton`` cannot work here (None when it is installed); imports nothing."""
    try:
        found = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return (f"triton not installed (the 'triton' extra: `make triton` installs triton=={TRITON_VERSION} "
                "from requirements/triton.lock)")
    return None


def interpret_env() -> bool:
    """Whether ``TRITON_INTERPRET`` is set to a true value in this process's environment."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


def _interpret_refusal() -> str:
    return ("TRITON_INTERPRET is set in this process: Triton would interpret instead of compiling, so "
            "device='cuda' is refused (unset it; device='cpu' is the interpreter, in any process)")


@register_kernel("triton-scaled-mm")
class TritonScaledMM(Kernel):
    """swapcheck's Triton scaled-mm (module docstring): int8 or fp8 e4m3 operands, the vLLM 0.32 tiling
    and epilogue ``rn(fl(sb * fl(sa * acc)) [+ bias in fp32])``, compiled (``device="cuda"``) or under
    Triton's interpreter (``device="cpu"``, fp32 stored, rounded by the host)."""

    operand_dtype = "any"
    version = "1"
    param_defaults = {"device": "cuda", "fp_fusion": True}

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        check_choice(self.name, "device", params["device"], MODES)
        if not isinstance(params["fp_fusion"], bool):
            raise KernelError(
                f"kernel {self.name!r}: fp_fusion must be true or false, got {params['fp_fusion']!r}"
            )
        return params

    @property
    def device(self) -> str:  # type: ignore[override]
        return str(self.params["device"])

    @property
    def description(self) -> str:  # type: ignore[override]
        where = ("compiled by Triton (CUDA)" if self.device == "cuda"
                 else "Triton interpreter on the CPU, fp32 stored and rounded by the host")
        bias = ("bias: rn(fma(sb, fl(sa*acc), bias)) (fp_fusion)" if self.params["fp_fusion"] and self.device == "cuda"
                else "bias: rn(fl(c + bias))")
        return (f"Triton scaled-mm after vLLM 0.32 triton_scaled_mm: tl.dot int8->int32 / fp8->fp32, "
                f"c = fl(sb*fl(sa*acc)), rn(c), {bias}; {where} (vllm-kernels.md §2.2)")

    # -- where it runs --------------------------------------------------------------------------
    def available(self) -> tuple[bool, str | None]:
        reasons: list[str] = []
        if self.device == "cuda":
            cuda = cuda_reason()
            if cuda:
                reasons.append(cuda)
        triton = triton_reason()
        if triton:
            reasons.append(triton)
        if self.device == "cuda" and interpret_env():
            reasons.append(_interpret_refusal())
        return (False, "; ".join(reasons)) if reasons else (True, None)

    @property
    def code_path(self) -> str:
        """What runs in this mode (static text: Triton is not imported for it)."""
        if self.device == "cpu":
            return ("Triton interpreter (triton.runtime.interpreter.InterpretedFunction): tl.dot as "
                    "np.matmul, int8 in int32 (exact, wraps mod 2**32), fp8 upcast to fp16 (exact) and "
                    "summed in fp32 by numpy's BLAS per BLOCK_K slab (the interpreter's summation, not a "
                    "GPU's); the kernel stores the fp32 epilogue result fl(sb*fl(sa*acc)) [+ bias in fp32] "
                    "and the host rounds it to the output dtype with torch (round to nearest even); "
                    "no fp fusion in the interpreter")
        fusion = ("fp_fusion on: with bias one fma.rn.f32 (sb*v + bias)" if self.params["fp_fusion"]
                  else "fp_fusion off: mul.rn.f32 then add.rn.f32")
        return ("compiled Triton kernel (JITFunction): tl.dot int8->int32 / fp8->fp32 (SM90 FP8: "
                f"imprecise accumulation, max_num_imprecise_acc 2**30), epilogue in fp32, {fusion}, "
                ".to(out dtype) in the kernel (cvt.rn)")

    def caveat(self) -> str | None:
        notes: list[str] = []
        installed = triton_version()
        if installed is not None and installed != TRITON_VERSION:
            notes.append(f"triton {installed} is installed; this kernel is written and measured for "
                         f"triton {TRITON_VERSION}")
        if self.device == "cpu":
            notes.append("FP8 under the interpreter sums in numpy's order: not a prediction of a GPU's "
                         "accumulation (judged against the blocked-<BLOCK_K> bound)")
        elif self.params["fp_fusion"]:
            notes.append("with a bias the compiled epilogue is fused (fma): int8-triton-order predicts it "
                         "bit for bit only without bias or with fp_fusion=false")
        return "; ".join(notes) or None

    def provenance(self) -> dict[str, Any]:
        """Versions this kernel runs with (for a unit's manifest); imports nothing new."""
        info: dict[str, Any] = {"kernel": self.name, "mode": self.device, "triton": triton_version(),
                                "torch": torch.__version__, "fp_fusion": self.params["fp_fusion"]}
        if self.device == "cuda" and cuda_reason() is None:
            info["device_name"] = torch.cuda.get_device_name()
            info["capability"] = list(torch.cuda.get_device_capability())
        return info

    # -- what it is compared with ---------------------------------------------------------------
    def emulation(self, operand_dtype: str = "int8") -> dict[str, Any]:
        """The CPU emulation this kernel is paired with: ``dict(kernel=..., params=...)``.

        int8: ``int8-triton-order`` with ``bias_mode="fp32"``: bit for bit without bias, and with bias
        under the interpreter or ``fp_fusion=False`` (:meth:`prediction`).  fp8: ``fp8-blocked`` with
        ``block_size=32`` (one SM90 wgmma adds 32 products to the running accumulator at once) and the
        Triton epilogue: the closest structure among the CPU FP8 emulations, but Hopper's imprecise
        accumulator keeps ~14 bits, so the pair is judged against the bound
        (:meth:`bounds_algorithm`), not predicted bit for bit.
        """
        if operand_dtype == "int8":
            return {"kernel": "int8-triton-order", "params": {"bias_mode": "fp32"}}
        if operand_dtype in ("fp8", "fp8_e4m3"):
            return {"kernel": "fp8-blocked", "params": {"block_size": WGMMA_FP8_K, "epilogue": "triton"}}
        raise KernelError(f"kernel {self.name!r}: operand_dtype must be 'int8' or 'fp8_e4m3', got {operand_dtype!r}")

    def prediction(self, operand_dtype: str = "int8", has_bias: bool = False) -> str:
        """``"bit_for_bit"`` where :meth:`emulation` predicts every output bit, else ``"bound"``."""
        if operand_dtype != "int8":
            return "bound"
        fused = self.device == "cuda" and self.params["fp_fusion"] and has_bias
        return "bound" if fused else "bit_for_bit"

    def bounds_algorithm(
        self, operand_dtype: str, m: int, n: int, capability: tuple[int, int] | None = None
    ) -> tuple[str, str]:
        """``(algorithm, accumulate)`` for :func:`tasks.checks.bounds.algorithm`: the accumulation this
        kernel declares for an ``[M, K] x [K, N]`` problem.

        * int8: ``("exact", "fp32")``: the int32 sum is exact (K <= 131071), converted to fp32 once.
        * fp8 under the interpreter: ``("blocked-<BLOCK_K>", "fp32")``: per BLOCK_K slab some fp32 order
          (numpy's BLAS), the slab sums added to the accumulator one after the other.
        * fp8 compiled on SM90 (``capability`` (9, 0); the default when no GPU is visible, the kit's
          H200): ``("any", "bf16")`` [inferred]: an accumulator of ~14 bits that aligns and truncates
          (reference numerics.md §5.2) has per-group errors far inside the bf16-format bound of any
          order; an fp32 algorithm does not describe it.
        * fp8 compiled elsewhere: ``("any", "fp32")`` [inferred: no promotion setting applies there].
        """
        if operand_dtype == "int8":
            return ("exact", "fp32")
        if self.device == "cpu":
            return (f"blocked-{tile_shape(m, n)[2]}", "fp32")
        if capability is None:
            capability = (tuple(torch.cuda.get_device_capability())  # type: ignore[assignment]
                          if cuda_reason() is None else (9, 0))
        assert capability is not None
        return ("any", "bf16") if tuple(capability)[:2] == (9, 0) else ("any", "fp32")

    # -- the call -------------------------------------------------------------------------------
    def compute(self, ops: Operands) -> torch.Tensor:
        mode = self.device
        if mode == "cuda":
            if interpret_env():
                raise KernelError(f"kernel {self.name!r}: {_interpret_refusal()}")
            cc = tuple(int(x) for x in torch.cuda.get_device_capability(ops.a.device))
            if ops.is_fp8 and cc < (8, 9):
                raise KernelError(f"kernel {self.name!r}: FP8 tl.dot needs compute capability >= 8.9, "
                                  f"this GPU is {cc[0]}.{cc[1]}")
        try:
            from . import _triton_jit as jit
        except ImportError as exc:
            raise KernelError(f"kernel {self.name!r}: cannot import triton: {exc}") from exc
        if mode == "cuda" and jit.interpret_knob():
            raise KernelError(f"kernel {self.name!r}: {_interpret_refusal()}")
        o = triton_operands(ops)
        store = torch.float32 if mode == "cpu" else ops.out_dtype
        out = torch.empty((ops.m, ops.n), dtype=store, device=ops.a.device)
        jit.launch(mode, o["a"], o["b"], o["scale_a"], o["scale_b"], o["bias"], out,
                   tile_shape(ops.m, ops.n), fp_fusion=bool(self.params["fp_fusion"]))
        # interpreter: the fp32 epilogue result, rounded here (torch: round to nearest even)
        return out if out.dtype == ops.out_dtype else out.to(ops.out_dtype)
