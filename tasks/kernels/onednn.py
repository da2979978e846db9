"""``int8-onednn``: PyTorch's oneDNN quantized linear (x86 CPU), called on our int8 operands.

The op is ``torch.ops.onednn.qlinear_pointwise`` (torch 2.13 schema)::

    qlinear_pointwise(Tensor qx, float x_scale, int x_zero_point, Tensor qw, Tensor w_scale,
                      Tensor w_zero_point, Tensor? bias, float output_scale,
                      int output_zero_point, ScalarType? output_dtype, str post_op_name,
                      Scalar?[] post_op_args, str post_op_algorithm) -> Tensor

with ``qw = torch.ops.onednn.qlinear_prepack(w [N, K] int8, x_shape=None)``.  What it accepts
(measured, torch 2.13.0+cpu, oneDNN v3.12.0):

* **Activation scale: per-tensor only** (``x_scale`` a float; the ``.tensor`` overload refuses more
  than one element: "act scale/zp size should be 1").  Weight scales: per-channel ``[N]`` or a
  single element.  So ``supports()`` requires ``scale_a`` with one element, unless the kernel is
  built with ``act_scale="split-rows"``: then rows are grouped by their activation scale and the op
  is called once per distinct scale (each output element is still exactly what oneDNN computes for
  its row; on the measured machine a row's result does not depend on which rows share the call).
* **Activations are passed as uint8 with zero point 128** (``x + 128``, exact).  Signed int8 with
  zero point 0 is accepted too and gives identical bits, but oneDNN then runs its reference
  implementation (``ref_int8``, ~150x slower); uint8 is what PyTorch's x86 quantization feeds it and
  runs the JIT kernel (``brg_matmul:avx512_core_vnni`` on the measured AVX512-VNNI CPU), which
  subtracts the zero-point compensation in int32.
* Output dtypes fp32, bf16 and fp16; a bias of any of those dtypes.

What it computes depends on the implementation oneDNN picks for this CPU at run time, so the kernel
measures it once per process (:func:`onednn_path`) and names it in its ``code_path`` (the identity of
every launch, the certificate's kernel identity) and, where it is not exact, in ``swapcheck kernels
list`` (:meth:`Int8OneDNN.caveat`):

* **VNNI** (``brg_matmul:avx512_core_vnni``, measured on an AVX512-VNNI CPU without AMX): an int32
  accumulator that is exact (wrapping modulo 2**32 past the overflow bound, like ``torch._int_mm``),
  then ``rn(fl(fl(fl(acc) * sa) * sb) + bias)`` -- the formula of ``int8-torch-channelwise``.  On
  an AMX CPU an earlier session found the accumulator exact and the fp32 outputs different from that
  formula; which implementation runs there was not recorded (the kernel's ``code_path`` names it).
* **AVX2 without VNNI** (``gemm:jit``; measured with ``ONEDNN_MAX_CPU_ISA=AVX2`` on a VNNI CPU, and
  reported on an AMD EPYC without AVX-512): **not exact**.  Each pair of adjacent products
  ``u[2i] * w[2i] + u[2i+1] * w[2i+1]`` (``u = x + 128`` in [0, 255], ``w`` in [-128, 127]) is summed
  in int16 with saturation (``vpmaddubsw``) before the int32 sums; :func:`saturated_pair_sums` models
  it and matched every output of the probe bit for bit.  A pair exceeds 32767 as soon as
  ``u * w`` averages above 16383, so at K = 1000 with random operands every output was wrong (384 of
  384; 53,707,303 fp32 spacings from exact at worst in the report).  PyTorch's own x86 quantizer
  avoids it by quantizing weights to 7 bits (``reduce_range``); swapcheck's operands use 8.

The measurement is :func:`onednn_path`: the implementation named by oneDNN's verbose log for one
call, and that call's integers against the exact ones on operands whose pairs saturate.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from .operands import Operands
from .registry import Kernel, check_choice, register_kernel

__all__ = ["Int8OneDNN", "OneDNNPath", "onednn_call", "onednn_path", "onednn_qlinear", "saturated_pair_sums"]

T = TypeVar("T")
ACT_SCALE_MODES = ("per-tensor", "split-rows")
_PROBE: tuple[bool, str | None] | None = None
_PATH: OneDNNPath | None = None
#: What the kernel says where the verbose log names no implementation.
UNKNOWN_IMPL = "implementation not reported"


def onednn_qlinear(
    a: torch.Tensor,
    w_packed: torch.Tensor,
    act_scale: float,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """One ``qlinear_pointwise`` call: int8 ``a [M, K]`` (shifted to uint8, zero point 128)."""
    qx = (a.to(torch.int16) + 128).to(torch.uint8)
    w_zp = torch.zeros(w_scale.numel(), dtype=torch.int64)
    out: torch.Tensor = torch.ops.onednn.qlinear_pointwise(
        qx, float(act_scale), 128, w_packed, w_scale, w_zp, bias, 1.0, 0, out_dtype, "none", [], ""
    )
    return out


def saturated_pair_sums(u: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum_i sat16(u[:, 2i] * w[2i, :] + u[:, 2i+1] * w[2i+1, :])`` in int64: what a GEMM built
    on ``vpmaddubsw`` (u8 x s8 products, adjacent pairs added with int16 saturation) accumulates
    before its int32 sums.  ``u`` is ``[M, K]``, ``w`` ``[K, N]``, both integer arrays; an odd K is
    padded with a zero product."""
    u = np.asarray(u, dtype=np.int64)
    w = np.asarray(w, dtype=np.int64)
    if u.shape[1] % 2:
        u = np.pad(u, ((0, 0), (0, 1)))
        w = np.pad(w, ((0, 1), (0, 0)))
    out = np.zeros((u.shape[0], w.shape[1]), dtype=np.int64)
    for k in range(0, u.shape[1], 2):
        pair = np.outer(u[:, k], w[k]) + np.outer(u[:, k + 1], w[k + 1])
        out += np.clip(pair, -32768, 32767)
    return out


