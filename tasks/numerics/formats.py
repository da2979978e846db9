"""Binary floating-point format descriptors (fp32, bf16, fp16, fp8 e4m3fn, fp8 e5m2).

Everything else in ``tasks.numerics`` is parameterised by a :class:`FloatFormat`, so the rounding,
spacing and distance code is written once and works for every format.  The descriptors carry only the
bit layout; every derived quantity (largest finite value, epsilon, ...) is computed from it so that a
typo cannot make two properties disagree.  The tests check each derived quantity against
``torch.finfo``.

fp8 e4m3fn is the odd one out: it has no infinities and only one NaN pattern per sign (S.1111.111), so
the top binade keeps its all-ones-exponent normals and the largest finite value is 1.75 * 2**8 = 448
rather than the IEEE-style 1.875 * 2**8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["FloatFormat", "FORMATS", "INT8_MAX_K", "get_format", "torch_dtype"]


@dataclass(frozen=True)
class FloatFormat:
    """Bit layout of a binary floating-point format with gradual underflow.

    Attributes:
        name: canonical name ("fp32", "bf16", "fp16", "fp8_e4m3fn", "fp8_e5m2").
        bits: total storage width.
        exponent_bits: width of the biased exponent field.
        mantissa_bits: stored fraction bits (precision minus the implicit leading bit).
        emin: exponent of the smallest normal number (min_normal = 2**emin).
        emax: exponent of the largest binade that holds finite numbers.
        has_inf: False only for fp8_e4m3fn, whose all-ones exponent still encodes normals.
        nan_description: which bit patterns are NaN, in words.
    """

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int
    emin: int
    emax: int
    has_inf: bool
    nan_description: str

    @property
    def precision(self) -> int:
        """Significand bits including the implicit leading one."""
        return self.mantissa_bits + 1

    @property
    def max_significand(self) -> int:
        """Largest integer significand in the top binade (IEEE: all ones; e4m3fn: all ones is NaN)."""
        full = (1 << self.precision) - 1
        return full if self.has_inf else full - 1

    @property
    def max_finite(self) -> float:
        """Largest finite value: max_significand * 2**(emax - mantissa_bits)."""
        return float(np.ldexp(float(self.max_significand), self.emax - self.mantissa_bits))

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, 2**emin."""
        return float(np.ldexp(1.0, self.emin))

    @property
    def min_subnormal(self) -> float:
        """Smallest positive subnormal, 2**(emin - mantissa_bits): also the spacing below min_normal."""
        return float(np.ldexp(1.0, self.emin - self.mantissa_bits))

    @property
    def eps(self) -> float:
        """Machine epsilon: the gap from 1.0 to the next value, 2**-mantissa_bits."""
        return float(np.ldexp(1.0, -self.mantissa_bits))

    @property
    def unit_roundoff(self) -> float:
        """u = eps / 2: bound on the relative error of one round-to-nearest in the normal range."""
        return self.eps / 2

    @property
    def max_exact_integer(self) -> int:
        """N = 2**precision: every integer 0..N is exact in this format, N + 1 is not."""
        return 1 << self.precision

    @property
    def sign_mask(self) -> int:
        """The sign bit of a bit pattern."""
        return 1 << (self.bits - 1)

    @property
    def max_finite_bits(self) -> int:
        """Magnitude bits of max_finite (patterns above it are inf or NaN)."""
        bias = (1 << (self.exponent_bits - 1)) - 1
        return ((self.emax + bias) << self.mantissa_bits) | (
            self.max_significand - (1 << self.mantissa_bits)
        )

    @property
    def top_non_nan_bits(self) -> int:
        """Largest magnitude bit pattern that is not NaN (inf's bits where there is an inf)."""
        return self.max_finite_bits + 1 if self.has_inf else self.max_finite_bits

    @property
    def torch_dtype(self) -> torch.dtype:
        """The matching ``torch.dtype`` (torch is imported lazily)."""
        import torch

        dtype: torch.dtype = getattr(torch, _TORCH_NAMES[self.name])
        return dtype

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The matching numpy dtype (ml_dtypes for bf16 and the fp8 formats)."""
        dtype: np.dtype[Any] = np.dtype(_NUMPY_TYPES[self.name])
        return dtype

    @property
    def int_dtype(self) -> np.dtype[Any]:
        """Unsigned integer dtype of the same width, for bit-pattern views."""
        return np.dtype(f"uint{self.bits}")

    def __str__(self) -> str:
        return self.name


_IEEE_NAN = "exponent all ones, mantissa != 0"

#: K above which an int32 accumulator of int8 products can overflow: weights in [-127, 127] and
#: activations in [-128, 127] give |product| <= 16256, and floor((2**31 - 1) / 16256) = 132104
#: (docs/reference/numerics.md §3).
INT8_MAX_K = 132104

FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat("fp32", 32, 8, 23, -126, 127, True, _IEEE_NAN),
        FloatFormat("bf16", 16, 8, 7, -126, 127, True, _IEEE_NAN),
        FloatFormat("fp16", 16, 5, 10, -14, 15, True, _IEEE_NAN),
        FloatFormat("fp8_e4m3fn", 8, 4, 3, -6, 8, False, "S.1111.111 only (0x7F, 0xFF)"),
        FloatFormat("fp8_e5m2", 8, 5, 2, -14, 15, True, _IEEE_NAN),
    )
}

_TORCH_NAMES = {
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8_e4m3fn": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}

_NUMPY_TYPES: dict[str, Any] = {
    "fp32": np.float32,
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "fp8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
}

_ALIASES: dict[str, str] = {
    **{name: name for name in FORMATS},
    "float32": "fp32",
    "single": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "e4m3": "fp8_e4m3fn",
    "e4m3fn": "fp8_e4m3fn",
    "fp8_e4m3": "fp8_e4m3fn",
    "float8_e4m3fn": "fp8_e4m3fn",
    "e5m2": "fp8_e5m2",
    "float8_e5m2": "fp8_e5m2",
}


def get_format(x: str | torch.dtype | np.dtype[Any] | type | FloatFormat) -> FloatFormat:
    """Resolve a name, alias, torch dtype or numpy/ml_dtypes dtype to its :class:`FloatFormat`.

    Raises:
        ValueError: for anything else, listing the canonical names and accepted aliases.
    """
    if isinstance(x, FloatFormat):
        return x
    key: str | None = None
    if isinstance(x, str):
        key = x.strip().lower()
        key = key.removeprefix("torch.")
    elif type(x).__module__ == "torch":  # a torch.dtype, without importing torch here
        key = str(x).removeprefix("torch.")
    else:
        try:
            key = np.dtype(x).name  # type: ignore[arg-type]
        except TypeError:
            key = None
    if key is not None and key in _ALIASES:
        return FORMATS[_ALIASES[key]]
    raise ValueError(
        f"unknown floating-point format {x!r}; valid names: {', '.join(FORMATS)} "
        f"(aliases: {', '.join(k for k in _ALIASES if k not in FORMATS)}; torch and numpy/ml_dtypes "
        "dtypes of these formats are accepted too)"
    )


def torch_dtype(name: str) -> torch.dtype:
    """The ``torch.dtype`` of the format called ``name`` (torch is imported lazily).

    ``name`` is a canonical name or an alias of :func:`get_format`, case-insensitive, with or without
    a ``torch.`` prefix: ``"bf16"``/``"bfloat16"``, ``"fp16"``/``"float16"``/``"half"``,
    ``"fp32"``/``"float32"``, ``"fp8_e4m3"`` (``float8_e4m3fn``), ``"fp8_e5m2"``.

    Raises:
        ValueError: an unknown name, listing the valid names and aliases.
    """
    return get_format(name).torch_dtype
