"""Compiled fast paths (numba) for the matmul algorithms of :mod:`.products`.

``MatmulAlgorithm.run`` asks :func:`run_ordered` first; it returns None (and the torch engines of
:mod:`.orders` run instead) when numba is not installed, when the fast paths are switched off
(environment ``SWAPCHECK_NUMBA=0`` or :func:`disabled`), or for an algorithm it does not cover.
Covered: ``matmul_sequential``, ``matmul_pairwise`` and ``matmul_blocked`` in every format and
round-to-nearest mode, with and without fma, for operands of fp32 or narrower formats.  The
kernels (:mod:`._nbkernels`, imported on first use: numba is never imported by ``import
tasks.numerics``) are bit-identical to the torch engines and to the Fraction oracle
(tests/test_numerics_compiled.py); :func:`path` says which kernel a configuration takes.

The first call in a process loads the compiled kernels from numba's cache (``__pycache__`` beside
the module), or compiles them (several seconds) when the cache is missing or stale.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np

from .formats import FloatFormat, get_format
from .rounding import NEAREST_AWAY, NEAREST_EVEN

__all__ = ["available", "disabled", "path", "run_ordered", "operands32", "to_output"]

_KINDS = {"fp32": 0, "bf16": 1, "fp16": 2}
_F32_MIN_NORMAL = 2.0**-126
_F32_MAX = float(np.finfo(np.float32).max)
_state: dict[str, Any] = {"enabled": os.environ.get("SWAPCHECK_NUMBA", "1") != "0", "mod": None}


def _kernels() -> ModuleType | None:
    """The kernel module, or None where numba cannot be imported (remembered)."""
    mod = _state["mod"]
    if mod is None:
        try:
            from . import _nbkernels as mod
        except ImportError:
            mod = False
        _state["mod"] = mod
    return mod or None


def available() -> bool:
    """Are the compiled paths on and numba importable?"""
    return bool(_state["enabled"]) and _kernels() is not None


@contextmanager
def disabled() -> Iterator[None]:
    """Within the block, every algorithm runs its torch engine (for comparisons and tests)."""
    old = _state["enabled"]
    _state["enabled"] = False
    try:
        yield
    finally:
        _state["enabled"] = old


def operands32(x: Any) -> tuple[np.ndarray, FloatFormat] | None:
    """A torch tensor or numpy array of fp32 or a narrower float dtype as a C-contiguous float32
    array (exact) and its format; None for anything else (float64, lists, other dtypes)."""
    if type(x).__module__.startswith("torch"):
        try:
            fmt = get_format(x.dtype)
        except ValueError:
            return None
        if fmt.bits > 32 or x.dim() != 2:
            return None
        return _from_torch(x, fmt), fmt
    if isinstance(x, np.ndarray) and x.dtype != np.float64 and x.ndim == 2:
        try:
            fmt = get_format(x.dtype)
        except ValueError:
            return None
        return np.ascontiguousarray(x, dtype=np.float32), fmt
    return None


def _from_torch(x: Any, fmt: FloatFormat) -> np.ndarray:
    """A CPU tensor's values as float32 through numpy: no torch kernel runs, so torch's intra-op
    threads are not woken to spin beside the compiled kernel's threads (that doubled its time)."""
    import torch

    x = x.detach().to("cpu").contiguous()
    k = _kernels() if fmt.name == "fp16" and available() else None
    if k is not None and k.HW_F16:  # vcvtph2ps: exact, a few times faster than numpy's conversion
        bits = x.view(torch.int16).numpy().view(np.uint16)
        out = np.empty(bits.shape, dtype=np.float32)
        k.widen_fp16(bits.reshape(-1), out.reshape(-1))
        return out
    if fmt.name in ("fp32", "fp16"):
        return np.asarray(x.numpy(), dtype=np.float32)
    ints = x.view(torch.int16 if fmt.bits == 16 else torch.uint8).numpy()
    return np.asarray(ints.view(fmt.int_dtype).view(fmt.numpy_dtype), dtype=np.float32)


def to_output(out: np.ndarray, fmt: FloatFormat, as_torch: bool) -> Any:
    """float32 values of ``fmt`` in fmt's numpy dtype, or as a torch tensor of its dtype (made
    through numpy, for the reason of :func:`_from_torch`); exact."""
    values = out.astype(fmt.numpy_dtype, copy=False)
    if not as_torch:
        return values
    import torch

    if fmt.name in ("fp32", "fp16"):
        return torch.from_numpy(values)
    ints = torch.from_numpy(values.view(fmt.int_dtype).view(np.int16 if fmt.bits == 16 else np.uint8))
    return ints.view(fmt.torch_dtype)