@contextlib.contextmanager
def _captured_stdout() -> Iterator[Callable[[], str]]:
    """What C code writes to file descriptor 1 inside the block (oneDNN's verbose log goes there)."""
    libc = ctypes.CDLL(None)
    with tempfile.TemporaryFile(mode="w+b") as f:
        libc.fflush(None)
        saved = os.dup(1)
        os.dup2(f.fileno(), 1)
        text: list[str] = []
        try:
            yield lambda: "".join(text)
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            f.seek(0)
            text.append(f.read().decode(errors="replace"))


def _implementation(log: str) -> str:
    """The implementation of the last ``exec`` line of a oneDNN verbose log: its name where oneDNN gives
    one (``brg_matmul:avx512_core_vnni``, ``gemm:jit``), else the primitive's kind (``gemm_api``, the
    BLAS-like entry ``torch._int_mm`` calls); :data:`UNKNOWN_IMPL` when no line ran."""
    for line in reversed(log.splitlines()):
        fields = line.split(",")
        if len(fields) > 6 and fields[0] == "onednn_verbose" and "exec" in fields[:4]:
            i = fields.index("exec")
            if len(fields) > i + 3 and fields[i + 3]:
                return fields[i + 3]
            if len(fields) > i + 2 and fields[i + 2]:
                return fields[i + 2]
    return UNKNOWN_IMPL


def onednn_call(fn: Callable[[], T]) -> tuple[T, str | None]:
    """``fn()`` with oneDNN's verbose log captured: its result and the implementation oneDNN ran for it,
    or None when ``fn`` ran no oneDNN primitive (e.g. ``torch._int_mm`` on PyTorch's own loop)."""
    with _captured_stdout() as log, torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        out = fn()
    impl = _implementation(log())
    return out, (None if impl == UNKNOWN_IMPL else impl)


