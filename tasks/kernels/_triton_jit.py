"""The Triton code of ``triton-scaled-mm`` (:mod:`.triton_mm`): one scaled-GEMM kernel and its launcher.

Written for this repository from the facts of docs/reference/vllm-kernels.md §2.2 about vLLM 0.32's
``triton_scaled_mm`` (not a copy of it): a plain 2-D grid of ``BLOCK_M x BLOCK_N`` output tiles, no
split-K; ``tl.dot(a, b, acc, out_dtype=int32)`` for int8 and ``out_dtype=float32`` for fp8, one
``BLOCK_K`` slab of K at a time with masked loads (no alignment requirement); the epilogue
``acc = scale_a * acc.to(fp32)``, then ``acc = scale_b.T * acc`` (``scale_b`` loaded as ``[BLOCK_N, 1]``
from the ``[N, 1]`` layout and transposed), the bias added in fp32 (vLLM >= 0.32), then
``.to(<c's element type>)``.

Only :mod:`.triton_mm` imports this module, inside ``compute``: ``import triton`` never runs when
``tasks.kernels`` is imported.  The kernel body below is an undecorated function; :func:`kernel_for`
wraps it once per mode, explicitly, whatever ``TRITON_INTERPRET`` says:

* ``"cuda"``: ``triton.runtime.jit.JITFunction`` (what ``@triton.jit`` builds), compiled for the GPU;
* ``"cpu"``: ``triton.runtime.interpreter.InterpretedFunction`` (what ``@triton.jit`` builds under
  ``TRITON_INTERPRET=1``), run by Triton's interpreter on numpy.

Two interpreter facts shape the body (Triton 3.6.0, numpy 2.4): a runtime scalar argument is a
one-element array there and cannot be a ``range`` bound (``int()`` of a 1-element array is an error
in numpy 2.4), so the K loop runs to the constexpr ``K_TILES`` in interpreter mode and to
``tl.cdiv(K, BLOCK_K)`` when compiled (a constexpr conditional, resolved at compile time: the GPU
kernel is not specialised on K); and a masked load's ``other=0`` (an int) cannot be cast to fp8
there, ``other=0.0`` can (both compile).
"""

import threading
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["KERNEL_NAME", "interpret_knob", "kernel_for", "launch"]

KERNEL_NAME = "swapcheck_triton_scaled_mm"

# The interpreter patches triton.language for the length of a call (InterpretedFunction ->
# GridExecutor, _patch_lang ... restore); a compiled launch (its first call compiles) must not overlap
# it, so every launch of either mode holds this lock.
_LAUNCH_LOCK = threading.Lock()
_KERNELS: dict[str, Any] = {}


def swapcheck_triton_scaled_mm(  # type: ignore[no-untyped-def]
    a_ptr,
    b_ptr,
    c_ptr,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    ACC_INT32: tl.constexpr,
    SA_STEP: tl.constexpr,
    SB_STEP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRETED: tl.constexpr,
    K_TILES: tl.constexpr,
):
    """One ``[BLOCK_M, BLOCK_N]`` tile of ``c = (scale_b.T * (scale_a * (a @ b))) [+ bias]``.

    ``SA_STEP`` / ``SB_STEP``: 1 for per-row / per-column scales, 0 for one scale (every offset 0).
    """
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    if ACC_INT32:
        acc = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.int32)
    else:
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, dtype=tl.float32)
    for t in range(0, K_TILES if INTERPRETED else (K + BLOCK_K - 1) // BLOCK_K):
        kk = t * BLOCK_K + ks
        k_ok = kk < K
        a = tl.load(
            a_ptr + rows[:, None] * stride_am + kk[None, :] * stride_ak,
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        b = tl.load(
            b_ptr + kk[:, None] * stride_bk + cols[None, :] * stride_bn,
            mask=k_ok[:, None] & col_ok[None, :],
            other=0.0,
        )
        if ACC_INT32:
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        else:
            acc = tl.dot(a, b, acc, out_dtype=tl.float32)
    # The epilogue: scale_a first, then scale_b.T (scale_b is [N, 1]: a [BLOCK_N, 1] column here).
    sa = tl.load(sa_ptr + rows[:, None] * SA_STEP, mask=row_ok[:, None], other=0.0)
    sb = tl.load(sb_ptr + cols[:, None] * SB_STEP, mask=col_ok[:, None], other=0.0)
    accf = sa * acc.to(tl.float32)
    accf = sb.T * accf
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0)
        accf = accf + bias.to(tl.float32)[None, :]
    c = accf.to(c_ptr.dtype.element_ty)
    tl.store(
        c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
        c,
        mask=row_ok[:, None] & col_ok[None, :],
    )


def kernel_for(mode: str) -> Any:
    """The kernel wrapped for ``mode`` (``"cuda"``: compiled, ``"cpu"``: interpreted), built once."""
    if mode not in _KERNELS:
        if mode == "cuda":
            from triton.runtime.jit import JITFunction

            _KERNELS[mode] = JITFunction(swapcheck_triton_scaled_mm)
        elif mode == "cpu":
            from triton.runtime.interpreter import InterpretedFunction

            _KERNELS[mode] = InterpretedFunction(swapcheck_triton_scaled_mm)
        else:
            raise ValueError(f"mode must be 'cuda' or 'cpu', got {mode!r}")
    return _KERNELS[mode]


def interpret_knob() -> bool:
    """What Triton itself reads as ``TRITON_INTERPRET`` in this process."""
    return bool(triton.knobs.runtime.interpret)


def launch(
    mode: str,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    tile: tuple[int, int, int],
    fp_fusion: bool = True,
) -> None:
    """Run the kernel over the 2-D tile grid, writing ``out`` ``[M, N]`` (its dtype is the kernel's store
    type: the output dtype on cuda, float32 in the interpreter).

    ``scale_a`` has 1 or M elements, ``scale_b`` 1 or N (the ``[N, 1]`` or ``[1, 1]`` layout),
    ``bias`` N elements or None; all contiguous on ``a``'s device.  ``fp_fusion`` is Triton's
    ``enable_fp_fusion`` for the compiled kernel (the interpreter never fuses).
    """
    m, k = int(a.shape[0]), int(a.shape[1])
    n = int(b.shape[1])
    block_m, block_n, block_k = tile
    k_tiles = -(-k // block_k)
    grid = (-(-m // block_m), -(-n // block_n))
    fn = kernel_for(mode)
    options = {"enable_fp_fusion": fp_fusion} if mode == "cuda" else {}
    with _LAUNCH_LOCK:
        fn[grid](
            a, b, out, scale_a, scale_b, bias if bias is not None else scale_b,
            m, n, k,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
            ACC_INT32=a.dtype == torch.int8,
            SA_STEP=0 if scale_a.numel() == 1 else 1,
            SB_STEP=0 if scale_b.numel() == 1 else 1,
            HAS_BIAS=bias is not None,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            INTERPRETED=mode == "cpu",
            # compiled: 0 always (not specialised on K); interpreted: the loop's bound
            K_TILES=k_tiles if mode == "cpu" else 0,
            **options,
        )  # fmt: skip