def _f32_products(a: np.ndarray, b: np.ndarray, fa: FloatFormat, fb: FloatFormat) -> bool:
    """Is every finite product of ``a`` and ``b`` exact in fp32 and a normal fp32 value or zero?"""
    if fa.precision + fb.precision > 24:
        return False
    lo = fa.min_subnormal * fb.min_subnormal
    hi = fa.max_finite * fb.max_finite
    if lo >= _F32_MIN_NORMAL and hi <= _F32_MAX:  # the formats alone guarantee it (fp16, fp8)
        return True
    k = _kernels()
    assert k is not None
    amin, amax = k.abs_range(a.reshape(-1))
    bmin, bmax = k.abs_range(b.reshape(-1))
    if amax == 0 or bmax == 0:  # no finite nonzero value on one side: no finite nonzero product
        return True
    return bool(amin * bmin >= _F32_MIN_NORMAL and amax * bmax <= _F32_MAX)


def path(fmt: FloatFormat, rounding: str, fa: FloatFormat, fb: FloatFormat,
         a: np.ndarray | None = None, b: np.ndarray | None = None) -> str:  # fmt: skip
    """Which kernel a configuration takes: ``"f32"`` (float32 arithmetic: fp32 accumulators, and
    bf16/fp16 ones whose products are exact in fp32), ``"gen"`` (float64, any format and
    rounding), or ``"torch"`` (not compiled)."""
    if not available():
        return "torch"
    kind = _KINDS.get(fmt.name) if rounding == NEAREST_EVEN else None
    if kind == 0:
        return "f32"
    if kind is not None and a is not None and b is not None and _f32_products(a, b, fa, fb):
        return "f32"
    if kind is not None and a is None and fa.precision + fb.precision <= 24:
        return "f32"  # (if the data's products fit fp32)
    return "gen"


def _default_nans(x: np.ndarray, fx: FloatFormat) -> np.ndarray:
    """``x`` with its NaNs replaced by the default NaN (a copy, only where there are any) when its
    format has more than 8 bits of precision (fp16: payload bits below fp32's 16th)."""
    if fx.precision <= 8:
        return x
    nan = np.isnan(x)
    return np.where(nan, np.float32(np.nan), x) if nan.any() else x


def run_ordered(order: str, block: int, fmt: FloatFormat, rounding: str, fma: bool,
                a: np.ndarray, b: np.ndarray, fa: FloatFormat, fb: FloatFormat) -> np.ndarray | None:  # fmt: skip
    """``A @ B`` summed in ``order`` (``"sequential"``, ``"pairwise"`` or ``"blocked"`` with
    ``block``) in ``fmt``: a float32 ``[M, N]`` array of values of ``fmt``, or None when not
    compiled.  ``a`` and ``b``: C-contiguous float32 arrays of values of ``fa`` and ``fb``."""
    if not available() or rounding not in (NEAREST_EVEN, NEAREST_AWAY):
        return None
    k = _kernels()
    assert k is not None
    m, kk = a.shape
    out = np.empty((m, b.shape[1]), dtype=np.float32)
    which = path(fmt, rounding, fa, fb, a, b)
    levels = max(2, kk.bit_length() + 2)
    bs, across = (max(kk, 1), False) if order == "sequential" else (block, True)
    if which == "f32":
        kind = _KINDS[fmt.name]
        if kind == 1:  # the bf16 kernels keep only NaNs whose low 16 bits are 0 (_nbkernels._bf16)
            a, b = _default_nans(a, fa), _default_nans(b, fb)
        if order == "pairwise":
            k.pairwise_f32(a, b, out, levels, fma, kind)
        else:
            k.blocked_f32(a, b, out, bs, across, fma, kind)
        return out
    spec = (fmt.mantissa_bits, fmt.emin, fmt.max_finite, fmt.has_inf, rounding == NEAREST_AWAY)
    if order == "pairwise":
        k.pairwise_gen(a, b, out, levels, fma, *spec)
    else:
        k.blocked_gen(a, b, out, bs, across, fma, *spec)
    return out