@dataclass(frozen=True)
class OneDNNPath:
    """The implementation oneDNN ran for int8 operands in this process, and whether it is exact.

    Attributes:
        impl: oneDNN's name for it (``brg_matmul:avx512_core_vnni``, ``gemm:jit``, ...).
        exact: the probe's integers equal the exact ones.
        wrong / total: outputs of the probe that were not exact, of all.
        cause: what explains the wrong outputs, as measured (None when exact).
    """

    impl: str
    exact: bool
    wrong: int
    total: int
    cause: str | None

    def describe(self) -> str:
        head = f"oneDNN {self.impl}"
        if self.exact:
            return f"{head}; exact int32 accumulator (probe: {self.total} of {self.total} sums exact)"
        return f"{head}; NOT EXACT here ({self.wrong} of {self.total} probe sums wrong): {self.cause}"


def _probe_operands() -> tuple[torch.Tensor, torch.Tensor]:
    """A [4, 1000] x [1000, 6] problem whose pairs of products overflow int16 after the +128 shift:
    extreme rows and columns beside random ones."""
    gen = torch.Generator().manual_seed(35)
    a = torch.randint(-128, 128, (4, 1000), dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, (6, 1000), dtype=torch.int8, generator=gen)
    a[0], a[1] = 127, -128
    w[0], w[1] = 127, -128
    return a, w


def onednn_path() -> OneDNNPath:
    """Measure, once per process, which implementation oneDNN runs and whether it is exact."""
    global _PATH
    if _PATH is not None:
        return _PATH
    a, w = _probe_operands()
    packed = torch.ops.onednn.qlinear_prepack(w, None)
    n = w.shape[0]
    out, ran = onednn_call(lambda: onednn_qlinear(a, packed, 1.0, torch.ones(n), torch.float32, None))
    impl = ran or UNKNOWN_IMPL
    got = out.to(torch.float64).numpy()  # every sum here is below 2**24: exact in the fp32 output
    a64, wt = a.numpy().astype(np.int64), w.numpy().astype(np.int64).T
    exact = a64 @ wt
    bad = got != exact
    cause = None
    if bad.any():
        model = saturated_pair_sums(a64 + 128, wt) - 128 * wt.sum(0)
        if np.array_equal(got, model):
            cause = ("int16 saturation of adjacent u8 x s8 product pairs (vpmaddubsw without VNNI): "
                     "every probe output equals that model bit for bit")
        else:
            i, j = np.argwhere(bad)[0]
            cause = (f"cause not identified (not int16 pair saturation): e.g. [{i},{j}] exact "
                     f"{int(exact[i, j])}, got {got[i, j]:.0f}")
    _PATH = OneDNNPath(impl, not bool(bad.any()), int(bad.sum()), int(bad.size), cause)
    return _PATH


def _probe() -> tuple[bool, str | None]:
    """Can the op run here, and does a tiny call give the right integer products?"""
    global _PROBE
    if _PROBE is not None:
        return _PROBE
    try:
        if not torch.backends.mkldnn.is_available():
            _PROBE = (False, "torch was built without oneDNN (torch.backends.mkldnn unavailable)")
            return _PROBE
        ops = torch.ops.onednn
        if not (hasattr(ops, "qlinear_pointwise") and hasattr(ops, "qlinear_prepack")):
            _PROBE = (False, "torch.ops.onednn.qlinear_pointwise/qlinear_prepack not registered")
            return _PROBE
        a = torch.tensor([[1, -2, 3, -128], [127, 5, -6, 7]], dtype=torch.int8)
        w = torch.tensor([[1, 2, 3, 4], [-1, -2, -3, -4], [127, -127, 0, 1]], dtype=torch.int8)
        packed = ops.qlinear_prepack(w, None)
        out = onednn_qlinear(a, packed, 1.0, torch.ones(3), torch.float32, None)
        want = (a.to(torch.int64) @ w.to(torch.int64).t()).to(torch.float32)
        if not torch.equal(out, want):
            _PROBE = (False, f"probe call returned {out.tolist()}, expected {want.tolist()}")
        else:
            _PROBE = (True, None)
    except Exception as exc:  # any failure means "not available", with the reason
        _PROBE = (False, f"probe call failed: {type(exc).__name__}: {exc}")
    return _PROBE


@register_kernel("int8-onednn")
class Int8OneDNN(Kernel):
    """PyTorch oneDNN quantized linear (``torch.ops.onednn.qlinear_pointwise``); see module docs."""

    operand_dtype = "int8"
    device = "cpu"
    param_defaults = {"act_scale": "per-tensor"}

    @property
    def description(self) -> str:  # type: ignore[override]
        split = (
            "; per-token scales by one call per distinct row scale"
            if self.params["act_scale"] == "split-rows"
            else "; per-tensor activation scale only"
        )
        return (
            "oneDNN qlinear_pointwise (uint8 acts, zero point 128): with VNNI or AMX an exact int32 acc, "
            f"rn(fl(fl(acc*sa)*sb) + bias) like vllm-kernels.md §2.4; without VNNI int16-saturated "
            f"pairs (code_path says which runs here){split}"
        )

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        check_choice(self.name, "act_scale", params["act_scale"], ACT_SCALE_MODES)
        return params

    def bounds_algorithm(
        self, operand_dtype: str, m: int, n: int, capability: tuple[int, int] | None = None
    ) -> tuple[str, str] | None:
        """``("exact", "fp32")``: what it claims (vLLM's channel-wise order on an exact int32 sum); on a
        CPU without VNNI its int16-saturated pairs are not exact, and the arbiter shows it outside."""
        return ("exact", "fp32")

    def available(self) -> tuple[bool, str | None]:
        return _probe()

    @property
    def code_path(self) -> str:
        """The implementation oneDNN runs here and whether it is exact (:func:`onednn_path`)."""
        if not _probe()[0]:
            return f"not available: {_probe()[1]}"
        return onednn_path().describe()

    def caveat(self) -> str | None:
        """What a user must know before trusting it here: a path that is not exact."""
        if not _probe()[0]:
            return None
        path = onednn_path()
        if not path.exact:
            return f"runs, but {path.describe()}"
        if path.impl.startswith("ref"):  # oneDNN's reference loops: exact, but ~100x slower than a JIT kernel
            return f"oneDNN runs its reference implementation here ({path.impl}): exact, but slow"
        return None

    def supports(
        self,
        m: int,
        n: int,
        k: int,
        scale_a_numel: int,
        scale_b_numel: int,
        has_bias: bool,
    ) -> tuple[bool, str | None]:
        if scale_a_numel != 1 and self.params["act_scale"] == "per-tensor":
            return False, (
                "oneDNN qlinear takes a per-tensor activation scale only (scale_a must have 1 "
                "element); build the kernel with act_scale='split-rows' to call it once per row scale"
            )
        return True, None

    def compute(self, ops: Operands) -> torch.Tensor:
        w_packed = torch.ops.onednn.qlinear_prepack(ops.b.t().contiguous(), None)
        w_scale = ops.scale_b.reshape(-1)[: ops.scale_b_numel].contiguous()
        a = ops.a.contiguous()
        if ops.scale_a_numel == 1:
            return onednn_qlinear(
                a, w_packed, ops.scale_a[0, 0].item(), w_scale, ops.out_dtype, ops.bias
            )
        scales = ops.scale_a.reshape(-1)
        values, inverse = torch.unique(scales, return_inverse=True)
        out = torch.empty(ops.m, ops.n, dtype=ops.out_dtype)
        for i, v in enumerate(values.tolist()):
            rows = torch.nonzero(inverse == i).reshape(-1)
            out[rows] = onednn_qlinear(a[rows], w_packed, v, w_scale, ops.out_dtype, ops.bias)
        return out
